"""The eager PyTorch baseline of issue 7: nanoGPT's model and CPU recipe for Tiny Shakespeare
(4 layers, 4 heads, d_model 128, context 64, batch 12, GELU MLP, LayerNorm without bias,
learned positions, AdamW), timed the way scripts/bench_train.py times ours, so the two compare
on one machine. Needs `pip install torch` (not a dependency of lm).

  python scripts/bench_torch_baseline.py --steps=60
"""

import time

import numpy as np
from absl import flags

from lm import perf
from lm.cli import run_app

_STEPS = flags.DEFINE_integer('steps', 60, 'Timed steps (median reported).')
_WARMUP = flags.DEFINE_integer('warmup', 5, 'Untimed steps.')
_THREADS = flags.DEFINE_integer('threads', 0, 'torch.set_num_threads; 0 = torch default.')


def build(torch, vocab=65, n_layer=4, n_head=4, n_embd=128, block=64):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(n_embd, bias=False)
            self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=False)
            self.c_proj = nn.Linear(n_embd, n_embd, bias=False)
            self.ln_2 = nn.LayerNorm(n_embd, bias=False)
            self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=False)
            self.mlp_proj = nn.Linear(4 * n_embd, n_embd, bias=False)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(n_embd, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, n_embd)
            self.wpe = nn.Embedding(block, n_embd)
            self.h = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd, bias=False)
            self.lm_head = nn.Linear(n_embd, vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as nanoGPT

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


def run() -> int:
    import torch  # optional: only this script needs it

    if _THREADS.value:
        torch.set_num_threads(_THREADS.value)
    torch.manual_seed(0)
    model = build(torch)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    x = torch.randint(0, 65, (12, 64))
    y = torch.randint(0, 65, (12, 64))

    def step():
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    for _ in range(_WARMUP.value):
        step()
    times = []
    for _ in range(_STEPS.value):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    n = sum(p.numel() for p in model.parameters())
    fpt = 6 * n + 12 * 4 * 4 * 32 * 64  # PaLM App. B, as lm.accounting
    dt = float(np.median(times))
    peak, source = perf.peak_flops()
    tps = 12 * 64 / dt
    print(
        f'eager PyTorch {torch.__version__} nanoGPT baseline: {n:,} params, '
        f'{torch.get_num_threads()} threads, peak {peak / 1e9:,.0f} GFLOP/s ({source})'
    )
    print(
        f'| torch eager | {dt * 1e3:.1f} ms/step | {tps:,.0f} tokens/s | '
        f'{fpt * tps / 1e9:.1f} GFLOP/s | MFU {perf.mfu(tps, fpt, peak):.1%} |'
    )
    return 0


if __name__ == '__main__':
    run_app(run)
