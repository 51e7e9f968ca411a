"""The data wing: text sources and tokenizers, the token cache (each split tokenised once into a
memmap), and which windows each training or evaluation batch holds.
"""
