"""Meta-World tasks as Gymnasium envs with images and prompts, and a vector env over several tasks.

Needs the ``metaworld`` extra (``metaworld`` 3.0, MuJoCo below 3.17) and a headless GL
(``MUJOCO_GL=egl``). Meta-World is imported only when an env is built, and the simulator is
created at the first ``reset()``, inside the process that steps it.

Meta-World's own conventions, kept: the 4-D action ``Box(-1, 1)`` (hand-target xyz deltas,
1 cm per unit, and the gripper effort, +1 closes), ``info["success"]`` at every step, episodes of
at most 500 steps, and a layout (object and goal positions) that is one of the 50 that
``metaworld.MT1(task, seed=...)`` draws. Meta-World ships no language; the one-sentence
instructions in :data:`METAWORLD_TASK_DESCRIPTIONS` are ours. :class:`MetaWorldEval` is its env
family (``--env metaworld``).
"""

from __future__ import annotations

import atexit
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any, Literal

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from .base import Episode, EvalEnv, make_render_context_current
from .chunking import make_held_env
from .limits import OwnTimeLimit

METAWORLD_MAX_EPISODE_STEPS = 500  # Meta-World's max_path_length; a step past it raises
METAWORLD_LAYOUTS_PER_TASK = 50  # layouts metaworld.MT1 draws per task
# The benchmark seed of the layouts (metaworld.MT1(task, seed=...)): LeRobot's, so that layout k
# is the same scene in both harnesses.
METAWORLD_LAYOUT_SEED = 42
# Cameras whose frames Meta-World renders rotated by 180 degrees; the env turns them upright.
# corner2 is moved as LeRobot and RLinf move it, to frame the table as their policies saw it.
METAWORLD_CAMERAS: dict[str, tuple[float, float, float] | None] = {
    "corner": None, "corner2": (0.75, 0.075, 0.7), "corner3": None,
}
_STATE_DIM = 4  # hand position (3) + gripper opening (1), the first four of the 39-D state

# One instruction per task, written for this project (Meta-World ships none).
METAWORLD_TASK_DESCRIPTIONS: dict[str, str] = {
    "assembly-v3": "pick up the ring and put it onto the peg",
    "basketball-v3": "pick up the ball and drop it into the basket",
    "bin-picking-v3": "move the puck from the left bin to the right bin",
    "box-close-v3": "pick up the lid and put it on the box",
    "button-press-topdown-v3": "press the button down from above",
    "button-press-topdown-wall-v3": "reach over the wall and press the button down from above",
    "button-press-v3": "push the button in from the front",
    "button-press-wall-v3": "reach around the wall and push the button in",
    "coffee-button-v3": "press the button on the coffee machine",
    "coffee-pull-v3": "pull the mug out from under the coffee machine",
    "coffee-push-v3": "push the mug under the coffee machine",
    "dial-turn-v3": "turn the dial half a turn",
    "disassemble-v3": "lift the ring off the peg",
    "door-close-v3": "swing the door closed",
    "door-lock-v3": "turn the door lock down to lock it",
    "door-open-v3": "pull the door open by its handle",
    "door-unlock-v3": "turn the door lock up to unlock it",
    "hand-insert-v3": "put the gripper into the hole in the table",
    "drawer-close-v3": "push the drawer closed",
    "drawer-open-v3": "pull the drawer open",
    "faucet-open-v3": "turn the faucet handle to the left",
    "faucet-close-v3": "turn the faucet handle to the right",
    "hammer-v3": "pick up the hammer and drive the nail into the wall",
    "handle-press-side-v3": "press the handle down from the side",
    "handle-press-v3": "press the handle down",
    "handle-pull-side-v3": "pull the handle up from the side",
    "handle-pull-v3": "pull the handle up",
    "lever-pull-v3": "pull the lever up",
    "pick-place-wall-v3": "pick up the puck and place it at the goal behind the wall",
    "pick-out-of-hole-v3": "pick the peg out of the hole and lift it",
    "pick-place-v3": "pick up the puck and place it at the goal",
    "plate-slide-v3": "slide the plate into the goal",
    "plate-slide-side-v3": "slide the plate sideways into the goal",
    "plate-slide-back-v3": "slide the plate back out of the goal",
    "plate-slide-back-side-v3": "slide the plate sideways back out of the goal",
    "peg-insert-side-v3": "pick up the peg and insert it into the hole from the side",
    "peg-unplug-side-v3": "pull the peg out of the hole sideways",
    "soccer-v3": "push the ball into the goal",
    "stick-push-v3": "pick up the stick and push the bottle with it",
    "stick-pull-v3": "pick up the stick and pull the bottle with it",
    "push-v3": "push the puck to the goal",
    "push-wall-v3": "push the puck around the wall to the goal",
    "push-back-v3": "pull the puck back to the goal",
    "reach-v3": "move the gripper to the goal",
    "reach-wall-v3": "reach over the wall to the goal",
    "shelf-place-v3": "pick up the puck and put it on the shelf",
    "sweep-into-v3": "sweep the puck into the hole",
    "sweep-v3": "sweep the puck off the edge of the table",
    "window-open-v3": "slide the window open",
    "window-close-v3": "slide the window closed",
}
METAWORLD_TASKS: tuple[str, ...] = tuple(METAWORLD_TASK_DESCRIPTIONS)
# Meta-World's MT10 task list.
METAWORLD_MT10: tuple[str, ...] = (
    "reach-v3", "push-v3", "pick-place-v3", "door-open-v3", "drawer-open-v3", "drawer-close-v3",
    "button-press-topdown-v3", "peg-insert-side-v3", "window-open-v3", "window-close-v3",
)


def _check_task(task: str) -> str:
    if task not in METAWORLD_TASK_DESCRIPTIONS:
        raise ValueError(
            f"unknown Meta-World task {task!r}; expected one of {list(METAWORLD_TASKS)}")
    return task


def _check_switch(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"metaworld {name} must be true or false; found {value!r}")


def check_metaworld_tasks(tasks: Sequence[str]) -> None:
    """A ``ValueError`` naming the tasks that are not Meta-World's."""
    unknown = [t for t in tasks if t not in METAWORLD_TASKS]
    if unknown:
        raise ValueError(f"unknown Meta-World tasks {unknown}; expected some of "
                         f"{list(METAWORLD_TASKS)}")


def check_metaworld_runs() -> None:
    """Before a run: the ``metaworld`` extra is installed and MuJoCo renders here
    (``MUJOCO_GL``); a ``ValueError`` naming the fix otherwise."""
    from .requirements import require_mujoco_rendering, require_package

    require_package("metaworld", env="metaworld", extra="metaworld")
    require_mujoco_rendering("metaworld")


@functools.cache
def _benchmark(task: str, layout_seed: int) -> Any:
    """``metaworld.MT1`` (50 layouts, slow to draw: docs/benchmarks.md, "Meta-World on a CPU"),
    once per process and task."""
    import metaworld

    return metaworld.MT1(task, seed=layout_seed)


# The envs whose renderer is open: closed at exit while EGL still works, since Meta-World's
# (MuJoCo's) EGL context freed later, in `__del__`, prints an "Exception ignored" traceback.
# Registered after the first render, that is after mujoco.egl's own exit handler (which
# terminates the EGL display), so that it runs before it.
_OPEN_SIMULATORS: weakref.WeakSet[MetaWorldEnv] = weakref.WeakSet()


@functools.cache
def _close_simulators_at_exit() -> None:
    atexit.register(lambda: [env.close() for env in list(_OPEN_SIMULATORS)])


class MetaWorldEnv(OwnTimeLimit, gym.Env[dict[str, np.ndarray], np.ndarray]):
    """One Meta-World task as a ``gymnasium.Env`` with an upright camera image and a prompt.

    * Observation: ``"image"`` uint8 ``[S, S, 3]``, the chosen camera **upright** (Meta-World
      renders its corner cameras rotated by 180 degrees; the env turns them back, as LeRobot and
      RLinf do), and ``"state"`` float32 ``[4]``: hand position and gripper opening. The full
      39-D Meta-World state is the ``raw_observation`` attribute (what the scripted experts
      read). ``render()`` returns the same frame.
    * Action: ``Box(-1, 1, (4,))``, Meta-World's own: hand-target xyz deltas and gripper effort
      (+1 closes).
    * Layout: ``options={"layout_id": k}`` picks layout ``k`` of the 50 that
      ``metaworld.MT1(task, seed=layout_seed)`` draws; without it a seeded reset takes
      ``layout_ids[seed % len(layout_ids)]`` and an unseeded one the next of ``layout_ids``.
      ``options={"task": name, "layout_id": k}`` switches task (the simulator is rebuilt).
      The same (task, layout) gives the same frames in any process.
    * ``shadows=False`` renders without the lights' shadow maps: about 5x faster under
      software GL (Mesa's llvmpipe: 34 ms instead of 183 ms a frame at 128 px on a 2-core
      machine), other frames than Meta-World's own (a mean 7 of 255 per pixel), so only for
      policies trained on them.
    * ``terminated`` on success (reward = Meta-World's shaped reward; ``info["is_success"]``,
      ``info["success"]``), ``truncated`` after ``max_episode_steps`` (at most 500).
      ``terminate_on_success=False``: every episode runs its ``max_episode_steps`` (never
      terminated), the shaped reward goes on after the goal (the return then ranks an early
      success above a late one, and a near miss above a far one), and ``info["is_success"]``
      says whether the goal was reached at any step so far, so the episode's success is the
      same as with termination; ``info["success"]`` stays Meta-World's flag for this step.
    * ``task_description`` (alias ``task``), ``task_name``, ``layout_id`` are attributes.

    Example (needs the ``metaworld`` extra and ``MUJOCO_GL=egl``; it builds a simulator):
        >>> env = MetaWorldEnv("reach-v3", image_size=64)  # doctest: +SKIP
        >>> obs, info = env.reset(options={"layout_id": 3})  # doctest: +SKIP
        >>> obs["image"].shape, obs["state"].shape, env.task_description  # doctest: +SKIP
        ((64, 64, 3), (4,), 'move the gripper to the goal')
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 80}
    spec_id = "cosmos3_gym/MetaWorld-v0"

    def __init__(
        self,
        task: str = "reach-v3",
        *,
        layout_ids: Sequence[int] | None = None,
        layout_seed: int = METAWORLD_LAYOUT_SEED,
        camera: str = "corner2",
        image_size: int = 224,
        max_episode_steps: int = METAWORLD_MAX_EPISODE_STEPS,
        render_mode: Literal["rgb_array"] | None = "rgb_array",
        shadows: bool = True,
        terminate_on_success: bool = True,
    ) -> None:
        _check_switch("shadows", shadows)
        _check_switch("terminate_on_success", terminate_on_success)
        if camera not in METAWORLD_CAMERAS:
            raise ValueError(f"camera must be one of {list(METAWORLD_CAMERAS)}, got {camera!r}")
        if not 1 <= int(max_episode_steps) <= METAWORLD_MAX_EPISODE_STEPS:
            raise ValueError(
                f"max_episode_steps must be in 1..{METAWORLD_MAX_EPISODE_STEPS} (Meta-World "
                f"raises past its {METAWORLD_MAX_EPISODE_STEPS} steps), got {max_episode_steps}"
            )
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        self.camera = camera
        self.image_size = int(image_size)
        self.layout_seed = int(layout_seed)
        self.max_episode_steps = int(max_episode_steps)
        self.render_mode = render_mode
        self.shadows = shadows
        self.terminate_on_success = terminate_on_success
        self._spec_kwargs = {
            "task": task, "layout_ids": None if layout_ids is None else list(layout_ids),
            "layout_seed": self.layout_seed, "camera": camera, "image_size": self.image_size,
            "max_episode_steps": self.max_episode_steps, "render_mode": render_mode,
            "shadows": shadows, "terminate_on_success": terminate_on_success,
        }
        image = spaces.Box(0, 255, (self.image_size, self.image_size, 3), np.uint8)
        state = spaces.Box(-np.inf, np.inf, (_STATE_DIM,), np.float32)
        self.observation_space = spaces.Dict({"image": image, "state": state})
        self.action_space = spaces.Box(-1.0, 1.0, (4,), np.float32)
        self._sim: Any = None
        self._sim_task: str | None = None
        self._elapsed = 0
        self._reached = False
        self._next_position = 0
        self._frame: np.ndarray | None = None
        self.raw_observation: np.ndarray | None = None
        self.layout_id: int | None = None
        self._set_task(task, layout_ids)

    @property
    def task(self) -> str:
        return self.task_description

    def _set_task(self, task: str, layout_ids: Sequence[int] | None) -> None:
        self.task_name = _check_task(task)
        self.task_description = METAWORLD_TASK_DESCRIPTIONS[task]
        ids = range(METAWORLD_LAYOUTS_PER_TASK) if layout_ids is None else layout_ids
        self.layout_ids = [self._check_layout_id(k) for k in ids]
        if not self.layout_ids:
            raise ValueError("layout_ids must not be empty")
        self._next_position = 0

    @staticmethod
    def _check_layout_id(k: int) -> int:
        if not 0 <= int(k) < METAWORLD_LAYOUTS_PER_TASK:
            raise ValueError(
                f"Meta-World layouts are 0..{METAWORLD_LAYOUTS_PER_TASK - 1}, got {k}")
        return int(k)

    def _build_sim(self) -> None:
        self.close()
        benchmark = _benchmark(self.task_name, self.layout_seed)
        sim = benchmark.train_classes[self.task_name](
            render_mode="rgb_array", camera_name=self.camera,
            width=self.image_size, height=self.image_size,
        )
        position = METAWORLD_CAMERAS[self.camera]
        if position is not None:
            sim.model.cam_pos[sim.model.camera(self.camera).id] = position
        if not self.shadows:
            sim.model.light_castshadow[:] = 0
        self._sim, self._sim_task = sim, self.task_name
        _OPEN_SIMULATORS.add(self)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        super().reset(seed=seed)
        options = dict(options or {})
        if "task" in options:
            if "layout_id" not in options:
                raise ValueError("reset(options={'task': ...}) also needs 'layout_id', so the "
                                 f"episode is explicit; got options {sorted(options)}")
            self._set_task(str(options["task"]), None)
        if "layout_id" in options:
            self.layout_id = self._check_layout_id(options["layout_id"])
        else:
            position = self._next_position if seed is None else seed % len(self.layout_ids)
            self.layout_id = self.layout_ids[position]
            self._next_position = (position + 1) % len(self.layout_ids)
        if self._sim_task != self.task_name:
            self._build_sim()
        self._sim.set_task(_benchmark(self.task_name, self.layout_seed).train_tasks[self.layout_id])
        raw, _ = self._sim.reset()
        self._elapsed = 0
        self._reached = False
        return self._observation(raw), {"is_success": False, "layout_id": self.layout_id}

    def step(
        self, action: np.ndarray
    ) -> tuple[dict[str, np.ndarray], float, bool, bool, dict[str, Any]]:
        if self._sim is None or self.layout_id is None:
            raise RuntimeError("MetaWorldEnv.step() called before reset()")
        action = np.asarray(action, dtype=np.float32)
        if action.shape != (4,):
            raise ValueError(f"action must have shape (4,), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ValueError(f"action must be finite, got {action.tolist()}")
        raw, reward, _, _, info = self._sim.step(np.clip(action, -1.0, 1.0))
        self._elapsed += 1
        self._reached = self._reached or bool(info["success"])
        terminated = self._reached and self.terminate_on_success
        truncated = not terminated and self._elapsed >= self.max_episode_steps
        info = {**info, "is_success": self._reached, "layout_id": self.layout_id}
        return self._observation(raw), float(reward), terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode != "rgb_array" or self._frame is None:
            return None
        return self._frame.copy()

    def close(self) -> None:
        if self._sim is not None:
            self._sim.close()
            self._sim, self._sim_task = None, None
        _OPEN_SIMULATORS.discard(self)

    def _observation(self, raw: np.ndarray) -> dict[str, np.ndarray]:
        self.raw_observation = np.asarray(raw, dtype=np.float64).copy()
        make_render_context_current(self._sim)  # another env built or closed since: base.py
        # Meta-World's corner cameras come out rotated by 180 degrees: reversing H and W turns
        # them upright (the orientation test checks it against the hand moving up).
        self._frame = np.ascontiguousarray(self._sim.render()[::-1, ::-1])
        _close_simulators_at_exit()  # after the first render: see _OPEN_SIMULATORS
        return {"image": self._frame.copy(),
                "state": self.raw_observation[:_STATE_DIM].astype(np.float32)}


class MetaWorldExpert:
    """Meta-World's scripted expert for one task (``metaworld.policies``): the 39-D state in,
    Meta-World's 4-D action out. Solves most tasks in well under 500 steps.

    >>> expert = MetaWorldExpert("reach-v3")  # doctest: +SKIP
    >>> expert.act(env.raw_observation).shape  # doctest: +SKIP
    (4,)
    """

    # Expert classes whose names do not follow Sawyer<Task>V3Policy.
    _CLASS_NAMES = {"peg-insert-side-v3": "SawyerPegInsertionSideV3Policy"}

    def __init__(self, task: str) -> None:
        import metaworld.policies

        _check_task(task)
        name = self._CLASS_NAMES.get(
            task, "Sawyer" + "".join(w.capitalize() for w in task[:-3].split("-")) + "V3Policy")
        self.task = task
        self._policy = getattr(metaworld.policies, name)()

    def act(self, raw_observation: np.ndarray) -> np.ndarray:
        return np.asarray(self._policy.get_action(raw_observation), dtype=np.float32)


def make_metaworld_vector_env(
    tasks: str | Sequence[str],
    num_envs: int,
    *,
    layout_ids: Sequence[int] | None = None,
    layout_seed: int = METAWORLD_LAYOUT_SEED,
    camera: str = "corner2",
    image_size: int = 224,
    max_episode_steps: int = METAWORLD_MAX_EPISODE_STEPS,
    shadows: bool = True,
    terminate_on_success: bool = True,
    async_: bool = False,
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    context: str | None = "forkserver",
) -> VectorEnv:
    """A ``VectorEnv`` of :class:`MetaWorldEnv`: env ``i`` runs ``tasks[i % len(tasks)]``.

    The ``m`` envs sharing a task split its layouts (the ``j``-th takes layouts ``j, j+m, ...``
    of ``layout_ids``, all 50 by default), so together they see each layout once before one
    repeats. Each sub-env is wrapped (outermost) in :class:`EpisodeEndHold`, ``wrappers``
    inside it, as :func:`~cosmos3_gym.envs.make_libero_vector_env` does, so the result can be
    chunk-stepped. Prompts: ``envs.get_attr("task_description")``.

    Example (needs the ``metaworld`` extra and ``MUJOCO_GL=egl``):
        >>> envs = make_metaworld_vector_env(["reach-v3", "push-v3"], 2, image_size=64)  # doctest: +SKIP
        >>> obs, _ = envs.reset(seed=0)  # doctest: +SKIP
        >>> obs["image"].shape, envs.get_attr("task_description")  # doctest: +SKIP
        ((2, 64, 64, 3), ('move the gripper to the goal', 'push the puck to the goal'))
    """  # noqa: E501
    if num_envs < 1:
        raise ValueError(f"num_envs must be at least 1, got {num_envs}")
    names = [tasks] if isinstance(tasks, str) else list(tasks)
    if not names:
        raise ValueError("tasks is an empty list")
    for name in names:
        _check_task(name)
    assigned = [names[i % len(names)] for i in range(num_envs)]
    pool = list(range(METAWORLD_LAYOUTS_PER_TASK)) if layout_ids is None else list(layout_ids)
    env_fns = []
    for i, task in enumerate(assigned):
        sharing = [j for j, other in enumerate(assigned) if other == task]
        rank, stride = sharing.index(i), len(sharing)
        env_fns.append(functools.partial(
            make_held_env, MetaWorldEnv, wrappers=tuple(wrappers), task=task,
            layout_ids=pool[rank % len(pool)::stride], layout_seed=layout_seed, camera=camera,
            image_size=image_size, max_episode_steps=max_episode_steps, shadows=shadows,
            terminate_on_success=terminate_on_success,
        ))
    if async_:
        return gym.vector.AsyncVectorEnv(env_fns, autoreset_mode=autoreset_mode, context=context)
    return gym.vector.SyncVectorEnv(env_fns, autoreset_mode=autoreset_mode)


class MetaWorldEval(EvalEnv):
    """Meta-World; a task is its name (``reach-v3``); trial ``t`` runs layout ``t % 50`` of the
    task's 50 (``metaworld.MT1(task, seed=42)``, LeRobot's set), seen from the corner2 camera.
    Default tasks: MT10's."""

    suite = "metaworld"
    adapter = "metaworld"
    domain = "metaworld"
    control_hz = 80.0  # frame_skip 5 x 2.5 ms; position deltas + gripper effort
    hold = "still-gripper"
    # shadows=False: software GL renders about 5x faster (MetaWorldEnv), other frames.
    # terminate_on_success=False: every episode runs to its step limit, its success whether the
    # goal was reached at any step (MetaWorldEnv); a return reward then grades every episode.
    env_kwargs_keys = ("shadows", "terminate_on_success")

    def __init__(self, tasks: list[str] | None = None, *, image_size: int = 224,
                 max_episode_steps: int | None = None, shadows: bool = True,
                 terminate_on_success: bool = True) -> None:
        _check_switch("shadows", shadows)
        _check_switch("terminate_on_success", terminate_on_success)
        tasks = list(METAWORLD_MT10) if tasks is None else tasks
        check_metaworld_runs()  # the extra and a renderer: a worker would fault on each
        check_metaworld_tasks(tasks)
        super().__init__(tasks)
        self.image_size = image_size
        self.max_episode_steps = max_episode_steps or 500
        self.shadows = shadows
        self.terminate_on_success = terminate_on_success

    @classmethod
    def from_cli(
        cls, *, suite: str | None, tasks: list[str] | None, image_size: int | None,
        max_episode_steps: int | None, step_budget: str | None = None,
        env_kwargs: dict[str, Any] | None = None,
    ) -> MetaWorldEval:
        if suite not in (None, "metaworld"):
            raise ValueError(f"--suite {suite!r} does not apply to --env metaworld; name its "
                             "tasks with --tasks (e.g. reach-v3,push-v3)")
        if step_budget is not None:
            raise ValueError(f"--step-budget {step_budget!r} applies to --env libero only; "
                             "--env metaworld takes --max-episode-steps (at most 500)")
        return cls(tasks, image_size=image_size or 224, max_episode_steps=max_episode_steps,
                   **(env_kwargs or {}))

    def episode_budget(self) -> dict[str, Any]:
        return {"step_budget": None, "settle_steps": 0,
                "max_episode_steps": {self.suite: self.max_episode_steps}}

    def init_state_id(self, trial: int) -> int | None:
        return trial % METAWORLD_LAYOUTS_PER_TASK

    def task_prompt(self, task_index: int) -> str:
        return METAWORLD_TASK_DESCRIPTIONS[self.tasks[task_index]]

    def reset_options(self, episode: Episode) -> dict[str, Any]:
        return {"task": episode.task, "layout_id": episode.init_state_id}

    def single_action_space(self) -> spaces.Space:
        return spaces.Box(-1.0, 1.0, (4,), np.float32)

    def make(
        self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode = AutoresetMode.DISABLED
    ) -> VectorEnv:
        return make_metaworld_vector_env(
            self.tasks, num_envs, async_=async_, image_size=self.image_size,
            max_episode_steps=self.max_episode_steps, autoreset_mode=autoreset_mode,
            shadows=self.shadows, terminate_on_success=self.terminate_on_success,
        )
