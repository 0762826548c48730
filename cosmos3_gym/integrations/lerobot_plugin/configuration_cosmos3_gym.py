"""The LeRobot config of the ``cosmos3_gym`` policy: every knob, its default, and why.

``lerobot-eval --policy.type=cosmos3_gym --policy.checkpoint=tiny ...`` fills it from the command
line; :func:`~cosmos3_gym.integrations.lerobot.make_lerobot_policy` fills it from a
:class:`~cosmos3_gym.VectorPolicy` that already exists.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from lerobot.configs.policies import PreTrainedConfig
from lerobot.configs.types import FeatureType

from cosmos3_gym.integrations.lerobot import default_camera_keys
from cosmos3_gym.pipeline.sampling import NOISE_RULES


@PreTrainedConfig.register_subclass("cosmos3_gym")
@dataclass
class Cosmos3GymConfig(PreTrainedConfig):
    """A cosmos3-gym :class:`~cosmos3_gym.VectorPolicy` as a LeRobot policy: batched over
    LeRobot's envs, one prompt and one action queue per env, per-env seeds.

    Inference only: there is nothing for LeRobot's trainer here (``cosmos3-gym train`` trains).
    ``--policy.device`` (LeRobot's own field) says where the model runs; LeRobot picks the GPU
    where there is one.
    """

    # What Cosmos3ActionPipeline.from_pretrained loads: a shipped name ("tiny") or a folder.
    # Not --policy.path: that reads a LeRobot config.json and takes the policy type from it.
    # None: a policy made around an existing VectorPolicy (make_lerobot_policy).
    checkpoint: str | None = "tiny"
    # The checkpoint's embodiment, for a folder without action_policy.json (cosmos3-gym eval's
    # --domain); None: the folder's own.
    domain: str | None = None
    # A released checkpoint's published sampler recipe (docs/recipes.md); None: the folder's.
    recipe: str | None = None
    # Action statistics JSON replacing the checkpoint's (cosmos3-gym eval's --action-stats).
    action_stats: str | None = None
    # fp32, bf16 or fp8, or auto: bf16 on CUDA, fp32 on the CPU (cosmos3-gym's --precision).
    precision: str = "auto"
    # The benchmark conventions (cosmos3_gym.policy.ADAPTERS: generic, libero, metaworld, droid);
    # None: VectorPolicy's default.
    adapter: str | None = None
    # Actions executed per chunk before the env replans; None: the whole chunk.
    n_action_steps: int | None = None
    # The root of every chunk's noise seed (VectorPolicy's seed).
    seed: int = 0
    # per_chunk: fresh noise for chunk c of env e's episode n, from (seed, e, n, c); fixed:
    # every chunk from `seed` (the official LIBERO server's rule). None: per_chunk.
    noise: str | None = None
    # Sampler overrides; None: the checkpoint's own.
    num_inference_steps: int | None = None
    guidance_scale: float | None = None
    flow_shift: float | None = None
    # LeRobot camera name (observation.images.<name>) -> the observation key the adapter reads;
    # default: LeRobot's LIBERO names (image, image2) to ours (agentview_image, wrist_image).
    camera_keys: dict[str, str] = field(default_factory=default_camera_keys)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.noise not in (None, *NOISE_RULES):
            raise ValueError(
                f"--policy.noise: expected one of {list(NOISE_RULES)}; found {self.noise!r}"
            )
        if self.n_action_steps is not None and self.n_action_steps < 1:
            raise ValueError(f"--policy.n_action_steps: expected >= 1; found {self.n_action_steps}")

    def sampler_settings(self) -> dict[str, Any]:
        """The sampler fields given here (VectorPolicy's keyword arguments)."""
        names = ("noise", "num_inference_steps", "guidance_scale", "flow_shift")
        return {name: getattr(self, name) for name in names if getattr(self, name) is not None}

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
        raise NotImplementedError("the cosmos3_gym LeRobot policy is inference only")

    def get_scheduler_preset(self) -> None:
        return None

    def validate_features(self) -> None:
        """At least one image in, an action out, when LeRobot has set the features (a policy
        made from a VectorPolicy, outside LeRobot's factory, has none)."""
        if not self.input_features and not self.output_features:
            return
        if not self.image_features:
            raise ValueError(
                "the cosmos3_gym policy reads images; the env's features have none: "
                f"{ {k: v.type.name for k, v in (self.input_features or {}).items()} }"
            )
        if self.action_feature is None or self.action_feature.type is not FeatureType.ACTION:
            raise ValueError(
                f"the cosmos3_gym policy makes actions; the env's output features are "
                f"{sorted(self.output_features or {})}, without 'action'"
            )

