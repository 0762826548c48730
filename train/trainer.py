"""Train a tiny Cosmos3 policy on ColorReach expert demos, deterministically on CPU.

The recipe, end to end:

1. **Layout first.** :func:`~cosmos3_gym.tiny.write_tiny_checkpoint` writes the full diffusers
   folder (tokenizer, frozen random tiny VAE, randomly initialised transformer, scheduler,
   ``action_policy.json``), and training loads it back through
   :meth:`Cosmos3ActionPipeline.from_pretrained`, so train and inference share one tokenizer, one
   VAE and one policy head description. The VAE stays random and frozen, but its per-channel
   ``latents_mean``/``latents_std`` are set from the demos' latents (as Wan2.2's are from its
   data): with the test statistics, frames differ by ~0.03 in latent space and learning stalls.
   The transformer is trained from its own unfused copy (the pipeline fuses GEN projections).
2. **Demos.** ColorReach episodes from fixed seeds, driven by the scripted expert with random
   detours (DAgger-lite: with probability ``detour_prob`` a random velocity is executed instead,
   so off-expert states are visited); every visited state is labelled with the expert's
   open-loop chunk of ``H`` actions from that state.
3. **Pipeline inputs.** Each sample goes through the pipeline's own functions: ``plan_canvas`` +
   ``preprocess`` (the 128x128 image on the 256 canvas), ``build_action_caption`` +
   ``tokenize_captions`` (the JSON caption), ``encode_conditioning_frames`` and the latent crop of
   ``latent_content_shape`` (8x8 latents, one 2x2 patch per arena cell).
4. **Loss.** Flow matching in the sampler's convention: ``x_σ = (1 − σ)·x0 + σ·ε``, target
   velocity ``ε − x0``, timestep ``σ·1000``; σ drawn half uniform, half logit-normal. The action
   tokens carry the expert chunk (padding channels zero, as the sampler keeps them). The future
   latent frame is supervised towards the current frame's latent (a "static video" target): it
   keeps the sampler's video state on the training distribution at no extra VAE cost; real
   future frames are not rendered (the VAE encode dominates the CPU budget).
5. **Optimiser.** AdamW, linear warmup then cosine decay, a fixed number of steps, a fixed data
   order from the seed, ``torch.use_deterministic_algorithms(True)``.

Run::

    python -m cosmos3_gym.train --out /tmp/tiny --seed 0

writes the checkpoint folder and ``train_log.json`` (loss curve, wall time) inside it.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos3_gym.envs import ColorReachEnv, ColorReachExpert
from cosmos3_gym.envs.color_reach import prompt_for

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


# ---------------------------------------------------------------------- demos


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


def collect_demos(cfg: TrainConfig) -> Demos:
    """Roll the expert (with random detours) from fixed seeds; label states with expert chunks."""
    expert = ColorReachExpert()
    images, colors, chunks = [], [], []
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


def encode_demos(pipe: Any, demos: Demos, batch_size: int) -> EncodedDemos:
    """Turn demos into the pipeline's exact tensors (canvas, caption tokens, VAE latent crop)."""
    from cosmos3_gym.pipeline.preprocess import crop_latent_to_content, plan_canvas, preprocess
    from cosmos3_gym.pipeline.prompt import build_action_caption, tokenize_captions
    from cosmos3_gym.pipeline.vae import encode_conditioning_frames

    policy = pipe.policy
    size = demos.images.shape[1]
    plan = plan_canvas(size, demos.images.shape[2], policy.resolution_tier)
    latents = []
    for start in range(0, len(demos), batch_size):
        batch = list(demos.images[start : start + batch_size])
        pixels = preprocess(batch, plan)  # [b, 3, Hc, Wc] in [-1, 1]
        latent = encode_conditioning_frames(pipe.vae, pixels)  # [b, 48, 1, Hc/16, Wc/16]
        latents.append(crop_latent_to_content(latent, plan))
    captions = [
        build_action_caption(
            prompt_for(color), view_point=policy.view_point, num_frames=policy.num_frames,
            fps=policy.fps, canvas_h=plan.target_h, canvas_w=plan.target_w,
        )
        for color in COLOR_ORDER
    ]
    tokens = tokenize_captions(
        pipe.tokenizer, captions, max_sequence_length=policy.max_sequence_length
    )
    actions = torch.zeros(len(demos), policy.action_horizon, pipe.transformer.config.action_dim)
    actions[..., : policy.raw_action_dim] = torch.from_numpy(demos.chunks)
    return EncodedDemos(
        latents=torch.cat(latents), colors=torch.from_numpy(demos.colors), actions=actions,
        input_ids=tokens.input_ids, text_mask=tokens.attention_mask,
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


# ---------------------------------------------------------------------- loss


def _select_text(text: Any, index: torch.Tensor) -> Any:
    """Rows ``index`` of a caption batch's K/V cache (gradients flow to the UND pathway)."""
    from cosmos3_gym.model import TextKVCache

    return TextKVCache(
        keys=[k[index] for k in text.keys], values=[v[index] for v in text.values],
        lengths=text.lengths[index], text_mask=text.text_mask[index],
    )


def sample_sigmas(batch: int, generator: torch.Generator) -> torch.Tensor:
    """Half uniform, half logit-normal(0, 1) σ in (0, 1): all noise levels, mid ones more."""
    uniform = torch.rand(batch, generator=generator)
    logit_normal = torch.sigmoid(torch.randn(batch, generator=generator))
    pick = torch.rand(batch, generator=generator) < 0.5
    return torch.where(pick, uniform, logit_normal).clamp(1e-3, 1.0 - 1e-3)


def flow_matching_loss(
    model: Any, data: EncodedDemos, index: torch.Tensor, generator: torch.Generator, *,
    raw_action_dim: int, domain_id: int, fps: float, video_loss_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Velocity MSE on the action tokens (+ weighted on the future latent frame)."""
    b = index.shape[0]
    cond = data.latents[index]  # [b, 48, 1, h, w]
    x0_actions = data.actions[index]  # [b, H, 64]
    horizon = x0_actions.shape[1]
    num_latent_frames = 1 + horizon // 4
    # The "static video" target: every future latent frame equals the conditioning one.
    x0_vision = cond.expand(-1, -1, num_latent_frames, -1, -1)  # [b, 48, T, h, w]

    sigma = sample_sigmas(b, generator)
    eps_actions = torch.randn(x0_actions.shape, generator=generator)
    eps_actions[..., raw_action_dim:] = 0.0  # the sampler's padding channels are zero
    eps_vision = torch.randn(x0_vision.shape, generator=generator)
    s_a = sigma[:, None, None]
    s_v = sigma[:, None, None, None, None]
    noisy_actions = (1.0 - s_a) * x0_actions + s_a * eps_actions
    noisy_vision = (1.0 - s_v) * x0_vision + s_v * eps_vision
    noisy_vision[:, :, :1] = cond  # latent frame 0 is the clean observation

    text = _select_text(
        model.encode_text(data.input_ids, data.text_mask), data.colors[index]
    )
    layout = model.gen_layout(
        text, latent_shape=tuple(noisy_vision.shape[2:]), num_actions=horizon, fps=fps
    )
    vision_noisy = (torch.arange(num_latent_frames) > 0)[None].expand(b, -1)
    action_noisy = torch.ones(b, horizon, dtype=torch.bool)
    domain_ids = torch.full((b,), domain_id, dtype=torch.long)
    v_vision, v_action = model.forward_gen(
        text, layout, noisy_vision, vision_noisy, noisy_actions, action_noisy, domain_ids,
        sigma * 1000.0,
    )
    action_target = (eps_actions - x0_actions)[..., :raw_action_dim]
    action_loss = (v_action[..., :raw_action_dim] - action_target).square().mean()
    video_target = (eps_vision - x0_vision)[:, :, 1:]
    video_loss = (v_vision[:, :, 1:] - video_target).square().mean()
    loss = action_loss + video_loss_weight * video_loss
    return loss, {"action": action_loss.item(), "video": video_loss.item()}


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def train_transformer(
    model: torch.nn.Module, data: EncodedDemos, cfg: TrainConfig, *, raw_action_dim: int,
    domain_id: int, fps: float,
) -> list[dict[str, float]]:
    """Fixed-step AdamW on the flow-matching loss; returns the logged loss curve."""
    model.train().requires_grad_(True)
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99)
    )
    n = data.latents.shape[0]
    order = torch.randperm(n, generator=generator)
    cursor = 0
    curve: list[dict[str, float]] = []
    window: list[tuple[float, float, float]] = []
    for step in range(cfg.steps):
        if cursor + cfg.batch_size > n:  # a fresh permutation per epoch, from the one generator
            order, cursor = torch.randperm(n, generator=generator), 0
        index = order[cursor : cursor + cfg.batch_size]
        cursor += cfg.batch_size
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg.warmup_steps, cfg.steps)
        loss, parts = flow_matching_loss(
            model, data, index, generator, raw_action_dim=raw_action_dim, domain_id=domain_id,
            fps=fps, video_loss_weight=cfg.video_loss_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        window.append((loss.item(), parts["action"], parts["video"]))
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            mean = np.mean(window, axis=0)
            curve.append({"step": step + 1, "loss": float(mean[0]), "action_loss": float(mean[1]),
                          "video_loss": float(mean[2]), "lr": optimizer.param_groups[0]["lr"]})
            print(f"step {step + 1:5d}  loss {mean[0]:.4f}  action {mean[1]:.4f}  "
                  f"video {mean[2]:.4f}", flush=True)
            window = []
    return curve


# ---------------------------------------------------------------------- evaluation


def evaluate_success(
    pipe: Any, *, episodes: int = 40, num_envs: int = 8, seed: int = 10_000,
    prompts: str = "right", n_action_steps: int | None = None, image_size: int = 128,
    **policy_kwargs: Any,
) -> dict[str, Any]:
    """Success rate of ``pipe`` on a fixed set of ColorReach episodes.

    Episodes run in rounds of ``num_envs``: round ``r`` resets the vector env with seed
    ``seed + r * num_envs`` (env ``i`` gets ``seed + r * num_envs + i``), and each env's first
    episode of the round counts. ``prompts="right"`` gives every env its own task;
    ``"shuffled"`` gives env ``i`` the task of env ``(i + 1) % num_envs`` (another env's target,
    which names the same colour about a quarter of the time, so chance is ~0.25).
    """
    from cosmos3_gym.envs import make_color_reach_vector_env
    from cosmos3_gym.policy import VectorPolicy

    if prompts not in ("right", "shuffled"):
        raise ValueError(f"prompts must be 'right' or 'shuffled', got {prompts!r}")
    if episodes % num_envs:
        raise ValueError(f"episodes ({episodes}) must be a multiple of num_envs ({num_envs})")
    envs = make_color_reach_vector_env(num_envs, image_size=image_size)
    policy = VectorPolicy(
        pipe, adapter="generic", n_action_steps=n_action_steps, seed=seed, **policy_kwargs
    )
    max_steps = envs.get_attr("max_episode_steps")[0]
    outcomes: list[bool] = []
    try:
        for round_index in range(episodes // num_envs):
            obs, _ = envs.reset(seed=seed + round_index * num_envs)
            tasks = list(envs.call("task_description"))
            if prompts == "shuffled":
                tasks = tasks[1:] + tasks[:1]
            policy.reset()
            done = np.zeros(num_envs, bool)
            success = np.zeros(num_envs, bool)
            for _ in range(max_steps):
                obs, _, terminated, truncated, infos = envs.step(policy.select_action(obs, tasks))
                ended = (terminated | truncated) & ~done
                success |= ended & np.asarray(infos["is_success"], bool)
                done |= ended
                if done.all():
                    break
            outcomes.extend(success.tolist())
    finally:
        envs.close()
    return {"episodes": episodes, "num_envs": num_envs, "seed": seed, "prompts": prompts,
            "success_rate": float(np.mean(outcomes)), "successes": int(np.sum(outcomes))}


# ---------------------------------------------------------------------- entry point


def train(cfg: TrainConfig) -> dict[str, Any]:
    """Collect, encode, train and write the checkpoint to ``cfg.out``; returns the log."""
    from cosmos3_gym.model import Cosmos3Transformer
    from cosmos3_gym.model.weights import save_transformer
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline
    from cosmos3_gym.tiny import write_tiny_checkpoint, write_tiny_vae

    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    # Filling fresh tensors with NaN is a debugging aid of deterministic mode, not part of it;
    # on CPU it costs a third of a step.
    torch.utils.deterministic.fill_uninitialized_memory = False
    out = Path(cfg.out)
    write_tiny_checkpoint(
        out, seed=cfg.seed, policy_overrides=policy_overrides(cfg), **transformer_overrides(cfg)
    )
    demos = collect_demos(cfg)
    # The random VAE's latents barely move between frames under the test statistics; like the
    # real Wan2.2 VAE, the shipped one normalises with per-channel statistics of its data.
    mean, std = latent_statistics(
        Cosmos3ActionPipeline.from_pretrained(out), demos, cfg.stats_samples,
        cfg.encode_batch_size,
    )
    write_tiny_vae(out / "vae", seed=cfg.seed, latents_mean=mean, latents_std=std)
    pipe = Cosmos3ActionPipeline.from_pretrained(out)
    policy = pipe.policy
    data = encode_demos(pipe, demos, cfg.encode_batch_size)
    encoded_at = time.perf_counter()
    print(f"{len(demos)} samples from {cfg.episodes} episodes, encoded in "
          f"{encoded_at - start:.1f}s", flush=True)

    # The pipeline fuses the GEN projections for inference (fused weights are plain tensors that
    # autograd would not train), so training loads its own unfused copy of the same weights.
    model = Cosmos3Transformer.from_pretrained(out / "transformer")
    curve = train_transformer(
        model, data, cfg, raw_action_dim=policy.raw_action_dim, domain_id=policy.domain_id,
        fps=policy.fps,
    )
    save_transformer(model.eval(), out / "transformer")
    wall = time.perf_counter() - start
    log = {
        "config": asdict(cfg), "num_samples": len(demos), "loss_curve": curve,
        "final_loss": curve[-1]["loss"] if curve else None,
        "encode_wall_s": round(encoded_at - start, 2),
        "train_wall_s": round(wall - (encoded_at - start), 2), "wall_s": round(wall, 2),
        "torch": torch.__version__,
    }
    (out / "train_log.json").write_text(json.dumps(log, indent=2))
    return log


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    defaults = TrainConfig()
    parser = argparse.ArgumentParser(
        prog="cosmos3-gym train",
        description="Train a tiny Cosmos3 policy on ColorReach expert demos (CPU, deterministic).",
    )
    for name, value in asdict(defaults).items():
        flag = "--" + name.replace("_", "-")
        parser.add_argument(flag, type=type(value), default=value, dest=name)
    return TrainConfig(**vars(parser.parse_args(argv)))


def main(argv: Sequence[str] | None = None) -> int:
    cfg = parse_args(argv)
    log = train(cfg)
    print(f"wrote {cfg.out}: {log['num_samples']} samples, {cfg.steps} steps, final loss "
          f"{log['final_loss']:.4f}, {log['wall_s']:.0f}s")
    return 0
