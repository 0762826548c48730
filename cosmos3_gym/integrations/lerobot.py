"""LeRobot's own evaluator drives Cosmos3: no glue for the user to write.

Two routes, one set of conventions:

- LeRobot 0.6's ``lerobot-eval --policy.type=cosmos3_gym``: the plugin
  (:mod:`cosmos3_gym.integrations.lerobot_plugin`, discovered through the
  ``lerobot_policy_cosmos3_gym`` distribution) builds the policy from its config, and
  ``--env.type=cosmos3_gym`` runs cosmos3-gym's env families with exactly the episodes of
  ``cosmos3-gym eval`` (:class:`TrialBySeed`).
- From Python (LeRobot 0.4.4 and 0.6): :func:`make_lerobot_policy` turns a
  :class:`~cosmos3_gym.VectorPolicy` into the ``PreTrainedPolicy`` that
  ``lerobot.scripts.lerobot_eval.eval_policy`` accepts; :func:`make_lerobot_env` turns a
  cosmos3-gym vector env (ColorReach or LIBERO, sync) into the vector env it expects.

This module does not import LeRobot (the env side needs Gymnasium only); the policy lives in
:mod:`cosmos3_gym.integrations.lerobot_plugin`.

Install, examples, and what is translated between the two and why: docs/lerobot.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv, VectorWrapper

if TYPE_CHECKING:
    import torch

    from cosmos3_gym.envs import EvalEnv
    from cosmos3_gym.integrations.lerobot_plugin.modeling_cosmos3_gym import Cosmos3GymPolicy
    from cosmos3_gym.policy import VectorPolicy

# Our LIBERO camera keys -> the camera names LeRobot's LIBERO env uses (observation.images.image,
# observation.images.image2); other cameras keep their key as their name.
LEROBOT_CAMERA_NAMES: dict[str, str] = {"agentview_image": "image", "wrist_image": "image2"}
# The observation key of the proprioceptive state in our envs; LeRobot calls it agent_pos.
STATE_KEY = "state"

OBS_IMAGE = "observation.image"
OBS_IMAGES_PREFIX = "observation.images."
OBS_STATE = "observation.state"

INSTALL_HINT = (
    "LeRobot is not importable. cosmos3-gym works with LeRobot 0.6 (Python 3.12: pip install -e "
    ". -e plugins/lerobot_policy_cosmos3_gym) and 0.4.4 (Python 3.10+: a torch with its "
    "torchvision, pip install -e '.[lerobot]', then pip install --no-deps lerobot==0.4.4); "
    "docs/lerobot.md gives the exact commands"
)


# ---------------------------------------------------------------------------------- the policy


def make_lerobot_policy(
    policy: VectorPolicy, *, camera_keys: Mapping[str, str] | None = None
) -> Cosmos3GymPolicy:
    """``policy`` as the ``PreTrainedPolicy`` that LeRobot's ``eval_policy`` accepts.

    The result's ``select_action(batch)`` returns float32 ``[B, D]`` torch actions from the
    policy's per-env chunk queues, prompted by ``batch["task"]``; ``predict_action_chunk(batch)``
    returns ``[B, H, D]``; ``reset()`` starts a new episode in every env. Its ``config`` is a
    ``PreTrainedConfig`` registered as ``"cosmos3_gym"``, so ``make_pre_post_processors(config)``
    finds its processors.

    Args:
        policy: the VectorPolicy to drive; its adapter holds the benchmark conventions.
        camera_keys: LeRobot camera name -> the observation key the adapter reads. Default:
            LIBERO's (``image`` -> ``agentview_image``, ``image2`` -> ``wrist_image``), others
            unchanged; a single ``observation.image`` arrives as ``image``.
    """
    from cosmos3_gym.policy import VectorPolicy

    if not isinstance(policy, VectorPolicy):
        raise TypeError(
            f"make_lerobot_policy expects a cosmos3_gym.VectorPolicy; found {type(policy).__name__}"
        )
    try:
        from cosmos3_gym.integrations.lerobot_plugin.modeling_cosmos3_gym import (
            Cosmos3GymConfig,
            Cosmos3GymPolicy,
        )
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from error

    device = getattr(policy.pipeline, "device", None)
    config = Cosmos3GymConfig(
        checkpoint=None,  # the pipeline is the VectorPolicy's
        device=str(device) if device is not None else "cpu",
        adapter=getattr(policy.adapter, "name", None),
        n_action_steps=policy.config.n_action_steps,
        seed=policy.config.seed,
        camera_keys=dict(default_camera_keys() if camera_keys is None else camera_keys),
    )
    return Cosmos3GymPolicy(config, policy)


def default_camera_keys() -> dict[str, str]:
    """LeRobot camera name -> our observation key: the inverse of :data:`LEROBOT_CAMERA_NAMES`."""
    return {name: key for key, name in LEROBOT_CAMERA_NAMES.items()}


def observation_from_lerobot_batch(
    batch: Mapping[str, Any], camera_keys: Mapping[str, str] | None = None
) -> tuple[dict[str, np.ndarray], list[str]]:
    """A LeRobot policy batch -> (a vector observation for the adapter, one prompt per env).

    Images ``observation.image`` (named ``image``) and ``observation.images.<camera>`` (named
    ``camera_keys.get(camera, camera)``) become uint8 ``[B, H, W, C]``, exactly the env's bytes;
    ``observation.state`` becomes float32 ``[B, S]`` under ``"state"``; ``batch["task"]`` gives
    the prompts.
    """
    camera_keys = default_camera_keys() if camera_keys is None else camera_keys
    obs: dict[str, np.ndarray] = {}
    for key, value in batch.items():
        if key == OBS_IMAGE:
            name = "image"
        elif key.startswith(OBS_IMAGES_PREFIX):
            camera = key[len(OBS_IMAGES_PREFIX):]
            name = camera_keys.get(camera, camera)
        else:
            continue
        if name in obs:
            raise ValueError(f"two LeRobot images map to the observation key {name!r}")
        obs[name] = uint8_frames(value, key)
    if not obs:
        raise ValueError(
            f"the LeRobot batch holds no images; found keys {sorted(batch)}. Expected "
            f"{OBS_IMAGE!r} or '{OBS_IMAGES_PREFIX}<camera>', which LeRobot makes from an env "
            "observation's 'pixels' (make_lerobot_env provides them)"
        )
    num_envs = next(iter(obs.values())).shape[0]
    if OBS_STATE in batch:
        obs[STATE_KEY] = _to_numpy(batch[OBS_STATE]).astype(np.float32)
    return obs, _tasks(batch.get("task"), num_envs)


def uint8_frames(images: torch.Tensor, key: str = "images") -> np.ndarray:
    """LeRobot's float ``[B, C, H, W]`` images in ``[0, 1]`` -> the uint8 ``[B, H, W, C]`` frames
    they were made from, exactly; anything else raises ``ValueError``."""
    import torch

    if not isinstance(images, torch.Tensor) or not images.is_floating_point() or images.ndim != 4:
        found = (
            f"{images.dtype} {list(images.shape)}" if isinstance(images, torch.Tensor)
            else type(images).__name__
        )
        raise ValueError(f"{key}: expected a float tensor [B, C, H, W] in [0, 1]; found {found}")
    _, channels, height, width = images.shape
    if not channels < min(height, width):
        raise ValueError(f"{key}: expected channel-first [B, C, H, W]; found {list(images.shape)}")
    scaled = images.detach().to(torch.float64) * 255.0
    levels = scaled.round()
    off_grid = float((scaled - levels).abs().max()) if scaled.numel() else 0.0
    if off_grid > 1e-3 or (scaled.numel() and (levels.min() < 0 or levels.max() > 255)):
        raise ValueError(
            f"{key}: values are not uint8 frames divided by 255 (largest distance from a "
            f"k/255 level: {off_grid / 255:.3g}, range [{float(images.min()):.3g}, "
            f"{float(images.max()):.3g}]); a processor between the env and the policy changed the "
            "images (normalisation, resizing). Use identity processors: the adapter converts"
        )
    return levels.to(torch.uint8).permute(0, 2, 3, 1).contiguous().cpu().numpy()


def _to_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _tasks(tasks: Any, num_envs: int) -> list[str]:
    if isinstance(tasks, str) or not isinstance(tasks, Sequence):
        raise ValueError(
            f"the LeRobot batch's 'task' is {tasks!r}; expected a list of {num_envs} prompts, "
            "one per env (LeRobot reads them from each sub-env's task_description)"
        )
    tasks = list(tasks)
    if len(tasks) != num_envs:
        raise ValueError(f"the LeRobot batch has {len(tasks)} tasks for {num_envs} envs")
    for env, task in enumerate(tasks):
        if not isinstance(task, str) or not task.strip():
            raise ValueError(
                f"the LeRobot batch's task for env {env} is {task!r}; LeRobot passes empty tasks "
                "when env.envs[0] has no task_description or task attribute "
                "(make_lerobot_env provides both)"
            )
    return tasks


# ------------------------------------------------------------------------------------ the env


class LeRobotConventions(gym.ObservationWrapper):
    """One sub-env as LeRobot's evaluator reads it.

    - Observations: an image observation becomes ``{"pixels": image}``; a dict observation
      becomes ``{"pixels": {camera: image}}`` (uint8 ``[H, W, C]`` entries, renamed with
      :data:`LEROBOT_CAMERA_NAMES`) plus ``{"agent_pos": state}`` from ``"state"``. Other
      entries raise, since LeRobot would drop them without a word.
    - ``task_description`` / ``task``: the wrapped env's, read through its wrappers (LeRobot
      looks them up with ``hasattr`` on the outermost wrapper).
    - ``_max_episode_steps``: the env's step budget, the smaller of ``spec.max_episode_steps``
      and its own ``max_episode_steps`` where both exist.
    - An episode end without ``info["is_success"]`` raises: LeRobot would count it a failure.

    Example:
        >>> from cosmos3_gym.envs import ColorReachEnv
        >>> env = LeRobotConventions(ColorReachEnv(image_size=64))
        >>> obs, _ = env.reset(seed=0)
        >>> obs["pixels"].shape, env._max_episode_steps, env.task == env.task_description
        ((64, 64, 3), 40, True)
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        space = env.observation_space
        if _is_image_space(space):
            self._layout: dict[str, str] | None = None
            self.observation_space = spaces.Dict({"pixels": space})
        elif isinstance(space, spaces.Dict):
            cameras = {k: LEROBOT_CAMERA_NAMES.get(k, k) for k, s in space.items()
                       if _is_image_space(s)}
            others = sorted(set(space.keys()) - set(cameras) - {STATE_KEY})
            if not cameras or others:
                raise ValueError(
                    "LeRobot passes policies uint8 [H, W, C] images (as 'pixels') and a state "
                    f"vector (as 'agent_pos', from {STATE_KEY!r}); this env's observation has "
                    f"images {sorted(cameras)} and other keys {others}"
                    + ("" if cameras else " (a LIBERO env built with render_images=False?)")
                )
            self._layout = cameras
            converted: dict[str, spaces.Space] = {
                "pixels": spaces.Dict({name: space[key] for key, name in cameras.items()})
            }
            if STATE_KEY in space.spaces:
                converted["agent_pos"] = space[STATE_KEY]
            self.observation_space = spaces.Dict(converted)
        else:
            raise ValueError(
                "LeRobot needs image observations: a uint8 [H, W, C] Box, or a Dict holding such "
                f"images; found {space}"
            )
        self._budget = _step_budget(env)

    @property
    def task_description(self) -> str:
        return self.env.get_wrapper_attr("task_description")

    @property
    def task(self) -> str:
        return self.task_description

    @property
    def _max_episode_steps(self) -> int:
        return self._budget

    def observation(self, observation: Any) -> dict[str, Any]:
        if self._layout is None:
            return {"pixels": observation}
        out: dict[str, Any] = {
            "pixels": {name: observation[key] for key, name in self._layout.items()}
        }
        if STATE_KEY in observation:
            out["agent_pos"] = observation[STATE_KEY]
        return out

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        if (terminated or truncated) and "is_success" not in info:
            raise ValueError(
                "the episode ended without info['is_success']; LeRobot's eval_policy reads "
                f"success only from there and would count it a failure (info keys: {sorted(info)})"
            )
        return self.observation(obs), reward, terminated, truncated, info


def _is_image_space(space: spaces.Space) -> bool:
    return (
        isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3
        and space.shape[2] < min(space.shape[:2])
    )


def _step_budget(env: gym.Env) -> int:
    budgets = []
    spec = env.spec
    if spec is not None and spec.max_episode_steps is not None:
        budgets.append(int(spec.max_episode_steps))
    if env.has_wrapper_attr("max_episode_steps"):
        own = env.get_wrapper_attr("max_episode_steps")
        if own is not None:
            budgets.append(int(own))
    if not budgets:
        raise ValueError(
            "LeRobot's rollout runs at most env._max_episode_steps steps; this env has neither "
            "spec.max_episode_steps nor a max_episode_steps attribute"
        )
    return min(budgets)


class LeRobotVectorEnv(SyncVectorEnv):
    """A ``SyncVectorEnv`` under ``SAME_STEP`` autoreset whose sub-envs follow LeRobot's
    conventions (:class:`LeRobotConventions`); made by :func:`make_lerobot_env`.

    With a ``policy``, every env that ends its episode in a step starts its new one in the
    policy too (``policy.reset(mask)``), since under ``SAME_STEP`` the observation that step
    returns is already the new episode's.
    """

    def __init__(self, envs: Sequence[LeRobotConventions], policy: Any = None) -> None:
        super().__init__(
            [(lambda env=env: env) for env in envs], autoreset_mode=AutoresetMode.SAME_STEP
        )
        self.policy = policy

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        obs, rewards, terminations, truncations, infos = super().step(actions)
        done = np.logical_or(terminations, truncations)
        if self.policy is not None and done.any():
            self.policy.reset(mask=done)
        return obs, rewards, terminations, truncations, infos


def make_lerobot_env(envs: VectorEnv, policy: Any = None) -> LeRobotVectorEnv:
    """A cosmos3-gym vector env as LeRobot's ``eval_policy`` expects it.

    ``envs`` is a ``SyncVectorEnv`` from :func:`~cosmos3_gym.envs.make_color_reach_vector_env`
    or :func:`~cosmos3_gym.envs.make_libero_vector_env` (``async_=False``), under any autoreset
    mode. The result takes over its sub-envs (use it instead of ``envs``): a ``SyncVectorEnv``
    under ``SAME_STEP`` autoreset, so that LeRobot finds success in ``info["final_info"]``,
    with LeRobot's observation keys, ``task_description`` / ``task`` and ``_max_episode_steps``
    on every sub-env (see :class:`LeRobotConventions`).

    Pass ``policy`` (what :func:`make_lerobot_policy` returned, or its VectorPolicy) so that an
    env that finishes early and autoresets during LeRobot's batched rollout starts its new
    episode with an empty action queue; without it, the rest of its old chunk would run in the
    new (unscored) episode.

    Raises ``TypeError`` / ``ValueError`` for setups under which LeRobot would read no success:
    an async or wrapped vector env, sub-envs armed for chunk stepping (they hide episode ends),
    envs with different step budgets, episodes that end without ``info["is_success"]``.

    Example:
        >>> from cosmos3_gym.envs import make_color_reach_vector_env
        >>> env = make_lerobot_env(make_color_reach_vector_env(2, image_size=64))
        >>> obs, _ = env.reset(seed=0)
        >>> obs["pixels"].shape, env.call("_max_episode_steps"), env.metadata["autoreset_mode"]
        ((2, 64, 64, 3), (40, 40), <AutoresetMode.SAME_STEP: 'SameStep'>)
        >>> env.close()
    """
    vector_policy = _vector_policy(policy, envs.num_envs)
    return LeRobotVectorEnv(lerobot_sub_envs(envs), vector_policy)


def lerobot_sub_envs(envs: VectorEnv) -> list[LeRobotConventions]:
    """The sub-envs of ``envs`` (a ``SyncVectorEnv``) under :class:`LeRobotConventions`, checked
    as :func:`make_lerobot_env` says; the vector env itself is left behind (do not close it)."""
    if isinstance(envs, VectorWrapper):
        raise TypeError(
            f"make_lerobot_env expects the vector env itself, not a {type(envs).__name__} "
            "wrapper: LeRobot steps one action per env per step and reads env.envs"
        )
    if not isinstance(envs, SyncVectorEnv):
        raise TypeError(
            f"make_lerobot_env expects a gymnasium SyncVectorEnv; found {type(envs).__name__}. "
            "LeRobot 0.4.4 reads prompts through env.envs, which only a SyncVectorEnv has: "
            "build the env with async_=False"
        )
    armed = [i for i, env in enumerate(envs.envs) if _armed_for_chunks(env)]
    if armed:
        raise ValueError(
            f"sub-envs {armed} are armed for chunk stepping (a ChunkedActionWrapper was put on "
            "this vector env); they hide episode ends, so LeRobot would read no success"
        )
    wrapped = [LeRobotConventions(env) for env in envs.envs]
    budgets = sorted({env._max_episode_steps for env in wrapped})
    if len(budgets) > 1:
        raise ValueError(
            f"the sub-envs have different step budgets {budgets}; LeRobot's rollout stops every "
            "env after env 0's budget. Make one vector env per budget (e.g. per LIBERO suite)"
        )
    return wrapped


class TrialBySeed(gym.Wrapper):
    """One sub-env of a cosmos3-gym env family, started the way ``cosmos3-gym eval`` starts it,
    with LeRobot's seed as the trial number.

    LeRobot numbers the episodes of a task by their reset seeds (``--seed``, ``--seed`` + 1,
    ...); cosmos3-gym by ``(task, trial)``, every other fact of an episode derived from that
    pair and the run's root seed. ``reset(seed=t)`` starts trial ``t`` of this env's task:
    the env seed ``derive_seed(root_seed, task, t)`` and the family's reset options (a
    ColorReach target, a LIBERO init state). So ``lerobot-eval --seed 0`` with ``N`` episodes
    per task runs trials ``0..N-1`` of every task, the episodes of ``cosmos3-gym eval --trials
    N --seed ROOT_SEED``. A reset without a seed raises: it has no trial.

    Example:
        >>> from cosmos3_gym.envs import ColorReachEnv, ColorReachEval
        >>> family = ColorReachEval(["blue"], image_size=64)
        >>> env = TrialBySeed(ColorReachEnv(image_size=64), family, task_index=0, root_seed=0)
        >>> _ = env.reset(seed=3)
        >>> env.episode.key, env.episode.seed == family.episode(0, 3, 0).seed
        (('blue', 3), True)
        >>> env.get_wrapper_attr("task_description")
        'reach the blue target'
    """

    def __init__(self, env: gym.Env, family: EvalEnv, task_index: int, root_seed: int) -> None:
        super().__init__(env)
        if not 0 <= task_index < len(family.tasks):
            raise ValueError(f"task_index {task_index}: the family has tasks {family.tasks}")
        self.family, self.task_index, self.root_seed = family, task_index, root_seed
        self.episode = None

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if seed is None:
            raise ValueError(
                "a cosmos3_gym env starts trial t on reset(seed=t); it was reset without a seed "
                "(give lerobot-eval a --seed, or reset with one)"
            )
        # LeRobot's own flags (lerobot_new_rollout) are for its wrappers; anything else would
        # be dropped for the family's options, so it is refused.
        foreign = sorted(k for k in (options or {}) if not str(k).startswith("lerobot_"))
        if foreign:
            raise ValueError(f"a cosmos3_gym env takes its reset options from its episode; "
                             f"found options {foreign}")
        self.episode = self.family.episode(self.task_index, int(seed), self.root_seed)
        return self.env.reset(seed=self.episode.seed,
                              options=self.family.reset_options(self.episode))


def _armed_for_chunks(env: gym.Env) -> bool:
    return env.has_wrapper_attr("chunk_hold_armed") and env.get_wrapper_attr("chunk_hold_armed")


def _vector_policy(policy: Any, num_envs: int) -> Any:
    if policy is None:
        return None
    vector_policy = getattr(policy, "vector_policy", policy)
    if not callable(getattr(vector_policy, "reset", None)):
        raise TypeError(
            "policy must be what make_lerobot_policy returned or a VectorPolicy; "
            f"found {type(policy).__name__}"
        )
    served = getattr(vector_policy, "num_envs", None)
    if served is not None and served != num_envs:
        raise ValueError(f"the policy serves {served} envs; these envs are {num_envs}")
    return vector_policy
