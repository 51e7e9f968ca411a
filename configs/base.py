"""Base config: every knob of the project, each with a one-line comment.

Other configs start from `get_config()` here and change a few values; the command line changes
any of them: `python train.py --config=configs/base.py --config.model.num_kv_heads=2`.
"""

import ml_collections


def get_config() -> ml_collections.ConfigDict:
    config = ml_collections.ConfigDict()
    config.seed = 0  # Seed for parameter init and the data order.
    config.compilation_cache_dir = '~/.cache/lm/xla'  # Persistent XLA compile cache; '' = off.

    model = config.model = ml_collections.ConfigDict()
    model.vocab_size = 0  # Vocabulary size; 0 = take it from the tokenizer.
    model.d_model = 256  # Width E of the residual stream.
    model.num_layers = 4  # Number of transformer blocks L.
    model.attention = 'gqa'  # Attention variant: 'mha' | 'gqa' | 'mqa' | 'mla' (lm/model/).
    model.num_heads = 8  # Query heads H.
    model.num_kv_heads = 0  # KV heads g (gqa); 0 = implied: H for mha, 1 for mqa. Unused by mla.
    model.kv_share_every = 1  # Cross-layer attention: one layer's K/V serve N layers (1 = off).
    model.kv_heads_per_layer = ()  # KV heads of each layer, e.g. (4, 2, 2, 1); () = num_kv_heads.
    model.head_dim = 0  # Per-head width d_h for mha/gqa/mqa; 0 = d_model // num_heads.
    model.attention_impl = 'einsum'  # 'einsum' (K/V not repeated) | 'dot_product' (XLA) | 'cudnn'.
    model.decode_chunk = 0  # Cached decoding reads the filled slots this many at a time; 0 = all.
    model.decode_kernel = 'xla'  # Decode steps: 'xla' | 'pallas' (GPU kernel) | 'pallas_interpret'.
    model.kv_quant_group = 32  # kivi4 KV cache: tokens per key group and float residual (KIVI).
    model.qkv_bias = False  # Biases on q_proj / k_proj / v_proj (Qwen-style); mha/gqa/mqa only.
    model.o_bias = False  # Bias on o_proj (HF Llama attention_bias=True); mha/gqa/mqa only.
    model.mlp_dim = 0  # SwiGLU hidden width; 0 = 8/3 · d_model rounded up to a multiple of 64.
    model.rope_theta = 10_000.0  # RoPE base frequency theta.
    model.rope_scaling = ''  # '' = plain RoPE | 'llama3' (Llama 3.1 frequency scaling, below).
    model.rope_scaling_factor = 8.0  # llama3: low frequencies are divided by this factor.
    model.rope_low_freq_factor = 1.0  # llama3: wavelengths > orig_len / this are fully scaled.
    model.rope_high_freq_factor = 4.0  # llama3: wavelengths < orig_len / this are kept.
    model.rope_original_max_len = 8192  # llama3: context length the model was pre-trained at.
    model.norm_eps = 1e-5  # RMSNorm epsilon.
    model.tie_embeddings = True  # Output head shares the token embedding matrix.
    model.init_std = 0.02  # Std of the token embedding init (projections use 1/sqrt(fan_in)).
    model.param_dtype = 'float32'  # Dtype parameters are stored (and optimised) in.
    model.dtype = 'float32'  # Compute dtype: 'float32' or 'bfloat16'; the loss is float32.
    model.logits_dtype = 'float32'  # Head output: 'float32' | 'compute' (model.dtype, autocast).
    model.sliding_window = 0  # Window W of local layers (W keys, the query's own included); 0=off.
    model.layer_pattern = ''  # 'L' local / 'G' global per layer, repeated ('LG'); '' = all local.
    # MLA's own section (DeepSeek-V2 §2.1), read only when attention = 'mla':
    mla = model.mla = ml_collections.ConfigDict()  # --config.model.mla.kv_lora_rank=64 etc.
    mla.kv_lora_rank = 128  # d_c: rank of the joint KV latent c_KV (what the cache stores).
    mla.q_lora_rank = 0  # d_c': rank of the query latent; 0 = queries straight from h_t.
    mla.qk_nope_head_dim = 32  # Per-head key/query width without RoPE (up-projected from c_KV).
    mla.qk_rope_head_dim = 16  # d_h^R: decoupled RoPE width of each RoPE key.
    mla.rope_heads = 1  # RoPE keys per token: 1 = shared by all heads; R: head h reads h // (H/R).
    mla.v_head_dim = 32  # Per-head value width.
    mla.latent_norm_eps = 0.0  # Epsilon of MLA's q/kv latent RMSNorms; 0 = norm_eps.

    data = config.data = ml_collections.ConfigDict()
    data.source = 'stdlib'  # 'stdlib' | 'text' | 'hf' | 'mqar_zoology' | 'mqar' | 'passkey'.
    data.path = ''  # text: comma-separated file paths; hf: optional local data_files (comma-sep).
    data.decode_errors = 'strict'  # Non-UTF-8 text: 'strict' = refuse it | 'replace' = U+FFFD.
    data.val_fraction = 0.1  # Held-out share: last chars (text), path hash (stdlib), docs (hf).
    data.split = ''  # Part trained on: '' = all | 'pretrain' | 'uptrain' | 'pretrain+uptrain'.
    data.uptrain_fraction = 0.1  # split set: share of the train text (its end) that is 'uptrain'.
    data.heldout_fraction = 0.5  # split set: share of validation (its end) that is 'heldout'.
    data.split_layout = 'contiguous'  # split set: parts as 'contiguous' spans | 'interleaved'.
    data.split_block = 1024  # interleaved: tokens per block; blocks dealt to parts (data/parts.py).
    data.hf_name = ''  # hf: dataset name on the hub, or a builder such as 'text' / 'json'.
    data.hf_config = ''  # hf: dataset config name ('' = none).
    data.hf_split = 'train'  # hf: split to train on.
    data.hf_eval_split = ''  # hf: held-out split; '' = every 1/val_fraction-th doc of hf_split.
    data.hf_text_column = 'text'  # hf: column holding the text.
    data.hf_sample_by = 'paragraph'  # hf_name='text': a doc is a 'line'|'paragraph'|'document'.
    data.hf_streaming = False  # hf: stream instead of downloading the whole split.
    data.hf_max_docs = 0  # hf: read at most this many documents per split (0 = all).
    data.tokenizer = 'byte'  # 'byte' (256 bytes + specials) | 'bpe' (trained here) | a .json path.
    data.eos_token = ''  # .json tokenizer: its end-of-text token; '' = <|endoftext|> or last id.
    data.bpe_vocab_size = 4096  # bpe: vocabulary size to train.
    data.seq_len = 256  # Tokens per training sequence (context length T).
    data.cache_dir = ''  # Where token memmaps and trained tokenizers go; '' = ~/.cache/lm.
    data.num_proc = 0  # BPE tokenisation processes past 16 MB; 0 = every CPU (<= 16), 1 = serial.
    data.sampling = 'random'  # 'random' windows (with replacement) | 'epochs' (each once/epoch).
    data.document_mask = False  # Attend only within a document (EOS-separated) in each window.
    # Recall sources (lm/data/recall.py), generated from seeds, scored on their answers only:
    data.recall_seed = 0  # Seed of the examples: held-out set from it, training from it + seed.
    data.recall_eval_examples = 1000  # Held-out examples scored per evaluation.
    data.recall_pairs = 8  # mqar, mqar_zoology: key-value pairs per row (each key queried once).
    data.recall_train_pairs = ''  # mqar: training rows' pair counts, one drawn per row ('2,4,8').
    data.recall_vocab = 256  # mqar, mqar_zoology: symbols; keys in [1, V/2), values in [V/2, V-1).
    data.recall_power_a = 0.01  # mqar: query-gap power law p(g) ~ g^(a-1) (Zoology: 0.01).
    data.passkey_lengths = '128,256'  # passkey: example lengths in bytes (<= seq_len + 1).
    data.passkey_depths = '0,0.25,0.5,0.75,1'  # passkey: needle depths scored (0 = first).

    train = config.train = ml_collections.ConfigDict()
    train.batch_size = 32  # Global sequences per optimizer step (all devices, all hosts).
    train.grad_accum_steps = 1  # Micro-batches per step; batch_size must divide by it.
    train.steps_per_call = 1  # Optimizer steps per jitted call (lax.scan): less host overhead.
    train.steps = 1000  # Optimizer steps in total.
    train.lr = 1e-3  # Peak learning rate, reached after warmup.
    train.min_lr = 1e-4  # Learning rate at the end of the cosine decay.
    train.warmup_steps = 100  # Linear warmup from 0 to lr.
    train.schedule_start = 0  # Step where that warmup starts (uptraining 'rewarm': source's step).
    train.decay_steps = 0  # Step where the cosine reaches min_lr; 0 = train.steps.
    train.ramp_start = 0  # Step where the lr ramp (ramp_steps) starts.
    train.ramp_steps = 0  # Scale the lr by a 0 -> 1 ramp over this many steps; 0 = no ramp.
    train.b1 = 0.9  # AdamW beta1.
    train.b2 = 0.95  # AdamW beta2.
    train.eps = 1e-8  # AdamW epsilon.
    train.weight_decay = 0.1  # AdamW decoupled weight decay, on matrices only (not norms).
    train.grad_clip = 1.0  # Clip the global gradient norm to this (0 = off).
    train.xla_options = ''  # Train step's XLA compile options: 'key=value key=value' (spaces).
    train.peak_flops = 0.0  # Stated peak FLOP/s per device for MFU; 0 = GPU/TPU table (CPU: none).
    train.ensemble = 0  # Seed ensemble: K members (seeds seed..seed+K-1) as one program; 0 = off.
    train.ensemble_loop = False  # Ensemble members one after another in the program, not vmapped.
    train.ensemble_lr = ''  # Ensemble members' peak lr, K comma-separated ('1e-3,3e-3'); '' = lr.
    train.ensemble_min_lr = ''  # Ensemble members' min_lr, K comma-separated; '' = min_lr.
    train.max_loss_ratio = 0.0  # Stop if loss > this x its last-100-step median, keep ckpt; 0=off

    mesh = config.mesh = ml_collections.ConfigDict()
    mesh.data = -1  # Data-parallel axis size; -1 = all devices the other axes leave.
    mesh.fsdp = 1  # Fully-sharded data-parallel axis size (parameters split on 'embed').
    mesh.tensor = 1  # Tensor-parallel axis size (heads, KV heads, MLP and vocab split).
    mesh.cpu_devices = 0  # CPU backend only: expose the host as N devices; 0 = JAX's default.
    rules = mesh.rules = ml_collections.ConfigDict()  # Logical axis -> mesh axes ('' = replicate).
    rules.batch = 'data,fsdp'  # Batch rows of inputs and activations.
    rules.member = 'data'  # Ensemble members (train.ensemble); a member's rules leave these out.
    rules.length = ''  # Sequence positions of activations.
    rules.embed = 'fsdp'  # d_model dimension of weights.
    rules.heads = 'tensor'  # Query heads.
    rules.kv_heads = 'tensor'  # KV heads (replicated when the tensor axis does not divide them).
    rules.head_dim = ''  # Per-head width.
    rules.mlp = 'tensor'  # SwiGLU hidden width.
    rules.vocab = 'tensor'  # Vocabulary dimension of the embedding / head.
    rules.q_lora = ''  # MLA query latent.
    rules.kv_lora = ''  # MLA KV latent (plus the RoPE key).
    rules.norm = ''  # RMSNorm scales.

    uptrain = config.uptrain = ml_collections.ConfigDict()  # MHA -> GQA/MQA (scripts/uptrain.py)
    uptrain.fraction = 0.05  # Uptraining steps as a fraction alpha of the source run's steps.
    uptrain.warmup_steps = -1  # Uptraining warmup; -1 = 10% of its steps (rewarm), none (continue).
    uptrain.schedule = 'continue'  # 'continue': the source's lr schedule; 'rewarm': warm up anew.
    uptrain.optimizer_state = 'convert'  # 'convert': source's Adam moments, K/V pooled; 'fresh'.
    uptrain.method = ''  # Set by scripts/uptrain.py: 'mean'|'first'|'random'|'aligned'|'joint_svd'.
    uptrain.grouping = 'contiguous'  # Which KV heads merge: 'contiguous' | 'similarity'.
    uptrain.target = ''  # Set by scripts/uptrain.py: the converted attention ('gqa'|'mqa'|'mla').
    uptrain.groups = ''  # Set by scripts/uptrain.py (similarity): merged heads, '0,2|1,3;...'.
    uptrain.rope_pairs = ''  # Set by scripts/uptrain.py (mla target): source RoPE pairs kept.
    uptrain.kv_budget = 0  # Total KV heads, split over layers by head similarity; 0 = off.
    uptrain.calibration_tokens = 8192  # Source train tokens fitting similarity/aligned/mla.
    uptrain.source_workdir = ''  # Set by scripts/uptrain.py: the run this one was converted from.
    uptrain.source_step = -1  # Set by scripts/uptrain.py: the source checkpoint's step.

    config.eval_every = 200  # Evaluate on the held-out split every N steps (and at the end).
    config.eval_at_start = True  # Evaluate a new run at step 0 too (eval_init/*); False skips it.
    config.eval_tokens = 0  # Held-out tokens per evaluation, windows spread evenly; 0 = all.
    config.eval_batch_size = 0  # Eval windows per call, at most the split's; 0 = train micro-batch.
    config.log_every = 50  # Print a log line every N steps (TensorBoard gets every step).
    config.checkpoint_every = 500  # Save a checkpoint every N steps (and at the end).
    config.keep_checkpoints = 3  # Keep the last K checkpoints.
    config.async_checkpointing = True  # Write checkpoints in a background thread.
    return config
