"""The README's quickstart as written: a real run, compiled as users' runs are (its own file, so
it runs beside the reference pages' command chain, not after it)."""

import os
import re
import subprocess
import sys

import pytest
from conftest import ROOT, USER_XLA_FLAGS
from doc_commands import doc_commands


@pytest.mark.slow
def test_quickstart_perplexities_are_in_the_readme_ranges(tmp_path):
    """The README's quickstart, as written (its workdir and caches moved under tmp_path): the
    step-0 and final eval perplexities fall in the ranges the README states."""
    readme = ' '.join((ROOT / 'README.md').read_text().split())
    found = re.search(
        r'falling from (\d+)–(\d+) at step 0 .*? to (\d+\.\d+)–(\d+\.\d+) at step (\d+)', readme
    )
    assert found, 'README: the quickstart perplexity sentence moved'
    lo0, hi0, lo, hi, steps = (float(g) for g in found.groups())
    commands = doc_commands((ROOT / 'README.md').read_text())
    (command,) = [c for c, _ in commands if 'configs/quickstart.py' in c]
    command = command.replace('runs/quickstart', str(tmp_path / 'run'))
    command += f' --config.data.cache_dir={tmp_path / "cache"} --config.compilation_cache_dir='
    out = subprocess.run(
        [sys.executable, *command.split()[1:]],
        cwd=ROOT,
        env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': USER_XLA_FLAGS},
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    evals = dict(re.findall(r'eval at step (\d+): .*?perplexity ([\d.]+)', out.stderr))
    assert lo0 <= float(evals['0']) <= hi0, evals
    assert lo <= float(evals[str(int(steps))]) <= hi, evals
