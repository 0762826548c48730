"""Packages whose public names load on first use (PEP 562), so that importing a light part of a
package does not import its heavy parts.

``import cosmos3_gym.runner.folder`` runs ``cosmos3_gym/runner/__init__.py`` first; were that
file to import the episode loop, the run-folder lock (standard library only) would cost torch,
diffusers and transformers, and the command line could not refuse a busy folder at once. Each
package's ``__init__`` therefore names its exports and the submodule each lives in::

    __getattr__, __dir__ = exports(__name__, {"RunFolder": "folder", "EpisodeRunner": "loop"})

and keeps the real imports under ``if TYPE_CHECKING:`` for type checkers and readers.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any


def exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any],
                                                           Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package`` whose public ``names`` live in
    its submodules (``{name: submodule}``, relative to ``package``, or absolute when dotted from
    ``cosmos3_gym``)."""

    def __getattr__(name: str) -> Any:
        where = names.get(name)
        if where is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        module = importlib.import_module(where if where.startswith("cosmos3_gym.")
                                         else f"{package}.{where}")
        return getattr(module, name)

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return __getattr__, __dir__
