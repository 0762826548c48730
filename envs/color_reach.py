"""ColorReach: a tiny multi-task env whose task is named by the prompt, with a scripted expert.

It needs no simulator download and steps in microseconds, so it serves the tests, the CPU demo
and the shipped tiny checkpoint. The arena is the unit square seen from above; coloured targets
sit at the centres of distinct cells of a 4x4 grid and a white agent square must reach the one the
prompt names. Every target is drawn in every episode, so a policy that ignores the prompt (or
reads another env's prompt) goes to the wrong target and fails. :class:`ColorReachEval` is its
env family (``--env color_reach``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv

from .base import Episode, EvalEnv
from .chunking import make_held_env
from .limits import OwnTimeLimit

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (230, 40, 40),
    "green": (40, 200, 60),
    "blue": (50, 90, 240),
    "yellow": (240, 220, 40),
}
AGENT_COLOR = (255, 255, 255)
GRID = 4  # targets and agent start on the centres of a GRID x GRID lattice of cells


def prompt_for(color: str) -> str:
    """The task description of an episode whose goal is ``color``."""
    return f"reach the {color} target"


@dataclass(frozen=True)
class ColorReachState:
    """Everything a scripted expert or a data collector needs, without touching env privates.

    Positions are (x, y) in arena units, x to the right and y downwards (image convention).
    """

    agent: np.ndarray  # (2,) float64
    targets: dict[str, np.ndarray]  # colour -> (2,) float64 centre
    goal: str
    max_speed: float

    @property
    def goal_position(self) -> np.ndarray:
        return self.targets[self.goal]


class ColorReachEnv(OwnTimeLimit, gym.Env[np.ndarray, np.ndarray]):
    """Reach the coloured target that the prompt names.

    * Observation: uint8 image ``[S, S, 3]`` (``S = image_size``, default 128), dark background,
      targets as filled squares half a cell wide, the agent as a smaller white square on top.
    * Action: ``Box(-1, 1, (2,), float32)``, a velocity ``(dx, dy)`` scaled by ``max_speed``
      arena units per step. Finite out-of-range actions are clipped to ``[-1, 1]`` (policies emit
      unbounded floats); NaN or infinite actions raise ``ValueError``. The agent is clipped to
      the arena.
    * Prompt: ``task_description`` (alias ``task``), e.g. ``"reach the red target"``; the goal
      colour is drawn from the seeded RNG at each reset, or given by ``options={"target": c}``.
    * Reward 1.0 and ``terminated`` when the agent centre is within ``success_radius`` of the goal
      centre (``info["is_success"]``; ``info["target_index"]`` is the goal's index in
      ``colors``: every info holds both keys), else 0.0; ``truncated`` after ``max_episode_steps``
      (also ``spec.max_episode_steps`` and ``_max_episode_steps``). Touching other targets is
      neither penalised nor terminal.
    * ``render()`` (``render_mode="rgb_array"``, the default) returns the observation frame, which
      is already upright.

    Fully deterministic given the reset seed.

    Example:
        >>> env = ColorReachEnv()
        >>> obs, info = env.reset(seed=0, options={"target": "blue"})
        >>> env.task_description, obs.shape, obs.dtype
        ('reach the blue target', (128, 128, 3), dtype('uint8'))
        >>> expert = ColorReachExpert()
        >>> for _ in range(40):
        ...     obs, reward, terminated, truncated, info = env.step(expert(env.state_dict()))
        ...     if terminated or truncated:
        ...         break
        >>> info["is_success"], reward
        (True, 1.0)
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    spec_id = "cosmos3_gym/ColorReach-v0"

    def __init__(
        self,
        render_mode: str | None = "rgb_array",
        *,
        image_size: int = 128,
        colors: tuple[str, ...] = ("red", "green", "blue", "yellow"),
        max_speed: float = 0.08,
        success_radius: float = 0.06,
        max_episode_steps: int = 40,
    ) -> None:
        if render_mode not in (None, "rgb_array"):
            raise ValueError(f"render_mode must be None or 'rgb_array', got {render_mode!r}")
        unknown = [c for c in colors if c not in COLORS]
        if unknown or len(set(colors)) != len(colors):
            raise ValueError(
                f"colors must be distinct names from {sorted(COLORS)}, got {list(colors)}"
            )
        # One cell must stay free for the agent's start.
        if not 2 <= len(colors) < GRID * GRID:
            raise ValueError(f"need between 2 and {GRID * GRID - 1} colours, got {len(colors)}")
        if image_size < 4 * GRID:
            raise ValueError(f"image_size must be at least {4 * GRID}, got {image_size}")
        self.render_mode = render_mode
        self.image_size = image_size
        self.colors = tuple(colors)
        self.max_speed = float(max_speed)
        self.success_radius = float(success_radius)
        self.max_episode_steps = int(max_episode_steps)
        self._spec_kwargs = {
            "render_mode": render_mode,
            "image_size": image_size,
            "colors": self.colors,
            "max_speed": self.max_speed,
            "success_radius": self.success_radius,
            "max_episode_steps": self.max_episode_steps,
        }

        self.observation_space = spaces.Box(0, 255, (image_size, image_size, 3), np.uint8)
        self.action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

        self._agent = np.zeros(2)
        self._targets: dict[str, np.ndarray] = {}
        self._goal = self.colors[0]
        self._elapsed = 0
        self.task_description = prompt_for(self._goal)

    @property
    def task(self) -> str:
        return self.task_description

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        cells = self.np_random.choice(GRID * GRID, size=len(self.colors) + 1, replace=False)
        centres = [self._cell_centre(int(c)) for c in cells]
        self._targets = dict(zip(self.colors, centres[:-1], strict=True))
        self._agent = centres[-1].copy()
        # The goal is drawn even when given, so an option never shifts the RNG stream.
        drawn = self.colors[int(self.np_random.integers(len(self.colors)))]
        goal = options.get("target", drawn)
        if goal not in self._targets:
            raise ValueError(f"options['target'] must be one of {list(self.colors)}, got {goal!r}")
        self._goal = goal
        self._elapsed = 0
        self.task_description = prompt_for(goal)
        return self._render_frame(), self._info(success=False)

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        action = np.asarray(action, dtype=np.float64)
        if action.shape != (2,):
            raise ValueError(f"action must have shape (2,), got {action.shape}")
        if not np.all(np.isfinite(action)):
            raise ValueError(f"action must be finite, got {action.tolist()}")
        velocity = np.clip(action, -1.0, 1.0) * self.max_speed
        self._agent = np.clip(self._agent + velocity, 0.0, 1.0)
        self._elapsed += 1
        success = self._distance_to_goal() <= self.success_radius
        truncated = not success and self._elapsed >= self.max_episode_steps
        return self._render_frame(), float(success), success, truncated, self._info(success)

    def render(self) -> np.ndarray | None:
        return self._render_frame() if self.render_mode == "rgb_array" else None

    def preview(self, actions: np.ndarray) -> np.ndarray:
        """uint8 ``[len(actions), S, S, 3]``: the frames :meth:`step` would render for each of
        ``actions`` in turn from the current state, which it leaves as it was (the env is
        deterministic, so these are exactly the frames the chunk would produce)."""
        agent, elapsed = self._agent.copy(), self._elapsed
        try:
            frames = [self.step(action)[0] for action in actions]
            return np.stack(frames) if frames else np.empty((0, *self.observation_space.shape),
                                                            np.uint8)
        finally:
            self._agent, self._elapsed = agent, elapsed

    def state_dict(self) -> ColorReachState:
        """A copy of the current state (for experts, data collection and tests)."""
        return ColorReachState(
            agent=self._agent.copy(),
            targets={c: p.copy() for c, p in self._targets.items()},
            goal=self._goal,
            max_speed=self.max_speed,
        )

    def _cell_centre(self, cell: int) -> np.ndarray:
        row, col = divmod(cell, GRID)
        return (np.array([col, row], dtype=np.float64) + 0.5) / GRID

    def _distance_to_goal(self) -> float:
        return float(np.linalg.norm(self._agent - self._targets[self._goal]))

    def _info(self, success: bool) -> dict[str, Any]:
        # The same keys with the same numeric types at every reset and step: tools that build
        # specs from infos (TorchRL's) cannot hold a string. The goal's name is in the prompt.
        return {"is_success": bool(success), "target_index": self.colors.index(self._goal)}

    def _render_frame(self) -> np.ndarray:
        size = self.image_size
        frame = np.full((size, size, 3), 16, dtype=np.uint8)
        target_half = 0.25 / GRID  # targets are half a cell wide
        for color, centre in self._targets.items():
            self._fill_square(frame, centre, target_half, COLORS[color])
        self._fill_square(frame, self._agent, 0.15 / GRID, AGENT_COLOR)
        return frame

    def _fill_square(
        self, frame: np.ndarray, centre: np.ndarray, half: float, color: tuple[int, int, int]
    ) -> None:
        size = frame.shape[0]
        x0, y0 = np.floor((centre - half) * size).astype(int).clip(0, size)
        x1, y1 = np.ceil((centre + half) * size).astype(int).clip(0, size)
        frame[y0:y1, x0:x1] = color


class ColorReachExpert:
    """Scripted expert: head straight for the goal at full speed, stop on it.

    It reads a :class:`ColorReachState` (``env.unwrapped.state_dict()``), never the image. Since
    the env is deterministic, :meth:`chunk` plans an exact open-loop action chunk.

    Example:
        >>> env = ColorReachEnv()
        >>> _ = env.reset(seed=3)
        >>> ColorReachExpert().chunk(env.state_dict(), horizon=4).shape
        (4, 2)
    """

    def __call__(self, state: ColorReachState) -> np.ndarray:
        return self._action(state.agent, state.goal_position, state.max_speed)

    def chunk(self, state: ColorReachState, horizon: int) -> np.ndarray:
        """``[horizon, 2]`` actions that the expert would take from ``state`` on, step by step."""
        agent = state.agent.copy()
        actions = np.zeros((horizon, 2), dtype=np.float32)
        for h in range(horizon):
            actions[h] = self._action(agent, state.goal_position, state.max_speed)
            agent = np.clip(agent + actions[h].astype(np.float64) * state.max_speed, 0.0, 1.0)
        return actions

    @staticmethod
    def _action(agent: np.ndarray, goal: np.ndarray, max_speed: float) -> np.ndarray:
        # Per-axis velocity that lands on the goal once it is within one step's reach.
        return np.clip((goal - agent) / max_speed, -1.0, 1.0).astype(np.float32)


def make_color_reach_vector_env(
    num_envs: int,
    *,
    async_: bool = False,
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    wrappers: Sequence[Callable[[gym.Env], gym.Env]] = (),
    **env_kwargs: Any,
) -> VectorEnv:
    """A ``VectorEnv`` of :class:`ColorReachEnv`, each sub-env wrapped for chunk stepping.

    ``env_kwargs`` go to every :class:`ColorReachEnv`. ``wrappers`` wrap each env in order, inside
    the outermost :class:`EpisodeEndHold`, where they see every env step also under chunk stepping
    (the place for ``gymnasium.wrappers.RecordEpisodeStatistics``). Sync by default: the env is so
    cheap that worker processes cost more than they save.

    Example:
        >>> envs = make_color_reach_vector_env(3, image_size=64)
        >>> obs, infos = envs.reset(seed=0)
        >>> obs.shape, len(envs.call("task_description"))
        ((3, 64, 64, 3), 3)
        >>> envs.close()
    """

    make = functools.partial(make_held_env, ColorReachEnv, tuple(wrappers), **env_kwargs)
    fns = [make] * num_envs
    if async_:
        return gym.vector.AsyncVectorEnv(fns, autoreset_mode=autoreset_mode)
    return gym.vector.SyncVectorEnv(fns, autoreset_mode=autoreset_mode)


class ColorReachEval(EvalEnv):
    """The built-in env; a task is a target colour (``red``, ``green``, ``blue``, ``yellow``)."""

    suite = "color_reach"
    adapter = "generic"
    domain = "color_reach"
    control_hz = 10.0  # its render_fps; actions are velocities
    hold = "still"
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
