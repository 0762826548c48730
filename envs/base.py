"""What a run of episodes needs to know about an env: the episode, the seed rule, and the
:class:`EvalEnv` base class every env family subclasses.

An :class:`EvalEnv` names a family's tasks, builds its vector env, says how a sub-env starts a
given episode (``reset_options``), what each task's instruction is, and its action space and
episode budget without building a simulator. The episode runner
(:mod:`cosmos3_gym.runner`), the evaluation and the rollouts drive every env through it. The
families live beside their envs (:mod:`~cosmos3_gym.envs.color_reach`,
:mod:`~cosmos3_gym.envs.libero_eval`, :mod:`~cosmos3_gym.envs.metaworld`,
:mod:`~cosmos3_gym.envs.gym_eval`, :mod:`~cosmos3_gym.envs.maniskill`); the command line finds
them by name in :mod:`~cosmos3_gym.envs.names`. A new env is one subclass and one entry there.

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

import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, overload

import numpy as np
from gymnasium.spaces import Space
from gymnasium.vector import AutoresetMode, VectorEnv

from .success import SuccessRule

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


@dataclass(frozen=True)
class Episode:
    """One evaluation episode and everything needed to run it again exactly."""

    task: str  # stable task name, e.g. "red" or "libero_10/3"
    task_index: int  # position of the task in the run's task list
    suite: str  # "color_reach" or the LIBERO suite
    trial: int
    seed: int  # env reset seed
    init_state_id: int | None
    # The name the episode's seeds derive from (its env seed, its chunks' noise): the task's,
    # but where a family says two tasks are one episode seen two ways (a LIBERO-PRO perturbation
    # of a task and the task), theirs is one name, so an arm and its control get the same seeds.
    seed_task: str

    @property
    def key(self) -> tuple[str, int]:
        return self.task, self.trial

    @property
    def seed_key(self) -> tuple[str, int]:
        """``(name, trial)`` the episode's seeds derive from (:attr:`seed_task`)."""
        return self.seed_task, self.trial


class EpisodeSet(Sequence[Episode]):
    """The episodes of a run, task-major (``k = task_index * trials + trial``), each computed
    when it is asked for: a run of any length costs nothing before it starts.

    >>> from cosmos3_gym.envs import ColorReachEval
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
    # Env steps per second: what turns a latency given in time into steps under real-time
    # execution (--latency 150ms); None: not declared (--control-hz gives it).
    control_hz: float | None = None
    # What a stall sends (real-time execution, nothing left to execute): "repeat" the last
    # action (position targets), "still" (zero: velocity or delta actions) or "still-gripper"
    # (zero, the gripper, the last dimension, as last commanded).
    hold: str = "repeat"

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

        >>> from cosmos3_gym.envs import ColorReachEval
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
        seed_task = self.seed_task(task_index)
        return Episode(
            task=task,
            task_index=task_index,
            suite=self.task_suite(task_index),
            trial=trial,
            seed=derive_seed(global_seed, seed_task, trial),
            init_state_id=self.init_state_id(trial),
            seed_task=seed_task,
        )

    def seed_task(self, task_index: int) -> str:
        """The name task ``task_index``'s seeds derive from: its own name; a family whose
        tasks come in variants of one episode (a perturbed suite beside its control) names the
        control's, so both draw the same seeds."""
        return self.tasks[task_index]

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


def make_render_context_current(env: Any) -> None:
    """Make the GL context of ``env``'s Gymnasium MuJoCo renderer current, if it has one (a
    no-op for any other env). Each such env renders in its own context, but Gymnasium makes it
    current only when it builds it: in one process, another env built since leaves its own
    current (this env's frame is then drawn with that env's meshes and textures), and one
    closed since leaves none (a black frame). Call it before each ``render()``."""
    renderer = getattr(getattr(env, "unwrapped", env), "mujoco_renderer", None)
    make_current = getattr(getattr(renderer, "viewer", None), "make_context_current", None)
    if make_current is not None:
        make_current()


def _plain(value: Any) -> bool:
    """Whether ``value`` is JSON data as it is (a setting a run folder can record)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in value.items())
    return False

