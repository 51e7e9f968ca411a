"""The shell commands of the docs, and how tests/test_doc_commands.py and test_doc_flags.py run
them. Each command's test scaling is written beside it in the doc, so a doc edit is never a test
edit.

A command is a line of a ```bash block (continuation lines joined, runs of spaces made one; a
multi-line `for` loop is one command). Its trailing comment may end in `ci: DIRECTIVES`
(`python eval.py --step=200  # the train split; ci: --step=20 --eval_tokens=256`):

- nothing: a reference page's command runs, scaled down: every `python train.py --config` and
  `python scripts/sweep.py --config` line gets `TINY` (a 1-layer model of width 32, 40 steps,
  checkpoints and evaluations every 20);
- `OLD=>NEW`: a substitution in the command, then any `--flag=value` words appended (an
  appended flag repeats one the command sets: the last one wins); `{NAME}` stands for
  `SCALINGS[NAME]`, in either;
- `flags`: only its flags are parsed (benchmarks, multi-host, hours-long runs), nothing runs;
- `skip WHY`: not run at all (a TPU pod, a GPU).

Commands that install (`pip`), serve (`tensorboard`) or are the suite (`pytest`) never run.
A line that only sets a shell variable (`COMMON=...`) is kept for its document's later
commands.

Reference pages (README.md and docs/*.md) are one chain (`REFERENCE`, in that order): their
commands run in one scratch directory, each once (a command repeated on a later page runs once),
so later ones read what earlier ones wrote (train, then eval, uptrain, analysis, export).
Studies (docs/studies/*/*.md: reports, records, statements) are only flag-checked, whatever
their comments say: each `python` invocation parses its flags, and the repository files each
command names exist.
Data: `data/tinyshakespeare.txt` and `prompts.txt` are texts the tests write (no network).
"""

import dataclasses
import os
import re
import shlex
import shutil
import subprocess
import sys

from conftest import ENV, ROOT, stdlib_text
from fork_server import ForkServer

REFERENCE = ['README.md'] + sorted(f'docs/{p.name}' for p in (ROOT / 'docs').glob('*.md'))
STUDIES = sorted(str(p.relative_to(ROOT)) for p in (ROOT / 'docs' / 'studies').glob('*/*.md'))
ANSWER_HEADER = '| question | result | date | reproduce |'  # a study's answer table
TINY = (
    '--config.model.d_model=32 --config.model.num_layers=1 --config.data.seq_len=16 '
    '--config.train.steps=40 --config.eval_every=20 --config.log_every=20 '
    '--config.checkpoint_every=20 --config.eval_tokens=64 --config.train.warmup_steps=2 '
    '--config.data.cache_dir=cache --config.compilation_cache_dir=xla'
)
# MQAR at TINY's seq_len (4 x pairs <= 16) with a small held-out set; passkey examples need
# >= 102 bytes, so its rows stay longer
MQAR_EVAL = '--config.data.recall_eval_examples=64 --config.eval_batch_size=32'
SCALINGS = {
    'TEXT': '--config.data.source=text --config.data.path=data/tinyshakespeare.txt',
    'FIXTURE': str(ROOT / 'tests' / 'fixtures' / 'hf' / 'llama_mha'),  # 4 heads, 2 layers
    'SMALL_ANALYSIS': '--batch=4 --max_batches=2 --num_random=4',
    'MQAR': f'--config.data.recall_pairs=2 --config.train.batch_size=32 {MQAR_EVAL}',
    'PASSKEY': (
        '--config.data.seq_len=128 --config.data.passkey_lengths=102,129 '
        '--config.data.recall_eval_examples=20 --config.eval_batch_size=10 '
        '--config.train.batch_size=8'
    ),
}
NEVER_RUN = re.compile(r'^(pip|tensorboard|pytest|python -m (pytest|venv)) ')


@dataclasses.dataclass(frozen=True)
class Action:
    kind: str  # 'run', 'flags' or 'skip'
    subs: tuple[tuple[str, str], ...] = ()
    extra: str = ''


def directive(comment: str) -> Action:
    """The Action of a command's trailing comment (`ci: ...`; none: run as it is)."""
    if 'ci:' not in comment:
        return Action('run')
    words = comment.rsplit('ci:', 1)[1].split()
    if words[:1] in (['flags'], ['skip']):
        return Action(words[0])
    expand = lambda w: re.sub(r'\{(\w+)\}', lambda m: SCALINGS[m.group(1)], w)  # noqa: E731
    subs = tuple(tuple(expand(p) for p in w.split('=>', 1)) for w in words if '=>' in w)
    extra = ' '.join(expand(w) for w in words if '=>' not in w)
    return Action('run', subs, extra)


def doc_commands(text: str) -> list[tuple[str, Action]]:
    """(command, Action) for every command of a document's bash blocks, in order: continuation
    lines joined, comments dropped (a trailing `ci:` one read first), a `for` loop kept whole."""
    out = []
    for block in re.findall(r'```bash\n(.*?)```', text, flags=re.S):
        lines, comments = [], []
        for line in block.replace('\\\n', ' ').splitlines():
            comment = re.search(r'(?:^|\s)#\s(.*)$', line)
            line = line[: comment.start()].strip() if comment else line.strip()
            if line:
                lines.append(' '.join(line.split()))
                comments.append(comment.group(1) if comment else '')
        i = 0
        while i < len(lines):
            loop = lines[i].startswith('for ') and 'done' not in lines[i]
            j = lines.index('done', i) if loop else i
            marked = [c for c in comments[i : j + 1] if 'ci:' in c]
            out.append(('\n'.join(lines[i : j + 1]), directive(marked[-1] if marked else '')))
            i = j + 1
    return out


def answer_commands(text: str) -> list[str]:
    """The whole commands of a study's answer table (its 'reproduce' cells: `python ...`, or an
    entry point's path, which gets `python ` put before it); cells that elide part of a command
    (`…`, 'same') are left out."""
    rows = (
        text.split(ANSWER_HEADER + '\n', 1)[1].split('\n\n', 1)[0] if ANSWER_HEADER in text else ''
    )
    out = []
    for row in rows.splitlines()[1:]:
        for command in re.findall(r'`([^`]+)`', row.rsplit(' | ', 1)[-1]):
            if command.startswith(('train.py', 'eval.py', 'scripts/')):
                command = f'python {command}'
            if command.startswith('python ') and '…' not in command:
                out.append(command)
    return out


def scaled(command: str, action: Action) -> str:
    """The command as the test runs it: substituted and TINY / extra appended ('run'), or each
    python command ended by --help ('flags')."""
    for old, new in action.subs:
        assert old in command, f'ci: {old}=> matches nothing in {command!r}'
        command = command.replace(old, new)
    if action.kind == 'flags':
        parts = re.split(r'(\s*(?:&&|;|&|\n)\s*)', command)
        return ''.join(p + ' --help' if 'python ' in p else p for p in parts)
    lines = []
    for line in command.split('\n'):
        if re.match(r'python (train|scripts/sweep)\.py --config', line):
            line += ' ' + TINY
        lines.append(line)
    return '\n'.join(lines) + (f' {action.extra}' if action.extra else '')


def walk(docs: list[str], study: bool = False):
    """(document, command, Action, shell variables set before it in its document) for every
    command of `docs` that runs or is flag-checked, each command once. In a study every command
    with a `python` invocation is flag-checked and the rest left out."""
    seen = set()
    for doc in docs:
        shell_vars = ''
        for command, action in doc_commands((ROOT / doc).read_text()):
            if study:
                action = Action('flags' if 'python ' in command else 'skip')
            if re.match(r'^[A-Z_][A-Z0-9_]*=', command):  # a variable later lines use
                shell_vars += command + '\n'
                continue
            if action.kind == 'skip' or NEVER_RUN.match(command) or command in seen:
                continue
            seen.add(command)
            yield doc, command, action, shell_vars


def scratch(tmp_path):
    """A directory that looks like the repository to the commands (entry points and scripts
    linked in, configs and docs copied), with `python` on PATH and the data files the commands
    read."""
    for name in ('train.py', 'eval.py', 'scripts'):
        (tmp_path / name).symlink_to(ROOT / name)
    shutil.copytree(ROOT / 'configs', tmp_path / 'configs')  # their '..' paths stay in here
    shutil.copytree(ROOT / 'docs', tmp_path / 'docs')  # study scripts; nothing writes the repo
    (tmp_path / 'bin').mkdir()
    # A script, not a link: a virtualenv's python is that venv only when started by its own
    # path (it finds pyvenv.cfg beside the path it was started by).
    python = tmp_path / 'bin' / 'python'
    python.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} "$@"\n')
    python.chmod(0o755)
    (tmp_path / 'data').mkdir()
    (tmp_path / 'data' / 'tinyshakespeare.txt').write_text(stdlib_text(60_000), encoding='utf-8')
    (tmp_path / 'other.txt').write_text(stdlib_text(20_000), encoding='utf-8')
    (tmp_path / 'prompts.txt').write_text('ROMEO:\nJULIET:\n', encoding='utf-8')
    env = {**ENV, 'PYTHONPATH': str(ROOT), 'RANK': '0'}
    env['PATH'] = f'{tmp_path / "bin"}{os.pathsep}{env["PATH"]}'
    return env


def bash(command: str, cwd, env) -> subprocess.CompletedProcess:
    return subprocess.run(
        ['bash', '-c', command], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def run_chain(tmp_path) -> None:
    """Runs the reference pages' commands in order in a scratch directory; fails on the first
    error. Their `python` runs are children of a fork server (tests/fork_server.py) where they
    can be."""
    env = scratch(tmp_path)
    server = ForkServer(env, tmp_path)
    assert server.start(), 'tests/fork_server.py did not start'
    server.python(tmp_path / 'bin' / 'python')
    try:
        for doc, command, action, shell_vars in walk(REFERENCE):
            if action.kind == 'run':
                out = bash(shell_vars + scaled(command, action), tmp_path, env)
                assert out.returncode == 0, (
                    f'{doc}: {command}\n{out.stdout[-2000:]}{out.stderr[-4000:]}'
                )
    finally:
        server.close()
