"""Parameter, KV-cache and FLOP accounting against published numbers and hand formulas."""

from conftest import tiny_config

from lm.model.accounting import (
    flops_per_token,
    kv_cache_bytes,
    kv_cache_bytes_per_token,
    kv_cache_elements_per_token,
    param_counts,
)
from lm.model.transformer import model_config


def big(**model):
    return model_config(tiny_config(**{'vocab_size': 128, 'mlp_dim': 64, **model}).model)


def test_llama31_8b_attention_params_per_layer():
    # 32 query heads, 8 KV heads, head_dim 128, hidden 4096: 2·4096² + 2·4096·1024 = 41,943,040.
    cfg = big(
        d_model=4096,
        num_layers=1,
        attention='gqa',
        num_heads=32,
        num_kv_heads=8,
        head_dim=128,
        mlp_dim=14336,
    )
    assert param_counts(cfg)['attention'] == 41_943_040
    assert round(param_counts(cfg)['attention'] / 1e6, 1) == 41.9
    assert param_counts(cfg)['mlp'] == 3 * 4096 * 14336


def test_llama4_maverick_kv_cache_bytes():
    cfg = big(
        d_model=5120, num_layers=48, attention='gqa', num_heads=40, num_kv_heads=8, head_dim=128
    )
    assert kv_cache_bytes_per_token(cfg, 'bfloat16') == 196_608
    assert kv_cache_bytes_per_token(cfg, 'float32') == 2 * 196_608


def test_llama4_chunked_layers_hold_at_most_a_chunk():
    # Llama 4 (Scout, Maverick): 48 layers, 8 KV heads of 128; three of every four layers attend
    # within chunks of 8,192 tokens (attention_chunk_size), every fourth globally. A chunked
    # layer holds at most one chunk, counted as a local layer of W = 8,192 (its upper bound).
    # At 131,072 tokens in bf16 (2·8·128·2 = 4,096 B per token and layer): 12 global layers
    # hold every token, 36 chunked ones 8,192: 6.44 GB + 1.21 GB, against 25.8 GB if uniform.
    shape = dict(d_model=5120, num_layers=48, attention='gqa', num_heads=40, num_kv_heads=8)
    uniform = big(head_dim=128, **shape)
    chunked = big(head_dim=128, sliding_window=8192, layer_pattern='LLLG', **shape)
    n = 131_072
    assert kv_cache_bytes(uniform, n, 'bfloat16') == 48 * n * 4096 == 25_769_803_776
    assert kv_cache_bytes(chunked, n, 'bfloat16') == 12 * n * 4096 + 36 * 8192 * 4096
    assert kv_cache_bytes(chunked, 4096, 'bfloat16') == 48 * 4096 * 4096  # shorter than a chunk


def test_deepseek_v3_mla_cache_elements():
    cfg = big(
        d_model=7168,
        num_layers=61,
        attention='mla',
        num_heads=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        q_lora_rank=1536,
    )
    assert kv_cache_elements_per_token(cfg) == 576 * 61


def test_llama2_70b_mha_vs_gqa8():
    shape = dict(d_model=8192, num_layers=80, num_heads=64, head_dim=128)
    mha, gqa = big(attention='mha', **shape), big(attention='gqa', num_kv_heads=8, **shape)
    assert kv_cache_elements_per_token(mha) == 2 * 64 * 128 * 80
    assert kv_cache_elements_per_token(mha) == 8 * kv_cache_elements_per_token(gqa)
    mqa = big(attention='mqa', **shape)
    assert kv_cache_elements_per_token(mqa) == 2 * 128 * 80


def test_param_counts_match_hand_formula():
    # vocab 61, E 32, L 2, H 4, g 2, D 8, F 64, untied head.
    cfg = model_config(tiny_config(attention='gqa', num_kv_heads=2, tie_embeddings=False).model)
    counts = param_counts(cfg)
    V, E, L, H, G, D, F = 61, 32, 2, 4, 2, 8, 64
    assert counts == {
        'embedding': V * E,
        'attention': L * (2 * E * H * D + 2 * E * G * D),
        'mlp': L * 3 * E * F,
        'norm': (2 * L + 1) * E,
        'lm_head': E * V,
        'total': V * E + L * (2 * E * H * D + 2 * E * G * D + 3 * E * F + 2 * E) + E + E * V,
    }


def test_mla_param_counts_match_hand_formula():
    cfg = model_config(tiny_config(attention='mla', q_lora_rank=12).model)
    E, H, C, Cq, Dn, Dr, Dv = 32, 4, 16, 12, 8, 4, 6
    per_layer = E * Cq + Cq + Cq * H * (Dn + Dr) + E * (C + Dr) + C * H * (Dn + Dv) + H * Dv * E
    counts = param_counts(cfg)
    # The two latent RMSNorm scales (Cq + C) count under attention, not under 'norm'.
    assert counts['attention'] == 2 * (per_layer + C)


def test_flops_per_token_palm_formula():
    cfg = model_config(tiny_config(attention='mha').model)  # tied: N includes the embedding
    n = param_counts(cfg)['total']
    assert flops_per_token(cfg, 64) == 6 * n + 12 * 2 * 4 * 8 * 64
    untied = model_config(tiny_config(attention='mha', tie_embeddings=False).model)
    counts = param_counts(untied)
    assert (
        flops_per_token(untied, 64)
        == 6 * (counts['total'] - counts['embedding']) + 12 * 2 * 4 * 8 * 64
    )
