"""The infer wing: KV-cache decoding (prefill, then token by token inside one jit) and sampling."""

from lm import public_face

# The public face: the names each private module offers, the only ones entry points import.
__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'decode': ('Decoder', 'Sampling', 'cache_capacity', 'init_caches', 'parse_sampling'),
    },
)
