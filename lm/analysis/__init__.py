"""The analysis wing: what each attention head does (scores from attention weights), per-run
reports, heatmaps and TensorBoard entries.
"""
