"""Robustness runs: perturbed suites beside their control, and the noise floor, as arms.

``--perturbations`` runs LIBERO-PRO's perturbations of ``--suite`` (:mod:`~cosmos3_gym.envs.
libero_pro`: one arm per dimension, the suite itself the control arm); ``--repeats K`` runs the
same episodes K times with fresh noise (arms ``repeat-0`` .. ``repeat-K-1``, ``repeat-0`` the
control and the run without repeats). Both are arms of one evaluation
(:func:`~cosmos3_gym.eval.arms.run_arms`): the same tasks, trials, init state ids and env
seeds in every arm, episodes paired by task and trial. docs/libero.md ("Robustness") says how
to read the results.
"""

from __future__ import annotations

from typing import Any

from cosmos3_gym.envs import canonical_suites
from cosmos3_gym.envs.libero_pro import dimensions, perturbed_suite
from cosmos3_gym.eval.arms import Arm

CONTROL = "control"


def check(config: Any) -> None:
    """The rules that tie ``--perturbations`` and ``--repeats`` to the other settings of an
    ``EvalConfig`` (one error each, before anything runs)."""
    if config.perturbations is not None:
        if config.env != "libero":
            raise ValueError(f"--perturbations runs LIBERO-PRO's perturbed suites: it needs "
                             f"--env libero; found --env {config.env}")
        if config.repeats is not None:
            raise ValueError(
                "--perturbations and --repeats: one at a time. The noise floor a dimension's "
                "difference is read against is measured on the control suite: run --repeats on "
                "--suite alone (docs/libero.md, Robustness)")
    if config.repeats is not None and config.repeats < 2:
        raise ValueError(f"--repeats must be at least 2 (agreement needs two draws of each "
                         f"episode); found {config.repeats}")


def canonical_perturbations(config: Any) -> tuple[str, ...] | None:
    """``--perturbations`` as canonical dimension names (``all`` expanded for the run's
    suites); an error for a dimension that does not run on one of them."""
    if config.perturbations is None:
        return None
    if config.suite is None:
        raise ValueError("--perturbations needs --suite: the control suite whose perturbations "
                         "run beside it (e.g. libero_10)")
    names = dimensions(list(config.perturbations), canonical_suites(config.suite).split(","))
    if not names:
        raise ValueError(f"--perturbations all: no dimension runs on every suite of --suite "
                         f"{config.suite}")
    return names


def arms_of(config: Any) -> tuple[list[Arm], str, bool] | None:
    """The arms a resolved ``EvalConfig`` runs, its control arm and whether the arms measure
    the noise floor (``--repeats``); ``None`` for a run of one evaluation."""
    if config.perturbations:
        suites = config.suite.split(",")
        arms = [Arm(CONTROL, {})]
        arms += [Arm(name, {"suite": ",".join(perturbed_suite(s, name) for s in suites)})
                 for name in config.perturbations]
        return arms, CONTROL, False
    if config.repeats:
        return [Arm(f"repeat-{r}", {"repeat": r}) for r in range(config.repeats)], "repeat-0", True
    return None
