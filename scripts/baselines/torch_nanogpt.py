"""The PyTorch baseline: nanoGPT's model (LayerNorm without bias, GELU MLP, learned positions,
tied head) trained by AdamW with gradient clipping, one step at a time: eager on a CPU; on a GPU
as nanoGPT trains there (bfloat16 autocast, flash SDPA, fused AdamW), eager or under
`torch.compile`.

PyTorch is optional (not a dependency of lm): it is imported inside the functions, so importing
this module never needs it. Used by scripts/bench_torch_baseline.py and scripts/bench_train.py.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from lm.data import eval_batches, eval_windows, train_batch

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


def version_and_threads(threads: int = 0) -> tuple[str, int]:
    """(PyTorch's version, the threads a stepper made with `threads` uses; 0 = torch's default)."""
    import torch  # optional: only the baseline needs it

    return torch.__version__, threads or torch.get_num_threads()


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
            # nanoGPT's init: N(0, 0.02), residual projections scaled by 1/sqrt(2 L).
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * s.n_layer) if 'proj' in name else 0.02
                    torch.nn.init.normal_(p, mean=0.0, std=std)

        def forward(self, idx, targets=None):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for blk in self.h:
                x = blk(x)
            logits = self.lm_head(self.ln_f(x))
            if targets is None:
                return logits
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


def cuda_available() -> bool:
    """Whether PyTorch is importable and sees a GPU."""
    if not available():
        return False
    import torch  # optional: only the baseline needs it

    return torch.cuda.is_available()


def make_stepper(
    s: Shape = Shape(), threads: int = 0, seed: int = 0, device: str = 'cpu', compiled: bool = False
) -> Stepper:
    """The baseline's train step (forward, backward, clip to 1.0, AdamW lr 1e-3, beta2 0.99,
    weight decay 0.1), timed as ours is: `step()` returns only once the update is done. On
    device 'cuda': float32 weights and AdamW (fused), bfloat16 autocast (nanoGPT's GPU recipe);
    `compiled`: the model under `torch.compile`."""
    import contextlib

    import torch  # optional: only the baseline needs it

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = build(torch, s).to(device)
    gpu = device != 'cpu'
    opt = torch.optim.AdamW(
        model.parameters(),
        lr=1e-3,
        betas=(0.9, 0.99),
        weight_decay=0.1,
        **({'fused': True} if gpu else {}),
    )
    x = torch.randint(0, s.vocab, (s.batch, s.block), device=device)
    y = torch.randint(0, s.vocab, (s.batch, s.block), device=device)
    forward = torch.compile(model) if compiled else model

    def step() -> float:
        autocast = torch.autocast('cuda', torch.bfloat16) if gpu else contextlib.nullcontext()
        with autocast:
            loss = forward(x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss.item()  # waits for the step

    n = sum(p.numel() for p in model.parameters())
    # PaLM App. B, as lm.model.accounting: 6N + 12·L·H·Q·T.
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


def nanogpt_lr(step: int, lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """nanoGPT's get_lr: linear warmup over `warmup` steps, then cosine from lr to min_lr."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step > decay_steps:
        return min_lr
    ratio = (step - warmup) / (decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def evaluate(torch, model, tokens: np.ndarray, seq_len: int, batch_size: int) -> float:
    """Mean next-token loss over every target of `tokens`, in the project's protocol: the
    non-overlapping windows of lm.data.corpus.eval_windows (eval_tokens = 0), each scored once."""
    starts = eval_windows(len(tokens), seq_len, 0)
    total, count = 0.0, 0.0
    model.eval()
    with torch.no_grad():
        for batch, weights in eval_batches(tokens, starts, batch_size=batch_size, seq_len=seq_len):
            b = torch.from_numpy(batch.astype(np.int64))
            logits = model(b[:, :-1])
            nll_BT = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1), b[:, 1:].flatten(), reduction='none'
            ).view(b.shape[0], -1)
            total += float((nll_BT * torch.from_numpy(weights)).sum())
            count += float(weights.sum())
    model.train()
    return total / count


def train_to_loss(
    train_tokens: np.ndarray,
    val_tokens: np.ndarray,
    s: Shape,
    *,
    target: float,
    steps: int,
    eval_every: int,
    lr: float,
    min_lr: float,
    warmup: int,
    seed: int = 0,
    eval_batch_size: int = 96,
    threads: int = 0,
) -> list[dict]:
    """Train the baseline with nanoGPT's recipe (AdamW beta2 0.99, weight decay 0.1, clip 1.0,
    nanoGPT's schedule) on lm.data.corpus.train_batch's batches, evaluating the whole validation
    split
    every `eval_every` steps until its loss <= target or `steps` are done. Returns one row per
    evaluation: step, validation loss, seconds since training started (evaluations included)."""
    import torch  # optional: only the baseline needs it

    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)
    model = build(torch, s)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.99), weight_decay=0.1)
    rows = []
    t0 = time.perf_counter()
    for step in range(steps + 1):
        if step % eval_every == 0 or step == steps:
            loss = evaluate(torch, model, val_tokens, s.block, eval_batch_size)
            rows.append({'step': step, 'val_loss': loss, 'seconds': time.perf_counter() - t0})
            if loss <= target or step == steps:
                return rows
        for group in opt.param_groups:
            group['lr'] = nanogpt_lr(step, lr, min_lr, warmup, steps)
        b = torch.from_numpy(
            train_batch(
                train_tokens, seed=seed, step=step, batch_size=s.batch, seq_len=s.block
            ).astype(np.int64)
        )
        loss = model(b[:, :-1].contiguous(), b[:, 1:].contiguous())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    return rows
