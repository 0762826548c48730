"""Env families: what a run of episodes needs to know about an env, before and while it runs.

An :class:`EvalEnv` names a family's tasks, builds its vector env, says how a sub-env starts a
given episode (``reset_options``), what each task's instruction is, and its action space and
episode budget without building a simulator. The episode runner
(:mod:`cosmos3_gym.runner`), the evaluation and the rollouts drive every env through it; a new
env is one subclass and one entry of :data:`EVAL_ENVS`.

An episode is ``(task, trial)``. Everything else about it derives from that pair and the run's
global seed, never from the env slot, batch or rank that happens to run it:

- ``seed``: the env's reset seed, ``derive_seed(global_seed, task, trial)``;
- ``init_state_id``: LIBERO's init state, ``trial % 50`` (the suites ship 50 per task);
  ``None`` for the built-in env, whose whole initial state follows from ``seed``;
- chunk ``c``'s noise seed (evaluations): ``derive_seed(global_seed, task, trial, chunk=c)``.

So one process, eight env slots or a torchrun launch produce the same episode, byte for byte.
A run's episodes (:meth:`EvalEnv.episodes`) are computed on demand, so a run of any number of
trials costs nothing before its first episode.
"""

from __future__ import annotations

import dataclasses
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from gymnasium.spaces import Space
from gymnasium.vector import AutoresetMode, VectorEnv

from .color_reach import COLORS, make_color_reach_vector_env, prompt_for
from .gym import VARIANT_OPTION, Variant, episode_budget
from .libero import (
    LIBERO_SETTLE_STEPS,
    STEP_BUDGETS,
    check_libero_runs,
    libero_max_episode_steps,
    libero_num_tasks,
    libero_task_description,
    make_libero_vector_env,
)
from .metaworld import (
    METAWORLD_LAYOUTS_PER_TASK,
    METAWORLD_MT10,
    METAWORLD_TASK_DESCRIPTIONS,
    METAWORLD_TASKS,
    check_metaworld_runs,
    make_metaworld_vector_env,
)
from .success import SuccessRule, parse_success

LIBERO_INIT_STATES_PER_TASK = 50
# Names for several suites at once (``--suite libero_4``): the four suites behind the published
# LIBERO averages (spatial, object, goal, long), in the order papers list them.
SUITE_GROUPS: dict[str, tuple[str, ...]] = {
    "libero_4": ("libero_spatial", "libero_object", "libero_goal", "libero_10"),
}

_ENV_SEED_TAG = 0  # keeps the env seed and the chunk seeds of one episode apart
_CHUNK_SEED_TAG = 1


def derive_seed(global_seed: int, task: str, trial: int, chunk: int | None = None) -> int:
    """A 31-bit seed from ``(global seed, task name, trial[, chunk])``, mixed by SeedSequence.

    The task enters by the CRC32 of its name, so adding or reordering tasks in a later run
    leaves every other episode's seeds unchanged.
    """
    entropy = [int(global_seed), zlib.crc32(task.encode()), int(trial)]
    entropy += [_ENV_SEED_TAG] if chunk is None else [_CHUNK_SEED_TAG, int(chunk)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0] >> 1)


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


@dataclass(frozen=True)
class Episode:
    """One evaluation episode and everything needed to run it again exactly."""

    task: str  # stable task name, e.g. "red" or "libero_10/3"
    task_index: int  # position of the task in the run's task list
    suite: str  # "color_reach" or the LIBERO suite
    trial: int
    seed: int  # env reset seed
    init_state_id: int | None

    @property
    def key(self) -> tuple[str, int]:
        return self.task, self.trial


class EpisodeSet(Sequence[Episode]):
    """The episodes of a run, task-major (``k = task_index * trials + trial``), each computed
    when it is asked for: a run of any length costs nothing before it starts.

    >>> episodes = ColorReachEval(["red", "blue"]).episodes(trials=3, global_seed=0)
    >>> len(episodes), episodes[4].key, episodes.index_of(("blue", 1))
    (6, ('blue', 1), 4)
    """

    def __init__(self, env: EvalEnv, trials: int, global_seed: int) -> None:
        if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
            raise ValueError(f"trials must be an integer of at least 1; found {trials!r}")
        self.env, self.trials, self.global_seed = env, trials, global_seed

    def __len__(self) -> int:
        return len(self.env.tasks) * self.trials

    @overload
    def __getitem__(self, k: int) -> Episode: ...

    @overload
    def __getitem__(self, k: slice) -> list[Episode]: ...

    def __getitem__(self, k: int | slice) -> Episode | list[Episode]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        if not -len(self) <= k < len(self):
            raise IndexError(f"episode {k} of a run of {len(self)}")
        task_index, trial = divmod(k % len(self), self.trials)
        return self.env.episode(task_index, trial, self.global_seed)

    def __iter__(self) -> Iterator[Episode]:
        return (self[k] for k in range(len(self)))

    def index_of(self, key: tuple[str, int]) -> int:
        """The position of episode ``(task, trial)`` in the run."""
        task, trial = key
        return self.env.tasks.index(task) * self.trials + int(trial)


class EvalEnv:
    """An evaluation env family: task names, episode reset options and a vector env factory.

    Subclass it to evaluate on your own env (the tests do, to inject worker crashes): sub-envs
    must be wrapped (outermost) in :class:`~cosmos3_gym.envs.EpisodeEndHold`, expose
    ``task_description`` and report ``info["is_success"]``.
    """

    suite: str = ""
    adapter: str = "generic"
    # Keyword arguments of the adapter (GymEval: image_key, state_key, flip).
    adapter_options: dict[str, Any] = {}
    # The checkpoint domain this env's actions belong to (names the fix of a width mismatch).
    domain: str | None = None
    # The suite `cosmos3-gym bench --overlap-env` measures when none is named (None: no suites).
    bench_suite: str | None = None
    # Whether the env takes actions in physical units (LIBERO: metres and radians per step), so
    # that a checkpoint's actions left in the model's normalised space would be meaningless.
    real_action_units: bool = False
    # How a trial picks its initial state, for results.json (None: the seed decides it all).
    init_state_rule: str | None = None
    # The settings of this family that ``--env-kwargs`` may give (its from_cli takes them as
    # ``env_kwargs``); gym:ID passes any to its env.
    env_kwargs_keys: tuple[str, ...] = ()
    # The action map (--action-map) a run applies unless told otherwise (None: unchanged).
    action_map: str | None = None
    # How the simulator was resolved on this machine (ManiSkill3: its sim backend and vector
    # env), recorded in a run's identity so a resumed run cannot switch it (None: nothing to
    # resolve).
    simulation: dict[str, str] | None = None

    @property
    def success_rule(self) -> SuccessRule:
        """Where this family's success comes from (results.json's ``success_source``): by
        default the sub-envs' own ``info["is_success"]``, which every family must report."""
        return SuccessRule("flag", "is_success", declared_by=f"the {self.suite or 'env'} family")

    def check_success(self) -> None:
        """Before a run: refuse an env whose success signal is not there (one error, before the
        model loads). The built-in families report theirs; :class:`GymEval` probes its envs."""

    @classmethod
    def from_cli(
        cls, *, suite: str | None, tasks: list[str] | None, image_size: int | None,
        max_episode_steps: int | None, step_budget: str | None = None,
    ) -> EvalEnv:
        """The env as the command line names it (``--suite``, ``--tasks`` as given, ...);
        ``None`` takes the env's default."""
        raise NotImplementedError

    def __init__(self, tasks: list[str]) -> None:
        if not tasks:
            raise ValueError("an evaluation needs at least one task; found none")
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"tasks must be distinct; found {tasks}")
        self.tasks = tasks

    def identity(self) -> dict[str, Any]:
        """What a run folder records of this env when it is handed to ``evaluate(...,
        eval_env=...)`` instead of named by the config: its class and every plain setting it
        holds (tasks, image size, budget, ...), so that two differently made envs never share
        a folder. Override it where a setting lives elsewhere than in plain attributes.

        >>> ColorReachEval(["red"], image_size=32).identity()["image_size"]
        32
        """
        cls = type(self)
        plain = {name: value for name, value in sorted(vars(self).items())
                 if not name.startswith("_") and _plain(value)}
        return {"family": f"{cls.__module__}.{cls.__qualname__}", "suite": self.suite, **plain}

    def episodes(self, trials: int, global_seed: int) -> EpisodeSet:
        """All episodes of the run, task-major: the canonical order ranks and resume share."""
        return EpisodeSet(self, trials, global_seed)

    def episode(self, task_index: int, trial: int, global_seed: int) -> Episode:
        """Trial ``trial`` of task ``task_index``, as every run of ``global_seed`` has it."""
        task = self.tasks[task_index]
        return Episode(
            task=task,
            task_index=task_index,
            suite=self.task_suite(task_index),
            trial=trial,
            seed=derive_seed(global_seed, task, trial),
            init_state_id=self.init_state_id(trial),
        )

    def init_state_id(self, trial: int) -> int | None:
        return None

    def task_suite(self, task_index: int) -> str:
        """The suite task ``task_index`` belongs to (results are grouped by it)."""
        return self.suite

    def reset_options(self, episode: Episode) -> dict[str, Any]:
        """The ``reset(options=...)`` that makes a sub-env start ``episode``."""
        raise NotImplementedError

    def make(
        self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode = AutoresetMode.DISABLED
    ) -> VectorEnv:
        """A fresh vector env of ``num_envs`` sub-envs (evaluation: autoreset disabled, the
        evaluator resets each slot itself; rollouts: an autoresetting mode)."""
        raise NotImplementedError

    def task_prompt(self, task_index: int) -> str:
        """The instruction an env shows for task ``task_index`` (its ``task_description``)."""
        raise NotImplementedError

    def single_action_space(self) -> Space:
        """One sub-env's action space, known before any simulator runs: what a checkpoint's
        actions are checked against at the start of an evaluation.

        The default builds a one-env sync vector env and closes it unreset; both built-in envs
        build their simulator only at the first reset. Override it where a constructor is costly.
        """
        envs = self.make(1, False)
        try:
            return envs.single_action_space
        finally:
            envs.close()

    def episode_budget(self) -> dict[str, Any] | None:
        """The episode-length convention, for results.json and the summary: ``step_budget``
        (its name), ``settle_steps`` (no-op steps inside ``reset()``) and ``max_episode_steps``
        (policy steps, per suite); ``None`` where the env has no such convention."""
        return None

    def shuffled_prompt(self, task_index: int) -> str:
        """Another task's instruction: the prompt-reading check of ``--shuffle-prompts``.

        Episodes of task k are given task k+1's prompt (cyclically), so every episode gets a
        wrong prompt, deterministically: the check resumes and shards like a normal run.
        """
        if len(self.tasks) < 2:
            raise ValueError(
                f"--shuffle-prompts needs at least 2 tasks to swap prompts between; "
                f"found {self.tasks}"
            )
        return self.task_prompt((task_index + 1) % len(self.tasks))


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON data as it is (a setting a run folder can record)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False


class ColorReachEval(EvalEnv):
    """The built-in env; a task is a target colour (``red``, ``green``, ``blue``, ``yellow``)."""

    suite = "color_reach"
    adapter = "generic"
    domain = "color_reach"
    # A faster agent (0.28 instead of 0.08 arena units per step) makes the tiny policy overshoot:
    # GRPO's reference benchmark (docs/rl.md).
    env_kwargs_keys = ("max_speed",)

    def __init__(
        self, tasks: list[str] | None = None, *, image_size: int = 128, max_episode_steps: int = 40,
        max_speed: float | None = None,
    ) -> None:
        if max_speed is not None and (isinstance(max_speed, bool)
                                      or not isinstance(max_speed, (int, float))
                                      or not max_speed > 0):
            raise ValueError(f"color_reach max_speed must be a positive number of arena units "
                             f"per step; found {max_speed!r}")
        tasks = list(COLORS) if tasks is None else tasks
        unknown = [t for t in tasks if t not in COLORS]
        if unknown:
            raise ValueError(
                f"unknown color_reach tasks {unknown}; expected some of {list(COLORS)}"
            )
        super().__init__(tasks)
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps
        # Arena units per step at full action; None: the env's own (a harder setting: faster).
        self.max_speed = max_speed

    @classmethod
    def from_cli(
        cls, *, suite: str | None, tasks: list[str] | None, image_size: int | None,
        max_episode_steps: int | None, step_budget: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> ColorReachEval:
        if suite not in (None, "color_reach"):
            raise ValueError(f"--suite {suite!r} does not apply to --env color_reach")
        if step_budget is not None:
            raise ValueError(
                f"--step-budget {step_budget!r} chooses between LIBERO clients' conventions and "
                "applies to --env libero only; --env color_reach takes --max-episode-steps"
            )
        return cls(tasks, image_size=image_size or 128, max_episode_steps=max_episode_steps or 40,
                   **(env_kwargs or {}))

    def episode_budget(self) -> dict[str, Any]:
        return {"step_budget": None, "settle_steps": 0,
                "max_episode_steps": {self.suite: self.max_episode_steps}}

    def reset_options(self, episode: Episode) -> dict[str, Any]:
        return {"target": episode.task}

    def task_prompt(self, task_index: int) -> str:
        return prompt_for(self.tasks[task_index])

    def make(
        self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode = AutoresetMode.DISABLED
    ) -> VectorEnv:
        return make_color_reach_vector_env(
            num_envs,
            async_=async_,
            autoreset_mode=autoreset_mode,
            image_size=self.image_size,
            max_episode_steps=self.max_episode_steps,
            **({} if self.max_speed is None else {"max_speed": self.max_speed}),
        )


class LiberoEval(EvalEnv):
    """LIBERO; a task is ``"{suite}/{task_id}"``; trial ``t`` starts from init state ``t % 50``.

    ``suite`` is one suite or several (``"libero_spatial,libero_10"``, or a sequence): the same
    ``task_ids`` are taken from each (``None``: every task of each), suite after suite, and every
    suite keeps its own budget.
    """

    adapter = "libero"
    domain = "libero"
    bench_suite = "libero_spatial"
    real_action_units = True
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


class MetaWorldEval(EvalEnv):
    """Meta-World; a task is its name (``reach-v3``); trial ``t`` runs layout ``t % 50`` of the
    task's 50 (``metaworld.MT1(task, seed=42)``, LeRobot's set), seen from the corner2 camera.
    Default tasks: MT10's."""

    suite = "metaworld"
    adapter = "metaworld"
    domain = "metaworld"

    def __init__(self, tasks: list[str] | None = None, *, image_size: int = 224,
                 max_episode_steps: int | None = None) -> None:
        tasks = list(METAWORLD_MT10) if tasks is None else tasks
        check_metaworld_runs()  # the extra and a renderer: a worker would fault on each
        unknown = [t for t in tasks if t not in METAWORLD_TASKS]
        if unknown:
            raise ValueError(f"unknown Meta-World tasks {unknown}; expected some of "
                             f"{list(METAWORLD_TASKS)}")
        super().__init__(tasks)
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps or 500

    @classmethod
    def from_cli(
        cls, *, suite: str | None, tasks: list[str] | None, image_size: int | None,
        max_episode_steps: int | None, step_budget: str | None = None,
    ) -> MetaWorldEval:
        if suite not in (None, "metaworld"):
            raise ValueError(f"--suite {suite!r} does not apply to --env metaworld; name its "
                             "tasks with --tasks (e.g. reach-v3,push-v3)")
        if step_budget is not None:
            raise ValueError(f"--step-budget {step_budget!r} applies to --env libero only; "
                             "--env metaworld takes --max-episode-steps (at most 500)")
        return cls(tasks, image_size=image_size or 224, max_episode_steps=max_episode_steps)

    def episode_budget(self) -> dict[str, Any]:
        return {"step_budget": None, "settle_steps": 0,
                "max_episode_steps": {self.suite: self.max_episode_steps}}

    def init_state_id(self, trial: int) -> int | None:
        return trial % METAWORLD_LAYOUTS_PER_TASK

    def task_prompt(self, task_index: int) -> str:
        return METAWORLD_TASK_DESCRIPTIONS[self.tasks[task_index]]

    def reset_options(self, episode: Episode) -> dict[str, Any]:
        return {"task": episode.task, "layout_id": episode.init_state_id}

    def single_action_space(self) -> Space:
        from gymnasium.spaces import Box

        return Box(-1.0, 1.0, (4,), np.float32)

    def make(
        self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode = AutoresetMode.DISABLED
    ) -> VectorEnv:
        return make_metaworld_vector_env(
            self.tasks, num_envs, async_=async_, image_size=self.image_size,
            max_episode_steps=self.max_episode_steps, autoreset_mode=autoreset_mode,
        )


# Every env the command line and the benchmark know, by --env name: a new env is one entry here
# (an EvalEnv subclass with its adapter, reset options and vector-env factory).
EVAL_ENVS: dict[str, type[EvalEnv]] = {
    "color_reach": ColorReachEval, "libero": LiberoEval, "metaworld": MetaWorldEval,
}
ENV_NAMES = tuple(EVAL_ENVS)
# Env families named with an id after a prefix (--env gym:ID), each filled in at the end of this
# module: GymEval.
GYM_PREFIX = "gym:"
PREFIXED_ENVS: dict[str, type[EvalEnv]] = {}
# The options that only --env gym:ID and the benchmark presets (envs/presets.py) take, with
# their flags.
GYM_OPTIONS = {"prompt": "--prompt", "import_modules": "--import", "env_kwargs": "--env-kwargs",
               "success_key": "--success-key", "success": "--success",
               "image_key": "--image-key", "state_key": "--state-key",
               "render_size": "--render-size", "flip": "--flip"}


def check_env_name(text: str) -> str:
    """``text`` if it names an env: a family of :data:`EVAL_ENVS`, ``gym:ID``, or a benchmark
    preset (``pusht``, ``aloha:insertion``, ``metaworld:mt10``: :mod:`~cosmos3_gym.envs.
    presets`); a ``ValueError`` listing what is known otherwise. Every command that takes
    ``--env`` parses it here."""
    from .presets import PRESETS, split_preset_name

    if text in ENV_NAMES or (text.startswith(GYM_PREFIX) and text[len(GYM_PREFIX):].strip()):
        return text
    if split_preset_name(text) is not None:
        return text
    raise ValueError(f"unknown env {text!r}; expected one of {', '.join(ENV_NAMES)}, a "
                     "benchmark preset "
                     f"({', '.join(PRESETS)}, optionally NAME:VARIANT), or gym:ID (a registered "
                     f"Gymnasium id, e.g. gym:gym_pusht/PushT-v0)")


def make_eval_env(
    env: str,
    *,
    suite: str | None = None,
    tasks: list[str] | None = None,
    image_size: int | None = None,
    max_episode_steps: int | None = None,
    step_budget: str | None = None,
    **gym_options: Any,
) -> EvalEnv:
    """The :class:`EvalEnv` the command line names (``tasks`` as given by ``--tasks``):
    ``gym:ID`` is :class:`GymEval`, a benchmark preset (``pusht``, ``metaworld:mt10``, ...)
    the family its entry in :data:`~cosmos3_gym.envs.presets.PRESETS` builds; only these take
    ``gym_options`` (:data:`GYM_OPTIONS`)."""
    from .presets import preset_eval_env, split_preset_name

    common = dict(suite=suite, tasks=tasks, image_size=image_size,
                  max_episode_steps=max_episode_steps, step_budget=step_budget)
    options = {k: v for k, v in gym_options.items() if v is not None}
    unknown = sorted(set(options) - set(GYM_OPTIONS))
    if unknown:
        raise TypeError(f"make_eval_env: unknown options {unknown}; expected {list(GYM_OPTIONS)}")
    if env.startswith(GYM_PREFIX):
        env_id = env[len(GYM_PREFIX):].strip()
        if not env_id:
            raise ValueError(f"--env {env!r}: expected gym:ID with a registered Gymnasium id, "
                             "e.g. gym:gym_pusht/PushT-v0")
        return PREFIXED_ENVS[GYM_PREFIX].from_cli(**common, env_id=env_id, **options)
    if env not in EVAL_ENVS and split_preset_name(env) is not None:
        return preset_eval_env(env, **common, **options)
    if env not in EVAL_ENVS:
        check_env_name(env)
    family = EVAL_ENVS[env]
    env_kwargs = options.pop("env_kwargs", None) if family.env_kwargs_keys else None
    given = [GYM_OPTIONS[k] for k, v in options.items() if v not in ((), [])]
    if given:
        raise ValueError(f"{', '.join(given)} apply to --env gym:ID and the benchmark presets "
                         f"only; found --env {env}")
    if env_kwargs:
        unknown = sorted(set(env_kwargs) - set(family.env_kwargs_keys))
        if unknown:
            raise ValueError(f"--env-kwargs {unknown}: --env {env} takes "
                             f"{list(family.env_kwargs_keys)} only")
        return family.from_cli(**common, env_kwargs=env_kwargs)
    return family.from_cli(**common)


def _task_id(text: str, n_tasks: int) -> int:
    try:
        task_id = int(text)
    except ValueError:
        raise ValueError(f"LIBERO tasks are task ids 0..{n_tasks - 1}; found {text!r}") from None
    if not 0 <= task_id < n_tasks:
        raise ValueError(f"LIBERO task id must be in 0..{n_tasks - 1}; found {task_id}")
    return task_id


class GymEval(EvalEnv):
    """Registered Gymnasium envs (``--env gym:ID``, and the benchmark presets); a task is a
    :class:`~cosmos3_gym.envs.gym.Variant`: an env id with its instruction and budget.

    The envs come from Gymnasium's registry: one id through :func:`~cosmos3_gym.envs.
    make_gym_vector_env` (``gymnasium.make_vec``, sync or async), several through
    :func:`~cosmos3_gym.envs.gym.make_variant_vector_env` (each slot runs any variant).
    ``import_modules`` register the ids (``gym_pusht``, ``gym_aloha``), ``env_kwargs`` go to
    every env, the image is the observation's own or the ``render()`` frame (``render_size``
    ``(H, W)``), and success follows ``success`` (a :class:`~cosmos3_gym.envs.success.
    SuccessRule` or its text; default ``auto``: the env's own flag, checked before a run by
    :meth:`check_success`). ``image_key`` / ``state_key`` / ``flip`` choose what the generic
    adapter reads (:attr:`adapter`); ``action_map`` is the map the run applies unless told
    otherwise.

    ``env`` is one id or the run's variants. With one id, ``prompts`` is one instruction (one
    task, named by the id), a ``{task name: instruction}`` dict (several tasks of the same env,
    each episode told its own), or ``None`` where the env names its task itself
    (``task_description``). Each episode's prompt reaches its sub-env as the reset option
    ``task_description`` (and its variant as ``variant``), so a slot switches tasks between
    episodes. ``--synthetic`` sizes its random action head to this env's action width.
    """

    # A synthetic (random-weight) model gets an action head as wide as this env's actions.
    sizes_synthetic_head = True

    def __init__(
        self,
        env: str | Sequence[Variant],
        prompts: str | dict[str, str] | None = None,
        *,
        import_modules: Sequence[str] = (),
        env_kwargs: dict[str, Any] | None = None,
        max_episode_steps: int | None = None,
        success: SuccessRule | str | None = None,
        success_key: str | None = None,
        image_key: str | Sequence[str] | None = None,
        state_key: str | None = None,
        render_size: tuple[int, int] | None = None,
        flip: str | None = None,
        action_map: str | None = None,
        env_wrappers: Sequence[str] = (),
        suite: str | None = None,
        label: str | None = None,
    ) -> None:
        import gymnasium

        from .gym import check_render_size, import_env_modules

        import_env_modules(import_modules)
        if isinstance(env, str):
            name = env.rsplit("/", 1)[-1]
            given = {name: prompts} if prompts is None or isinstance(prompts, str) else prompts
            variants = [Variant(task, env, prompt) for task, prompt in given.items()]
        else:
            if prompts is not None:
                raise ValueError("GymEval: variants carry their own prompts; found prompts too")
            variants = list(env)
        if not variants:
            raise ValueError("GymEval: expected one env id or at least one variant; found none")
        for v in variants:
            try:
                gymnasium.spec(v.env_id)
            except gymnasium.error.Error as err:
                raise ValueError(
                    f"--env {label or 'gym:' + v.env_id}: {v.env_id} is not in Gymnasium's "
                    f"registry ({err}); import the package that registers it with --import "
                    "MODULE (e.g. --import gym_pusht)"
                ) from None
        super().__init__([v.task for v in variants])
        self.label = label or f"gym:{variants[0].env_id}"
        self.suite = suite or f"gym:{variants[0].env_id}"
        self.import_modules = tuple(import_modules)
        self.env_kwargs = dict(env_kwargs or {})
        budgets = {}
        for v in variants:
            budget = episode_budget(v.env_id, max_episode_steps or v.max_episode_steps)
            if budget is None:
                raise ValueError(
                    f"--env {self.label}: {v.env_id}'s spec sets no max_episode_steps, so "
                    "episodes would not end; give one with --max-episode-steps N")
            budgets[v.task] = budget
        self._variants = [Variant(v.task, v.env_id, v.prompt, budgets[v.task],
                                  {**self.env_kwargs, **v.env_kwargs}) for v in variants]
        self.variants = [v.as_dict() for v in self._variants]  # what identity() records
        self.prompts = {v.task: v.prompt for v in self._variants}
        self.env_id = variants[0].env_id
        self.max_episode_steps = budgets[variants[0].task]
        if success is not None and success_key is not None:
            raise ValueError(f"--success {success!r} and --success-key {success_key!r} both "
                             "say where success comes from; give one")
        if success_key is not None:
            rule = parse_success(f"info.{success_key}", "--success-key")
        elif isinstance(success, str):
            rule = parse_success(success)
        else:
            rule = success or SuccessRule("flag", declared_by="the env")
        self._rule = rule
        self.success = rule.text
        self.image_key = _keys(image_key)
        self.state_key = state_key
        self.render_size = None if render_size is None else check_render_size(render_size)
        self.flip = flip  # checked by the adapter (cosmos3_gym.policy.adapters.FLIPS)
        self.action_map = action_map
        self.env_wrappers = tuple(env_wrappers)
        distinct = {(v.env_id, repr(sorted(v.env_kwargs.items())), v.max_episode_steps)
                    for v in self._variants}
        self._several_envs = len(distinct) > 1
        self._action_space: Space | None = None
        self._success_checked = False

    @classmethod
    def from_cli(
        cls, *, suite: str | None, tasks: list[str] | None, image_size: int | None,
        max_episode_steps: int | None, step_budget: str | None = None, env_id: str = "",
        prompt: str | dict[str, str] | None = None, **options: Any,
    ) -> GymEval:
        given = {"--suite": suite, "--tasks": tasks, "--image-size": image_size,
                 "--step-budget": step_budget}
        unused = [flag for flag, value in given.items() if value is not None]
        if unused:
            raise ValueError(
                f"{', '.join(unused)} do not apply to --env gym:{env_id}: name its tasks with "
                "--prompt '{\"task\": \"instruction\", ...}', the size of its render() frames "
                "with --render-size HxW, or its own image size with --env-kwargs"
            )
        return cls(env_id, prompt, max_episode_steps=max_episode_steps, **options)

    @property
    def success_rule(self) -> SuccessRule:
        return self._rule

    @property
    def adapter_options(self) -> dict[str, Any]:  # type: ignore[override]
        """The generic adapter's image key(s), state key and flip for this env."""
        keys = self.image_key
        return {"image_key": None if keys is None else (keys[0] if len(keys) == 1
                                                          else tuple(keys)),
                "state_key": self.state_key, "flip": self.flip}

    def episode_budget(self) -> dict[str, Any]:
        budgets = {v.task: v.max_episode_steps for v in self._variants}
        if len(set(budgets.values())) == 1:
            budgets = {self.suite: self.max_episode_steps}
        return {"step_budget": None, "settle_steps": 0, "max_episode_steps": budgets}

    def reset_options(self, episode: Episode) -> dict[str, Any]:
        prompt = self.prompts[episode.task]
        options = {} if prompt is None else {"task_description": prompt}
        if self._several_envs:
            options[VARIANT_OPTION] = episode.task
        return options

    def task_prompt(self, task_index: int) -> str:
        prompt = self.prompts[self.tasks[task_index]]
        if prompt is None:
            raise ValueError(f"--env {self.label} names its own tasks; give them with "
                             "--prompt to know them before an episode runs")
        return prompt

    def single_action_space(self) -> Space:
        """The env's action space, from one sync sub-env built as the runner builds them and
        reset once (then closed), so that what the env gets wrong for this run is one
        ``ValueError`` before any model loads: a package it needs, a ``--env-kwargs`` keyword
        its constructor does not take, no prompt where it names no task, a ``render()`` that
        gives no image, an action space the adapters cannot map (they map actions onto a
        ``Box``)."""
        if self._action_space is None:
            from gymnasium.spaces import Box

            from .gym import foreign_env_errors

            envs = self.make(1, False)
            try:
                space = envs.single_action_space
                if not isinstance(space, Box):
                    raise ValueError(
                        f"--env {self.label}'s action space is {space}; the policy's actions "
                        "are real vectors, which its adapters map onto a Box action space only. "
                        "Expected an env with a Box action space (a discrete env can be wrapped "
                        "in a gymnasium.ActionWrapper that takes a Box: docs/your_own_env.md)")
                with foreign_env_errors(self.env_id, self.env_kwargs):
                    envs.reset(seed=0, options=self.reset_options(self.episode(0, 0, 0)))
            finally:
                envs.close()
            self._action_space = space
        return self._action_space

    def check_success(self) -> None:
        """Before a run: build each variant's sub-env once (as a run wraps it), step it once
        (the action at the middle of its Box) and read its success there, so that an env with
        no success signal, a key that is not there or a flag that holds no bool is one error
        now, not a fault in the middle of a run; variants whose spaces differ (one vector env
        cannot hold them) are refused here too."""
        if self._success_checked:
            return
        import gymnasium

        from .gym import SubEnvWrapping, sub_env_kwargs

        keep = self._kept_keys() if self._several_envs else None
        wrap = SubEnvWrapping(None, "auto", self._rule, None, (), self.env_wrappers, keep)
        first: tuple[Any, Any] | None = None
        for v in self._variants:
            kwargs, frames = sub_env_kwargs(v.env_id, v.env_kwargs, "auto", self.render_size)
            env = dataclasses.replace(wrap, render_size=frames).inner(gymnasium.make(
                v.env_id, max_episode_steps=v.max_episode_steps, **kwargs))
            try:
                spaces = (env.observation_space, env.action_space)
                if first is None:
                    first = spaces
                elif spaces != first:
                    raise ValueError(
                        f"--env {self.label}: variant {v.task!r} ({v.env_id}) has the spaces "
                        f"{spaces}; the first variant has {first}: one run's variants must "
                        "share them (run them apart with --tasks)")
                if not self._rule.counts:
                    continue
                env.reset(seed=0)
                try:
                    info = env.step(_probe_action(env.action_space))[4]
                except ValueError as err:
                    raise ValueError(f"--env {self.label}: {err}") from None
                if "is_success" not in info:
                    threshold = gymnasium.spec(v.env_id).reward_threshold
                    hint = f" (its spec's reward_threshold is {threshold:g})" if threshold else ""
                    raise ValueError(
                        f"--env {self.label}: {v.env_id} reports no success signal: its step "
                        f"info holds {sorted(info)}, neither is_success nor success. Declare "
                        "where success comes from: --success 'info.KEY > X' (a threshold on an "
                        "info number), --success 'return >= X' (the episode's return"
                        f"{hint}), --success terminated (its termination is its success), or "
                        "--success none (returns and lengths only, no rate)")
            finally:
                env.close()
        self._success_checked = True

    def make(
        self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode = AutoresetMode.DISABLED
    ) -> VectorEnv:
        from .gym import make_gym_vector_env, make_variant_vector_env

        if self._several_envs:
            return make_variant_vector_env(
                self._variants, num_envs, async_=async_, autoreset_mode=autoreset_mode,
                success=self._rule, render_size=self.render_size,
                env_wrappers=self.env_wrappers, keep=self._kept_keys())
        v = self._variants[0]
        return make_gym_vector_env(
            v.env_id, num_envs, prompt=v.prompt,
            vectorization_mode="async" if async_ else "sync", autoreset_mode=autoreset_mode,
            max_episode_steps=v.max_episode_steps, success=self._rule,
            render_size=self.render_size, env_wrappers=self.env_wrappers, **v.env_kwargs,
        )

    def _kept_keys(self) -> tuple[str, ...] | None:
        """Variants of one run share the observation keys the policy reads (the camera, the
        state): where the image keys are named, only those (top-level) keys are kept."""
        if self.image_key is None:
            return None
        keys = [k.split("/", 1)[0] for k in [*self.image_key, *(
            [self.state_key] if self.state_key else [])]]
        return tuple(dict.fromkeys(keys))


def _keys(keys: str | Sequence[str] | None) -> list[str] | None:
    if keys is None:
        return None
    keys = [keys] if isinstance(keys, str) else list(keys)
    if not keys or not all(isinstance(k, str) and k for k in keys):
        raise ValueError(f"--image-key: expected one or more observation keys; found {keys!r}")
    return keys


def _probe_action(space: Space) -> Any:
    """A deterministic action for the success probe: a Box's middle (its bounds where one is
    infinite), else the space's own zero-like sample."""
    from gymnasium.spaces import Box

    if isinstance(space, Box):
        low, high = np.asarray(space.low, np.float64), np.asarray(space.high, np.float64)
        middle = np.where(np.isfinite(low) & np.isfinite(high), (low + high) / 2.0,
                          np.clip(0.0, low, high))
        return middle.astype(space.dtype)
    space.seed(0)
    return space.sample()


PREFIXED_ENVS[GYM_PREFIX] = GymEval
