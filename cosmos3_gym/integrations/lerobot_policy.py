"""The LeRobot policy class around a VectorPolicy. Imports LeRobot: reach it through
:func:`cosmos3_gym.integrations.lerobot.make_lerobot_policy`, which says how to install LeRobot
when it is missing.

Importing this module registers the ``"cosmos3"`` policy config with LeRobot, and LeRobot's
``make_pre_post_processors(config)`` finds :func:`make_cosmos3_pre_post_processors` here (its
plugin lookup: ``make_<type>_pre_post_processors`` in the config's module).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from lerobot.configs.policies import PreTrainedConfig
from lerobot.policies.pretrained import PreTrainedPolicy
from lerobot.processor import PolicyProcessorPipeline
from lerobot.processor.converters import (
    policy_action_to_transition,
    transition_to_policy_action,
)
from torch import Tensor

from cosmos3_gym.integrations.lerobot import default_camera_keys, observation_from_lerobot_batch
from cosmos3_gym.policy import VectorPolicy


@PreTrainedConfig.register_subclass("cosmos3")
@dataclass
class Cosmos3Config(PreTrainedConfig):
    """LeRobot's config for a cosmos3-gym VectorPolicy; the VectorPolicy's own settings (adapter,
    ``n_action_steps``, seed, sampler) stay on the VectorPolicy.

    Inference only: there is nothing for LeRobot's trainer here (train Cosmos3 with its own
    recipe; ``cosmos3-gym train`` makes the tiny checkpoint).
    """

    # LeRobot camera name (observation.images.<name>) -> the observation key the adapter reads.
    camera_keys: dict[str, str] = field(default_factory=default_camera_keys)
    # Where the pipeline runs; set from the pipeline by make_lerobot_policy.
    device: str | None = "cpu"

    @property
    def observation_delta_indices(self) -> None:
        return None  # the current frame only

    @property
    def action_delta_indices(self) -> None:
        return None

    @property
    def reward_delta_indices(self) -> None:
        return None

    def get_optimizer_preset(self) -> Any:
        raise NotImplementedError("the cosmos3 LeRobot policy is inference only")

    def get_scheduler_preset(self) -> None:
        return None

    def validate_features(self) -> None:
        """Nothing to check up front: each batch is checked as it arrives."""


class Cosmos3Policy(PreTrainedPolicy):
    """A :class:`~cosmos3_gym.VectorPolicy` behind LeRobot's ``PreTrainedPolicy`` surface.

    Each env of LeRobot's batch keeps its own prompt (``batch["task"][i]``) and its own action
    queue; ``select_action`` replans, in one batched pipeline call, only the envs whose queue is
    empty. ``reset()`` (LeRobot calls it when a rollout starts) starts a new episode everywhere;
    an env that autoresets inside a rollout is started afresh by the env from
    :func:`~cosmos3_gym.integrations.lerobot.make_lerobot_env` when it was given this policy.
    """

    config_class = Cosmos3Config
    name = "cosmos3"

    def __init__(self, config: Cosmos3Config, vector_policy: VectorPolicy) -> None:
        super().__init__(config)
        self.vector_policy = vector_policy

    def reset(self) -> None:
        self.vector_policy.reset()

    @torch.no_grad()
    def select_action(self, batch: dict[str, Any], noise: Tensor | None = None) -> Tensor:
        """float32 ``[B, D]``: one action per env, from per-env chunk queues."""
        if noise is not None:
            raise ValueError(
                "select_action draws noise from the VectorPolicy's per-env seeds; pass explicit "
                "noise to predict_action_chunk instead"
            )
        obs, tasks = observation_from_lerobot_batch(batch, self.config.camera_keys)
        return torch.from_numpy(self.vector_policy.select_action(obs, tasks))

    @torch.no_grad()
    def predict_action_chunk(self, batch: dict[str, Any], noise: Tensor | None = None) -> Tensor:
        """float32 ``[B, H, D]``: a fresh chunk for every env (queues untouched); ``noise``
        (``[B, H, 64]``) replaces the seeded initial action noise."""
        obs, tasks = observation_from_lerobot_batch(batch, self.config.camera_keys)
        action_noise = None if noise is None else noise.detach().cpu().numpy()
        chunk = self.vector_policy.predict_action_chunk(obs, tasks, action_noise=action_noise)
        return torch.from_numpy(chunk)

    def forward(self, batch: dict[str, Tensor]) -> tuple[Tensor, dict | None]:
        raise NotImplementedError("the cosmos3 LeRobot policy is inference only (no training loss)")

    def get_optim_params(self) -> dict:
        raise NotImplementedError("the cosmos3 LeRobot policy is inference only")


def make_cosmos3_pre_post_processors(
    config: Cosmos3Config, dataset_stats: dict[str, Any] | None = None
) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """Identity processors: the adapter turns images into model inputs and the pipeline
    un-normalises actions with the checkpoint's own statistics, so LeRobot's dataset
    statistics are not used. Found by LeRobot's ``make_pre_post_processors(config)``."""
    del config, dataset_stats
    preprocessor = PolicyProcessorPipeline(steps=[], name="cosmos3_preprocessor")
    postprocessor = PolicyProcessorPipeline(
        steps=[],
        name="cosmos3_postprocessor",
        to_transition=policy_action_to_transition,
        to_output=transition_to_policy_action,
    )
    return preprocessor, postprocessor
