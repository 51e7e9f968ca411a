"""The experiments wing: sweeps and uptraining ablations, equal-budget comparisons, statistics over
seeds and summaries; the eager PyTorch baseline the benchmarks compare against.
"""
