"""Demos: expert rollouts (ColorReach's or Meta-World's scripted experts), and the tensors the
transformer trains on.

Every sample goes through the pipeline's own functions, so training sees exactly what inference
sees: the preprocess stage's canvas (the 128x128 image on the 256 canvas), the VAE latent of its
content (8x8 latents, one 2x2 patch per ColorReach arena cell; the clip of the observation and
the frames after it, encoded causally, so latent frame 0 is the encode stage's conditioning
latent) and the prompt stage's caption tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from cosmos3_gym.envs import ColorReachEnv, ColorReachExpert
from cosmos3_gym.envs.color_reach import prompt_for
from cosmos3_gym.pipeline.preprocess import CanvasPlan, plan_canvas
from cosmos3_gym.pipeline.stages import MicroBatch, SamplingParams
from cosmos3_gym.progress import progress_bar
from cosmos3_gym.train.config import TrainConfig, check_demo_env, demo_episode_steps
from cosmos3_gym.train.vae import encode_clips


@dataclass
class Demos:
    """Expert-labelled samples: ``images`` uint8 ``[N, S, S, 3]``, ``prompt_ids`` int ``[N]``
    (index into ``prompts``, the instruction of each sample's episode), ``chunks`` float32
    ``[N, H, D]`` (the expert's raw actions) and ``futures`` uint8 ``[N, H, S, S, 3]``: the
    frames after each action of the chunk, so ``futures[n, k]`` is the frame ``k + 1`` steps
    after ``images[n]``."""

    images: np.ndarray
    prompt_ids: np.ndarray
    chunks: np.ndarray
    futures: np.ndarray
    prompts: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def __getitem__(self, index: slice | np.ndarray) -> Demos:
        return Demos(self.images[index], self.prompt_ids[index], self.chunks[index],
                     self.futures[index], self.prompts)

    @property
    def clips(self) -> np.ndarray:
        """uint8 ``[N, H + 1, S, S, 3]``: each sample's observation and its chunk's frames."""
        return np.concatenate([self.images[:, None], self.futures], axis=1)


COLOR_ORDER = ("red", "green", "blue", "yellow")
# One sample: (image, prompt id, chunk [H, D], futures [H, S, S, 3]).
Sample = tuple[np.ndarray, int, np.ndarray, np.ndarray]


def collect_demos(
    cfg: TrainConfig, progress: bool = False, *, episodes: range | None = None
) -> Demos:
    """Roll the family's expert (``cfg.env``) with random detours from fixed seeds; label
    states with expert chunks and the frames after them. ``episodes`` (default
    ``range(cfg.episodes)``) picks the episode indices (the VAE's held-out clips come from
    indices past the training ones)."""
    episodes = range(cfg.episodes) if episodes is None else episodes
    check_demo_env(cfg.env)
    prompts, samples = demo_prompts(cfg), COLLECTORS[cfg.env](cfg, episodes)
    images, prompt_ids, chunks, futures = [], [], [], []
    bar = progress_bar(enabled=progress, total=len(episodes), desc="demos", unit="ep")
    for sample in samples:
        if sample is None:  # an episode ended
            bar.update(1)
            continue
        images.append(sample[0])
        prompt_ids.append(sample[1])
        chunks.append(sample[2])
        futures.append(sample[3])
    bar.close()
    return Demos(np.stack(images), np.asarray(prompt_ids, np.int64), np.stack(chunks),
                 np.stack(futures), prompts)


def demo_prompts(cfg: TrainConfig) -> tuple[str, ...]:
    """The demos' prompts, in the order their samples' prompt ids index: ColorReach's four
    colours, or each of ``cfg.tasks``'s Meta-World task descriptions."""
    if cfg.env == "metaworld":
        from cosmos3_gym.envs.metaworld import METAWORLD_TASK_DESCRIPTIONS

        return tuple(METAWORLD_TASK_DESCRIPTIONS[t] for t in cfg.tasks or ())
    return tuple(prompt_for(c) for c in COLOR_ORDER)


def _color_reach_demos(cfg: TrainConfig, episodes: range) -> Iterator[Sample | None]:
    """ColorReach: each kept state is labelled with the expert's open-loop chunk and the frames
    that chunk renders (the env is deterministic: :meth:`ColorReachEnv.preview`)."""
    expert = ColorReachExpert()
    for episode in episodes:
        env = ColorReachEnv(image_size=cfg.image_size, colors=COLOR_ORDER)
        rng = np.random.default_rng([cfg.seed, episode])
        obs, _ = env.reset(seed=cfg.seed * 1_000_003 + episode)
        for _ in range(env.max_episode_steps):
            state = env.state_dict()
            if rng.random() < cfg.keep_prob:
                chunk = expert.chunk(state, cfg.action_horizon)
                yield obs, COLOR_ORDER.index(state.goal), chunk, env.preview(chunk)
            if rng.random() < cfg.detour_prob:
                action = rng.uniform(-1.0, 1.0, size=2).astype(np.float32)
            else:
                action = expert(state)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        yield None


def _metaworld_demos(cfg: TrainConfig, episodes: range) -> Iterator[Sample | None]:
    """Meta-World: episode ``k`` runs task ``k mod T`` of ``cfg.tasks`` on layout
    ``(k // T) mod 50``, frames rendered without shadows. Its expert reads the simulator's
    state, so a chunk cannot be previewed: the episode is recorded whole (the expert's action
    at every state, a random one executed instead with ``detour_prob``), and each kept state is
    labelled with the expert's actions at it and the next ``H - 1`` states, and the ``H``
    frames that follow it (where a detour ran, the frames show the detour; the labels stay the
    expert's). Past the episode's end the last action and frame repeat. Actions are the
    metaworld adapter's raw ones (:meth:`MetaWorldAdapter.raw_actions`)."""
    from cosmos3_gym.envs.metaworld import METAWORLD_LAYOUTS_PER_TASK, MetaWorldEnv, MetaWorldExpert
    from cosmos3_gym.policy.adapters import MetaWorldAdapter

    tasks = list(cfg.tasks or ())
    steps = demo_episode_steps(cfg)
    horizon = cfg.action_horizon
    envs = {t: MetaWorldEnv(t, image_size=cfg.image_size, max_episode_steps=steps,
                            shadows=False) for t in tasks}
    experts = {t: MetaWorldExpert(t) for t in tasks}
    try:
        for episode in episodes:
            index = episode % len(tasks)
            env, expert = envs[tasks[index]], experts[tasks[index]]
            rng = np.random.default_rng([cfg.seed, episode])
            layout = (episode // len(tasks)) % METAWORLD_LAYOUTS_PER_TASK
            obs, _ = env.reset(options={"layout_id": layout})
            frames, labels, keep = [obs["image"]], [], []
            for _ in range(steps):
                labels.append(np.clip(expert.act(env.raw_observation), -1.0, 1.0))
                keep.append(rng.random() < cfg.keep_prob)
                if rng.random() < cfg.detour_prob:
                    action = rng.uniform(-1.0, 1.0, size=4).astype(np.float32)
                else:
                    action = labels[-1]
                obs, _, terminated, truncated, _ = env.step(action)
                frames.append(obs["image"])
                if terminated or truncated:
                    break
            labels.append(np.clip(expert.act(env.raw_observation), -1.0, 1.0))
            raw = MetaWorldAdapter.raw_actions(np.stack(labels))  # [T + 1, 4]
            last = len(frames) - 1
            for t in np.flatnonzero(keep):
                ahead = np.minimum(np.arange(t, t + horizon), last)
                yield (frames[t], index, raw[ahead].astype(np.float32),
                       np.stack([frames[k] for k in np.minimum(ahead + 1, last)]))
            yield None
    finally:
        for env in envs.values():
            env.close()


# Each env family's expert demos (train/config.py's DEMO_HEADS names the same families).
COLLECTORS = {"color_reach": _color_reach_demos, "metaworld": _metaworld_demos}


# ---------------------------------------------------------------------- pipeline inputs


@dataclass
class EncodedDemos:
    """What the transformer sees: clean latents, caption tokens per prompt, action targets."""

    latents: torch.Tensor  # [N, 48, T, h, w] normalised: frame 0 the observation (T = 1: only
    # it, the "still" target), frames 1.. the real future (the "future" target)
    prompt_ids: torch.Tensor  # [N] index into the caption batch
    actions: torch.Tensor  # [N, H, 64] float32, channels >= raw_action_dim zero
    input_ids: torch.Tensor  # [P, L] one JSON caption per prompt
    text_mask: torch.Tensor  # [P, L]


def encode_demos(
    pipe: Any, demos: Demos, batch_size: int, progress: bool = False,
    future_latents: torch.Tensor | None = None,
) -> EncodedDemos:
    """Turn demos into the pipeline's exact tensors through its own stages: preprocess and
    encode (the image on the tier canvas, the VAE latent of its content) and the prompt stage's
    tokens (the JSON caption of each prompt). ``future_latents`` (raw ``[N, 48, T, h, w]`` clip
    latents from :func:`encode_raw_latents`) append the real future's latent frames 1..,
    normalised with the checkpoint VAE's statistics."""
    policy = pipe.policy
    plan = demo_canvas(pipe, demos)
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
    latent = torch.cat(latents)
    if future_latents is not None:
        from cosmos3_gym.pipeline.vae import latent_normalization

        mean, inv_std = latent_normalization(pipe.vae)
        future = (future_latents[:, :, 1:] - mean.view(1, -1, 1, 1, 1)) * inv_std.view(
            1, -1, 1, 1, 1)
        latent = torch.cat([latent, future], dim=2)
    captions = MicroBatch(
        indices=list(range(len(demos.prompts))), images=[], prompts=list(demos.prompts),
        seeds=[], plan=plan,
    )
    input_ids, text_mask = pipe.prompt.tokenize(captions, params)
    actions = torch.zeros(len(demos), policy.action_horizon, pipe.noise.action_dim)
    actions[..., : policy.raw_action_dim] = torch.from_numpy(demos.chunks)
    return EncodedDemos(
        latents=latent, prompt_ids=torch.from_numpy(demos.prompt_ids), actions=actions,
        input_ids=input_ids, text_mask=text_mask,
    )


def motion_cells(demos: Demos, cell: int) -> torch.Tensor:
    """float32 ``[N, S / cell, S / cell]``: the share of each latent cell's pixels that the chunk
    changes (any of its rendered frames differs from the observation there, in any channel)."""
    moved = np.any(demos.futures != demos.images[:, None], axis=(1, 4))  # [N, S, S]
    n, h, w = moved.shape
    if h % cell or w % cell:
        raise ValueError(f"motion cells: {h}x{w} px images do not tile into {cell} px cells")
    share = moved.reshape(n, h // cell, cell, w // cell, cell).mean(axis=(2, 4))
    return torch.from_numpy(share.astype(np.float32))


def encode_raw_latents(
    vae: Any, demos: Demos, plan: CanvasPlan, batch_size: int, progress: bool = False
) -> torch.Tensor:
    """The VAE posterior mode of every demo clip, ``[N, 48, T, h, w]`` (not normalised): each
    frame on the model's canvas (the preprocess stage's function), the clip encoded causally,
    the latent cropped to the content as the encode stage crops it. Latent frame 0 is the
    encode stage's conditioning latent (the causal encoder codes frame 0 alone); frame ``j``
    codes the chunk's frames ``4(j - 1) + 1 .. 4j``."""
    latents = []
    bar = progress_bar(enabled=progress, total=len(demos), desc="encode clips", unit="clip")
    for start in range(0, len(demos), batch_size):
        latents.append(encode_clips(vae, demos[start : start + batch_size].clips, plan))
        bar.update(min(batch_size, len(demos) - start))
    bar.close()
    return torch.cat(latents)


def demo_canvas(pipe: Any, demos: Demos) -> CanvasPlan:
    """The canvas the pipeline puts the demos' images on (the policy head's resolution tier)."""
    return plan_canvas(demos.images.shape[1], demos.images.shape[2], pipe.policy.resolution_tier)


def latent_statistics(
    pipe: Any, demos: Demos, samples: int, batch_size: int
) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of the VAE posterior mode over the first ``samples`` demos."""
    from cosmos3_gym.pipeline.vae import latent_normalization

    normalized = encode_demos(pipe, demos[:samples], batch_size).latents  # [n, 48, 1, h, w]
    mean, inv_std = latent_normalization(pipe.vae)
    raw = normalized / inv_std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)
    channels = raw.transpose(0, 1).reshape(raw.shape[1], -1)  # [48, n*h*w]
    return channels.mean(1).tolist(), channels.std(1).clamp_min(1e-6).tolist()
