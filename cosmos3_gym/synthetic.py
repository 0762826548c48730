"""Weight-free evaluations and rollouts: the real loop around a Cosmos3 of a published shape.

``cosmos3-gym eval --synthetic nano`` (and ``rollout --synthetic ...``) runs the whole loop
(envs, adapter, chunk planner, queues, results) around :meth:`Cosmos3ActionPipeline.from_preset`,
a generator and VAE of the published shape with random weights built on the device. Timing and
memory depend on shapes, not weight values, so the run measures what a suite will cost (episodes
per hour, the loop's time beside the pipeline's) before the weights are at hand. Its success
rates mean nothing, and its results say so.

The model sees what it would see on LIBERO. On ``--env libero`` that is LIBERO itself, under the
official recipe's settings (10-D actions, 16-action chunks, the 256 tier). On the built-in
``color_reach`` each frame is shown twice side by side, as LIBERO's agentview and wrist cameras
are, under LIBERO's prompt sentences: a 256x256 ColorReach frame becomes LIBERO's 256x512 model
input, with its token counts (250 vision + 16 action GEN tokens), and the env's 2-D action is
the first two of the 10 raw action channels.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.policy.adapters import Adapter, GenericAdapter, get_adapter
from cosmos3_gym.settings import SYNTHETIC_PRESETS

if TYPE_CHECKING:
    import torch

    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.envs import EvalEnv
    from cosmos3_gym.pipeline import InferenceOptions

PRESETS = SYNTHETIC_PRESETS
# The side of a ColorReach frame under --synthetic (one LIBERO camera view).
COLOR_REACH_VIEW = 256
MEANINGLESS = ("synthetic model (random weights): success rates are meaningless; the timings "
               "are the real model's")


class TwoViewColorReachAdapter(GenericAdapter):
    """ColorReach frames as LIBERO's model input: the frame twice side by side
    (``[B, S, S, 3]`` -> ``[B, S, 2S, 3]``), the task with LIBERO's view sentences, and the
    first two raw action channels as the env's 2-D velocity.

    >>> import numpy as np
    >>> TwoViewColorReachAdapter().images(np.zeros((2, 256, 256, 3), np.uint8)).shape
    (2, 256, 512, 3)
    """

    name = "color_reach_two_view"

    def images(self, obs: Any) -> np.ndarray:
        frames = super().images(obs)
        return np.concatenate([frames, frames], axis=2)

    def prompt(self, task: str) -> str:
        return get_adapter("libero").prompt(task)

    def actions(self, raw: np.ndarray) -> np.ndarray:
        return np.array(raw[..., :2], dtype=np.float32, copy=True)


def view_size(env: str, synthetic: str | None, image_size: int | None) -> int | None:
    """The env image size a run uses: on ``color_reach`` under ``--synthetic``, one LIBERO view
    (256) unless given; otherwise as given."""
    if synthetic is not None and env == "color_reach" and image_size is None:
        return COLOR_REACH_VIEW
    return image_size


def synthetic_policy(eval_env: EvalEnv | None = None) -> PolicyConfig:
    """The action head a synthetic run uses: LIBERO's recipe (10-D actions, 16-action chunks,
    the 256 tier, 30 steps), un-normalised: random weights have no statistics. An env family
    that sizes the head (``sizes_synthetic_head``: ``--env gym:ID``) gets one as wide as its
    actions, in the model's normalised space (what ``--action-map box`` maps onto its Box)."""
    width = _sized_head_width(eval_env)
    extra = {} if width is None else {"raw_action_dim": width}
    return PolicyConfig.for_domain("libero", normalization="none", **extra)


def synthetic_adapter(eval_env: EvalEnv) -> Adapter:
    """The adapter a synthetic run drives ``eval_env`` with (see the module notes)."""
    if _sized_head_width(eval_env) is not None:
        return get_adapter(eval_env.adapter, **eval_env.adapter_options)
    if eval_env.adapter == "generic":
        return TwoViewColorReachAdapter()
    return get_adapter(eval_env.adapter, **eval_env.adapter_options)


def _sized_head_width(eval_env: EvalEnv | None) -> int | None:
    if eval_env is None or not getattr(eval_env, "sizes_synthetic_head", False):
        return None
    space = eval_env.single_action_space()
    if not getattr(space, "shape", None):
        raise ValueError(f"--synthetic sizes its action head to the env's actions; found the "
                         f"action space {space}, expected a Box [D]")
    return int(space.shape[-1])


def synthetic_pipeline(
    preset: str, *, device: torch.device | str = "auto", dtype: torch.dtype | None = None,
    options: InferenceOptions | None = None, eval_env: EvalEnv | None = None,
) -> Cosmos3ActionPipeline:
    """:meth:`Cosmos3ActionPipeline.from_preset` with :func:`synthetic_policy`'s action head
    (for ``eval_env``)."""
    from cosmos3_gym import Cosmos3ActionPipeline

    if preset not in PRESETS:
        raise ValueError(f"--synthetic: unknown preset {preset!r}; expected one of {PRESETS}")
    return Cosmos3ActionPipeline.from_preset(
        preset, synthetic_policy(eval_env), device=device, dtype=dtype, options=options
    )
