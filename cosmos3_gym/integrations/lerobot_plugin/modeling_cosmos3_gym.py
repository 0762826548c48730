"""The ``cosmos3_gym`` LeRobot policy: a :class:`~cosmos3_gym.VectorPolicy` behind LeRobot's
``PreTrainedPolicy`` surface (``select_action``, ``predict_action_chunk``, ``reset``)."""

from __future__ import annotations

from typing import Any

import torch
from gymnasium.spaces import Box
from lerobot.policies.pretrained import PreTrainedPolicy
from torch import Tensor

from cosmos3_gym.integrations.lerobot import observation_from_lerobot_batch
from cosmos3_gym.policy import VectorPolicy, check_action_fit
from cosmos3_gym.policy.planner import pipeline_action_head

from .configuration_cosmos3_gym import Cosmos3GymConfig


class Cosmos3GymPolicy(PreTrainedPolicy):
    """A :class:`~cosmos3_gym.VectorPolicy` as LeRobot drives a policy.

    Each env of LeRobot's batch keeps its own prompt (``batch["task"][i]``) and its own action
    queue; ``select_action`` replans, in one batched pipeline call, only the envs whose queue is
    empty. ``reset()`` (LeRobot calls it when a rollout starts) starts a new episode everywhere;
    an env that autoresets inside a rollout is started afresh by the env from
    :func:`~cosmos3_gym.integrations.lerobot.make_lerobot_env` when it was given this policy.

    Built by LeRobot's factory from ``config`` alone (the pipeline is loaded from
    ``config.checkpoint``), or around an existing ``vector_policy``
    (:func:`~cosmos3_gym.integrations.lerobot.make_lerobot_policy`).
    """

    config_class = Cosmos3GymConfig
    name = "cosmos3_gym"

    def __init__(
        self, config: Cosmos3GymConfig, vector_policy: VectorPolicy | None = None,
        **factory_kwargs: Any,
    ) -> None:
        super().__init__(config)
        # LeRobot's factory passes the dataset's statistics and metadata when it builds a
        # policy for training; this policy is inference only and uses its checkpoint's.
        unused = sorted(k for k, v in factory_kwargs.items() if v is not None)
        if unused:
            raise ValueError(f"the cosmos3_gym policy takes no {unused} (it is inference only "
                             "and un-normalises with its checkpoint's statistics)")
        config.validate_features()
        self.vector_policy = load_vector_policy(config) if vector_policy is None else vector_policy
        self._check_action_feature()

    def _check_action_feature(self) -> None:
        """The checkpoint's actions, through the adapter, as wide as the env's (LeRobot's
        ``action`` feature), before any episode runs."""
        feature = self.config.action_feature
        head = pipeline_action_head(self.vector_policy.pipeline)
        if feature is None or head is None:
            return
        width, domain = head
        check_action_fit(
            self.vector_policy.adapter, width, domain, Box(-float("inf"), float("inf"),
                                                           tuple(feature.shape)),
            checkpoint=f"checkpoint {self.config.checkpoint!r}", env_label="LeRobot's env's",
            fix="Choose the adapter (--policy.adapter) or checkpoint made for this env.",
        )

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
        raise NotImplementedError("the cosmos3_gym LeRobot policy is inference only "
                                  "(no training loss)")

    def get_optim_params(self) -> dict:
        raise NotImplementedError("the cosmos3_gym LeRobot policy is inference only")


def load_vector_policy(config: Cosmos3GymConfig) -> VectorPolicy:
    """The VectorPolicy ``config`` describes: its checkpoint loaded as ``cosmos3-gym eval``
    loads one (``--device``, ``--precision``, ``--domain``, ``--recipe``, ``--action-stats``)."""
    from cosmos3_gym.devices import resolve_device, resolve_precision
    from cosmos3_gym.pipeline import InferenceOptions
    from cosmos3_gym.settings import ModelSettings
    from cosmos3_gym.source import read_model_source

    if config.checkpoint is None:
        raise ValueError("the cosmos3_gym policy needs a checkpoint (--policy.checkpoint=tiny or "
                         "a folder) or a VectorPolicy (make_lerobot_policy)")
    source = read_model_source(ModelSettings(
        checkpoint=config.checkpoint, domain=config.domain, recipe=config.recipe,
        action_stats=config.action_stats))
    device = resolve_device(config.device or "auto")
    dtype, fp8 = resolve_precision(config.precision, device)
    pipeline = source.load(device=device, dtype=dtype, options=InferenceOptions(fp8=fp8))
    adapter = {} if config.adapter is None else {"adapter": config.adapter}
    return VectorPolicy(pipeline, n_action_steps=config.n_action_steps, seed=config.seed,
                        **adapter, **config.sampler_settings())
