"""The LIBERO env family (``--env libero``): a task is ``"{suite}/{task_id}"``, a trial picks its
init state, and ``--suite`` names one suite, several, or a group of them (:data:`SUITE_GROUPS`).
The env itself is :mod:`~cosmos3_gym.envs.libero`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gymnasium.vector import AutoresetMode, VectorEnv

from .base import Episode, EvalEnv
from .libero import (
    LIBERO_SETTLE_STEPS,
    STEP_BUDGETS,
    check_libero_runs,
    libero_max_episode_steps,
    make_libero_vector_env,
)
from .libero_pro import base_suite
from .libero_suites import check_libero_tasks, libero_num_tasks, libero_task_description

LIBERO_INIT_STATES_PER_TASK = 50
# Names for several suites at once (``--suite libero_4``): the four suites behind the published
# LIBERO averages (spatial, object, goal, long), in the order papers list them.
SUITE_GROUPS: dict[str, tuple[str, ...]] = {
    "libero_4": ("libero_spatial", "libero_object", "libero_goal", "libero_10"),
}


def canonical_suites(suite: str | None) -> str | None:
    """``--suite`` as one comma-separated string: groups (:data:`SUITE_GROUPS`) expanded, each
    suite once, in the order given, so ``libero_4`` and its four names are the same run.

    >>> canonical_suites("libero_4")
    'libero_spatial,libero_object,libero_goal,libero_10'
    >>> canonical_suites(" libero_10 ")
    'libero_10'
    """
    if suite is None:
        return None
    names = [n.strip() for n in suite.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--suite: expected one or more suite names; found {suite!r}")
    expanded = [s for n in names for s in SUITE_GROUPS.get(n, (n,))]
    repeated = sorted({s for s in expanded if expanded.count(s) > 1})
    if repeated:
        raise ValueError(f"--suite {suite}: each suite once; found {repeated} more than once")
    return ",".join(expanded)



class LiberoEval(EvalEnv):
    """LIBERO; a task is ``"{suite}/{task_id}"``; trial ``t`` starts from init state ``t % 50``.

    ``suite`` is one suite or several (``"libero_spatial,libero_10"``, or a sequence): the same
    ``task_ids`` are taken from each (``None``: every task of each), suite after suite, and every
    suite keeps its own budget. LIBERO-PRO's perturbed suites (``libero_10_lan``, ...) run with
    the prompt, BDDL and init states their protocol defines
    (:data:`~cosmos3_gym.envs.libero_suites.PROMPT_SOURCES`); a suite that cannot run is refused
    here, before anything runs.
    """

    adapter = "libero"
    domain = "libero"
    bench_suite = "libero_spatial"
    real_action_units = True
    control_hz = 20.0  # robosuite's control_freq in LIBERO's envs; end-effector deltas + gripper
    hold = "still-gripper"
    init_state_rule = f"trial % {LIBERO_INIT_STATES_PER_TASK}"

    def __init__(
        self,
        suite: str | Sequence[str],
        task_ids: list[int] | None,
        *,
        image_size: int = 256,
        step_budget: str = "cosmos3",
        max_episode_steps: int | None = None,
    ) -> None:
        check_libero_runs()  # the extra and a renderer, before any task is looked up
        suites = suite.split(",") if isinstance(suite, str) else list(suite)
        if task_ids is None:
            self.pairs = [(s, t) for s in suites for t in range(libero_num_tasks(s))]
        else:
            self.pairs = [(s, t) for s in suites for t in task_ids]
        super().__init__([f"{s}/{t}" for s, t in self.pairs])
        for s in suites:  # before anything runs: the suite's prompt rule and files
            check_libero_tasks(s, [t for suite_of, t in self.pairs if suite_of == s])
        if step_budget not in STEP_BUDGETS:
            raise ValueError(
                f"step_budget must be one of {list(STEP_BUDGETS)}; found {step_budget!r}"
            )
        self.suites = suites
        self.suite = ",".join(suites)
        self.image_size = image_size
        self.step_budget = step_budget
        self.max_episode_steps = max_episode_steps

    @classmethod
    def from_cli(
        cls, *, suite: str | None, tasks: list[str] | None, image_size: int | None,
        max_episode_steps: int | None, step_budget: str | None = None,
    ) -> LiberoEval:
        if suite is None:
            raise ValueError(
                "--env libero needs --suite (e.g. libero_10, several as libero_spatial,libero_10, "
                f"or {', '.join(SUITE_GROUPS)} for {', '.join(SUITE_GROUPS['libero_4'])})"
            )
        if step_budget is not None and max_episode_steps is not None:
            raise ValueError(
                f"--step-budget {step_budget!r} and --max-episode-steps {max_episode_steps} both "
                "set the episode length; give one (--max-episode-steps makes the budget 'custom')"
            )
        check_libero_runs()
        suites = canonical_suites(suite).split(",")
        ids = None
        if tasks is not None:  # every suite must have each task id
            n_tasks = min(libero_num_tasks(s) for s in suites)
            ids = [_task_id(t, n_tasks) for t in tasks]
        return cls(suites, ids, image_size=image_size or 256, step_budget=step_budget or "cosmos3",
                   max_episode_steps=max_episode_steps)

    def episode_budget(self) -> dict[str, Any]:
        """``cosmos3`` (default: the official Cosmos3 client's, settle steps counted inside),
        ``openpi`` (settle steps on top), or ``custom`` when ``max_episode_steps`` is given.

        >>> LiberoEval("libero_10", [0], step_budget="openpi").episode_budget()
        {'step_budget': 'openpi', 'settle_steps': 10, 'max_episode_steps': {'libero_10': 520}}
        """
        if self.max_episode_steps is not None:
            name = "custom"
            steps = {s: self.max_episode_steps for s in self.suites}
        else:
            name = self.step_budget
            steps = {s: libero_max_episode_steps(s, self.step_budget) for s in self.suites}
        return {"step_budget": name, "settle_steps": LIBERO_SETTLE_STEPS,
                "max_episode_steps": steps}

    def init_state_id(self, trial: int) -> int | None:
        return trial % LIBERO_INIT_STATES_PER_TASK

    def task_suite(self, task_index: int) -> str:
        return self.pairs[task_index][0]

    def seed_task(self, task_index: int) -> str:
        """A LIBERO-PRO perturbed suite's task draws its base suite's task's seeds
        (``libero_10_lan/3`` those of ``libero_10/3``): the perturbation arm pairs with its
        control on the same env seed and noise. The standard suites' are their own names."""
        suite, task = self.pairs[task_index]
        return f"{base_suite(suite)}/{task}"

    def task_prompt(self, task_index: int) -> str:
        return libero_task_description(*self.pairs[task_index])

    def reset_options(self, episode: Episode) -> dict[str, Any]:
        return {"task": self.pairs[episode.task_index], "init_state_id": episode.init_state_id}

    def make(
        self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode = AutoresetMode.DISABLED
    ) -> VectorEnv:
        return make_libero_vector_env(
            self.pairs,
            num_envs,
            async_=async_,
            image_size=self.image_size,
            autoreset_mode=autoreset_mode,
            step_budget=self.step_budget,
            max_episode_steps=self.max_episode_steps,
        )


def _task_id(text: str, n_tasks: int) -> int:
    try:
        task_id = int(text)
    except ValueError:
        raise ValueError(f"LIBERO tasks are task ids 0..{n_tasks - 1}; found {text!r}") from None
    if not 0 <= task_id < n_tasks:
        raise ValueError(f"LIBERO task id must be in 0..{n_tasks - 1}; found {task_id}")
    return task_id
