"""The infer wing: KV-cache decoding (prefill, then token by token inside one jit) and sampling."""
