"""Every example in the README and docs/ is run or checked, so none can rot.

A page's fenced blocks, as the reader sees them:

- ``python``: executed, the page's blocks in order in one namespace, in a fresh interpreter
  (cwd: an empty folder). A block that needs what a CPU machine cannot have is marked on the line
  just before its fence, ``<!-- docs: not run (needs a CUDA GPU) -->``, with the reason; it is
  compiled, and the ``cosmos3_gym`` names it imports must exist.
- ``bash``: every ``cosmos3-gym`` command (``torchrun ... -m cosmos3_gym.eval.cli`` too) is parsed
  by the real command line and its settings built, so a renamed flag or a bad value fails here
  (a shell variable in it, such as a SLURM array's ``${SLURM_ARRAY_TASK_ID}``, is checked as
  ``1``); a block marked ``<!-- docs: run -->`` is also executed (cwd: an empty folder).
- other languages (``text``, output) are not code.

The README's relative links must name files that exist (the site's own links are checked by its
strict build, ``make docs``).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# docs/cli.md is generated from the parsers (tests/test_cli.py keeps it current).
PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "cli.md")]
FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)\s*$")
MARK = re.compile(r"^\s*<!-- docs: (?P<what>run|not run \((?P<why>[^)]+)\)) -->\s*$")
PAGE_TIMEOUT_S = 900


@dataclasses.dataclass
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    code: str
    mark: str | None  # "run", "not run", or None
    why: str | None

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text(encoding="utf-8").splitlines()
    found, i = [], 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, lang, start = len(opening["indent"]), opening["lang"], i
        i += 1
        body = []
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i][indent:])
            i += 1
        mark = MARK.match(lines[start - 1]) if start else None
        found.append(Block(page, start + 1, lang, "\n".join(body) + "\n",
                           None if mark is None else mark["what"].split(" (")[0],
                           None if mark is None else mark["why"]))
        i += 1
    return found


def every_block() -> list[Block]:
    return [b for page in PAGES for b in blocks(page)]


def _id(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_block_reader_sees_marks_and_fences(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("text\n<!-- docs: not run (needs a CUDA GPU) -->\n```python\nx = 1\n```\n"
                    "- a list item:\n  ```bash\n  cosmos3-gym eval --trials 1\n  ```\n")
    first, second = blocks(page)
    assert (first.lang, first.code, first.mark, first.why) == ("python", "x = 1\n", "not run",
                                                               "needs a CUDA GPU")
    assert (second.lang, second.code.strip(), second.mark) == ("bash",
                                                               "cosmos3-gym eval --trials 1", None)


def test_the_pages_have_examples() -> None:
    langs = [b.lang for b in every_block()]
    assert langs.count("python") >= 10 and langs.count("bash") >= 10


def test_every_mark_names_a_reason_and_a_block() -> None:
    for page in PAGES:
        lines = page.read_text(encoding="utf-8").splitlines()
        for n, line in enumerate(lines):
            if "<!-- docs:" in line:
                assert MARK.match(line), f"{_id(page)}:{n + 1}: unreadable mark {line!r}"
                assert n + 1 < len(lines) and FENCE.match(lines[n + 1]), (
                    f"{_id(page)}:{n + 1}: a mark must sit on the line before a fence")


# -- python -------------------------------------------------------------------------------------


def check_imports(block: Block) -> None:
    """A block that is not run still names only what exists in cosmos3_gym."""
    tree = ast.parse(block.code, filename=block.where())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("cosmos3_gym"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                assert hasattr(module, alias.name) or importlib.util.find_spec(
                    f"{node.module}.{alias.name}"), (
                    f"{block.where()}: {node.module} has no {alias.name}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("cosmos3_gym"):
                    importlib.import_module(alias.name)


PYTHON_PAGES = [p for p in PAGES if any(b.lang == "python" for b in blocks(p))]


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=_id)
def test_python_examples_run(page: Path, tmp_path: Path) -> None:
    script = []
    for block in blocks(page):
        if block.lang != "python":
            continue
        compile(block.code, block.where(), "exec")  # every block parses, run or not
        if block.mark == "not run":
            check_imports(block)
            continue
        script.append(f"# --- {block.where()}\n{block.code}")
    if not script:
        return
    (tmp_path / "page_examples.py").write_text("\n".join(script), encoding="utf-8")
    env = {**os.environ, "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, "page_examples.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    assert done.returncode == 0, f"{_id(page)}'s Python examples failed:\n{done.stderr[-4000:]}"


# -- bash ---------------------------------------------------------------------------------------


def commands(code: str) -> list[list[str]]:
    """The shell commands of a block, continuation lines joined, comments dropped."""
    found, current = [], ""
    for line in code.splitlines():
        current += line.rstrip()
        if current.endswith("\\"):
            current = current[:-1] + " "
            continue
        if current.strip():
            found.append(shlex.split(current, comments=True))
        current = ""
    return [c for c in found if c]


SHELL_VARIABLE = re.compile(r"\$\{?\w+\}?")


def cli_words(words: list[str]) -> list[str] | None:
    """The ``cosmos3-gym`` arguments of one shell command, or None where it is another program;
    a shell variable (a value the job gets when it runs) stands as ``1``."""
    if words[0] == "cosmos3-gym":
        found = words[1:]
    elif "cosmos3_gym.eval.cli" in words:
        found = words[words.index("cosmos3_gym.eval.cli") + 1:]
    else:
        return None
    return [SHELL_VARIABLE.sub("1", w) for w in found]


def check_command(argv: list[str], where: str) -> None:
    from cosmos3_gym.eval.cli import build_parser, command_settings, settings_classes

    if "..." in argv:  # an elided command: its flags must still exist
        name = argv[0]
        options = {s for action in build_parser()._subparsers._group_actions[0].choices[name]
                   ._actions for s in action.option_strings}
        unknown = [w for w in argv if w.startswith("--") and w.split("=")[0] not in options]
        assert not unknown, f"{where}: cosmos3-gym {name} has no {unknown}"
        return
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_info:
        pytest.fail(f"{where}: cosmos3-gym {shlex.join(argv)} does not parse ({exit_info})")
    command = args.command if args.command != "rl" else f"rl {args.algorithm}"
    if command in settings_classes() and getattr(args, "config", None) is None:
        command_settings(args, settings_classes()[command])  # values checked as a run would


def test_the_command_checker_fails_on_a_renamed_flag() -> None:
    check_command(["eval", "--trials", "2", "--out", "x"], "here")
    check_command(["eval", "...", "--videos", "imagined"], "here")
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        check_command(["rollout", "--steps", "3"], "here")
    with pytest.raises(AssertionError, match="has no"):
        check_command(["eval", "...", "--dtype", "bf16"], "here")
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        check_command(["eval", "--trials", "0", "--out", "x"], "here")
    words = cli_words(["cosmos3-gym", "eval", "--shard", "${SLURM_ARRAY_TASK_ID}/8", "--out",
                       "runs/part$SLURM_ARRAY_TASK_ID"])
    assert words == ["eval", "--shard", "1/8", "--out", "runs/part1"]
    check_command(words, "here")
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        check_command(cli_words(["cosmos3-gym", "eval", "--shard", "$I", "--out", "x"]), "here")


BASH_PAGES = [p for p in PAGES if any(b.lang == "bash" for b in blocks(p))]


@pytest.mark.parametrize("page", BASH_PAGES, ids=_id)
def test_shell_examples_parse(page: Path) -> None:
    for block in blocks(page):
        if block.lang != "bash":
            continue
        for words in commands(block.code):
            argv = cli_words(words)
            if argv is not None:
                check_command(argv, block.where())


RUN_BLOCKS = [b for b in every_block() if b.lang == "bash" and b.mark == "run"]


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=Block.where)
def test_marked_shell_examples_run(block: Block, tmp_path: Path) -> None:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "MUJOCO_GL": "egl", "PYOPENGL_PLATFORM": "egl",
           "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block.code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=PAGE_TIMEOUT_S)
    assert done.returncode == 0, f"{block.where()} failed:\n{done.stderr[-4000:]}"


# -- links --------------------------------------------------------------------------------------

LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")


def test_the_readmes_links_name_files_that_exist() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    local = [m["target"] for m in LINK.finditer(text) if "://" not in m["target"]
             and not m["target"].startswith("#")]
    assert local, "the README links into the docs"
    missing = [t for t in local if not (ROOT / t.split("#")[0]).exists()]
    assert missing == []


# -- one folder per run -------------------------------------------------------------------------


def _run_settings(argv: list[str]) -> tuple[str, str, dict] | None:
    """``(command, out, settings)`` of a docs command that writes a run folder (eval, rollout,
    rl grpo) at a concrete ``--out``, its settings without those that never change which run a
    folder holds; None for any other command."""
    from cosmos3_gym.eval import evaluate, rollout
    from cosmos3_gym.eval.cli import build_parser, command_settings, settings_classes
    from cosmos3_gym.train import config as train_config

    if "..." in argv or "--config" in argv:
        return None
    args = build_parser().parse_args(argv)
    command = args.command if args.command != "rl" else f"rl {args.algorithm}"
    run_only = {"eval": evaluate.RUN_ONLY, "rollout": rollout.RUN_ONLY,
                "rl grpo": train_config.RUN_ONLY}.get(command)
    out = getattr(args, "out", None)
    if run_only is None or out is None or not out.startswith("runs/"):
        return None
    settings = dataclasses.asdict(command_settings(args, settings_classes()[command]))
    return command, out, {k: v for k, v in settings.items() if k not in (*run_only, "out")}


def test_every_docs_run_has_its_own_out() -> None:
    """Following the pages in order runs every command: two different runs that share an
    ``--out`` make the second refused ("holds a different run"). Three pages once used
    ``--out runs/pusht`` for three different runs."""
    runs: dict[str, list[tuple[str, dict]]] = {}
    for block in every_block():
        if block.lang != "bash":
            continue
        for words in commands(block.code):
            while words and re.match(r"^\w+=", words[0]):  # MUJOCO_GL=egl cosmos3-gym ...
                words = words[1:]
            argv = cli_words(words) if words else None
            found = None if argv is None else _run_settings(argv)
            if found is not None:
                command, out, settings = found
                runs.setdefault(out, []).append((block.where(), (command, settings)))
    assert len(runs) > 10
    shared = {out: [where for where, _ in seen] for out, seen in runs.items()
              if len({repr(run) for _, run in seen}) > 1}
    assert not shared, f"different runs share an --out: {shared}"


def test_no_page_holds_a_placeholder_for_a_measurement() -> None:
    """A line that is one upper-case token alone (``COSTS_SHARDS``, ``MEASURED-TABLES``) is a
    slot a writer meant to fill with measured numbers: a page never ships one."""
    slots = [f"{page.relative_to(ROOT)}:{n}" for page in PAGES
             for n, line in enumerate(page.read_text(encoding="utf-8").splitlines(), 1)
             if re.fullmatch(r"[A-Z][A-Z0-9_-]{5,}", line.strip())]
    assert slots == [], slots
