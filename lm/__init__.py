"""lm: small decoder-only language models for studying how attention heads are shared.

Each wing (model, data, train, infer, analysis, convert, experiments) has a public face, its
`__init__`, over private modules: entry points (train.py, eval.py, scripts/) import only that;
the modules behind it may change freely.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def public_face(
    package: str, exports: dict[str, tuple[str, ...]]
) -> tuple[list[str], Callable[[str], Any], Callable[[], list[str]]]:
    """(`__all__`, `__getattr__`, `__dir__`) of a wing's `__init__`: the names each private
    module offers (`exports`: module -> names; 'name as alias' offers `name` as `alias`),
    imported on first use (PEP 562), so a script that needs one name does not import the whole
    wing."""
    where = {}
    for module, names in exports.items():
        for entry in names:
            name, _, alias = entry.partition(' as ')
            where[alias or name] = (module, name)

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f'module {package!r} has no attribute {name!r}')
        module, attr = where[name]
        return getattr(importlib.import_module(f'{package}.{module}'), attr)

    def __dir__() -> list[str]:
        return sorted(where)

    return sorted(where), __getattr__, __dir__
