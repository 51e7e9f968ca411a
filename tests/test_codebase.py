"""Structure rules of lm/ that keep it easy to extend (see lm/model/attention.py and DEVGUIDE)."""

import ast
import re

import pytest
from conftest import ROOT

MODULES = sorted((ROOT / 'lm').rglob('*.py'))


@pytest.mark.parametrize('path', MODULES, ids=lambda p: p.relative_to(ROOT / 'lm').as_posix())
def test_functions_fit_on_a_screen(path):
    tree = ast.parse(path.read_text())
    long = [
        (node.name, node.end_lineno - node.lineno + 1)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.end_lineno - node.lineno + 1 > 60
    ]
    assert not long, long


# attention.py, variant.py, gqa.py and mla.py define the variants and their contract (names,
# examples).
# hf_mapping.py is the variants' own Hugging Face mappings (Llama <-> MHA/GQA/MQA, DeepseekV3 <->
# MLA), which the variants hold: the file format itself is tied to the variant, so it names them.
# convert/__init__.py names its private module mla.py (the MHA -> MLA conversion's maths).
NAMING_ALLOWED = (
    'convert/__init__.py',
    'model/attention.py',
    'model/variant.py',
    'model/gqa.py',
    'model/mla.py',
    'model/hf_mapping.py',
)


def test_only_lm_attention_names_variants():
    """Everything else asks the variant class (lm.model.attention.variant(cfg)) what it can do."""
    names = re.compile(r"""['"](mha|gqa|mqa|mla)\d*['"]""")
    offenders = [
        f'{path.relative_to(ROOT)}:{i}: {line.strip()}'
        for path in MODULES
        if path.relative_to(ROOT / 'lm').as_posix() not in NAMING_ALLOWED
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if names.search(line)
    ]
    assert not offenders, offenders


PYTHON_FILES = sorted(
    [*MODULES, *(ROOT / 'scripts').glob('*.py'), *(ROOT / 'configs').rglob('*.py')]
    + [ROOT / 'train.py', ROOT / 'eval.py']
)


def test_docstrings_keep_their_line_continuations():
    """`--help` prints an entry point's docstring: a shell example continued with a backslash
    must keep its line breaks (a raw docstring), not collapse into one line of spaces."""
    collapsed = []
    for path in PYTHON_FILES:
        source = path.read_text()
        for node in ast.walk(ast.parse(source)):
            body = getattr(node, 'body', None)
            if not (isinstance(body, list) and body and isinstance(body[0], ast.Expr)):
                continue
            doc = body[0].value
            if isinstance(doc, ast.Constant) and isinstance(doc.value, str):
                # the literal spans end_lineno - lineno line breaks of the source
                if doc.end_lineno - doc.lineno != doc.value.count('\n'):
                    collapsed.append(f'{path.relative_to(ROOT)}:{doc.lineno}')
    assert not collapsed, collapsed
