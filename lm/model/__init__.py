"""The model wing: the model config schema (`config`), layers, the attention-variant contract
(`variant`), one file per variant (`gqa`, `mla`), the factory (`attention`), the variants'
Hugging Face mappings as data (`hf_mapping`), the decoding cache every variant shares
(`kv_cache`: full or a sliding-window ring, float or int8 via `kv_quant`), the decoder
(`transformer`) and the accounting of parameters, KV-cache bytes and FLOPs. Imports no other wing.
"""
