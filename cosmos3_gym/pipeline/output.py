"""What one pipeline call returns."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from cosmos3_gym.pipeline.sde import StochasticRecord


@dataclass
class ActionOutput:
    """The result of ``Cosmos3ActionPipeline.__call__`` for B requests.

    Attributes:
        actions: ``[B, H, D]`` float32, un-normalised raw actions of the checkpoint's domain
            (``D = raw_action_dim``; e.g. 10-D ``[dpos, rot6d, gripper]`` for the LIBERO recipe).
            ``B == 1`` keeps the batch axis; use ``out.actions[0]`` for ``[H, D]``.
        normalized_actions: ``[B, H, D]`` float32, the sampler's output before un-normalisation.
        action_noise: ``[B, H, 64]`` float32, the initial action noise each item started from
            (what an RL learner needs to replay a chunk).
        seeds: the per-item seeds seeded noise was drawn from (``None`` when the caller passed
            both ``action_noise`` and ``video_noise``).
        timings: per-stage seconds (``"<stage>_s"``), peak memory where measurable
            (``"<stage>_peak_bytes"``) and ``"total_s"``.
        video: the decoded future video per item when asked for (``None`` for the items
            not asked, when ``return_video`` named items), else ``None``.
        stochastic: with a stochastic ``sampler``, the stochastic steps of every item and their
            log-probabilities (:class:`~cosmos3_gym.pipeline.sde.StochasticRecord`), else None.
    """

    actions: np.ndarray
    normalized_actions: np.ndarray
    action_noise: np.ndarray
    seeds: list[int | None]
    timings: dict[str, float] = field(default_factory=dict)
    # With ``return_video``: per item, the predicted clip as uint8 ``[H + 1, h, w, 3]`` (frame 0
    # is the decoded observation, frame k the one after action k; content region, padding
    # cropped away), or None for an item not asked.
    video: list[np.ndarray | None] | None = None
    stochastic: StochasticRecord | None = None

    def __len__(self) -> int:
        return int(self.actions.shape[0])
