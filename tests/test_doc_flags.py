"""Every benchmark, multi-host and long-experiment command of the docs parses its flags
(tests/doc_plan.py's `Flags`): each `python` command runs with `--help`, so absl checks every
flag the docs give, and nothing runs."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from doc_plan import DOCS, Flags, bash, scaled, scratch, walk


@pytest.mark.slow
def test_every_doc_flag_parses(tmp_path):
    env, checks = scratch(tmp_path), {}
    for doc, command, action, shell_vars in walk(DOCS):
        if isinstance(action, Flags):
            checks.setdefault(shell_vars + scaled(command, action), f'{doc}: {command}')
    with ThreadPoolExecutor(2) as pool:
        for command, out in pool.map(lambda c: (c, bash(c, tmp_path, env)), checks):
            assert out.returncode == 0 and 'flags:' in out.stdout, (
                f'{checks[command]}\n{out.stderr[-3000:]}'
            )
