"""Head analysis (lm/analysis/scores.py, scripts/analyze_heads.py): scores against per-position loop
references, hand-built heads, the probe against the model's own attention output, and the CLI
on a tiny trained run."""

import csv
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import reference
from conftest import (
    read_scalars,
    run_entry,
    sown_weights,
    tiered,
    tiny_config,
    tiny_train_config,
)
from flax import nnx
from reference import p, rmsnorm

from lm.analysis import scores as analysis
from lm.model import attention
from lm.model.transformer import build_model, model_config


@pytest.fixture
def no_rank_promotion():
    """For the pure score functions (the model itself relies on rank promotion)."""
    with jax.numpy_rank_promotion('raise'):
        yield


def random_probs(rng, B, H, T):
    """Causal softmax of random logits: [B, H, T, T] float32, rows sum to 1."""
    logits = rng.normal(scale=2.0, size=(B, H, T, T))
    logits = np.where(np.tril(np.ones((T, T), bool)), logits, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)).astype(np.float32)


# ---- scores against naive loops ---------------------------------------------------------------


def loop_scores(probs, tokens, eps):
    """Every per-head score by explicit loops over rows, heads and query positions (float64)."""
    B, H, T, _ = probs.shape
    probs = probs.astype(np.float64)
    out = {k: np.zeros(H) for k in ('prev', 'dup', 'ind', 'first', 'sink', 'entropy')}
    for h in range(H):
        prev, first, sink, ent, dup, ind = [], [], [], [], [], []
        for b in range(B):
            for t in range(1, T):
                row = probs[b, h, t]
                prev.append(row[t - 1])
                first.append(row[0])
                sink.append(1.0 if row[0] > eps else 0.0)
                ent.append(-sum(x * math.log(x) for x in row if x > 0))
                copies = [s for s in range(t) if tokens[b, s] == tokens[b, t]]
                if copies:
                    dup.append(sum(row[s] for s in copies))
                    ind.append(sum(row[s + 1] for s in copies))
        for key, vals in zip(
            ('prev', 'first', 'sink', 'entropy', 'dup', 'ind'),
            (prev, first, sink, ent, dup, ind),
            strict=True,
        ):
            out[key][h] = np.mean(vals)
    return out


@pytest.mark.parametrize('seed', [0, 1])
def test_scores_match_loop_reference(seed, no_rank_promotion):
    rng = np.random.default_rng(seed)
    B, H, T = 3, 4, 11
    probs = random_probs(rng, B, H, T)
    tokens = rng.integers(0, 4, (B, T))  # a small vocabulary: many earlier copies
    ref = loop_scores(probs, tokens, eps=0.3)
    pj, tj = jnp.asarray(probs), jnp.asarray(tokens)
    got = {
        'prev': analysis.previous_token_score(pj),
        'first': analysis.first_position_attention(pj),
        'sink': analysis.sink_fraction(pj, 0.3),
        'entropy': analysis.attention_entropy(pj),
        'dup': analysis.duplicate_token_score(pj, tj),
        'ind': analysis.induction_score(pj, tj),
    }
    for key, value in got.items():
        assert value.shape == (H,), key
        np.testing.assert_allclose(np.asarray(value), ref[key], rtol=1e-5, atol=1e-6, err_msg=key)
    assert 0 < ref['sink'].min() and ref['sink'].max() < 1  # the threshold splits positions
    first_LH = np.array([[0.1, 0.5], [0.31, 0.2]])
    assert analysis.sink_rate(first_LH) == 0.5  # 2 of the 4 heads exceed 0.3


def test_entropy_counts_zero_probabilities_as_zero(no_rank_promotion):
    T = 5
    one_hot = np.zeros((1, 1, T, T), np.float32)
    one_hot[0, 0, np.arange(T), 0] = 1.0
    uniform = np.tril(np.ones((T, T), np.float32)) / np.arange(1, T + 1)[:, None]
    assert float(analysis.attention_entropy(jnp.asarray(one_hot))[0]) == 0.0
    expected = np.mean(np.log(np.arange(2, T + 1)))
    np.testing.assert_allclose(
        analysis.attention_entropy(jnp.asarray(uniform[None, None])), [expected], rtol=1e-6
    )


def test_repeated_random_tokens(no_rank_promotion):
    rng = np.random.default_rng(0)
    ids = np.arange(10, 50)
    tokens = analysis.repeated_random_tokens(rng, 5, 16, ids)
    assert tokens.shape == (5, 32) and tokens.dtype == np.int32
    np.testing.assert_array_equal(tokens[:, :16], tokens[:, 16:])
    assert all(len(set(row[:16])) == 16 for row in tokens)  # distinct: one earlier copy each
    assert set(np.unique(tokens)) <= set(ids)
    # On such rows the induction score is exactly the attention from t to t - 16 + 1.
    probs = random_probs(rng, 5, 2, 32)
    expected = np.mean([probs[:, :, t, t - 15] for t in range(16, 32)], axis=(0, 1))
    np.testing.assert_allclose(
        analysis.induction_score(jnp.asarray(probs), jnp.asarray(tokens)), expected, rtol=1e-5
    )


def test_icl_positions_scale_olsson_to_the_context():
    assert analysis.icl_positions(500) == (49, 499)  # Olsson et al.'s 50th and 500th tokens
    assert analysis.icl_positions(64) == (5, 63)
    loss = np.linspace(3.0, 1.0, 64)
    assert analysis.icl_score(loss) == pytest.approx(loss[63] - loss[5])


# ---- KV-head similarity ---------------------------------------------------------------------


def test_kv_similarity_against_reference(no_rank_promotion):
    rng = np.random.default_rng(0)
    N, G, D = 200, 3, 5
    x = rng.normal(size=(N, G, D)) + rng.normal(size=(1, G, D))
    rot = np.linalg.qr(rng.normal(size=(D, D)))[0]
    x[:, 2] = x[:, 0] @ rot + 4.0  # head 2: head 0 rotated and shifted
    # Moments summed over two chunks equal one pass.
    m1 = analysis.head_moments(jnp.asarray(x[:70], jnp.float32))
    m2 = analysis.head_moments(jnp.asarray(x[70:], jnp.float32))
    cov = analysis.head_covariance(jax.tree.map(np.add, m1, m2))
    xc = x - x.mean(axis=0)
    flat = xc.transpose(1, 0, 2).reshape(G, -1)  # [G, N·D]
    cos_ref = flat @ flat.T / np.outer(np.linalg.norm(flat, axis=1), np.linalg.norm(flat, axis=1))
    cka_ref = np.zeros((G, G))
    for g in range(G):
        for h in range(G):
            cross = xc[:, g].T @ xc[:, h]
            cka_ref[g, h] = np.sum(cross**2) / (
                np.linalg.norm(xc[:, g].T @ xc[:, g]) * np.linalg.norm(xc[:, h].T @ xc[:, h])
            )
    np.testing.assert_allclose(analysis.centred_cosine(cov), cos_ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(analysis.linear_cka(cov), cka_ref, rtol=1e-4, atol=1e-5)
    assert analysis.linear_cka(cov)[0, 2] == pytest.approx(1.0, abs=1e-4)  # rotation-invariant
    assert abs(analysis.centred_cosine(cov)[0, 2]) < 0.9  # dimension-aligned


# ---- hand-built heads -----------------------------------------------------------------------


def hand_built_model():
    """One MHA layer, 3 heads of width 8 over an embedding [1, one-hot(token)]:
    head 0 attends t -> t - 1 (queries and keys constant, the key rotated by one step of RoPE's
    fastest pair), head 1 attends to token 0 (which the test puts at position 0 only) through
    RoPE's slowest pair, head 2 has zero queries (uniform attention)."""
    cfg = model_config(
        tiny_config(
            attention='mha', vocab_size=12, d_model=16, num_layers=1, num_heads=3, head_dim=8
        ).model
    )
    model = build_model(cfg)
    E, V = cfg.d_model, cfg.vocab_size
    embed = np.zeros((V, E), np.float32)
    embed[:, 0] = 1.0
    embed[np.arange(V), 1 + np.arange(V)] = 1.0
    model.embed[...] = jnp.asarray(embed)
    q = np.zeros((E, 3, 8), np.float32)
    k = np.zeros((E, 3, 8), np.float32)
    q[0, 0, 0] = 300.0  # pair (0, 4) rotates by 1 rad per position
    k[0, 0, 0], k[0, 0, 4] = math.cos(1.0), math.sin(1.0)  # score ∝ cos(t - s - 1)
    q[0, 1, 3] = 10.0  # pair (3, 7) rotates by 0.001 rad per position
    k[1, 1, 3] = 1.0  # embedding dim 1 = token 0
    attn = model.blocks[0].attn
    attn.q_proj.kernel[...] = jnp.asarray(q)
    attn.k_proj.kernel[...] = jnp.asarray(k)
    return model


@pytest.mark.slow
def test_hand_built_heads_are_found():
    model = hand_built_model()
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 12, (4, 24))
    tokens[:, 0] = 0
    probs = analysis.attention_probs(model, jnp.asarray(tokens))[0]
    prev = np.asarray(analysis.previous_token_score(probs))
    sink = np.asarray(analysis.sink_fraction(probs))
    first = np.asarray(analysis.first_position_attention(probs))
    assert prev[0] > 0.9 and sink[1] > 0.9 and first[1] > 0.9
    assert prev[1] < 0.2 and prev[2] < 0.2
    assert sink[0] < 0.2 and sink[2] < 0.2 and first[0] < 0.2 and first[2] < 0.2
    entropy = np.asarray(analysis.attention_entropy(probs))
    assert entropy[0] < 0.1 and entropy[1] < 0.1 and entropy[2] > 2.0


# ---- the probe against the model ------------------------------------------------------------

VARIANTS = {
    'mha': dict(attention='mha'),
    'gqa2': dict(attention='gqa', num_kv_heads=2),
    'mqa': dict(attention='mqa'),
    'mha_bias': dict(attention='mha', qkv_bias=True),
    'mla': dict(attention='mla'),
    'mla_qlora': dict(attention='mla', q_lora_rank=8),
}


def test_every_registered_variant_has_a_probe_case():
    """A new variant (lm/model/attention.py's registry) is refused here until VARIANTS has it."""
    assert {case['attention'] for case in VARIANTS.values()} >= set(attention.VARIANTS)


def randomise_biases(model, rng):
    for block in model.blocks:
        for name in ('q_proj', 'k_proj', 'v_proj'):
            proj = getattr(block.attn, name, None)
            if proj is not None and proj.bias is not None:
                proj.bias[...] = jnp.asarray(rng.normal(size=proj.bias.shape), jnp.float32)


@pytest.mark.parametrize('variant', tiered(VARIANTS, fast=('mha', 'mla')))
def test_sown_weights_times_values_give_the_attention_output(variant):
    """The weights a variant sows (what the probe reads) · float64 values → o_proj reproduces
    the module's own output on the same call (float32, atol 2e-5), for every variant."""
    cfg = model_config(tiny_config(**VARIANTS[variant]).model)
    model = build_model(cfg, seed=1)
    rng = np.random.default_rng(0)
    randomise_biases(model, rng)
    attn = model.blocks[0].attn
    x = rng.normal(size=(2, 9, cfg.d_model)).astype(np.float32)
    pos = np.broadcast_to(np.arange(9), (2, 9))
    (y, _), weights = sown_weights(attn, jnp.asarray(x), jnp.asarray(pos))
    assert weights.shape == (2, cfg.num_heads, 9, 9)
    v = reference.qkv(attn, cfg, x.astype(np.float64), pos.astype(np.float64))[2]
    out = np.einsum('bhts,bshd->bthd', np.asarray(weights, np.float64), v)
    out = np.einsum('bthd,hde->bte', out, p(attn.o_proj.kernel))
    np.testing.assert_allclose(out, np.asarray(y), atol=2e-5)


@pytest.mark.parametrize('variant', VARIANTS)
def test_probe_matches_reference_probabilities_in_every_layer(variant):
    """The probe (jitted, as the report runs it) against a float64 NumPy forward (atol 1e-5)."""
    cfg = model_config(tiny_config(**VARIANTS[variant]).model)
    model = build_model(cfg, seed=2)
    rng = np.random.default_rng(1)
    randomise_biases(model, rng)
    tokens = rng.integers(0, cfg.vocab_size, (2, 10))
    got = nnx.jit(analysis.attention_probs)(model, jnp.asarray(tokens))
    assert len(got) == cfg.num_layers
    pos = np.broadcast_to(np.arange(10, dtype=np.float64), (2, 10))
    x = p(model.embed)[tokens]
    for layer, block in enumerate(model.blocks):
        h = rmsnorm(x, p(block.attn_norm.scale), cfg.norm_eps)
        ref = reference.weights(block.attn, cfg, h, pos)
        np.testing.assert_allclose(np.asarray(got[layer]), ref, atol=1e-5, err_msg=f'L{layer}')
        x = x + reference.attention(block.attn, cfg, h, pos)
        h = rmsnorm(x, p(block.mlp_norm.scale), cfg.norm_eps)
        gate, up = h @ p(block.mlp.gate_proj.kernel), h @ p(block.mlp.up_proj.kernel)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p(block.mlp.down_proj.kernel)


def test_kv_projections_need_per_head_kv():
    cfg = model_config(tiny_config(attention='mla').model)
    with pytest.raises(ValueError, match="attention='mla' has none"):
        analysis.kv_projections(build_model(cfg), jnp.zeros((1, 4), jnp.int32))


# ---- the CLI --------------------------------------------------------------------------------


def write_text(path):
    """A small text the test writes itself: random sentences over a few words."""
    rng = np.random.default_rng(0)
    words = 'the cat sat on a mat and dog ran to see it by his red hat'.split()
    lines = [' '.join(rng.choice(words, 8)).capitalize() + '.' for _ in range(600)]
    path.write_text('\n'.join(lines))
    return path


def cli(*args):
    return run_entry('scripts/analyze_heads.py', *args)


@pytest.mark.slow
def test_analyze_heads_cli(tmp_path):
    from tensorboard.backend.event_processing import event_accumulator

    from lm.train.loop import train

    text = write_text(tmp_path / 'text.txt')
    config = tiny_train_config(
        tmp_path, text, **{'model.attention': 'mha', 'model.num_kv_heads': 0}
    )
    workdir = tmp_path / 'run'
    train(config, str(workdir), str(tmp_path / 'tb'))  # 8 steps, checkpoints at 4 and 8
    out = tmp_path / 'heads'
    out.mkdir()  # an earlier analysis's image of a run not analysed now, and a file of the user's
    (out / 'heads.csv').write_text('run,layer,head,previous_token\nold,0,0,0.5\n')
    (out / 'attention_old_step9_L0.png').write_bytes(b'old')
    (out / 'notes.txt').write_text('mine')
    args = (f'--workdir={workdir}', f'--compare={workdir}@4', f'--out={out}', '--batch=4')
    kept = cli(*args)  # an analysis of other runs is not replaced unasked
    assert kept.returncode == 1 and kept.stderr.strip().splitlines()[-1] == (
        f"error: --out='{out}' holds an analysis of old, not analysed now (a run at another step "
        'counts as another): give another --out, or --overwrite to replace it'
    )
    assert (out / 'attention_old_step9_L0.png').read_bytes() == b'old'
    res = cli(*args, '--max_batches=2', '--num_random=4', '--overwrite')
    assert res.returncode == 0, res.stderr[-3000:]
    assert not (out / 'attention_old_step9_L0.png').exists()
    assert (out / 'notes.txt').read_text() == 'mine'
    with open(out / 'heads.csv') as f:
        rows = list(csv.reader(f))
    assert rows[0] == [
        'run', 'layer', 'head', 'previous_token', 'induction', 'duplicate_token', 'sink',
        'entropy',
    ]  # fmt: skip
    body = rows[1:]
    assert len(body) == 2 * 2 * 4  # 2 runs x 2 layers x 4 heads
    assert {r[0] for r in body} == {'run@8', 'run@4'}
    for r in body:
        assert all(0.0 <= float(v) <= 1.0 for v in r[3:7]), r
        assert 0.0 <= float(r[7]) <= math.log(16)
    with open(out / 'kv_similarity.csv') as f:
        kv = list(csv.DictReader(f))
    assert len(kv) == 2 * 2 * 4 * 4 * 4  # runs x layers x kinds x 4 x 4 heads
    diag = [float(r['value']) for r in kv if r['head_a'] == r['head_b']]
    assert diag and all(abs(v - 1) < 1e-3 for v in diag)
    summary = (out / 'summary.md').read_text()
    assert '# Head analysis' in summary and 'run@4' in summary and 'KV-head similarity' in summary
    for name in (
        'previous_token', 'induction', 'duplicate_token', 'sink', 'entropy', 'first_position',
        'loss_by_position', 'attention_run_step8_L0', 'attention_run_step4_L1',
        'kv_similarity_run_step8',
    ):  # fmt: skip
        assert (out / f'{name}.png').stat().st_size > 1000, name
    tb = tmp_path / 'tb' / 'run'  # the TensorBoard directory the run was trained with
    assert not (workdir / 'tb').exists()
    assert set(read_scalars(tb, 'heads/previous_token/L1H3')) == {4, 8}
    assert set(read_scalars(tb, 'heads/icl_score')) == {4, 8}
    acc = event_accumulator.EventAccumulator(str(tb), size_guidance={'images': 0})
    acc.Reload()
    assert {'heads/induction', 'heads/attention_L0', 'heads/kv_similarity'} <= set(
        acc.Tags()['images']
    )
    for label in ('run@8', 'run@4'):  # progress over the validation batches, then the random ones
        assert f'head analysis of {label}: validation batch 1/2' in res.stderr
        assert f'head analysis of {label}: validation batch 2/2' in res.stderr
        assert f'head analysis of {label}: 4 repeated random sequences' in res.stderr
    out_o = f'--out={tmp_path / "o"}'
    refused = {  # a step a run does not hold: refused before any work, naming the steps it has
        (f'--compare={workdir}@5',): f'--compare={workdir}@5: {workdir} has no checkpoint',
        ('--step=5', f'--compare={workdir}@4'): f'--workdir: {workdir} has no checkpoint',
    }
    for args, want in refused.items():
        bad = cli(f'--workdir={workdir}', *args, out_o)
        assert bad.returncode == 1 and 'head analysis of' not in bad.stderr, bad.stderr[-2000:]
        assert bad.stderr.strip().splitlines()[-1] == f'error: {want} at step 5 (steps: 4, 8)'
    assert not (tmp_path / 'o').exists()
    notes = tmp_path / 'notes'  # the user's summary.md, in a directory no analysis wrote
    notes.mkdir()
    (notes / 'summary.md').write_text('mine')
    bad = cli(f'--workdir={workdir}', f'--out={notes}')
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1] == (
        f"error: --out='{notes}' holds summary.md, which an analysis would replace, but no "
        "earlier analysis's heads.csv: give a new directory or an earlier analysis's"
    )
    assert (notes / 'summary.md').read_text() == 'mine'


@pytest.mark.slow
def test_analyze_heads_cli_rejects_a_run_without_checkpoints(tmp_path):
    res = cli(f'--workdir={tmp_path}', f'--out={tmp_path / "o"}')
    assert res.returncode == 1 and 'Traceback' not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == (
        f'error: --workdir: {tmp_path / "checkpoints"} holds no checkpoint'
    )


def test_parse_run():
    from lm.analysis.report import parse_run

    assert parse_run('runs/a', 7) == ('runs/a', 7)
    assert parse_run('runs/a@12') == ('runs/a', 12)
    with pytest.raises(ValueError, match="--compare='runs/a@x': expected WORKDIR or WORKDIR@STEP"):
        parse_run('runs/a@x')
