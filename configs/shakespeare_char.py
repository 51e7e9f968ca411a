"""nanoGPT's CPU recipe for Tiny Shakespeare (character level) with our block.

4 layers, 4 heads, d_model 128, context 64, batch 12, 2000 steps, lr 1e-3 -> 1e-4 cosine,
warmup 100, beta2 0.99, byte tokenizer. The text is data/tinyshakespeare.txt (relative to the
working directory; fetch it with `python scripts/get_data.py tinyshakespeare`, or point
--config.data.path elsewhere):

  python train.py --config=configs/shakespeare_char.py:gqa2 --workdir=runs/gqa2

The optional argument picks the attention variant: mha (default), gqa<g> (e.g. gqa2), mqa, mla.
"""

import os

from lm.config import load_config_file
from lm.model.attention import parse_variant


def get_config(variant: str = 'mha'):
    config = load_config_file(os.path.join(os.path.dirname(__file__), 'base.py'))
    config.model.update(d_model=128, num_layers=4, num_heads=4, head_dim=0)
    try:
        config.model.update(parse_variant(variant))
    except ValueError as e:
        raise ValueError(f'configs/shakespeare_char.py: {e}') from None
    # MLA at this width: d_c = 4·d_h and d_h^R = d_h / 2 as in DeepSeek-V2, with d_h = 32.
    config.model.mla.update(
        kv_lora_rank=128, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32
    )
    config.data.update(source='text', path='data/tinyshakespeare.txt', tokenizer='byte', seq_len=64)
    config.train.update(
        batch_size=12,
        steps=2000,
        lr=1e-3,
        min_lr=1e-4,
        warmup_steps=100,
        b2=0.99,
        weight_decay=0.1,
        grad_clip=1.0,
    )
    config.update(eval_every=250, log_every=100, checkpoint_every=500)
    # Every validation character once (eval_tokens = 0: ~1,740 windows of 64), 96 per call
    # (8 training batches: divisible by any data-parallel size the batch of 12 allows).
    config.update(eval_tokens=0, eval_batch_size=96)
    # Data parallel across 2 CPU cores (one thread each): 1.6-1.7x faster than one 2-thread
    # device (AMD EPYC, 2026-11-22, docs/studies/performance/README.md).
    config.mesh.cpu_devices = 2
    # 10 optimizer steps per jitted call (divides every interval above): host dispatch per step
    # drops from 1.4-2.4 ms to 0.1-0.3 ms; with the loop's own host work, ~3% of a 22-24 ms
    # step on 2 CPU devices (docs/performance.md).
    config.train.steps_per_call = 10
    return config
