"""The convert wing: Hugging Face checkpoints in and out, and checkpoint conversions between
attention variants (MHA -> GQA/MQA by pooling or merging KV heads, MHA -> MLA).
"""
