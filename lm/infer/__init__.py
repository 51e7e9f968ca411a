"""The infer wing: KV-cache decoding (prefill, then token by token inside one jit) and sampling.

Public face: the `Decoder`, its sampling settings, and the caches it decodes through.
"""

from lm import public_face

__all__, __getattr__, __dir__ = public_face(
    __name__,
    {
        'decode': ('Decoder', 'Sampling', 'cache_capacity', 'init_caches', 'parse_sampling'),
    },
)
