"""The attention-variant contract: a toy variant, one class registered here, works in the
factory, the model, KV-cache decoding and head analysis (all through its one `__call__`),
accounting, uptraining checks, training, sweeps and plots without editing any module of lm/;
export refuses it (it declares no Hugging Face mapping)."""

import dataclasses
import json
import math
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from conftest import ENV, ROOT, full_forward_rows, sown_weights, tiny_config, tiny_train_config
from flax import nnx
from jax.extend import core as jax_core

from lm.analysis import scores as analysis
from lm.convert import hf
from lm.convert.uptrain import ConversionOptions, check_conversion
from lm.experiments import sweep_points, sweep_summary
from lm.experiments.runner import Spec
from lm.infer.decode import Decoder, cache_elements_per_token, init_caches
from lm.model import accounting, attention
from lm.model.attention import AttentionVariant, KVCache
from lm.model.config import ModelConfig
from lm.model.gqa import GroupedQueryAttention
from lm.model.layers import Dense, residual_scale, rope
from lm.model.transformer import build_model, model_config
from lm.train.hparams import hparam_values
from lm.train.loop import train


class SharedKV(AttentionVariant):
    """Toy: one RoPE'd projection per KV head serves as both key and value (half GQA's cache)."""

    names = ('toy_shared_kv',)

    @staticmethod
    def resolve(cfg: ModelConfig) -> ModelConfig:
        G, H = cfg.num_kv_heads, cfg.num_heads
        if G <= 0 or H % G:
            raise ValueError(f'config.model.num_kv_heads={G} must divide num_heads={H} (toy)')
        return dataclasses.replace(cfg, head_dim=cfg.head_dim or cfg.d_model // H)

    @staticmethod
    def kv_cache_elements(cfg: ModelConfig) -> int:
        return cfg.num_kv_heads * cfg.head_dim

    @staticmethod
    def kv_cache_vectors(cfg: ModelConfig) -> int:
        return cfg.num_kv_heads

    @staticmethod
    def kv_heads(cfg: ModelConfig) -> str:
        return f'{cfg.num_kv_heads} shared'

    @staticmethod
    def score_dims(cfg: ModelConfig) -> tuple[int, int]:
        return cfg.head_dim, cfg.head_dim

    @staticmethod
    def init_cache(cfg: ModelConfig, batch: int, length: int, dtype) -> KVCache:
        return KVCache.empty(kv=jnp.zeros((batch, cfg.num_kv_heads, length, cfg.head_dim), dtype))

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        E, H, G, D = cfg.d_model, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_proj = Dense((E,), (H, D), ('embed', 'heads', 'head_dim'), cfg, rngs=rngs)
        self.kv_proj = Dense((E,), (G, D), ('embed', 'kv_heads', 'head_dim'), cfg, rngs=rngs)
        self.o_proj = Dense(
            (H, D), (E,), ('heads', 'head_dim', 'embed'), cfg, rngs=rngs, scale=residual_scale(cfg)
        )
        self.cfg = cfg

    def __call__(self, x_BTE, positions_BT, *, segment_ids_BT=None, cache=None):
        theta = self.cfg.rope_theta
        q_BTHD = rope(self.q_proj(x_BTE), positions_BT, theta)
        kv_BGSD = rope(self.kv_proj(x_BTE), positions_BT, theta).transpose(0, 2, 1, 3)
        mask = self.mask(x_BTE.shape[1], segment_ids_BT)
        if cache is not None:
            cache, seen, mask = cache.write(kv=kv_BGSD)
            kv_BGSD = seen['kv'].astype(q_BTHD.dtype)
        out_BTHD = self.attend(q_BTHD, kv_BGSD, kv_BGSD, scale=self.cfg.head_dim**-0.5, mask=mask)
        return self.o_proj(out_BTHD), cache


def toy_weights(attn, cfg, x, pos):
    """float64 reference: softmax(q · k) with the one shared projection as key, repeated per
    query head, [B, H, T, T]."""
    q = np.einsum('bte,ehd->bthd', x, reference.p(attn.q_proj.kernel))
    k = np.einsum('bte,egd->btgd', x, reference.p(attn.kv_proj.kernel))
    q, k = reference.rope(q, pos, cfg.rope_theta), reference.rope(k, pos, cfg.rope_theta)
    k = np.repeat(k, cfg.num_heads // cfg.num_kv_heads, axis=2)
    return reference.causal_weights(q, k, cfg.head_dim**-0.5)


@pytest.fixture
def toy():
    attention.register(SharedKV)
    yield SharedKV
    attention.unregister(SharedKV)
    assert 'toy_shared_kv' not in attention.VARIANTS


def toy_cfg(**model):
    return model_config(
        tiny_config(**{'attention': 'toy_shared_kv', 'num_kv_heads': 2, **model}).model
    )


CONTRACT_MEMBERS = [
    'resolve',
    'kv_cache_elements',
    'kv_cache_vectors',
    'kv_heads',
    'score_dims',
    'init_cache',
    '__init__',
    '__call__',
]


@pytest.mark.parametrize('member', CONTRACT_MEMBERS)
def test_register_refuses_a_variant_lacking_a_contract_member(member):
    """The toy less any one contract member is refused at registration, in one line naming it,
    and stays out of the registry."""
    stripped = {k: v for k, v in vars(SharedKV).items() if k != member}
    partial = type('Partial', (AttentionVariant,), {**stripped, 'names': ('toy_partial',)})
    with pytest.raises(TypeError) as refused:
        attention.register(partial)
    assert str(refused.value) == (
        f'attention variant Partial lacks {member} of the AttentionVariant contract '
        '(lm/model/variant.py)'
    )
    assert 'toy_partial' not in attention.VARIANTS


def test_register_refuses_missing_names_sections_and_capability_members():
    """So is a variant without names, with half a config section, or claiming a capability
    without its members; every registered variant is complete."""

    def refusal(**members) -> str:
        cls = type('Toy', (SharedKV,), members)
        with pytest.raises(TypeError) as refused:
            attention.register(cls)
        assert set(attention.VARIANTS.values()).isdisjoint({cls})
        return str(refused.value).split(' of the ')[0]

    assert refusal(names=()) == 'attention variant Toy lacks names'
    assert refusal(config_section='toy') == 'attention variant Toy lacks config_class'
    assert refusal(poolable_kv_heads=True) == 'attention variant Toy lacks kv_projections, pooled'
    assert refusal(latent_kv=True) == 'attention variant Toy lacks config_section'
    assert attention.missing_members(SharedKV) == []
    for cls in set(attention.VARIANTS.values()):
        assert attention.missing_members(cls) == [], cls


def test_factory_model_and_parsing(toy):
    cfg = toy_cfg()
    assert isinstance(attention.make_attention(cfg, rngs=nnx.Rngs(0)), SharedKV)
    assert attention.parse_variant('toy_shared_kv') == {'attention': 'toy_shared_kv'}
    model = build_model(cfg)
    tokens = jax.random.randint(jax.random.key(0), (2, 10), 0, cfg.vocab_size)
    logits = model(tokens)
    assert logits.shape == (2, 10, cfg.vocab_size)
    changed = tokens.at[:, 6].set((tokens[:, 6] + 1) % cfg.vocab_size)
    np.testing.assert_array_equal(model(changed)[:, :6], logits[:, :6])  # causal
    with pytest.raises(ValueError, match=r'num_kv_heads=3 must divide num_heads=4 \(toy\)'):
        toy_cfg(num_kv_heads=3)


@pytest.mark.slow
def test_decoding_and_analysis_use_the_one_computation(toy):
    """Greedy decoding follows the full forward; the probe reads the weights the toy sows, equal
    to a float64 reference from its parameters (atol 1e-5), as a module and in the model."""
    cfg = toy_cfg()
    model = build_model(cfg, seed=1)
    prompts = [[5, 9, 2, 7], [4, 4]]
    out = Decoder(model).generate(prompts, 5)
    fulls = full_forward_rows(model, [p + n for p, n in zip(prompts, out, strict=True)])
    for prompt, new, logits in zip(prompts, out, fulls, strict=True):
        assert len(new) == 5
        # greedy: each generated token is the argmax of the full forward at the previous position
        np.testing.assert_array_equal(np.argmax(logits[len(prompt) - 1 : -1], -1), new)
    caches = init_caches(cfg, 2, 16)
    assert cache_elements_per_token(caches) == accounting.kv_cache_elements_per_token(cfg)

    attn = model.blocks[0].attn
    x = jax.random.normal(jax.random.key(3), (2, 7, cfg.d_model))
    pos = np.broadcast_to(np.arange(7), (2, 7))
    _, weights = sown_weights(attn, x, pos)
    want = toy_weights(attn, cfg, np.asarray(x, np.float64), pos.astype(np.float64))
    np.testing.assert_allclose(weights, want, atol=1e-5)
    tokens = np.array([[3, 1, 4, 1, 5, 9, 2]], np.int32)
    probs = analysis.attention_probs(model, jnp.asarray(tokens))
    assert [p.shape for p in probs] == [(1, cfg.num_heads, 7, 7)] * cfg.num_layers
    h = reference.rmsnorm(
        reference.p(model.embed)[tokens], reference.p(model.blocks[0].attn_norm.scale), cfg.norm_eps
    )
    want = toy_weights(attn, cfg, h, pos[:1].astype(np.float64))
    np.testing.assert_allclose(probs[0], want, atol=1e-5)


def param_size(module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(module, nnx.Param)))


def dot_general_flops(jaxpr) -> int:
    """2 · (contracted size) · (output size) summed over the dot_generals of `jaxpr` and of
    the jaxprs nested in it (jit, custom_vjp, ...)."""
    total = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == 'dot_general':
            (contracted, _), _ = eqn.params['dimension_numbers']
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            total += 2 * math.prod(lhs[i] for i in contracted) * math.prod(out)
        assert eqn.primitive.name not in ('scan', 'while'), 'loops would need a trip count'
        total += sum(dot_general_flops(sub) for sub in jax_core.jaxprs_in_params(eqn.params))
    return total


def test_accounting_uptraining_and_export_ask_the_variant(toy):
    """Accounting against measurements of the built model: its parameter arrays, the cache
    arrays the variant's init_cache makes, and the matmul FLOPs of its jitted forward."""
    cfg = toy_cfg(tie_embeddings=False)
    model = build_model(cfg)
    blocks = list(model.blocks)
    measured = {
        'embedding': model.embed.size,
        'attention': sum(param_size(b.attn) for b in blocks),
        'mlp': sum(param_size(b.mlp) for b in blocks),
        'norm': param_size(model.final_norm)
        + sum(param_size(b.attn_norm) + param_size(b.mlp_norm) for b in blocks),
        'lm_head': param_size(model.lm_head),
        'total': param_size(model),
    }
    assert accounting.param_counts(cfg) == measured

    B, S = 3, 5
    cache = toy.init_cache(cfg, B, S, jnp.bfloat16)
    per_layer = sum(x.size for x in cache.arrays.values()) // (B * S)
    assert accounting.kv_cache_elements_per_token(cfg) == cfg.num_layers * per_layer
    nbytes = sum(x.nbytes for x in cache.arrays.values()) // (B * S)
    assert accounting.kv_cache_bytes_per_token(cfg, 'bfloat16') == cfg.num_layers * nbytes
    for storage in ('int8', 'kivi4'):  # stored caches, counted from the variant's members
        live = sum(a.nbytes for c in init_caches(cfg, B, S, storage) for a in c.arrays.values())
        assert live == B * accounting.kv_cache_bytes(cfg, S, cfg.dtype, storage), storage

    # Forward FLOPs counted on the traced computation: every matmul, the masked half of the
    # T x T scores included (PaLM's convention; the embedding lookup is a gather, not a matmul).
    # Accounting's training FLOPs are 3x the forward's (backward = 2x forward) and its N counts
    # every parameter, so they exceed the matmuls by exactly 2 FLOPs per RMSNorm scale, which
    # multiplies elementwise: the comparison is exact, with that term stated.
    T = 16
    graphdef, state = nnx.split(model)
    forward = jax.jit(lambda state, tokens: nnx.merge(graphdef, state)(tokens))
    jaxpr = jax.make_jaxpr(forward)(state, jnp.zeros((B, T), jnp.int32)).jaxpr
    forward_per_token = dot_general_flops(jaxpr) // (B * T)
    assert forward_per_token * B * T == dot_general_flops(jaxpr)
    norm_flops = 2 * measured['norm']
    assert accounting.flops_per_token(cfg, T) == 3 * (forward_per_token + norm_flops)

    with pytest.raises(ValueError, match=r"attention='toy_shared_kv', which has no K/V heads"):
        check_conversion(cfg, ConversionOptions(num_kv_heads=1))
    shown = hparam_values(tiny_config(), cfg, measured['total'])
    assert 'num_kv_heads' not in shown  # its cache holds no K/V heads of the GQA kind
    assert shown['kv_cache_bytes_per_token'] == accounting.kv_cache_bytes_per_token(cfg, 'bfloat16')
    with pytest.raises(ValueError) as refused:  # never exported as some other architecture
        hf.hf_from_model(cfg, 64)
    assert str(refused.value) == (
        "config.model.attention='toy_shared_kv' (SharedKV) has no Hugging Face mapping; export "
        'supports LlamaForCausalLM (llama: mha/gqa/mqa), Qwen2ForCausalLM (qwen2: mha/gqa/mqa), '
        'DeepseekV3ForCausalLM (deepseek_v3: mla)'
    )


class KeyScaled(GroupedQueryAttention):
    """Toy: GQA plus a parameter its inherited Llama / Qwen2 mappings do not name."""

    names = ('toy_key_scaled',)

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, **layout):
        super().__init__(cfg, rngs=rngs, **layout)
        self.key_scale = nnx.Param(jnp.ones((cfg.head_dim,)))


class NoOutput(GroupedQueryAttention):
    """Toy: GQA less a parameter its inherited mappings name."""

    names = ('toy_no_output',)

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, **layout):
        super().__init__(cfg, rngs=rngs, **layout)
        self.o_proj = None


@pytest.mark.parametrize(
    'toy, side, names',
    [
        (KeyScaled, 'leaves out', 'blocks/0/attn/key_scale, blocks/1/attn/key_scale'),
        (NoOutput, 'names', 'blocks/0/attn/o_proj/kernel, blocks/1/attn/o_proj/kernel'),
    ],
)
def test_export_refuses_a_mapping_that_does_not_name_the_models_parameters(toy, side, names):
    """A subclass inherits its parent's Hugging Face mappings; one whose parameters they do not
    name exactly is refused from its config, before any array is read (an export would drop a
    parameter, an import leave it at its initial value)."""
    attention.register(toy)
    try:
        cfg = toy_cfg(attention=toy.names[0])
        for check in (hf.check_exportable, hf.tensor_map):
            with pytest.raises(ValueError) as refused:
                check(cfg)
            assert str(refused.value).startswith(
                f"config.model.attention='{toy.names[0]}' ({toy.__name__}): its Hugging Face "
                f'mapping (LlamaForCausalLM) {side} 2 parameters ({names}): '
            )
    finally:
        attention.unregister(toy)
    hf.check_exportable(toy_cfg(attention='gqa'))  # the parent's own parameters: all named


@pytest.mark.slow
def test_training_sweep_summary_and_plot(toy, tmp_path, small_text):
    bad = tiny_train_config(
        tmp_path, small_text, **{'model.attention': 'toy_shared_kv', 'model.num_kv_heads': 3}
    )
    assert (
        sweep_points.invalid_reason(bad)
        == 'config.model.num_kv_heads=3 must divide num_heads=4 (toy)'
    )

    config = tiny_train_config(
        tmp_path,
        small_text,
        **{'model.attention': 'toy_shared_kv', 'model.num_kv_heads': 2, 'train.steps': 2},
        **{'eval_every': 2, 'checkpoint_every': 2, 'log_every': 1, 'eval_tokens': 64},
    )
    assert sweep_points.invalid_reason(config) is None
    assert (
        sweep_points.run_name({}, config) == 'toy_shared_kv_h4_kv2'
    )  # its name leaves KV heads free
    train(config, str(tmp_path / 'toy'))
    result = json.loads((tmp_path / 'toy' / 'results.json').read_text())
    spec = Spec('toy', {}, lambda workdir: result, arm='toy')
    rows = {r['point']: r for r in sweep_summary.summarise(str(tmp_path), [spec], {'toy': result})}
    cfg = model_config(tiny_config(attention='toy_shared_kv', num_kv_heads=2, vocab_size=258).model)
    assert rows['toy']['attention'] == 'toy_shared_kv' and rows['toy']['kv_heads'] == '2 shared'
    assert rows['toy']['kv_cache_bytes_per_token'] == accounting.kv_cache_bytes_per_token(cfg)
    assert rows['toy']['params'] == accounting.param_counts(cfg)['total']
    assert math.isfinite(rows['toy']['eval_perplexity'])
    assert '| toy | toy_shared_kv | 4 | 2 shared |' in (tmp_path / 'summary.md').read_text()
    gqa = {**rows['toy'], 'point': 'gqa', 'attention': 'gqa', 'kv_cache_bytes_per_token': 64}
    labels = sweep_summary._plot([rows['toy'], gqa], str(tmp_path / 'plot.png'))
    assert labels == ['GQA', 'TOY_SHARED_KV']  # every kind gets a marker, registry order

    # The export command refuses the trained toy run in one line, writing nothing.
    out = tmp_path / 'hf'
    script = ROOT / 'scripts' / 'convert_hf.py'
    argv = [str(script), 'export', f'--workdir={tmp_path / "toy"}', f'--hf_dir={out}']
    code = (
        'import runpy, sys; sys.path.insert(0, "tests"); '
        'from test_variant_contract import SharedKV; from lm.model import attention; '
        f'attention.register(SharedKV); sys.argv = {argv!r}; '
        f'runpy.run_path({str(script)!r}, run_name="__main__")'
    )
    env = dict(ENV)
    done = subprocess.run(
        [sys.executable, '-c', code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "error: config.model.attention='toy_shared_kv' (SharedKV) has no Hugging Face mapping; "
        'export supports LlamaForCausalLM (llama: mha/gqa/mqa), Qwen2ForCausalLM '
        '(qwen2: mha/gqa/mqa), DeepseekV3ForCausalLM (deepseek_v3: mla)'
    )
    assert not out.exists()
