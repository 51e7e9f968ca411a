"""Benchmark-only peers of lm, beside the scripts that time them (not part of the library):
nanoGPT's model and recipe in PyTorch (`torch_nanogpt`) and the PyTorch profile read in the
categories lm's own profile uses (`torch_profile`). PyTorch is optional: these modules import
it inside their functions."""
