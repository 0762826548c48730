"""What a training run is: every knob with its default (the shipped ``tiny`` checkpoint's), and
the transformer and policy-head configs it writes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cosmos3_gym.settings import setting

VIEW_POINT = "ego_view"
DOMAIN_NAME = "color_reach"
DOMAIN_ID = 0  # ColorReach is no released embodiment; row 0 of the DomainAwareLinear tables
# How the future video's noise level relates to the actions' in training (train/trainer.py).
VIDEO_NOISE = ("shared", "independent")


def _knob(default: Any, text: str, flag: str | None = None,
          choices: tuple[str, ...] | None = None) -> Any:
    """A field with its default and its one-line help (``cosmos3-gym train --help``)."""
    return setting(default, text, group="train", flag=flag, choices=choices)


@dataclass
class TrainConfig:
    """Every knob of a training run, with its default (the shipped ``tiny`` checkpoint's)."""

    out: str = _knob("tiny", "where the command writes its results; the checkpoint folder")
    seed: int = _knob(0, "the run's root seed; the demos, the initial weights and the data "
                      "order derive from it")
    # Demo collection: episodes, the chance of a random detour per step, and the chance that
    # a visited state is kept as a sample (fewer samples per layout, more layouts per VAE second).
    episodes: int = _knob(1400, "expert ColorReach episodes collected as demos")
    detour_prob: float = _knob(
        0.3, "chance per step that a random velocity replaces the expert's (off-expert states)"
    )
    keep_prob: float = _knob(0.3, "chance that a visited state is kept as a training sample")
    image_size: int = _knob(128, "the env's square image size in pixels; ColorReach's, for the "
                            "demos")
    # Model: the real architecture at tiny widths.
    hidden_size: int = _knob(128, "transformer width")
    num_layers: int = _knob(2, "transformer layers")
    num_heads: int = _knob(4, "attention query heads")
    num_kv_heads: int = _knob(2, "attention key/value heads (grouped-query attention)")
    head_dim: int = _knob(32, "width of one attention head")
    intermediate_size: int = _knob(256, "MLP width")
    # Policy head.
    action_horizon: int = _knob(4, "actions per chunk (a multiple of 4)")
    num_inference_steps: int = _knob(8, "denoising steps the trained head asks for at inference",
                                     flag="head-denoising-steps")
    flow_shift: float = _knob(1.0, "the flow shift the trained head asks for at inference",
                              flag="head-flow-shift")
    # Optimisation.
    steps: int = _knob(2400, "optimiser steps of the transformer", flag="train-steps")
    batch_size: int = _knob(64, "samples per optimiser step")
    lr: float = _knob(2e-3, "the optimiser's learning rate (AdamW); the peak of a warmup and "
                      "cosine schedule")
    weight_decay: float = _knob(0.01, "AdamW weight decay")
    warmup_steps: int = _knob(150, "linear warmup steps before the cosine decay")
    video_loss_weight: float = _knob(
        0.1, "weight of the future-frame velocity loss beside the action loss"
    )
    video_target: str = _knob(
        "still", "future latent frames trained towards: 'still' (the observation's latent) or "
        "'future' (the frames the expert's chunk renders; see train/trainer.py)"
    )
    video_noise: str = _knob(
        "shared", "noise levels of the future video and the action tokens: 'shared' (one per "
        "sample) or 'independent' (each its own; see train/trainer.py)", choices=VIDEO_NOISE
    )
    pure_noise_video: float = _knob(
        0.0, "share of samples whose future video is pure noise (with 'independent' video noise)"
    )
    video_motion_weight: float = _knob(
        0.0, "extra weight of the video loss on latent cells the chunk changes, per share of "
        "their pixels that move"
    )
    log_every: int = _knob(25, "steps per point of the loss curves (train_log.json)")
    encode_batch_size: int = _knob(32, "demo images per VAE encode call")
    stats_samples: int = _knob(
        64, "demos whose latents set the VAE's per-channel normalisation statistics"
    )
    # The VAE's decoder, trained after the statistics are set (train/vae.py); the encoder stays.
    vae_clips: int = _knob(1024, "demo clips the VAE decoder learns to draw (the first ones)")
    vae_steps: int = _knob(1800, "VAE decoder optimiser steps (0: keep it random)")
    vae_batch_size: int = _knob(8, "clips per VAE decoder step")
    vae_still_rows: int = _knob(
        2, "clips per VAE step shown as the still future (with the 'still' video target)"
    )
    vae_crop: int = _knob(64, "side of the window each VAE training clip is cut to (px)")
    vae_lr: float = _knob(3e-3, "peak learning rate of the VAE decoder (AdamW)")
    vae_warmup_steps: int = _knob(50, "VAE linear warmup steps before the cosine decay")
    vae_holdout_episodes: int = _knob(
        40, "expert episodes after the training ones whose clips measure the VAE's PSNR"
    )
    # One intra-op thread: the result does not depend on how busy a shared machine is, and
    # two threads on two shared cores are slower than one.
    threads: int = _knob(1, "torch intra-op CPU threads; 1 keeps the result independent of how "
                         "busy a shared machine is")


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
