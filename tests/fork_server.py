"""Entry-point runs for the tests without a fresh interpreter each (tests/conftest.py's
`run_entry`). One server Python per test worker imports the libraries that the modules of `lm`
import (JAX, Flax, orbax, ...) once; each run is a child it forks, which runs the entry point
as `python SCRIPT ARGS...` would: `__main__`, its sys.argv, its directory on sys.path, the
caller's working directory, stdout and stderr (stdin /dev/null), `lm` imported afresh; an
uncaught exception prints its traceback and exits 1, and the child shuts down as any Python
does (threads joined, atexit handlers run). A run saves most of the ~1.5 s of imports a fresh
Python pays.

The server holds no thread and no JAX backend when it forks (checked), so each child starts its
own backend; it serves runs side by side (a sweep and its runs). `ForkServer.run` serves only runs
whose environment is the server's (libraries read some variables when they are imported):
otherwise, or when the server is gone, it returns None and the caller starts a fresh Python.

A client (`--python`) sends a run to the server with its own stdio and working directory when it
can, and otherwise becomes a fresh Python; a SIGTERM or SIGINT it gets goes on to the run, and it
exits as the run did. The reference pages' command chain (tests/doc_commands.py) puts one on PATH
as `python`, and in each child `sys.executable` is one: the runs an entry point starts itself as
`[sys.executable, script, ...]` (a sweep's runs, say) are served too.

  python tests/fork_server.py SOCKET                      # the server (ForkServer starts it)
  python tests/fork_server.py --python SOCKET ARGS...     # `python ARGS...`, served if it can be
"""

import importlib
import json
import os
import pkgutil
import runpy
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import warnings

READY = b'ready\n'
# What bash adds to the environment of the commands it starts: not a difference that matters.
SHELL_VARS = {'PWD', 'OLDPWD', 'SHLVL', '_'}


def serve(path: str) -> dict:
    """Listens at `path` for runs; returns only in a forked child, with that child's request
    ({'argv': [script or '-m', ...], 'cwd': ...}), its stdio already the caller's."""
    import lm  # noqa: PLC0415  (the client side of this file must not import lm)

    for module in pkgutil.walk_packages(lm.__path__, 'lm.'):
        importlib.import_module(module.name)
    # The libraries lm imports stay imported; lm itself goes, so that each child imports it as a
    # fresh Python does (an import lm forgets fails here too, as it would for a user).
    for name in [n for n in sys.modules if n == 'lm' or n.startswith('lm.')]:
        del sys.modules[name]
    assert threading.active_count() == 1, 'a thread before fork: children could deadlock'
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(8)
    listener.settimeout(0.05)  # how often finished children are reaped
    parent = os.getppid()
    running: dict[int, socket.socket] = {}  # child pid -> its caller's connection
    sys.stdout.buffer.write(READY)
    sys.stdout.flush()
    while True:
        _reap(running)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            if os.getppid() != parent:  # the test worker is gone (killed): so is the server
                sys.exit(0)
            continue
        conn.settimeout(None)
        message, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
        if len(fds) != 3:
            for fd in fds:
                os.close(fd)
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            for other in (listener, conn, *running.values()):
                other.close()
            for target, fd in enumerate(fds):
                os.dup2(fd, target)
                os.close(fd)
            request = json.loads(message)
            os.chdir(request['cwd'])
            sys.executable = path + '.python'  # the runs it starts itself are served too
            return request
        for fd in fds:
            os.close(fd)
        conn.send(str(pid).encode())
        running[pid] = conn


def _reap(running: dict) -> None:
    """Tells the callers of finished children their exit status."""
    while running:
        pid, status = os.waitpid(-1, os.WNOHANG)
        if pid == 0:
            return
        conn = running.pop(pid, None)
        if conn is None:
            continue
        try:
            conn.send(str(os.waitstatus_to_exitcode(status)).encode())
        except OSError:  # the caller gave up (a timeout): nobody to tell
            pass
        conn.close()


def request(
    path: str, argv: list[str], cwd: str, fds: list[int], timeout=None, forward=False
) -> int:
    """Runs `argv` in a child of the server at `path` with stdin, stdout, stderr `fds`; its exit
    status (-N: stopped by signal N). A server that is gone raises ConnectionError; a run past
    `timeout` seconds is killed (subprocess.TimeoutExpired). With `forward` (main thread only),
    a SIGTERM or SIGINT to this process goes on to the run."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
        try:
            conn.connect(path)
            socket.send_fds(conn, [json.dumps({'argv': argv, 'cwd': cwd}).encode()], fds)
            pid = int(conn.recv(64))
        except (OSError, ValueError) as e:
            raise ConnectionError(f'the server at {path} failed ({e})') from e
        if forward:
            for signum in (signal.SIGTERM, signal.SIGINT):
                signal.signal(signum, lambda s, _: os.kill(pid, s))
        conn.settimeout(timeout)
        try:
            return int(conn.recv(64))
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            raise subprocess.TimeoutExpired(argv, timeout) from None


def _environment(env) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in SHELL_VARS}


def as_python(path: str, argv: list[str]) -> None:
    """`python ARGV...` for a shell: a script or `-m` run in the same environment as the
    server's is served with this process's stdio; anything else becomes a fresh Python."""
    with open(path + '.env') as f:
        same = _environment(json.load(f)) == _environment(os.environ)
    if same and argv and (argv[0] == '-m' or argv[0].endswith('.py')):
        try:
            code = request(path, argv, os.getcwd(), [0, 1, 2], forward=True)
        except ConnectionError:
            code = None
        if code is not None and code < 0:  # stopped by a signal: so is this process
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
        if code is not None:
            sys.exit(code)
    os.execv(sys.executable, [sys.executable, *argv])


def run_as_main(argv: list[str]) -> None:
    """`python ARGV...` in this process: a script, or `-m` a module, as `__main__` with its
    sys.argv and (a script) its directory first on sys.path."""
    if argv[0] == '-m':
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name='__main__', alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
        runpy.run_path(argv[0], run_name='__main__')


def main() -> None:
    if sys.argv[1] == '--python':
        as_python(sys.argv[2], sys.argv[3:])
    run_as_main(serve(sys.argv[1])['argv'])


def write_client(where, path: str) -> None:
    """Writes `where`: a `python` that sends its runs to the server at `path` (`as_python`)."""
    client = f'{sys.executable} -S {os.path.abspath(__file__)} --python {path}'
    with open(where, 'w') as f:
        f.write(f'#!/bin/sh\nexec {client} "$@"\n')
    os.chmod(where, 0o755)


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

    def start(self) -> bool:
        """Starts the server unless it runs; whether it runs."""
        with self.lock:
            if self.proc is None and not self.broken:
                self.path = os.path.join(tempfile.mkdtemp(prefix='lm-fork-server-'), 'socket')
                with open(self.path + '.env', 'w') as f:
                    json.dump(self.env, f)
                write_client(self.path + '.python', self.path)  # its children's sys.executable
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
        return self.proc is not None and self.proc.poll() is None

    def python(self, where) -> None:
        """Writes `where`, a `python` for a shell's PATH that this server serves."""
        write_client(where, self.path)

    def _give_up(self, why: str) -> None:
        warnings.warn(f'tests/fork_server.py: {why}; fresh Pythons instead', stacklevel=3)
        self.broken = True
        self.close()

    def run(self, argv: list[str], cwd, env: dict, timeout: float):
        """`subprocess.run([python, *argv], cwd, env, capture_output=True, text=True,
        timeout)`'s CompletedProcess, from a forked child; None when this run is not served."""
        if _environment(env) != _environment(self.env) or not self.start():
            return None
        with (
            tempfile.TemporaryFile() as out,
            tempfile.TemporaryFile() as err,
            open(os.devnull, 'rb') as stdin,
        ):
            try:
                code = request(
                    self.path, argv, str(cwd), [stdin.fileno(), out.fileno(), err.fileno()], timeout
                )
            except ConnectionError as e:
                self._give_up(str(e))
                return None
            out.seek(0)
            err.seek(0)
            args = [sys.executable, *argv]
            return subprocess.CompletedProcess(args, code, _text(out.read()), _text(err.read()))

    def close(self) -> None:
        """Stops the server and removes its folder (the socket, the environment, the client)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None
        if self.path:
            shutil.rmtree(os.path.dirname(self.path), ignore_errors=True)


if __name__ == '__main__':
    main()
