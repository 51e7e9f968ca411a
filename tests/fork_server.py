"""Entry-point runs for the tests without a fresh interpreter each. One server Python per test
worker imports every module of `lm` once; each run is a child it forks, which runs the entry
point as `python SCRIPT ARGS...` would: `__main__`, its sys.argv, its directory on sys.path, the
caller's working directory, stdout and stderr (stdin /dev/null); an uncaught exception prints
its traceback and exits 1, and the child shuts down as any Python does (threads joined, atexit
handlers run). A run saves the ~1.5 s of imports a fresh Python pays (tests/conftest.py's
`run_entry`).

The server holds no thread and no JAX backend when it forks (checked), so each child starts its
own backend. `ForkServer.run` serves only runs whose environment is the server's (libraries read
some variables when they are imported) and one run at a time: otherwise, or when the server is
gone, it returns None and the caller starts a fresh Python.

  python tests/fork_server.py SOCKET   # the server (ForkServer starts it)
"""

import importlib
import json
import os
import pkgutil
import runpy
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings

READY = b'ready\n'


def serve(path: str) -> dict:
    """Listens at `path` for runs; returns only in a forked child, with that child's request
    ({'argv': [script or '-m', ...], 'cwd': ...}), its stdio already the caller's."""
    import lm  # noqa: PLC0415  (the client side of this file must not import lm)

    for module in pkgutil.walk_packages(lm.__path__, 'lm.'):
        importlib.import_module(module.name)
    assert threading.active_count() == 1, 'a thread before fork: children could deadlock'
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(8)
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    while True:
        conn, _ = listener.accept()
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if len(fds) != 3:
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            conn.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            request = json.loads(message)
            os.chdir(request['cwd'])
            return request
        for fd in fds:
            os.close(fd)
        conn.send(str(pid).encode())
        _, status = os.waitpid(pid, 0)
        try:
            conn.send(str(os.waitstatus_to_exitcode(status)).encode())
        except OSError:  # the caller gave up (a timeout): nobody to tell
            pass
        conn.close()


def main() -> None:
    argv = serve(sys.argv[1])['argv']
    if argv[0] == '-m':
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name='__main__')


def _text(data: bytes) -> str:
    """What subprocess's text mode makes of `data`: UTF-8, universal newlines."""
    return data.decode().replace('\r\n', '\n').replace('\r', '\n')


class ForkServer:
    """The client: starts the server on its first run and stops it with `close`."""

    def __init__(self, env: dict[str, str], cwd) -> None:
        self.env, self.cwd = dict(env), str(cwd)
        self.proc: subprocess.Popen | None = None
        self.path = ''
        self.broken = False
        self.lock = threading.Lock()

    def _start(self) -> None:
        self.path = os.path.join(tempfile.mkdtemp(prefix='lm-fork-server-'), 'socket')
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self.path],
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        if self.proc.stdout.readline() != READY:
            self._give_up('it did not start')

    def _give_up(self, why: str) -> None:
        warnings.warn(
            f'tests/fork_server.py: {why}; entry points run in fresh Pythons', stacklevel=3
        )
        self.broken = True
        self.close()

    def run(self, argv: list[str], cwd, env: dict, timeout: float):
        """`subprocess.run(argv[1:] after python, cwd, env, capture_output=True, text=True,
        timeout)`'s CompletedProcess, from a forked child; None when this run is not served."""
        if self.broken or dict(env) != self.env or not self.lock.acquire(blocking=False):
            return None
        try:
            if self.proc is None:
                self._start()
            if self.broken or self.proc.poll() is not None:
                return None
            return self._run(argv, cwd, timeout)
        finally:
            self.lock.release()

    def _run(self, argv: list[str], cwd, timeout: float):
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            open(os.devnull, 'rb') as stdin,
            socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn,
        ):
            try:
                conn.connect(self.path)
                request = json.dumps({'argv': argv, 'cwd': str(cwd)}).encode()
                socket.send_fds(conn, [request], [stdin.fileno(), out.fileno(), err.fileno()])
                pid = int(conn.recv(64))
            except (OSError, ValueError) as e:
                self._give_up(f'the server failed ({e})')
                return None
            conn.settimeout(timeout)
            try:
                code = int(conn.recv(64))
            except TimeoutError:
                os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(argv, timeout) from None
            out.seek(0)
            err.seek(0)
            args = [sys.executable, *argv]
            return subprocess.CompletedProcess(args, code, _text(out.read()), _text(err.read()))

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


if __name__ == '__main__':
    main()
