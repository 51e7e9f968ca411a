"""A GPT-2-small-sized model (12 layers, d_model 768, 12 heads, context 1024, bfloat16 compute)
for GPU throughput / MFU measurements: `python scripts/bench_train.py --config=configs/gpt125m.py
--set=model.attention_impl=cudnn` (cuDNN flash attention; about 1.8x XLA's on an H100,
2026-11-23, two runs ten minutes apart: indicative). Its logits are
bfloat16 (as PyTorch autocast makes them) and its train step compiles with XLA's Triton GEMMs
off (cuBLAS): 1.03x and 1.06x on an H200, each an A/B in one process
(docs/studies/performance/README.md); a CPU ignores the GPU option.
A workdir made before 2026-11-28 (float32 logits) resumes with --allow_config_change, or with
--config.model.logits_dtype=float32.
The optional argument picks the attention variant, as in configs/shakespeare_char.py; the byte
tokenizer's 258 ids sit in GPT-2's padded 50,304-row vocabulary so the FLOPs match GPT-2 small.
"""

import os

from lm.config import load_config_file


def get_config(variant: str = 'mha'):
    here = os.path.dirname(__file__)
    config = load_config_file(os.path.join(here, 'shakespeare_char.py'), variant)
    config.model.update(
        d_model=768,
        num_layers=12,
        num_heads=12,
        head_dim=0,
        dtype='bfloat16',
        vocab_size=50304,
        logits_dtype='compute',
    )
    config.model.mla.update(
        kv_lora_rank=256, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64
    )
    config.data.update(seq_len=1024)
    config.train.update(batch_size=16, steps=5000, warmup_steps=500, lr=6e-4, min_lr=6e-5, b2=0.95)
    config.train.xla_options = 'xla_gpu_enable_triton_gemm=false'  # cuBLAS for every GEMM
    config.update(eval_every=500, log_every=50, checkpoint_every=1000)
    config.eval_batch_size = 0  # the training batch: 96 windows of 1024 would not fit
    return config
