"""The architecture as the folder tree shows it, checked on the imports: the library (model,
pipeline, policy, runner, envs, integrations) knows nothing of the commands built on it; the
benchmarks know nothing of the evaluator, and training only its measurement; and one loop
(``cosmos3_gym.runner``) drives a policy through vector envs.

One name crosses from the library to a command, on purpose: the top-level package names
``cosmos3_gym.evaluate`` (and its ``EvalResults``), the evaluation command's one call
(``cosmos3_gym/eval/api.py``), because a training loop looks for it at the top, as vla-eval's
users find ``vla_eval.evaluate``. The top-level package is the front door, not a layer: it runs
nothing at import (a lazy export, cosmos3_gym/lazy.py), so ``import cosmos3_gym`` still loads
no command, and no module of the library under it (model, pipeline, policy, runner, envs,
integrations) may import a command, lazily or not. The alternative, moving the evaluator into
the library, would move the run folder, the results and the protocol with it: the commands
would be the library. A lazy export counts as an import here, so the exception is this one line
(:data:`FRONT_DOOR`), not a blind spot."""

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


def imports(name: str, path: Path, tree: ast.AST | None = None) -> set[str]:
    """The absolute names ``path`` (or ``tree``, a part of it) imports, at any depth
    (function-level imports count too, and a package's lazy exports: ``exports(__name__,
    {NAME: MODULE})``, cosmos3_gym/lazy.py)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    tree = tree if tree is not None else ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id == "exports" and len(node.args) == 2
                and isinstance(node.args[1], ast.Dict)):
            for key, value in zip(node.args[1].keys, node.args[1].values, strict=True):
                where = ast.literal_eval(value)
                module = where if where.startswith("cosmos3_gym.") else f"{package}.{where}"
                out.update((module, f"{module}.{ast.literal_eval(key)}"))
        elif isinstance(node, ast.Import):
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


# The one crossing (the module notes say why): the top-level package names the evaluation call.
FRONT_DOOR = {"cosmos3_gym imports cosmos3_gym.eval.api",
              "cosmos3_gym imports cosmos3_gym.eval.api.EvalResults",
              "cosmos3_gym imports cosmos3_gym.eval.api.evaluate"}


def test_the_library_imports_nothing_from_the_commands() -> None:
    assert len(library()) > 40  # the walk found the library
    assert set(offenders(library(), COMMANDS)) == FRONT_DOOR
    # ... which loads nothing when the package loads
    top = modules("cosmos3_gym")["cosmos3_gym"]
    assert not {t for t in module_level_imports("cosmos3_gym", top) if t.startswith(COMMANDS)}


# What training may take from the evaluator: its held-out measurement is an evaluation (the same
# episodes, records and intervals as `cosmos3-gym eval`), sharded over torchrun's ranks as eval's,
# and a GRPO run is resolved as every command's run is (cosmos3_gym/eval/run.py).
TRAINING_MEASURES_WITH = ("cosmos3_gym.eval.evaluate", "cosmos3_gym.eval.distributed",
                          "cosmos3_gym.eval.run", "cosmos3_gym.eval.api")


# What a benchmark may take from the commands: the multi-seed GRPO driver runs `rl grpo` command
# lines, and reads what each asks for (its --iterations) as the command does: its parser and the
# settings it resolves (cosmos3_gym/eval/cli.py), not a second reading of the same flags.
BENCHMARKS_READ_COMMAND_LINES_WITH = {
    "cosmos3_gym.bench.grpo_seeds": ("cosmos3_gym.eval.cli.build_parser",
                                     "cosmos3_gym.eval.cli.parse_command_line",
                                     "cosmos3_gym.eval.cli.command_settings")}


def test_the_benchmarks_import_nothing_from_the_evaluator_and_training_only_its_measure() -> None:
    found = offenders(modules("bench"), ("cosmos3_gym.eval",))
    allowed = {f"{bench} imports {name}" for bench, names
               in BENCHMARKS_READ_COMMAND_LINES_WITH.items()
               for name in (*names, "cosmos3_gym.eval.cli")}
    assert [f for f in found if f not in allowed] == []
    found = offenders(modules("train"), ("cosmos3_gym.eval",))
    assert [f for f in found if not f.split(" imports ")[1].startswith(
        TRAINING_MEASURES_WITH)] == []


def test_the_import_walk_sees_relative_and_function_level_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("def f():\n    from ..eval import cli\n"
                      "    import cosmos3_gym.bench.latency\n")
    found = imports("cosmos3_gym.runner.mod", source)
    assert "cosmos3_gym.eval.cli" in found and "cosmos3_gym.bench.latency" in found
    package = tmp_path / "__init__.py"
    package.write_text("__getattr__, __dir__ = exports(__name__, {'A': 'loop', "
                       "'run': 'cosmos3_gym.eval.api'})\n")
    found = imports("cosmos3_gym.runner", package)
    assert {"cosmos3_gym.runner.loop.A", "cosmos3_gym.eval.api.run"} <= found


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


def module_level_imports(name: str, path: Path) -> set[str]:
    """The absolute names ``path`` imports when it is imported: top-level statements (in ``if``
    and ``try`` blocks too), not inside functions, not under ``if TYPE_CHECKING:``."""
    out: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):
                if "TYPE_CHECKING" not in ast.unparse(node.test):
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                for block in (node.body, node.orelse, node.finalbody,
                              *(h.body for h in node.handlers)):
                    visit(block)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                out.update(imports(name, path, node))

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the project modules importing it runs: each module it imports at module level,
    and the packages that import initialises first (``import a.b.c`` runs ``a`` and ``a.b``),
    except its own parent packages, which are already running."""
    found = {name: path for folder in PACKAGES for name, path in modules(folder).items()}
    graph: dict[str, set[str]] = {}
    for name, path in found.items():
        own = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)}
        runs: set[str] = set()
        for target in module_level_imports(name, path):
            while target and target not in found:
                target = target.rpartition(".")[0]
            parts = target.split(".")
            runs.update(p for p in (".".join(parts[:i]) for i in range(1, len(parts) + 1))
                        if p in found and p not in own and p != name)
        graph[name] = runs
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_module_imports_itself_through_others_when_it_loads() -> None:
    """The import graph at load time has no cycle: a package's ``__init__`` names its exports
    lazily (cosmos3_gym/lazy.py), so importing one light module (the run-folder lock, the
    settings) never runs the heavy ones, and no module meets another half-initialised."""
    graph = import_graph()
    assert len(graph) > 80 and "cosmos3_gym.runner.folder" in graph
    assert cycles(graph) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The env families, each beside its env or in its own file; the base class every family
# subclasses; the name table that knows them all (envs/names.py).
ENVS_BASE = "cosmos3_gym.envs.base"
ENVS_NAMES = "cosmos3_gym.envs.names"
ENV_FAMILIES = ("cosmos3_gym.envs.color_reach", "cosmos3_gym.envs.libero_eval",
                "cosmos3_gym.envs.metaworld", "cosmos3_gym.envs.gym_eval",
                "cosmos3_gym.envs.maniskill", "cosmos3_gym.envs.presets")


def test_the_envs_import_one_way_base_then_families_then_the_name_table() -> None:
    """``base <- families (and presets) <- names``: the base class knows no family, no family or
    preset imports the name table (at load time or later), and the name table imports every
    family (a new one is an entry there, not an import back from it)."""
    graph = import_graph()
    found = modules("envs")
    assert set(ENV_FAMILIES) | {ENVS_BASE, ENVS_NAMES} <= set(found)
    envs_modules = {name for name in found if name != "cosmos3_gym.envs"}
    assert sorted(graph[ENVS_BASE] & envs_modules) == ["cosmos3_gym.envs.success"]
    for family in ENV_FAMILIES:
        assert ENVS_BASE in graph[family] or "cosmos3_gym.envs.gym_eval" in graph[family], family
    back = sorted(f"{name} imports {target}" for name in envs_modules - {ENVS_NAMES}
                  for target in imports(name, found[name]) if target.startswith(ENVS_NAMES))
    assert back == []
    assert {f for f in ENV_FAMILIES if f != "cosmos3_gym.envs.maniskill"} <= graph[ENVS_NAMES]


# The modules the command line imports before it has checked what it was given: none of them may
# import torch, diffusers or transformers when it loads (tests/test_cli_answers_at_once.py runs
# the commands themselves).
LIGHT = ("cosmos3_gym.eval.cli", "cosmos3_gym.settings", "cosmos3_gym.runner.folder",
         "cosmos3_gym.checkpoint", "cosmos3_gym.formats", "cosmos3_gym.train.config",
         "cosmos3_gym.eval.evaluate", "cosmos3_gym.eval.rollout")
HEAVY = ("torch", "diffusers", "transformers", "safetensors", "peft")


def test_what_the_command_line_loads_first_imports_no_model_stack() -> None:
    graph = import_graph()
    found = {name: path for folder in PACKAGES for name, path in modules(folder).items()}
    reached, todo = set(), list(LIGHT)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(graph[name])
    heavy = sorted(f"{name} imports {target}" for name in reached
                   for target in module_level_imports(name, found[name])
                   if target.split(".")[0] in HEAVY)
    assert heavy == []
