"""The loss-spike guard (`config.train.max_loss_ratio`): stop a diverging run while its last
checkpoint is still a good one, and keep that checkpoint."""

from __future__ import annotations

import collections

import numpy as np

from lm.train.checkpoint import Checkpointer

WINDOW = 100  # the running median is over the last WINDOW steps' training losses
MIN_STEPS = 10  # ...and is only trusted once it holds this many (after a start or a resume)


class LossSpikeGuard:
    """`observe(step, loss)` raises FloatingPointError when `loss` exceeds `max_ratio` times the
    median of the previous losses (up to WINDOW of them, at least MIN_STEPS), after pinning the
    newest checkpoint (saved before the spike: checkpoints are written only after every loss up
    to their step has been observed) so that no later save rotates it away. 0 = off."""

    def __init__(self, max_ratio: float, ckpt: Checkpointer):
        self.max_ratio, self.ckpt = max_ratio, ckpt
        self.losses: collections.deque[float] = collections.deque(maxlen=WINDOW)

    def observe(self, step: int, loss: float) -> None:
        if not self.max_ratio:
            return
        if len(self.losses) >= MIN_STEPS:
            median = float(np.median(self.losses))
            if loss > self.max_ratio * median:
                self._stop(step, loss, median)
        self.losses.append(loss)

    def _stop(self, step: int, loss: float, median: float) -> None:
        spike = (
            f'loss spike at step {step}: loss {loss:.4f} > config.train.max_loss_ratio='
            f'{self.max_ratio:g} x {median:.4f} (median of the last {len(self.losses)} steps)'
        )
        before = [s for s in self.ckpt.steps() if s < step]
        if not before:
            raise FloatingPointError(f'{spike}; stopping; no checkpoint precedes it')
        self.ckpt.pin(before[-1], spike)
        raise FloatingPointError(
            f'{spike}; stopping without saving; checkpoint {before[-1]} (the last before the '
            f'spike) is kept in {self.ckpt.directory}'
        )
