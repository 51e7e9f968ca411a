"""SIGTERM / SIGINT as a flag that long phases check between pieces of work (train steps,
evaluation batches), so a run or a read-only command stops within a piece, not minutes later."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator


class Interrupted(BaseException):
    """A stop signal arrived during a phase that checks `StopRequest.check` (or inside
    `StopRequest.at_once`). Like KeyboardInterrupt it is not an Exception, so that a library's
    `except Exception` (a restore's fallback, a cache read) cannot swallow or misreport it."""

    def __init__(self, signum: int):
        super().__init__(f'stopped by {signal.Signals(signum).name}')
        self.signum = signum


class StopRequest:
    """While active (a context manager), SIGTERM and SIGINT set `signum` instead of killing the
    process; `check` raises `Interrupted` once one has arrived, and `arrived` says so from any
    thread. Nested in another (a sweep's run in its process), it starts with the outer one's
    signal and passes its own on."""

    def __init__(self):
        self.signum = 0
        self._raise = False  # `at_once`: the handler raises instead of only recording
        self.previous: dict = {}
        self._wakeup: tuple[int, int] | None = None  # (read end, write end) of a pipe
        self._previous_fd = -1
        self._woken = 0

    def __enter__(self) -> StopRequest:
        self.previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}
        if outer := self._outer(signal.SIGTERM):
            self.signum = outer.signum
            outer._handed_on()
        # Python runs `_handle` only when the main thread is back in Python; the C handler
        # writes the signal number to the wakeup fd at once, which `arrived` reads.
        read, write = os.pipe()
        os.set_blocking(read, False)
        os.set_blocking(write, False)
        self._wakeup = (read, write)
        self._previous_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        return self

    def __exit__(self, *exc) -> None:
        signal.set_wakeup_fd(self._previous_fd)
        for fd in self._wakeup or ():
            os.close(fd)
        self._wakeup = None
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _outer(self, signum: int) -> StopRequest | None:
        handler = self.previous.get(signum)
        return (
            handler.__self__
            if isinstance(getattr(handler, '__self__', None), StopRequest)
            else None
        )

    def _handed_on(self) -> None:
        """An inner StopRequest starts: it acts on the signal from here on."""

    def arrived(self) -> bool:
        """True once SIGTERM or SIGINT has arrived; callable from any thread, also while the main
        thread is blocked in native code (a jitted loop calling back to the host)."""
        if self.signum or self._woken:
            return True
        try:
            data = os.read(self._wakeup[0], 64) if self._wakeup else b''
        except BlockingIOError:
            data = b''
        self._woken = next((b for b in data if b in (signal.SIGTERM, signal.SIGINT)), 0)
        return bool(self._woken)

    def _handle(self, signum, frame, passed_on: bool = False) -> None:
        """Records `signum` here and in the outer StopRequest; raises where this one is the
        handler that received it and raises at once (`at_once`), never for an inner one."""
        self.signum = signum
        if outer := self._outer(signum):
            outer._handle(signum, frame, passed_on=True)
        if self._raise and not passed_on:
            raise Interrupted(signum)

    @contextlib.contextmanager
    def at_once(self) -> Iterator[None]:
        """Within it, a stop signal raises `Interrupted` in the main thread as soon as Python
        runs again (for phases that write nothing and have no natural place to check)."""
        self.check()
        self._raise = True
        try:
            yield
        finally:
            self._raise = False

    def check(self) -> None:
        """Raises `Interrupted` when a stop signal has arrived."""
        if self.signum:
            raise Interrupted(self.signum)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT that `EntryPointStop` raised (a KeyboardInterrupt, as Python's own
    Ctrl-C, with the signal)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class EntryPointStop(StopRequest):
    """An entry point's outermost StopRequest: a signal no phase listens for (start-up,
    compiling) raises `Stopped` at once, so that `with` blocks unwind (SIGTERM's default handler
    killed the process silently); and it is recorded, so a phase that starts later (a restore,
    the training loop, an evaluation) starts with it and stops at its first check, even when
    the exception was raised where Python drops it (a garbage-collector callback). Dropped
    and with no such phase to follow (a model being built), the process ends by the signal's
    default action `DEFAULT_AFTER_S` later, as it would have without this handler; a second
    signal ends it at once."""

    DEFAULT_AFTER_S = 5.0

    def __enter__(self) -> EntryPointStop:
        super().__enter__()
        self._alarm = signal.signal(signal.SIGALRM, self._default_action)
        return self

    def __exit__(self, *exc) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, self._alarm)
        super().__exit__(*exc)

    def _handle(self, signum, frame, passed_on: bool = False) -> None:
        again = bool(self.signum)
        super()._handle(signum, frame, passed_on)
        if passed_on:
            return
        if again:
            self._default_action()
        signal.setitimer(signal.ITIMER_REAL, self.DEFAULT_AFTER_S)
        raise Stopped(signum)

    def _handed_on(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)

    def _default_action(self, *_) -> None:
        """Ends the process by the recorded signal's default action (SIGTERM's, SIGINT's)."""
        signal.signal(self.signum, signal.SIG_DFL)
        os.kill(os.getpid(), self.signum)


@contextlib.contextmanager
def deferred_stop() -> Iterator[StopRequest]:
    """SIGTERM / SIGINT recorded, not raised, while the block runs, then `Interrupted` at its end
    (or at the block's own `check`): for reads through libraries that wrap an exception raised
    in their waits into an `Exception` (orbax and TensorStore report a KeyboardInterrupt during a
    restore as an unreadable checkpoint). Outside the main thread, no signal is received."""
    stop = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return
    with stop:
        try:
            yield stop
        finally:
            stop.check()
