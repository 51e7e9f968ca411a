"""lm: small decoder-only language models for studying how attention heads are shared."""
