"""The decoder-only language model: embedding, pre-norm blocks, final norm, output head.

Block: x += attention(RMSNorm(x)); x += SwiGLU(RMSNorm(x)). The attention module comes from the
factory in `lm/model/attention.py`, so this file does not change when a variant is added.

Shape legend, one meaning per letter, used as suffixes (`q_BTHD`) and in einsum strings across lm/:
  B batch rows                     T query positions (sequence length; T1 = T + 1 with targets)
  S key positions (cache slots)    E d_model, the residual stream width
  H query heads                    G KV heads
  R query heads per KV head, H / G D per-head query/key width
  U per-head value width           V vocabulary size
  F SwiGLU hidden width            L layers
  C MLA KV latent rank             N MLA query/key width without RoPE (qk_nope_head_dim)
  P MLA decoupled RoPE width       A micro-batches per step (gradient accumulation)
  K optimizer steps per jitted call
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from lm.model import attention, layout
from lm.model.config import DTYPES, ModelConfig
from lm.model.layers import Dense, RMSNorm, SwiGLU, head_logits
from lm.model.variant import KVCache

Constrain = Callable[[jax.Array, tuple[str | None, ...]], jax.Array]
ACT_AXES = ('batch', 'length', None)  # logical axes of the residual stream [B, T, E]


def no_constraint(x: jax.Array, axes: tuple[str | None, ...]) -> jax.Array:
    return x


def model_config(
    model: ml_collections.ConfigDict, tokenizer_vocab: int | None = None
) -> ModelConfig:
    """The one resolver: `config.model` (+ the tokenizer's vocabulary size) -> the ModelConfig
    the model is built from, every knob checked (one-line ValueError, before any array is built)
    and every derived one filled in. vocab_size 0 takes the tokenizer's size; a given size must
    hold the tokenizer's tokens."""
    cfg = check_model_config(model)
    vocab = cfg.vocab_size or tokenizer_vocab or 0
    if vocab <= 0:
        raise ValueError(
            'config.model.vocab_size must be > 0, or 0 to take it from the tokenizer '
            f'(none given), got {cfg.vocab_size}'
        )
    if tokenizer_vocab and vocab < tokenizer_vocab:
        raise ValueError(
            f'config.model.vocab_size={vocab} is smaller than the tokenizer '
            f'vocabulary ({tokenizer_vocab})'
        )
    return dataclasses.replace(cfg, vocab_size=vocab)


def check_model_config(model: ml_collections.ConfigDict) -> ModelConfig:
    """`model_config` before the tokenizer is known: every check but the vocabulary's (so a bad
    setting fails before any data is read). vocab_size stays as given (0 = not yet known).
    The active variant reads its own section of `config.model` and checks it (`resolve`)."""
    cls = attention.variant(model)
    cfg = ModelConfig.from_config(model, cls.read_section(model), attention.sections())
    return layout.resolve(cls, cfg)


class Block(nnx.Module):
    """One pre-norm transformer block: layer `layer` of the model, which sets its attention's
    KV layout role (`layout.sharing`, `layout.layer_config`) and sliding window
    (`cfg.layer_window`: 0 for a global layer)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, layer: int = 0):
        self.attn_norm = RMSNorm(cfg.d_model, cfg)
        self.attn = attention.make_attention(
            layout.layer_config(cfg, layer), rngs=rngs, **layout.sharing(cfg, layer)
        )
        self.attn.window = cfg.layer_window(layer)  # a local layer's sliding window (0: global)
        self.mlp_norm = RMSNorm(cfg.d_model, cfg)
        self.mlp = SwiGLU(cfg, rngs=rngs)

    def __call__(
        self,
        x_BTE: jax.Array,
        positions_BT: jax.Array,
        *,
        segment_ids_BT: jax.Array | None = None,
        cache: KVCache | None = None,
    ) -> tuple[jax.Array, KVCache | None]:
        """The block on T tokens; with this layer's KV cache, also the updated cache (a CLA
        consumer's `cache` is its producer's K/V, lm/model/layout.py)."""
        h_BTE, cache = self.attn(
            self.attn_norm(x_BTE), positions_BT, segment_ids_BT=segment_ids_BT, cache=cache
        )
        x_BTE = x_BTE + h_BTE
        return x_BTE + self.mlp(self.mlp_norm(x_BTE)), cache


class Transformer(nnx.Module):
    """tokens [B, T] -> logits [B, T, vocab] (float32)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        V, E = cfg.vocab_size, cfg.d_model
        table = cfg.init_std * jax.random.normal(rngs.params(), (V, E), DTYPES[cfg.param_dtype])
        self.embed = nnx.Param(table, axes=('vocab', 'embed'))
        self.blocks = nnx.List([Block(cfg, rngs=rngs, layer=i) for i in range(cfg.num_layers)])
        self.final_norm = RMSNorm(E, cfg)
        self.lm_head = (
            None if cfg.tie_embeddings else Dense((E,), (V,), ('embed', 'vocab'), cfg, rngs=rngs)
        )

    def __call__(
        self,
        tokens_BT: jax.Array,
        positions_BT: jax.Array | None = None,
        *,
        constrain: Constrain = no_constraint,
        segment_ids_BT: jax.Array | None = None,
        caches: list[KVCache] | None = None,
        upcast: bool = True,
    ) -> jax.Array | tuple[jax.Array, list[KVCache]]:
        """Logits [B, T, V] (float32; `upcast=False`: as the head wrote them, in
        `cfg.logits_dtype`, for a loss that upcasts inside its own passes); with `caches`,
        (logits, updated caches).

        `constrain(x, logical_axes)` pins activation shardings; the trainer passes one built
        from the mesh rules (lm/sharding.py), the default leaves them to the compiler.
        `segment_ids_BT` (the document of each position of a packed row) restricts attention
        to each token's own document; None = plain causal attention. `caches` (one `KVCache`
        per layer that computes K/V, `layout.producers`; lm/infer/decode.py) are the decoding
        path: the T new tokens per row are written at the caches' slot (prefill: the whole
        prompt; decode: T = 1) and attend every valid slot up to their own."""
        if positions_BT is None:
            positions_BT = jnp.broadcast_to(jnp.arange(tokens_BT.shape[1]), tokens_BT.shape)
        # The lookup reads the table whole (an explicit all-gather, as FSDP gathers any weight
        # before use): a gather from the vocab/embed-sharded table would come out sharded on E,
        # which XLA can only turn into the batch-sharded stream by full rematerialisation.
        table_VE = constrain(self.embed[...], (None, None))
        x_BTE = jnp.take(table_VE, tokens_BT, axis=0).astype(DTYPES[self.cfg.dtype])
        x_BTE = constrain(x_BTE, ACT_AXES)
        layer_caches = iter([None] * len(self.blocks) if caches is None else caches)
        new_caches, below = [], None
        for i, block in enumerate(self.blocks):
            producer = layout.is_producer(self.cfg, i)
            cache = next(layer_caches) if producer else below  # a consumer reads its producer's
            x_BTE, cache = block(x_BTE, positions_BT, segment_ids_BT=segment_ids_BT, cache=cache)
            x_BTE = constrain(x_BTE, ACT_AXES)
            if producer:
                new_caches.append(cache)
                below = cache
        if caches is not None and len(caches) != len(new_caches):
            raise ValueError(f'{len(caches)} caches given for {len(new_caches)} K/V layers')
        logits = self._logits(x_BTE)
        logits = logits.astype(jnp.float32) if upcast else logits
        return logits if caches is None else (logits, new_caches)

    def _logits(self, x_BTE: jax.Array) -> jax.Array:
        dtype = DTYPES[self.cfg.dtype]
        x_BTE = self.final_norm(x_BTE)
        out_dtype = jnp.float32 if self.cfg.logits_dtype == 'float32' else dtype
        if self.lm_head is None:
            table_VE = self.embed[...]  # tied: x · embedᵀ
        else:
            table_VE = self.lm_head.kernel[...].T
        return head_logits(x_BTE.astype(dtype), table_VE.astype(dtype), out_dtype)


def build_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    """A freshly initialised model (parameters drawn from `seed`)."""
    return Transformer(cfg, rngs=nnx.Rngs(params=seed))
