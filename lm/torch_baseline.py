"""The eager PyTorch baseline of issue 7: nanoGPT's model (LayerNorm without bias, GELU MLP,
learned positions, tied head) trained by AdamW with gradient clipping, one step at a time.

PyTorch is optional (not a dependency of lm): it is imported inside the functions, so importing
this module never needs it. Used by scripts/bench_torch_baseline.py and scripts/bench_train.py.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass

NANOGPT_VOCAB = 65  # nanoGPT's Tiny Shakespeare character vocabulary


@dataclass(frozen=True)
class Shape:
    """The baseline's shape; the defaults are nanoGPT's CPU recipe for Tiny Shakespeare."""

    vocab: int = NANOGPT_VOCAB
    n_layer: int = 4
    n_head: int = 4
    n_embd: int = 128
    block: int = 64
    batch: int = 12


def available() -> bool:
    """Whether PyTorch can be imported here."""
    return importlib.util.find_spec('torch') is not None


def build(torch, s: Shape):
    """nanoGPT's GPT of shape `s` (a torch.nn.Module whose forward returns the mean loss)."""
    nn, F = torch.nn, torch.nn.functional
    n_embd, n_head = s.n_embd, s.n_head

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
            self.wte = nn.Embedding(s.vocab, n_embd)
            self.wpe = nn.Embedding(s.block, n_embd)
            self.h = nn.ModuleList(Block() for _ in range(s.n_layer))
            self.ln_f = nn.LayerNorm(n_embd, bias=False)
            self.lm_head = nn.Linear(n_embd, s.vocab, bias=False)
            self.lm_head.weight = self.wte.weight  # tied, as nanoGPT

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))

    return GPT()


@dataclass
class Stepper:
    """One training step of the baseline on a fixed random batch: `step()` runs it to the end."""

    step: Callable[[], float]
    params: int
    version: str
    threads: int
    flops_per_token: float


def make_stepper(s: Shape = Shape(), threads: int = 0, seed: int = 0) -> Stepper:
    """The baseline's train step (forward, backward, clip to 1.0, AdamW lr 1e-3, beta2 0.99,
    weight decay 0.1), timed as ours is: `step()` returns only once the update is done."""
    import torch  # optional: only the baseline needs it

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = build(torch, s)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1)
    x = torch.randint(0, s.vocab, (s.batch, s.block))
    y = torch.randint(0, s.vocab, (s.batch, s.block))

    def step() -> float:
        loss = model(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()

    n = sum(p.numel() for p in model.parameters())
    # PaLM App. B, as lm.accounting: 6N + 12·L·H·Q·T.
    fpt = 6 * n + 12 * s.n_layer * s.n_head * (s.n_embd // s.n_head) * s.block
    return Stepper(step, n, torch.__version__, torch.get_num_threads(), fpt)


def time_steps(stepper: Stepper, steps: int) -> list[float]:
    """Seconds of each of `steps` consecutive baseline steps."""
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        stepper.step()
        times.append(time.perf_counter() - t)
    return times
