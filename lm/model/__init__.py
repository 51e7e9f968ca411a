"""The model wing: the model config schema (`config`), layers, the attention-variant contract
(`variant`), chunked decoding attention (`chunked`) and its fused GPU kernel (`flash_decode`),
one file per variant (`gqa`, `mla`), the factory (`attention`), KV layouts across layers
(`layout`: cross-layer attention, per-layer KV heads), the variants' Hugging Face mappings as
data (`hf_mapping`), the decoding cache every variant shares (`kv_cache`: full or a
sliding-window ring, float or int8 via `kv_quant`, or, full caches, KIVI's 4 bits via
`kv_kivi`), the decoder (`transformer`) and the accounting of parameters, KV-cache bytes and
FLOPs. Imports no other wing.
"""

from lm import public_face

# The public face: the names each private module offers, the only ones entry points import.
__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'config': ('DECODE_KERNELS', 'DTYPES', 'ModelConfig'),
        'transformer': ('Transformer', 'build_model', 'check_model_config', 'model_config'),
        'attention': (
            'AttentionVariant',
            'inactive_sections',
            'parse_variant',
            'register',
            'variant as variant_class',
        ),
        'kv_cache': ('KVCache', 'KV_CACHE_DTYPES', 'check_storage'),
        'accounting': (
            'flops_per_token',
            'kv_cache_bytes',
            'kv_cache_bytes_read',
            'param_counts',
            'param_shapes',
        ),
        'flash_decode': ('check_backend as check_decode_backend',),
    },
)
