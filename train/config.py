"""What a training run is: every knob with its default (the shipped ``tiny`` checkpoint's), and
the transformer and policy-head configs it writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

VIEW_POINT = "ego_view"
DOMAIN_NAME = "color_reach"
DOMAIN_ID = 0  # ColorReach is no released embodiment; row 0 of the DomainAwareLinear tables


@dataclass
class TrainConfig:
    """Every knob of a training run, with its default (the shipped ``tiny`` checkpoint's)."""

    out: str = "tiny"
    seed: int = 0
    # Demo collection: episodes, the chance of a random detour per step, and the chance that
    # a visited state is kept as a sample (fewer samples per layout, more layouts per VAE second).
    episodes: int = 1400
    detour_prob: float = 0.3
    keep_prob: float = 0.3
    image_size: int = 128
    # Model: the real architecture at tiny widths.
    hidden_size: int = 128
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    # Policy head.
    action_horizon: int = 4
    num_inference_steps: int = 8
    flow_shift: float = 1.0
    # Optimisation.
    steps: int = 2400
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_steps: int = 150
    video_loss_weight: float = 0.1
    log_every: int = 25
    encode_batch_size: int = 32
    # Demos whose latents set the VAE's per-channel normalisation statistics.
    stats_samples: int = 64
    # One intra-op thread: the result does not depend on how busy a shared machine is, and
    # two threads on two shared cores are slower than one.
    threads: int = 1


def transformer_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """``transformer/config.json`` keys that differ from the tiny test default."""
    quarter = cfg.head_dim // 8
    axes = [cfg.head_dim // 2 - 2 * quarter, quarter, quarter]  # (T, H, W) split of mRoPE
    return {
        "hidden_size": cfg.hidden_size,
        "head_dim": cfg.head_dim,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "num_hidden_layers": cfg.num_layers,
        "intermediate_size": cfg.intermediate_size,
        "rope_axes_dim": axes,
        "rope_scaling": {"mrope_section": axes, "mrope_interleaved": True},
    }


def policy_overrides(cfg: TrainConfig) -> dict[str, Any]:
    """``action_policy.json`` of the trained checkpoint: ColorReach's 2-D velocities in [-1, 1]."""
    return {
        "domain_name": DOMAIN_NAME, "domain_id": DOMAIN_ID, "raw_action_dim": 2,
        "action_horizon": cfg.action_horizon, "normalization": "none", "stats": None,
        "fps": 20.0, "resolution_tier": 256, "view_point": VIEW_POINT,
        "num_inference_steps": cfg.num_inference_steps, "flow_shift": cfg.flow_shift,
    }
