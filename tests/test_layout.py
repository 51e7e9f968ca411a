"""The package shows the architecture: wings with one job each, imports flowing one way, and a
README Layout table that names every wing, top-level module and entry point."""

import ast
import re

import pytest
from conftest import ROOT

LM = ROOT / 'lm'
# Rank of each wing and top-level module: a module imports only from ranks at or below its own,
# and from its own wing. Foundation modules (config files, migration, mesh) sit under everything.
RANKS = {
    'config': 0,
    'config_migration': 0,
    'sharding': 0,
    'model': 1,
    'data': 1,
    'train': 2,
    'infer': 2,
    'analysis': 3,
    'convert': 4,
    'experiments': 5,
    'cli': 6,
}
WINGS = sorted(p.name for p in LM.iterdir() if (p / '__init__.py').exists())
TOP_MODULES = sorted(p.stem for p in LM.glob('*.py') if p.name != '__init__.py')


def _unit(module: str) -> str | None:
    """'lm.model.gqa' -> 'model'; 'lm.config' -> 'config'; 'lm' -> None."""
    parts = module.split('.')
    return parts[1] if parts[0] == 'lm' and len(parts) > 1 else None


def _imports(path) -> set[str]:
    """Every lm module `path` imports ('from lm import x' counts as lm.x)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split('.')[0] == 'lm'}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == 'lm':
                found |= {f'lm.{a.name}' for a in node.names}
            elif node.module.split('.')[0] == 'lm':
                found.add(node.module)
    return found


def test_wings_and_a_small_top_level():
    assert len(WINGS) >= 5, WINGS
    assert len(TOP_MODULES) <= 8, TOP_MODULES
    assert set(WINGS) | set(TOP_MODULES) == set(RANKS), 'every wing and module has a rank here'
    for wing in WINGS:
        doc = ast.get_docstring(ast.parse((LM / wing / '__init__.py').read_text()))
        assert doc and len(doc) > 40, f'lm/{wing}/__init__.py needs a docstring saying its job'


@pytest.mark.parametrize('path', sorted(LM.rglob('*.py')), ids=lambda p: str(p.relative_to(LM)))
def test_imports_flow_one_way(path):
    rel = path.relative_to(LM)
    own = rel.parts[0] if len(rel.parts) > 1 else rel.stem
    if own == '__init__.py':
        return
    upward = [
        m
        for m in _imports(path)
        if (unit := _unit(m)) and unit != own and RANKS[unit] >= RANKS[own]
    ]
    assert not upward, f'lm/{rel} (rank {RANKS[own]}) imports {upward}'


def test_model_imports_no_other_wing():
    for path in (LM / 'model').rglob('*.py'):
        others = {m for m in _imports(path) if _unit(m) not in (None, 'model')}
        assert not others, f'{path.relative_to(ROOT)} imports {others}'


def test_entry_points_import_lm_only():
    entry = [ROOT / 'train.py', ROOT / 'eval.py', *sorted((ROOT / 'scripts').glob('*.py'))]
    names = {p.stem for p in entry} | {'scripts'}
    for path in entry:
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            bad = [m for m in mods if m.split('.')[0] in names]
            assert not bad, f'{path.relative_to(ROOT)} imports entry point(s) {bad}'


def test_readme_layout_table_names_everything():
    readme = (ROOT / 'README.md').read_text()
    section = readme.split('## Layout', 1)[1].split('\n## ', 1)[0]
    rows = {m.group(1) for m in re.finditer(r'^\| `([^`]+)`', section, re.M)}
    wanted = {f'lm/{w}/' for w in WINGS} | {f'lm/{m}.py' for m in TOP_MODULES}
    wanted |= {'train.py', 'eval.py', 'configs/', 'tests/'}
    wanted |= {f'scripts/{p.name}' for p in (ROOT / 'scripts').iterdir() if p.is_file()}
    assert not wanted - rows, f'README Layout table lacks {sorted(wanted - rows)}'
    assert not rows - wanted, f'README Layout table names what does not exist: {rows - wanted}'


def test_readme_layout_row_of_each_wing_names_its_modules():
    readme = (ROOT / 'README.md').read_text()
    for wing in WINGS:
        (row,) = re.findall(rf'^\| `lm/{wing}/` \|(.*)$', readme, re.M)
        named = set(re.findall(r'`(\w+)`', row))
        modules = {p.stem for p in (ROOT / 'lm' / wing).glob('*.py') if p.stem != '__init__'}
        assert not modules - named, f'README row of lm/{wing}/ lacks {sorted(modules - named)}'
