"""Every docstring example (``>>>``) in the installed package runs here, one test per module, so a
failure names the module and no module's examples can rot unseen.

The walk covers ``cosmos3_gym`` and the subpackages pyproject.toml's package-dir maps from
top-level folders (``envs``, ``eval``, ``bench``, ``train``): an editable install does not put
those under ``cosmos3_gym/``, so they are walked from their own paths. A module whose import
needs an optional package that is absent (LIBERO, Meta-World, LeRobot, ...) is skipped with the
package's name; any other import error fails.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import inspect
import pkgutil
from pathlib import Path

import pytest

import cosmos3_gym

ROOT = Path(__file__).resolve().parent.parent
# pyproject.toml's package-dir: top-level folders installed as subpackages of cosmos3_gym.
MAPPED = ("envs", "eval", "bench", "train")


def walk() -> list[str]:
    """The dotted names of every module the package installs. A package whose import fails (an
    optional dependency) is walked from its folder all the same, so its modules each get a test
    that says why they are skipped."""
    names = {"cosmos3_gym"}

    def walk_into(prefix: str, path: list[str]) -> None:
        def unimportable(name: str) -> None:
            walk_into(name, importlib.util.find_spec(name).submodule_search_locations)

        names.update(info.name for info in
                     pkgutil.walk_packages(path, f"{prefix}.", onerror=unimportable))

    walk_into("cosmos3_gym", cosmos3_gym.__path__)
    for sub in MAPPED:
        package = importlib.import_module(f"cosmos3_gym.{sub}")
        names.add(package.__name__)
        walk_into(package.__name__, package.__path__)
    return sorted(names)


MODULES = walk()


def import_or_skip(name: str):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        missing = (err.name or "").partition(".")[0]
        if not missing or missing == "cosmos3_gym":
            raise
        pytest.skip(f"{name} imports {err.name}, an optional package that is not installed")


def test_the_walk_finds_every_module_pyproject_installs() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    folders = setuptools["package-dir"]
    expected = set()
    for package in setuptools["packages"]:
        mapped = max((p for p in folders if package == p or package.startswith(f"{p}.")), key=len)
        folder = ROOT / folders[mapped] / package[len(mapped):].lstrip(".").replace(".", "/")
        expected.add(package)
        expected.update(f"{package}.{path.stem}" for path in folder.glob("*.py")
                        if path.stem != "__init__")
    assert set(MODULES) == expected


# Every module's examples run in well under a second, so none is marked slow; the longest test,
# cosmos3_gym.bench.diffusers_reference, is diffusers' import (test_model.py pays it anyway).
@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_hold(name: str) -> None:
    module = import_or_skip(name)
    examples = doctest.DocTestFinder().find(module)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    for example in examples:
        runner.run(example)  # a failure is printed: pytest shows it under the test's output
    assert runner.failures == 0, f"{runner.failures} of {name}'s examples failed (printed above)"
    if ">>>" in inspect.getsource(module):  # examples where doctest cannot see them never run
        assert any(e.examples for e in examples), f"{name} shows examples doctest does not find"
