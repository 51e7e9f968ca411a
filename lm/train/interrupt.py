"""SIGTERM / SIGINT as a flag that long phases check between pieces of work (train steps,
evaluation batches), so a run or a read-only command stops within a piece, not minutes later."""

from __future__ import annotations

import signal


class Interrupted(Exception):
    """A stop signal arrived during a phase that checks `StopRequest.check`."""

    def __init__(self, signum: int):
        super().__init__(f'stopped by {signal.Signals(signum).name}')
        self.signum = signum


class StopRequest:
    """While active (a context manager), SIGTERM and SIGINT set `signum` instead of killing the
    process; `check` raises `Interrupted` once one has arrived. Nested in another (a sweep's
    run in its process), it starts with the outer one's signal and passes its own on."""

    def __init__(self):
        self.signum = 0
        self.previous: dict = {}

    def __enter__(self) -> StopRequest:
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        if outer := self._outer(signal.SIGTERM):
            self.signum = outer.signum
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _outer(self, signum: int) -> StopRequest | None:
        handler = self.previous.get(signum)
        return (
            handler.__self__
            if isinstance(getattr(handler, '__self__', None), StopRequest)
            else None
        )

    def _handle(self, signum, frame) -> None:
        self.signum = signum
        if outer := self._outer(signum):
            outer._handle(signum, frame)

    def check(self) -> None:
        """Raises `Interrupted` when a stop signal has arrived."""
        if self.signum:
            raise Interrupted(self.signum)
