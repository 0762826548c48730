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
   The pipeline encodes frames with diffusers' causal VAE encode
   (``InferenceOptions(frame_encoder=False)``), as when the shipped checkpoint was trained.
2. **Demos.** ColorReach episodes from fixed seeds, driven by the scripted expert with random
   detours (DAgger-lite: with probability ``detour_prob`` a random velocity is executed instead,
   so off-expert states are visited); every visited state is labelled with the expert's
   open-loop chunk of ``H`` actions from that state.
3. **Pipeline inputs.** Each sample goes through the pipeline's own stages
   (:func:`~cosmos3_gym.train.demos.encode_demos`): preprocess and encode (the 128x128 image on
   the 256 canvas, 8x8 content latents, one 2x2 patch per arena cell) and the prompt stage's
   tokens (the JSON caption). Each step runs the UND pathway once over the four captions and
   takes each sample's rows (:meth:`~cosmos3_gym.model.TextKVCache.rows`); the latent frame
   count follows the VAE's temporal compression (``pipe.noise.num_latent_frames``).
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
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos3_gym.progress import progress_bar
from cosmos3_gym.train.config import TrainConfig, policy_overrides, transformer_overrides
from cosmos3_gym.train.demos import EncodedDemos, collect_demos, encode_demos, latent_statistics


def sample_sigmas(batch: int, generator: torch.Generator) -> torch.Tensor:
    """Half uniform, half logit-normal(0, 1) σ in (0, 1): all noise levels, mid ones more."""
    uniform = torch.rand(batch, generator=generator)
    logit_normal = torch.sigmoid(torch.randn(batch, generator=generator))
    pick = torch.rand(batch, generator=generator) < 0.5
    return torch.where(pick, uniform, logit_normal).clamp(1e-3, 1.0 - 1e-3)


def flow_matching_loss(
    model: Any, data: EncodedDemos, index: torch.Tensor, generator: torch.Generator, *,
    raw_action_dim: int, domain_id: int, fps: float, num_latent_frames: int,
    video_loss_weight: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Velocity MSE on the action tokens (+ weighted on the future latent frames)."""
    b = index.shape[0]
    cond = data.latents[index]  # [b, 48, 1, h, w]
    x0_actions = data.actions[index]  # [b, H, 64]
    horizon = x0_actions.shape[1]
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

    text = model.encode_text(data.input_ids, data.text_mask).rows(data.colors[index])
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
    domain_id: int, fps: float, num_latent_frames: int, progress: bool = True,
) -> list[dict[str, float]]:
    """Fixed-step AdamW on the flow-matching loss; returns the logged loss curve (a progress
    bar shows the last logged losses)."""
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
    bar = progress_bar(enabled=progress, total=cfg.steps, desc="train", unit="step")
    for step in range(cfg.steps):
        if cursor + cfg.batch_size > n:  # a fresh permutation per epoch, from the one generator
            order, cursor = torch.randperm(n, generator=generator), 0
        index = order[cursor : cursor + cfg.batch_size]
        cursor += cfg.batch_size
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg.warmup_steps, cfg.steps)
        loss, parts = flow_matching_loss(
            model, data, index, generator, raw_action_dim=raw_action_dim, domain_id=domain_id,
            fps=fps, num_latent_frames=num_latent_frames, video_loss_weight=cfg.video_loss_weight,
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
            bar.set_postfix({"loss": f"{mean[0]:.4f}", "action": f"{mean[1]:.4f}",
                             "video": f"{mean[2]:.4f}"}, refresh=False)
            window = []
        bar.update(1)
    bar.close()
    return curve


def train(cfg: TrainConfig, *, progress: bool = True) -> dict[str, Any]:
    """Collect, encode, train and write the checkpoint to ``cfg.out``; returns the log.

    ``progress`` shows a bar per phase (demos, encoding, training with its loss), on rank 0
    only; it changes nothing else."""
    from cosmos3_gym.model import Cosmos3Transformer
    from cosmos3_gym.model.weights import save_transformer
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline, InferenceOptions
    from cosmos3_gym.tiny import write_tiny_checkpoint, write_tiny_vae

    options = InferenceOptions(frame_encoder=False)

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
    demos = collect_demos(cfg, progress=progress)
    # The random VAE's latents barely move between frames under the test statistics; like the
    # real Wan2.2 VAE, the shipped one normalises with per-channel statistics of its data.
    mean, std = latent_statistics(
        Cosmos3ActionPipeline.from_pretrained(out, options=options), demos, cfg.stats_samples,
        cfg.encode_batch_size,
    )
    write_tiny_vae(out / "vae", seed=cfg.seed, latents_mean=mean, latents_std=std)
    pipe = Cosmos3ActionPipeline.from_pretrained(out, options=options)
    policy = pipe.policy
    data = encode_demos(pipe, demos, cfg.encode_batch_size, progress=progress)
    encoded_at = time.perf_counter()
    print(f"{len(demos)} samples from {cfg.episodes} episodes, encoded in "
          f"{encoded_at - start:.1f}s", flush=True)

    # The pipeline fuses the GEN projections for inference (fused weights are plain tensors that
    # autograd would not train), so training loads its own unfused copy of the same weights.
    model = Cosmos3Transformer.from_pretrained(out / "transformer")
    curve = train_transformer(
        model, data, cfg, raw_action_dim=policy.raw_action_dim, domain_id=policy.domain_id,
        fps=policy.fps, num_latent_frames=pipe.noise.num_latent_frames, progress=progress,
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


def build_parser() -> argparse.ArgumentParser:
    """``cosmos3-gym train``'s options: one per :class:`TrainConfig` field, and the bars."""
    parser = argparse.ArgumentParser(
        prog="cosmos3-gym train",
        description="Train a tiny Cosmos3 policy on ColorReach expert demos (CPU, deterministic).",
    )
    for knob in fields(TrainConfig):
        parser.add_argument(
            "--" + knob.name.replace("_", "-"), type=type(knob.default), default=knob.default,
            dest=knob.name, help=f"{knob.metadata['help']} (default: {knob.default})",
        )
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bars")
    return parser


def _config(args: argparse.Namespace) -> TrainConfig:
    return TrainConfig(**{knob.name: getattr(args, knob.name) for knob in fields(TrainConfig)})


def parse_args(argv: Sequence[str] | None) -> TrainConfig:
    return _config(build_parser().parse_args(argv))


def main(argv: Sequence[str] | None = None) -> int:
    import sys

    argv = list(sys.argv[1:] if argv is None else argv)
    if any(a == "--rl" or a.startswith("--rl=") for a in argv):  # RL fine-tuning: train/grpo.py
        from cosmos3_gym.train.grpo import main as grpo_main

        return grpo_main(argv)
    args = build_parser().parse_args(argv)
    cfg = _config(args)
    log = train(cfg, progress=not args.no_progress)
    print(f"wrote {cfg.out}: {log['num_samples']} samples, {cfg.steps} steps, final loss "
          f"{log['final_loss']:.4f}, {log['wall_s']:.0f}s")
    return 0
