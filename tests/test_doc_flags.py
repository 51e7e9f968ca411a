"""Every study command (its bash blocks and its answer table's whole commands), every reference
command marked `ci: flags` (benchmarks, multi-host, long experiments; tests/doc_commands.py) and
every example in an entry point's docstring (what its --help shows) parses its flags: each
`python` command's flags are parsed by its own parser, so an unknown flag, a bad value or a
config key that does not exist fails, and nothing runs; and the repository files a study's
commands name exist.

bash runs each command as written (variables, loops, `&&`, `taskset`) with a stand-in `python`
first on PATH that records each invocation; tests/flag_parse.py then parses all of them in one
Python that has imported `lm` once, each in a forked child, instead of ~60 fresh interpreters
(`--help`, which the plan appends, would hide an unknown flag: absl exits at `--help` first)."""

import ast
import re

import pytest
from conftest import ROOT
from doc_commands import (
    REFERENCE,
    STUDIES,
    answer_commands,
    bash,
    doc_commands,
    scaled,
    scratch,
    walk,
)
from flag_parse import PARSED, in_one_python

GPU_SCRIPT = ROOT / 'scripts' / 'bench_gpu.sh'
# `python` for bash: records "$PWD", then the arguments, NUL-separated, in a file of its own
RECORDER = '#!/usr/bin/env bash\nprintf \'%s\\0\' "$PWD" "$@" > "$(mktemp "$CALLS/call.XXXXXX")"\n'


def recording(tmp_path, env: dict, name: str) -> dict:
    """`env` with a recorder named `name` (`python`, `python3`) first on PATH."""
    recorder = tmp_path / 'recorder'
    recorder.mkdir()
    (recorder / name).write_text(RECORDER)
    (recorder / name).chmod(0o755)
    return {**env, 'PATH': f'{recorder}:{env["PATH"]}'}


def invocations(command: str, tmp_path, env, index: int) -> list[dict]:
    """The python invocations (cwd, argv) bash makes running `command`."""
    calls = tmp_path / 'calls' / str(index)
    calls.mkdir(parents=True)
    out = bash(command, tmp_path, {**env, 'CALLS': str(calls)})
    assert out.returncode == 0, out.stderr[-2000:]
    found = []
    for path in sorted(calls.iterdir()):
        cwd, *argv = path.read_bytes().decode().split('\0')[:-1]
        found.append({'cwd': cwd, 'argv': argv})
    assert found, 'no python command ran'
    return found


def docstring_commands(path) -> list[str]:
    """The `python ...` example commands of an entry point's docstring, continuation lines
    joined, trailing comments dropped."""
    commands, lines = [], (ast.get_docstring(ast.parse(path.read_text())) or '').splitlines()
    for i, line in enumerate(lines):
        if not line.lstrip().startswith('python '):
            continue
        command = line.strip()
        while command.endswith('\\') and i + 1 < len(lines):
            i += 1
            command = command[:-1] + ' ' + lines[i].strip()
        commands.append(re.sub(r'\s+#.*$', '', command))
    return commands


@pytest.mark.slow
def test_every_doc_flag_parses(tmp_path):
    """The docs' commands marked `ci: flags`, and the examples each entry point's --help shows
    (its docstring)."""
    env = scratch(tmp_path)
    record_env = recording(tmp_path, env, 'python')
    labels, calls = [], []

    def record(label: str, command: str) -> None:
        found = invocations(command, tmp_path, record_env, len(labels))
        labels.extend([label] * len(found))
        calls.extend(found)

    for doc, command, action, shell_vars in [*walk(REFERENCE), *walk(STUDIES, study=True)]:
        if action.kind == 'flags':
            record(f'{doc}: {command}', shell_vars + scaled(command, action))
    for doc in STUDIES:  # the whole commands of its answer table's 'reproduce' column
        for command in answer_commands((ROOT / doc).read_text()):
            record(f'{doc} (answer table): {command}', command)
    for path in sorted([ROOT / 'train.py', ROOT / 'eval.py', *(ROOT / 'scripts').glob('*.py')]):
        for command in docstring_commands(path):
            record(f'{path.name} (docstring): {command}', command)
    # the check itself: a flag no entry point defines fails, even before a --help
    canary = {'cwd': str(tmp_path), 'argv': ['train.py', '--no_such_flag=1', '--help']}
    refused, *results = in_one_python([canary, *calls], tmp_path, env)
    assert refused['code'] == 1 and "Unknown command line flag 'no_such_flag'" in refused['out']
    failed = [
        f'{label}\n{call["argv"]}\n{result["out"][-1000:]}'
        for label, call, result in zip(labels, calls, results, strict=True)
        if result['code'] != 0 or PARSED not in result['out']
    ]
    assert not failed, '\n\n'.join(failed)


# a repository path in a command: a config (its ':argument' dropped), a script, a doc's file
PATH = re.compile(r'(?<![\w/.$-])((?:configs|scripts|docs)/[\w./${}-]+)')


def test_the_files_study_commands_name_exist():
    """A study's CSVs, figures, configs and scripts are committed: every repository path its
    commands name (inputs and the outputs they made) exists, so a moved file fails here."""
    missing = []
    for doc in STUDIES:
        text = (ROOT / doc).read_text()
        for command in [c for c, _ in doc_commands(text)] + answer_commands(text):
            for path in PATH.findall(command):
                if '$' not in path and not (ROOT / path.split(':')[0]).exists():
                    missing.append(f'{doc}: {path}')
    assert not missing, missing


@pytest.mark.slow
def test_every_gpu_script_command_parses(tmp_path):
    """scripts/bench_gpu.sh runs only where a GPU is lent, minutes at a time, so a bad flag there
    costs a session's device time: each of its parts, run here with a recording `python3`, makes
    python commands whose flags parse (as above) and pytest commands whose test files exist."""
    env = scratch(tmp_path)
    record_env = recording(tmp_path, env, 'python3')
    usage = re.search(r"usage='usage: bench_gpu.sh ([\w|]+) OUT_DIR'", GPU_SCRIPT.read_text())
    labels, calls, tests = [], [], []
    for i, part in enumerate(usage.group(1).split('|')):
        command = f'bash scripts/bench_gpu.sh {part} {tmp_path}/out_{part}'
        for call in invocations(command, tmp_path, record_env, i):
            if call['argv'][:2] == ['-m', 'pytest']:
                tests += [a.split('::')[0] for a in call['argv'] if a.startswith('tests/')]
            elif call['argv'][0] != '-c':  # the environment lines
                labels.append(part)
                calls.append(call)
    assert calls and tests
    assert not [t for t in tests if not (ROOT / t).exists()]
    for label, call, result in zip(labels, calls, in_one_python(calls, tmp_path, env), strict=True):
        assert result['code'] == 0 and PARSED in result['out'], (
            f'bench_gpu.sh {label}\n{call["argv"]}\n{result["out"][-3000:]}'
        )
