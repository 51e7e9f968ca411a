"""Base config: every knob of the project, each with a one-line comment.

Other configs start from `get_config()` here and change a few values; the command line changes
any of them: `python train.py --config=configs/base.py --config.model.num_kv_heads=2`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # Seed for parameter init and the data order.

    model = config.model = ml_collections.ConfigDict()
    model.vocab_size = 0  # Vocabulary size; 0 = take it from the tokenizer.
    model.d_model = 256  # Width E of the residual stream.
    model.num_layers = 4  # Number of transformer blocks L.
    model.attention = 'gqa'  # Attention variant: 'mha' | 'gqa' | 'mqa' | 'mla' (lm/attention.py).
    model.num_heads = 8  # Query heads H.
    model.num_kv_heads = 0  # KV heads g (gqa); 0 = implied: H for mha, 1 for mqa. Unused by mla.
    model.head_dim = 0  # Per-head width d_h for mha/gqa/mqa; 0 = d_model // num_heads.
    model.attention_impl = 'einsum'  # 'einsum' (grouped, K/V never repeated) | 'dot_product'.
    model.qkv_bias = False  # Biases on q_proj / k_proj / v_proj (Qwen-style); mha/gqa/mqa only.
    model.mlp_dim = 0  # SwiGLU hidden width; 0 = 8/3 · d_model rounded up to a multiple of 64.
    model.rope_theta = 10_000.0  # RoPE base frequency theta.
    model.norm_eps = 1e-5  # RMSNorm epsilon.
    model.tie_embeddings = True  # Output head shares the token embedding matrix.
    model.init_std = 0.02  # Std of the token embedding init (projections use 1/sqrt(fan_in)).
    model.param_dtype = 'float32'  # Dtype parameters are stored (and optimised) in.
    model.dtype = 'float32'  # Compute dtype: 'float32' or 'bfloat16'; logits are float32.
    # MLA (DeepSeek-V2 §2.1) knobs, used only when attention = 'mla':
    model.kv_lora_rank = 128  # d_c: rank of the joint KV latent c_KV (what the cache stores).
    model.q_lora_rank = 0  # d_c': rank of the query latent; 0 = queries straight from h_t.
    model.qk_nope_head_dim = 32  # Per-head key/query width without RoPE (up-projected from c_KV).
    model.qk_rope_head_dim = 16  # d_h^R: decoupled RoPE width; the RoPE key is shared by heads.
    model.v_head_dim = 32  # Per-head value width.
    return config
