"""The architecture as the folder tree shows it, checked on the imports: the library (model,
pipeline, policy, runner, envs, integrations) knows nothing of the commands built on it; the
benchmarks know nothing of the evaluator, and training only its measurement; and one loop
(``cosmos3_gym.runner``) drives a policy through vector envs."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Folder in the repository -> the package it installs as (pyproject.toml's package-dir).
PACKAGES = {"cosmos3_gym": "cosmos3_gym", "envs": "cosmos3_gym.envs", "eval": "cosmos3_gym.eval",
            "bench": "cosmos3_gym.bench", "train": "cosmos3_gym.train"}
COMMANDS = ("cosmos3_gym.eval", "cosmos3_gym.bench", "cosmos3_gym.train")


def modules(folder: str) -> dict[str, Path]:
    """Every module under ``folder``, by its installed dotted name."""
    found = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        parts = path.relative_to(ROOT / folder).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join((PACKAGES[folder], *parts))] = path
    return found


def imports(name: str, path: Path) -> set[str]:
    """The absolute names ``path`` imports, at any depth (function-level imports count too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def library() -> dict[str, Path]:
    found = {**modules("cosmos3_gym"), **modules("envs")}
    return {name: path for name, path in found.items() if not name.startswith(COMMANDS)}


def offenders(found: dict[str, Path], forbidden: tuple[str, ...]) -> list[str]:
    return sorted(f"{name} imports {target}" for name, path in found.items()
                  for target in imports(name, path)
                  if target.startswith(forbidden))


def test_the_library_imports_nothing_from_the_commands() -> None:
    assert len(library()) > 40  # the walk found the library
    assert offenders(library(), COMMANDS) == []


# What training may take from the evaluator: its held-out measurement is an evaluation (the same
# episodes, records and intervals as `cosmos3-gym eval`), sharded over torchrun's ranks as eval's.
TRAINING_MEASURES_WITH = ("cosmos3_gym.eval.evaluate", "cosmos3_gym.eval.distributed")


def test_the_benchmarks_import_nothing_from_the_evaluator_and_training_only_its_measure() -> None:
    assert offenders(modules("bench"), ("cosmos3_gym.eval",)) == []
    found = offenders(modules("train"), ("cosmos3_gym.eval",))
    assert [f for f in found if not f.split(" imports ")[1].startswith(
        TRAINING_MEASURES_WITH)] == []


def test_the_import_walk_sees_relative_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from ..eval import cli\n"
                      "    import cosmos3_gym.bench.latency\n")
    found = imports("cosmos3_gym.runner.mod", source)
    assert "cosmos3_gym.eval.cli" in found and "cosmos3_gym.bench.latency" in found


def calls(path: Path, method: str) -> int:
    return sum(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
               and node.func.attr == method
               for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))))


def test_one_loop_drives_policies_through_vector_envs() -> None:
    """``select_action`` is called by the runner and by the adapters that hand a policy to
    another framework's loop (LeRobot's, TorchRL's); every command goes through the runner."""
    every = {**library(), **modules("eval"), **modules("bench"), **modules("train")}
    callers = sorted(name for name, path in every.items() if calls(path, "select_action"))
    assert callers == ["cosmos3_gym.integrations.lerobot_plugin.modeling_cosmos3_gym",
                       "cosmos3_gym.integrations.torchrl", "cosmos3_gym.runner.loop"]
