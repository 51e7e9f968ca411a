"""Plain float64 NumPy references, written independently of lm/: K/V heads are repeated
explicitly and attention is a textbook softmax over a causal mask."""

import numpy as np


def p(param):
    """A parameter as a float64 NumPy array."""
    return np.asarray(param[...], dtype=np.float64)


def rmsnorm(x, scale, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * scale


def llama3_frequencies(freqs, factor, low, high, old_context):
    """Llama 3.1's RoPE frequency scaling, one frequency at a time as Meta's reference code."""
    out = []
    for f in freqs:
        wavelen = 2 * np.pi / f
        if wavelen < old_context / high:
            out.append(f)
        elif wavelen > old_context / low:
            out.append(f / factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return np.array(out)


def rope(x, pos, theta, cfg=None):
    """x [B, T, H, D], pos [B, T]: pairs (i, i + D/2) rotated by pos · theta^(-2i/D), the
    frequencies scaled as cfg.rope_scaling says."""
    half = x.shape[-1] // 2
    freqs = theta ** (-np.arange(half) / half)
    if cfg is not None and cfg.rope_scaling == 'llama3':
        freqs = llama3_frequencies(
            freqs,
            cfg.rope_scaling_factor,
            cfg.rope_low_freq_factor,
            cfg.rope_high_freq_factor,
            cfg.rope_original_max_len,
        )
    ang = pos[:, :, None, None] * freqs
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate(
        [x1 * np.cos(ang) - x2 * np.sin(ang), x2 * np.cos(ang) + x1 * np.sin(ang)], axis=-1
    )


def causal_weights(q, k, scale):
    """q, k [B, T, H, Dk], every head with its own keys: causal softmax weights [B, H, T, T]."""
    T = q.shape[1]
    s = np.einsum('bthd,bshd->bhts', q, k) * scale
    s = np.where(np.tril(np.ones((T, T), bool)), s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return w / w.sum(-1, keepdims=True)


def gqa_qkv(attn, cfg, x, pos):
    """GroupedQueryAttention's q, k, v [B, T, H, D] with KV heads repeated per query head (head
    i uses i // (H/g)), and the softmax scale."""
    H, G = cfg.num_heads, cfg.num_kv_heads
    q = np.einsum('bte,ehd->bthd', x, p(attn.q_proj.kernel))
    k = np.einsum('bte,egd->btgd', x, p(attn.k_proj.kernel))
    v = np.einsum('bte,egd->btgd', x, p(attn.v_proj.kernel))
    if cfg.qkv_bias:
        q, k, v = q + p(attn.q_proj.bias), k + p(attn.k_proj.bias), v + p(attn.v_proj.bias)
    q, k = rope(q, pos, cfg.rope_theta, cfg), rope(k, pos, cfg.rope_theta, cfg)
    k, v = np.repeat(k, H // G, axis=2), np.repeat(v, H // G, axis=2)
    return q, k, v, cfg.head_dim**-0.5


def mla_qkv(attn, cfg, x, pos):
    """MLA's q, k [B, T, H, N + P] and v [B, T, H, U], full per-head K and V materialised from
    the latent c_KV, and the softmax scale."""
    H, C, Dn = cfg.num_heads, cfg.section.kv_lora_rank, cfg.section.qk_nope_head_dim
    eps = cfg.section.latent_norm_eps or cfg.norm_eps
    if cfg.section.q_lora_rank:
        cq = rmsnorm(x @ p(attn.q_a_proj.kernel), p(attn.q_a_layernorm.scale), eps)
        q = np.einsum('btc,chk->bthk', cq, p(attn.q_b_proj.kernel))
    else:
        q = np.einsum('bte,ehk->bthk', x, p(attn.q_proj.kernel))
    q = np.concatenate([q[..., :Dn], rope(q[..., Dn:], pos, cfg.rope_theta, cfg)], axis=-1)
    kv_a = x @ p(attn.kv_a_proj_with_mqa.kernel)
    c = rmsnorm(kv_a[..., :C], p(attn.kv_a_layernorm.scale), eps)
    R, P = cfg.section.rope_heads, cfg.section.qk_rope_head_dim
    k_pe = np.stack([kv_a[..., C + r * P : C + (r + 1) * P] for r in range(R)], axis=2)
    k_pe = rope(k_pe, pos, cfg.rope_theta, cfg)  # R RoPE keys; head h reads key h // (H / R)
    kv = np.einsum('btc,chk->bthk', c, p(attn.kv_b_proj.kernel))
    k = np.concatenate([kv[..., :Dn], k_pe[:, :, [h * R // H for h in range(H)]]], axis=-1)
    return q, k, kv[..., Dn:], (Dn + cfg.section.qk_rope_head_dim) ** -0.5


def qkv(attn, cfg, x, pos):
    return (mla_qkv if cfg.attention == 'mla' else gqa_qkv)(attn, cfg, x, pos)


def weights(attn, cfg, x, pos):
    """The attention weights [B, H, T, T] of the module `attn` on x [B, T, E]."""
    q, k, _, scale = qkv(attn, cfg, x, pos)
    return causal_weights(q, k, scale)


def attention(attn, cfg, x, pos):
    """The module's output [B, T, E]: weights · values, then o_proj."""
    q, k, v, scale = qkv(attn, cfg, x, pos)
    o = np.einsum('bhts,bshd->bthd', causal_weights(q, k, scale), v)
    out = np.einsum('bthd,hde->bte', o, p(attn.o_proj.kernel))
    return out + p(attn.o_proj.bias) if cfg.o_bias else out


def forward(model, cfg, tokens):
    """Whole-model logits: embedding, pre-norm blocks with SwiGLU, final norm, head."""
    B, T = tokens.shape
    pos = np.broadcast_to(np.arange(T, dtype=np.float64), (B, T))
    x = p(model.embed)[tokens]
    for blk in model.blocks:
        x = x + attention(blk.attn, cfg, rmsnorm(x, p(blk.attn_norm.scale), cfg.norm_eps), pos)
        h = rmsnorm(x, p(blk.mlp_norm.scale), cfg.norm_eps)
        gate, up = h @ p(blk.mlp.gate_proj.kernel), h @ p(blk.mlp.up_proj.kernel)
        x = x + (gate / (1 + np.exp(-gate)) * up) @ p(blk.mlp.down_proj.kernel)
    x = rmsnorm(x, p(model.final_norm.scale), cfg.norm_eps)
    head = p(model.embed).T if cfg.tie_embeddings else p(model.lm_head.kernel)
    return x @ head
