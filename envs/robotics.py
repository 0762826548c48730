"""Benchmarks that need a few lines of ours to run here: gymnasium-robotics' Fetch and robosuite.

Importing this module registers, with Gymnasium:

- ``cosmos3_gym/Fetch{Reach,Push,Slide,PickAndPlace}-v4``: gymnasium-robotics 1.4.2's Fetch
  envs, built through :func:`make_fetch`, which first repairs its joint-type check for MuJoCo
  3.16 (:func:`patch_gymnasium_robotics`; upstream's ``set_joint_qpos`` fails there with a bare
  ``AssertionError``). Everything else is upstream's: the 4-D action ``Box(-1, 1)``, 50-step
  episodes, ``info["is_success"]`` (a float 0/1).
- ``cosmos3_gym/robosuite-{Lift,Door,Stack,...}-v0``: robosuite envs (:class:`RobosuiteEnv`),
  which robosuite itself does not register. Its horizon end is a truncation here (robosuite's
  own ``done`` and GymWrapper report it as a termination), success is ``_check_success()`` in
  ``info["is_success"]`` and ends the episode (robomimic's convention); the cameras' frames
  come as robosuite renders them, upside down (the presets flip them back). robosuite 1.5
  and 1.4 take the same calls here, seeding aside; both need MuJoCo 3.9 or older (their
  controllers call ``mj_fullM(model, dst, data.qM)``: 3.10 made it ``mj_fullM(model, data,
  dst)``, 3.11 dropped ``MjData.qM``), not the main venv's 3.16, so robosuite runs in a venv of
  its own (``.ci/robosuite``; docs/presets.md has the versions).

Nothing is imported from either package until an env is made, inside the process that steps it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

FETCH_TASKS = {"Reach": "reach", "Push": "push", "Slide": "slide",
               "PickAndPlace": "pick_and_place"}
ROBOSUITE_TASKS = ("Lift", "Door", "Stack", "NutAssemblySquare", "PickPlaceCan", "Wipe")
ROBOSUITE_HORIZON = 500
# The first MuJoCo robosuite's controllers fail on (the module docstring says why).
ROBOSUITE_MUJOCO_BREAKS = (3, 10)
_PATCHED = False


def _joint_width(joint_type: Any, kind: str) -> int:
    """qpos (``kind="qpos"``) or qvel entries of a MuJoCo joint type: free 7/6, ball 4/3, hinge
    and slide 1. The joint type is compared as an integer: under MuJoCo 3.16 with numpy 2,
    ``model.jnt_type[i] in (mjJNT_HINGE, mjJNT_SLIDE)`` is False for a hinge, which is what
    gymnasium-robotics 1.4.2 and robosuite 1.4.0 assert."""
    import mujoco

    widths = {int(mujoco.mjtJoint.mjJNT_FREE): (7, 6), int(mujoco.mjtJoint.mjJNT_BALL): (4, 3)}
    return widths.get(int(joint_type), (1, 1))[0 if kind == "qpos" else 1]


def patch_gymnasium_robotics() -> None:
    """gymnasium-robotics' ``set_joint_qpos`` / ``set_joint_qvel`` / ``get_joint_qpos`` /
    ``get_joint_qvel`` with the joint type compared as an integer (:func:`_joint_width`):
    without it every Fetch env fails to build with a bare ``AssertionError``. Idempotent."""
    global _PATCHED
    if _PATCHED:
        return
    import mujoco
    from gymnasium_robotics.utils import mujoco_utils

    def span(model: Any, name: str, kind: str) -> slice:
        joint = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, name)
        if joint == -1:
            raise ValueError(f"joint {name!r} is not part of the model")
        start = int((model.jnt_qposadr if kind == "qpos" else model.jnt_dofadr)[joint])
        return slice(start, start + _joint_width(model.jnt_type[joint], kind))

    def setter(kind: str) -> Any:
        def set_joint(model: Any, data: Any, name: str, value: Any) -> None:
            getattr(data, kind)[span(model, name, kind)] = np.asarray(value)
        return set_joint

    def getter(kind: str) -> Any:
        def get_joint(model: Any, data: Any, name: str) -> np.ndarray:
            return getattr(data, kind)[span(model, name, kind)].copy()
        return get_joint

    for kind in ("qpos", "qvel"):
        setattr(mujoco_utils, f"set_joint_{kind}", setter(kind))
        setattr(mujoco_utils, f"get_joint_{kind}", getter(kind))
    _PATCHED = True


def patch_robosuite() -> None:
    """robosuite's ``MjModel.get_joint_qpos_addr`` / ``get_joint_qvel_addr`` with the joint
    type compared as an integer (:func:`_joint_width`), for the same reason. Idempotent."""
    from robosuite.utils import binding_utils

    model = binding_utils.MjModel
    if getattr(model, "_cosmos3_gym_patched", False):
        return

    def address(kind: str, field: str) -> Any:
        def get_address(self: Any, name: str) -> Any:
            joint = self.joint_name2id(name)
            start = int(getattr(self, field)[joint])
            ndim = _joint_width(self.jnt_type[joint], kind)
            return start if ndim == 1 else (start, start + ndim)
        return get_address

    model.get_joint_qpos_addr = address("qpos", "jnt_qposadr")
    model.get_joint_qvel_addr = address("qvel", "jnt_dofadr")
    model._cosmos3_gym_patched = True


def robosuite_unavailable() -> str | None:
    """Why robosuite's envs cannot run in this Python, or ``None`` where they can; read from the
    installed versions, importing neither package (the tests' skip reason)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        robosuite, mujoco = version("robosuite"), version("mujoco")
    except PackageNotFoundError as err:
        return f"{err.name} is not installed; .ci/robosuite builds a venv where robosuite runs"
    if tuple(int(part) for part in mujoco.split(".")[:2]) >= ROBOSUITE_MUJOCO_BREAKS:
        return (f"robosuite {robosuite} needs MuJoCo 3.9 or older (its controllers call "
                f"mj_fullM with MjData.qM); found mujoco {mujoco}: .ci/robosuite runs it in a "
                f"venv of its own")
    return None


def make_fetch(task: str, *, width: int = 480, height: int = 480, **kwargs: Any) -> gym.Env:
    """gymnasium-robotics' MuJoCo Fetch env ``task`` (``"Reach"``, ...), built after
    :func:`patch_gymnasium_robotics`; ``width`` / ``height``: its ``render()`` frame size."""
    if task not in FETCH_TASKS:
        raise ValueError(f"Fetch task: expected one of {list(FETCH_TASKS)}; found {task!r}")
    patch_gymnasium_robotics()
    import importlib

    module = importlib.import_module(f"gymnasium_robotics.envs.fetch.{FETCH_TASKS[task]}")
    return getattr(module, f"MujocoFetch{task}Env")(width=width, height=height, **kwargs)


# What the registry reads of an entry point without making an env (the Fetch envs' own).
make_fetch.metadata = {"render_modes": ["human", "rgb_array"], "render_fps": 25}


class RobosuiteEnv(gym.Env):
    """A robosuite task as a Gymnasium env: cameras ``camera_names`` (uint8 ``[H, W, 3]`` each,
    as ``NAME_image``), the proprioceptive state (``robot0_proprio-state``), the controller's
    actions; success (``_check_success()``) terminates, the horizon truncates.

    The simulator is built in the constructor (its spaces come from it).
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 20}

    def __init__(self, task: str = "Lift", robots: str = "Panda",
                 camera_names: tuple[str, ...] = ("agentview", "robot0_eye_in_hand"),
                 camera_size: int = 128, horizon: int = ROBOSUITE_HORIZON,
                 control_freq: int = 20, render_mode: str | None = None) -> None:
        if task not in ROBOSUITE_TASKS:
            raise ValueError(f"robosuite task: expected one of {list(ROBOSUITE_TASKS)}; found "
                             f"{task!r}")
        self.task, self.robots = task, robots
        self.camera_names, self.camera_size = tuple(camera_names), int(camera_size)
        self.horizon, self.control_freq, self.render_mode = horizon, control_freq, render_mode
        self._env: Any = None
        image = spaces.Box(0, 255, (self.camera_size, self.camera_size, 3), np.uint8)
        self._build()
        state_dim = self._env.observation_spec()["robot0_proprio-state"].shape[0]
        self.observation_space = spaces.Dict({
            **{f"{name}_image": image for name in self.camera_names},
            "robot0_proprio-state": spaces.Box(-np.inf, np.inf, (state_dim,), np.float64),
        })
        low, high = self._env.action_spec
        self.action_space = spaces.Box(low.astype(np.float32), high.astype(np.float32))

    def _build(self) -> None:
        if self._env is not None:
            return
        import robosuite

        patch_robosuite()
        self._env = robosuite.make(
            self.task, robots=self.robots, has_renderer=False, has_offscreen_renderer=True,
            use_camera_obs=True, camera_names=list(self.camera_names),
            camera_heights=self.camera_size, camera_widths=self.camera_size,
            horizon=self.horizon, ignore_done=True, reward_shaping=True,
            control_freq=self.control_freq)

    def _observation(self, raw: dict[str, Any]) -> dict[str, Any]:
        return {**{f"{n}_image": np.asarray(raw[f"{n}_image"], np.uint8)
                   for n in self.camera_names},
                "robot0_proprio-state": np.asarray(raw["robot0_proprio-state"], np.float64)}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self._build()
        if seed is not None:
            # robosuite 1.5 draws placements and the robot's start noise from one Generator
            # (env.rng) that its samplers hold too, so it is reseeded in place; 1.4 draws from
            # numpy's global RNG.
            rng = getattr(self._env, "rng", None)
            if rng is None:
                np.random.seed(seed)
            else:
                rng.bit_generator.state = np.random.default_rng(seed).bit_generator.state
        self._steps = 0
        return self._observation(self._env.reset()), {"is_success": False}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        raw, reward, _, info = self._env.step(np.asarray(action, np.float64))
        self._steps += 1
        success = bool(self._env._check_success())
        truncated = not success and self._steps >= self.horizon
        return self._observation(raw), float(reward), success, truncated, {
            **info, "is_success": success}

    def render(self) -> np.ndarray:
        name = self.camera_names[0]
        frame = self._env.sim.render(camera_name=name, width=self.camera_size,
                                     height=self.camera_size)
        return np.asarray(frame[::-1], np.uint8)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def register() -> None:
    """Register the ids this module's docstring lists (once)."""
    for task in FETCH_TASKS:
        env_id = f"cosmos3_gym/Fetch{task}-v4"
        if env_id not in gym.registry:
            gym.register(env_id, entry_point="cosmos3_gym.envs.robotics:make_fetch",
                         kwargs={"task": task}, max_episode_steps=50)
    for task in ROBOSUITE_TASKS:
        env_id = f"cosmos3_gym/robosuite-{task}-v0"
        if env_id not in gym.registry:
            # RobosuiteEnv truncates at its horizon itself; the TimeLimit says the same.
            gym.register(env_id, entry_point="cosmos3_gym.envs.robotics:RobosuiteEnv",
                         kwargs={"task": task}, max_episode_steps=ROBOSUITE_HORIZON)


register()
