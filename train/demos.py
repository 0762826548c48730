"""Demos: ColorReach expert rollouts, and the tensors the transformer trains on.

Every sample goes through the pipeline's own stages, so training sees exactly what inference
sees: preprocess + encode (the 128x128 image on the 256 canvas, the VAE latent of its content:
8x8 latents, one 2x2 patch per arena cell) and the prompt stage's caption tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cosmos3_gym.envs import ColorReachEnv, ColorReachExpert
from cosmos3_gym.envs.color_reach import prompt_for
from cosmos3_gym.pipeline.preprocess import plan_canvas
from cosmos3_gym.pipeline.stages import MicroBatch, SamplingParams
from cosmos3_gym.progress import progress_bar
from cosmos3_gym.train.config import TrainConfig


@dataclass
class Demos:
    """Expert-labelled samples: ``images`` uint8 ``[N, S, S, 3]``, ``colors`` int ``[N]``
    (index into ``COLOR_ORDER``), ``chunks`` float32 ``[N, H, 2]``."""

    images: np.ndarray
    colors: np.ndarray
    chunks: np.ndarray

    def __len__(self) -> int:
        return int(self.images.shape[0])


COLOR_ORDER = ("red", "green", "blue", "yellow")


def collect_demos(cfg: TrainConfig, progress: bool = False) -> Demos:
    """Roll the expert (with random detours) from fixed seeds; label states with expert chunks."""
    expert = ColorReachExpert()
    images, colors, chunks = [], [], []
    episodes = progress_bar(enabled=progress, total=cfg.episodes, desc="demos", unit="ep")
    for episode in range(cfg.episodes):
        env = ColorReachEnv(image_size=cfg.image_size, colors=COLOR_ORDER)
        rng = np.random.default_rng([cfg.seed, episode])
        obs, _ = env.reset(seed=cfg.seed * 1_000_003 + episode)
        for _ in range(env.max_episode_steps):
            state = env.state_dict()
            if rng.random() < cfg.keep_prob:
                images.append(obs)
                colors.append(COLOR_ORDER.index(state.goal))
                chunks.append(expert.chunk(state, cfg.action_horizon))
            if rng.random() < cfg.detour_prob:
                action = rng.uniform(-1.0, 1.0, size=2).astype(np.float32)
            else:
                action = expert(state)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        episodes.update(1)
    episodes.close()
    return Demos(np.stack(images), np.asarray(colors, np.int64), np.stack(chunks))


# ---------------------------------------------------------------------- pipeline inputs


@dataclass
class EncodedDemos:
    """What the transformer sees: clean latents, caption tokens per colour, action targets."""

    latents: torch.Tensor  # [N, 48, 1, h, w] normalised conditioning latents
    colors: torch.Tensor  # [N] index into the caption batch
    actions: torch.Tensor  # [N, H, 64] float32, channels >= raw_action_dim zero
    input_ids: torch.Tensor  # [4, L] one JSON caption per colour
    text_mask: torch.Tensor  # [4, L]


def encode_demos(pipe: Any, demos: Demos, batch_size: int, progress: bool = False) -> EncodedDemos:
    """Turn demos into the pipeline's exact tensors through its own stages: preprocess and
    encode (the image on the tier canvas, the VAE latent of its content) and the prompt stage's
    tokens (the JSON caption of each colour)."""
    policy = pipe.policy
    plan = plan_canvas(demos.images.shape[1], demos.images.shape[2], policy.resolution_tier)
    params = SamplingParams(
        num_inference_steps=policy.num_inference_steps, guidance_scale=1.0,
        flow_shift=policy.flow_shift, progress=False,
    )
    latents = []
    bar = progress_bar(enabled=progress, total=len(demos), desc="encode", unit="sample")
    for start in range(0, len(demos), batch_size):
        images = list(demos.images[start : start + batch_size])
        batch = MicroBatch(
            indices=list(range(len(images))), images=images, prompts=[], seeds=[], plan=plan
        )
        for stage in (pipe.preprocess, pipe.encode):
            batch = stage(batch, params)
        latents.append(batch.cond_latent)  # [b, 48, 1, h, w] normalised content latents
        bar.update(len(images))
    bar.close()
    captions = MicroBatch(
        indices=list(range(len(COLOR_ORDER))), images=[],
        prompts=[prompt_for(color) for color in COLOR_ORDER], seeds=[], plan=plan,
    )
    input_ids, text_mask = pipe.prompt.tokenize(captions, params)
    actions = torch.zeros(len(demos), policy.action_horizon, pipe.noise.action_dim)
    actions[..., : policy.raw_action_dim] = torch.from_numpy(demos.chunks)
    return EncodedDemos(
        latents=torch.cat(latents), colors=torch.from_numpy(demos.colors), actions=actions,
        input_ids=input_ids, text_mask=text_mask,
    )


def latent_statistics(
    pipe: Any, demos: Demos, samples: int, batch_size: int
) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the VAE posterior mode over the first ``samples`` demos."""
    from cosmos3_gym.pipeline.vae import latent_normalization

    subset = Demos(demos.images[:samples], demos.colors[:samples], demos.chunks[:samples])
    normalized = encode_demos(pipe, subset, batch_size).latents  # [n, 48, 1, h, w]
    mean, inv_std = latent_normalization(pipe.vae)
    raw = normalized / inv_std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)
    channels = raw.transpose(0, 1).reshape(raw.shape[1], -1)  # [48, n*h*w]
    return channels.mean(1).tolist(), channels.std(1).clamp_min(1e-6).tolist()
