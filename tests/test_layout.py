"""The package shows the architecture: wings with one job each, imports flowing one way, and a
README Layout table that names every wing, top-level module and entry point."""

import ast
import importlib
import re
import subprocess
import sys

import pytest
from conftest import ROOT

LM = ROOT / 'lm'
# Rank of each wing and top-level module: a module imports only from ranks below its own, and
# from its own wing. Foundation modules (migration, config files, mesh) sit under the wings that
# use them, in that order.
RANKS = {
    'config_migration': 0,
    'config': 1,
    'sharding': 2,
    'model': 1,
    'data': 1,
    'train': 3,
    'infer': 3,
    'analysis': 4,
    'convert': 5,
    'experiments': 6,
    'distributed': 7,
    'cli_flags': 7,
    'cli': 8,
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
            if node.module == 'lm':  # a wing or module, not lm's own `public_face`
                found |= {f'lm.{a.name}' for a in node.names if a.name in RANKS}
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


ENTRY_POINTS = [ROOT / 'train.py', ROOT / 'eval.py', *sorted((ROOT / 'scripts').glob('*.py'))]


def _face(wing: str) -> set[str]:
    """The names lm/<wing>/__init__.py offers (its `__all__`; the modules load on first use)."""
    return set(importlib.import_module(f'lm.{wing}').__all__)


def _private_uses(path) -> list[str]:
    """What `path` takes from lm other than a top-level module or a name of a wing's face: a
    wing's private module (`lm.train.run`), a name its face does not offer, or such a name read
    through the wing (`from lm import train` ... `train.run`)."""
    tree = ast.parse(path.read_text())
    bad, bound = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split('.')[0] == 'lm']
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split('.')
            if parts[0] != 'lm':
                continue
            if len(parts) == 1:
                bound |= {a.asname or a.name: a.name for a in node.names if a.name in WINGS}
                bad += [f'lm.{a.name}' for a in node.names if a.name not in RANKS]
            elif len(parts) > 2 or parts[1] not in WINGS:
                bad += [] if node.module in {f'lm.{m}' for m in TOP_MODULES} else [node.module]
            else:
                face = _face(parts[1])
                bad += [f'{node.module}.{a.name}' for a in node.names if a.name not in face]
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            wing = bound.get(node.value.id)
            if wing and node.attr not in _face(wing):
                bad.append(f'lm.{wing}.{node.attr}')
    return bad


@pytest.mark.parametrize('path', ENTRY_POINTS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_entry_points_import_only_public_faces(path):
    """An entry point takes from a wing only what its `__init__` offers, never a private module,
    so the modules behind a face can change without touching a script."""
    bad = _private_uses(path)
    assert not bad, f'{path.relative_to(ROOT)} reaches past a public face: {sorted(set(bad))}'


@pytest.mark.parametrize('wing', WINGS)
def test_public_faces_resolve(wing):
    """Every name a face offers exists, and none is shadowed by a module of the same name."""
    module = importlib.import_module(f'lm.{wing}')
    modules = {p.stem for p in (LM / wing).glob('*.py')}
    assert module.__all__ and not set(module.__all__) & modules, set(module.__all__) & modules
    for name in module.__all__:
        assert getattr(module, name) is not None, name


def test_faces_import_a_module_on_first_use():
    """A name from a face imports its own module only: a script that needs `StopRequest` does
    not wait for the whole train wing (the run assembly, orbax, optax) to import."""
    code = (
        'import sys; from lm.train import StopRequest; from lm import experiments; '
        "print(*sorted(m for m in sys.modules if m.startswith('lm.')))"
    )
    done = subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ['lm.experiments', 'lm.train', 'lm.train.interrupt']


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


# The reference page of each wing (docs/): its opening names every module of the wing.
WING_PAGES = {
    'model': 'model.md',
    'data': 'data.md',
    'train': 'train.md',
    'infer': 'decoding.md',
    'convert': 'convert.md',
    'analysis': 'analysis.md',
    'experiments': 'experiments.md',
}


def test_each_wings_page_names_its_modules():
    assert set(WING_PAGES) == set(WINGS), 'every wing has a reference page here'
    for wing, page in WING_PAGES.items():
        text = (ROOT / 'docs' / page).read_text()
        named = set(re.findall(r'`(\w+)', text)) | set(re.findall(r'(\w+)\.py\b', text))
        modules = {p.stem for p in (ROOT / 'lm' / wing).glob('*.py') if p.stem != '__init__'}
        assert not modules - named, f'docs/{page} lacks lm/{wing}/ {sorted(modules - named)}'
