"""The train wing: run assembly (`run`), the jitted train/eval steps, the loop, optimizer,
checkpoints, the run directory, evaluation, TensorBoard and the run log; performance accounting
(`perf`) and profiler traces (`profile`). Imports neither `convert` nor `analysis`.
"""
