"""The README's Python snippets run as written."""

import os
import re

import pytest
from conftest import ROOT


def python_blocks():
    text = (ROOT / 'README.md').read_text()
    return re.findall(r'```python\n(.*?)```', text, flags=re.S)


@pytest.mark.slow
def test_readme_python_snippets_run(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    blocks = python_blocks()
    assert blocks, 'README has no python snippet'
    for block in blocks:
        exec(compile(block, os.fspath(ROOT / 'README.md'), 'exec'), {})
    out = capsys.readouterr().out
    for attention in ('mha', 'gqa', 'mqa', 'mla'):
        assert re.search(rf'^{attention} \(2, 16, 256\) \d+ \d+$', out, flags=re.M), out
