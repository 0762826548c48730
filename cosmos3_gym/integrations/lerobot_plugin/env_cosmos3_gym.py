"""cosmos3-gym's env families as a LeRobot env: ``lerobot-eval --env.type=cosmos3_gym``.

LeRobot's evaluator then runs exactly the episodes ``cosmos3-gym eval`` runs (the same env
seeds, the same reset options), so the two can be compared episode by episode; see
:class:`~cosmos3_gym.integrations.lerobot.TrialBySeed` for how LeRobot's seeds become trials.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
from gymnasium import spaces
from gymnasium.vector import AutoresetMode
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.envs.configs import EnvConfig

from cosmos3_gym.integrations.lerobot import (
    OBS_IMAGE,
    OBS_IMAGES_PREFIX,
    OBS_STATE,
    TrialBySeed,
    lerobot_sub_envs,
)

try:  # LeRobot 0.6: a sub-env whose episode ended replays its last step until the next rollout
    from lerobot.envs.utils import FreezeAfterEpisodeEnd
except ImportError:  # LeRobot 0.4.4, whose lerobot-eval this env type is not made for
    FreezeAfterEpisodeEnd = None

ACTION = "action"


@EnvConfig.register_subclass("cosmos3_gym")
@dataclass
class Cosmos3GymEnv(EnvConfig):
    """A cosmos3-gym env family (``cosmos3-gym eval --env``) for LeRobot's evaluator.

    One LeRobot task per family task (a ColorReach colour, a LIBERO task id, a Meta-World task),
    each its own vector env of ``--eval.batch_size`` sub-envs. Episode ``j`` of a task is the
    one LeRobot seeds ``--seed`` + ``j``: trial ``--seed`` + ``j`` of cosmos3-gym's episode set
    under ``root_seed`` (:class:`~cosmos3_gym.integrations.lerobot.TrialBySeed`). ``features``
    are read from the envs when LeRobot builds them.
    """

    # cosmos3-gym eval's --env: color_reach, libero or metaworld.
    family: str = "color_reach"
    # cosmos3-gym eval's --tasks, comma-separated (colours, LIBERO task ids, Meta-World names);
    # None: all of the family's.
    task: str | None = None
    # cosmos3-gym eval's --suite (LIBERO).
    suite: str | None = None
    # cosmos3-gym eval's --image-size, --max-episode-steps and --step-budget; None: the env's.
    image_size: int | None = None
    max_episode_steps: int | None = None
    step_budget: str | None = None
    # cosmos3-gym eval's --seed: the root every episode's env seed derives from, with its
    # (task, trial). LeRobot's own --seed numbers the trials.
    root_seed: int = 0

    def family_env(self) -> Any:
        """The :class:`~cosmos3_gym.envs.EvalEnv` these settings name, as ``cosmos3-gym eval``
        builds it."""
        from cosmos3_gym.envs import make_eval_env

        tasks = None if self.task is None else [t.strip() for t in self.task.split(",")]
        return make_eval_env(self.family, suite=self.suite, tasks=tasks,
                             image_size=self.image_size, max_episode_steps=self.max_episode_steps,
                             step_budget=self.step_budget)

    @property
    def gym_kwargs(self) -> dict:
        return {}  # the family builds its envs (create_envs), not gym.make

    def create_envs(
        self, n_envs: int, use_async_envs: bool = False
    ) -> dict[str, dict[int, gym.vector.VectorEnv]]:
        if FreezeAfterEpisodeEnd is None:
            raise RuntimeError("--env.type=cosmos3_gym needs LeRobot 0.6 (its "
                               "FreezeAfterEpisodeEnd); this LeRobot has none")
        family = self.family_env()
        envs: dict[int, gym.vector.VectorEnv] = {}
        for task_index in range(len(family.tasks)):
            make = functools.partial(_make_sub_env, self, task_index)
            if use_async_envs and n_envs > 1:  # LeRobot's choice of start method, as its own envs
                envs[task_index] = gym.vector.AsyncVectorEnv(
                    [make] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP, context="forkserver")
            else:
                envs[task_index] = gym.vector.SyncVectorEnv(
                    [make] * n_envs, autoreset_mode=AutoresetMode.SAME_STEP)
        first = envs[0]
        self.features, self.features_map = lerobot_features(
            first.single_observation_space, first.single_action_space)
        self.fps = int(first.metadata.get("render_fps") or self.fps)
        return {family.suite or self.family: envs}


def _make_sub_env(config: Cosmos3GymEnv, task_index: int) -> gym.Env:
    """One sub-env of task ``task_index``: the family's own env under LeRobot's conventions,
    started by trial (:class:`~cosmos3_gym.integrations.lerobot.TrialBySeed`), frozen after its
    episode ends as LeRobot's own envs are. Module-level, so that worker processes can build it."""
    family = config.family_env()
    (env,) = lerobot_sub_envs(family.make(1, async_=False))
    return FreezeAfterEpisodeEnd(TrialBySeed(env, family, task_index, config.root_seed))


def lerobot_features(
    observation_space: spaces.Space, action_space: spaces.Space
) -> tuple[dict[str, PolicyFeature], dict[str, str]]:
    """``(features, features_map)`` of an env that follows LeRobot's conventions
    (:class:`~cosmos3_gym.integrations.lerobot.LeRobotConventions`), keyed so that both
    LeRobot's policy factory and its ``--eval.recording`` find them: one image as
    ``observation.image``, cameras as ``observation.images.<name>``, the state as ``agent_pos``
    (the raw observation key the recorder reads), the action as ``action``."""
    features: dict[str, PolicyFeature] = {
        ACTION: PolicyFeature(type=FeatureType.ACTION, shape=tuple(action_space.shape))}
    names = {ACTION: ACTION}
    pixels = observation_space["pixels"]
    cameras = ({OBS_IMAGE: pixels} if isinstance(pixels, spaces.Box) else
               {f"{OBS_IMAGES_PREFIX}{name}": space for name, space in pixels.items()})
    for key, space in cameras.items():
        features[key] = PolicyFeature(type=FeatureType.VISUAL, shape=tuple(space.shape))
        names[key] = key
    if "agent_pos" in observation_space.spaces:
        features["agent_pos"] = PolicyFeature(
            type=FeatureType.STATE, shape=tuple(observation_space["agent_pos"].shape))
        names["agent_pos"] = OBS_STATE
    return features, names
