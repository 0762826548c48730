"""Train the tiny Wan2.2-layout VAE's decoder to draw ColorReach clips, deterministically on CPU.

The shipped tiny checkpoint's VAE is diffusers' ``AutoencoderKLWan`` at tiny widths
(:func:`cosmos3_gym.tiny.tiny_vae_config`: 48 latent channels, 2x2 patchify, 16x spatial and 4x
temporal compression, causal in time). Training makes its latents decode to the scene, so the
frames the generator predicts show what it expects:

* **The encoder stays as initialised** (random, seeded), and the decoder learns to invert it: an
  autoencoder whose code is fixed. With the encoder trained too, the reconstructions were as
  good but the tiny transformer could no longer read the scene off the latents, while the
  random encoder's latents are the ones it learns the task from (docs/benchmarks.md, "Training
  the tiny checkpoint"). A frozen encoder also means every clip is encoded once, before
  the decoder trains, and the generator trains on those same latents.
* **Data.** Clips of ``H + 1`` frames from the demos (the observation a chunk was planned from
  and the frames the env renders while the expert's chunk runs), encoded as the pipeline encodes
  (:func:`encode_clips`: each frame on the model's canvas, the causal encode, the latent cropped
  to the content). Latent frame 0 codes the observation, frame 1 the chunk's 4 next frames.
* **Decoder input at unit scale.** The random encoder's latents vary by a few hundredths; the
  decoder's first layer (``post_quant_conv``, a 1x1 convolution) starts as the per-channel
  whitening ``(z - mean) / std`` with the demos' statistics, so training starts from unit-scale
  inputs (the same statistics become the config's ``latents_mean``/``latents_std``).
* **Loss.** Mean squared error of the decoded clip against the env's pixels (in [-1, 1]), on
  windows of ``crop`` px (``crop / 16`` latent cells) drawn over the content. A share of each
  batch is the still future the generator is trained to predict (frame 0's latent repeated,
  the observation repeated), so that prediction decodes as the scene held still: without it,
  frame 0's latent in a future slot (a code the encoder never gives there) decoded to a smear
  (measured on the demo: docs/benchmarks.md, "Training the tiny checkpoint").
* **Optimiser.** AdamW, linear warmup then cosine decay, clips and windows drawn from one seeded
  generator, one intra-op thread, deterministic algorithms: bit-for-bit repeatable.

:func:`reconstruction_psnr` measures what the pipeline will get: whole clips encoded on the
canvas, cropped to the content and decoded, against the env's frames, per frame index.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from cosmos3_gym.pipeline.preprocess import CanvasPlan, crop_latent_to_content, preprocess
from cosmos3_gym.progress import progress_bar


def clips_on_canvas(clips: np.ndarray, plan: CanvasPlan) -> torch.Tensor:
    """uint8 ``[B, T, S, S, 3]`` clips -> float32 ``[B, 3, T, Hc, Wc]`` in [-1, 1], each frame
    placed on the model's canvas exactly as the preprocess stage places an observation."""
    b, t = clips.shape[:2]
    frames = preprocess(list(clips.reshape(b * t, *clips.shape[2:])), plan)  # [B*T, 3, Hc, Wc]
    return frames.view(b, t, *frames.shape[1:]).transpose(1, 2)


def clips_as_pixels(clips: np.ndarray) -> torch.Tensor:
    """uint8 ``[B, T, h, w, 3]`` -> float32 ``[B, 3, T, h, w]`` in [-1, 1] (no canvas)."""
    return torch.from_numpy(clips).permute(0, 4, 1, 2, 3).float().div(127.5).sub(1.0)


def train_vae(
    vae: Any, latents: torch.Tensor, clips: np.ndarray, statistics: tuple[list[float], list[float]],
    *, steps: int, batch_size: int, lr: float, crop: int, warmup_steps: int, seed: int,
    log_every: int, still_rows: int = 0, progress: bool = False,
) -> list[dict[str, float]]:
    """Fit ``vae``'s decoder (an ``AutoencoderKLWan``, trained in place; the encoder frozen) to
    draw uint8 ``[N, T, S, S, 3]`` clips from their raw latents ``[N, z, T', S/16, S/16]``
    (:func:`encode_clips` of the same clips); returns the loss curve (mean MSE per
    ``log_every`` steps). ``statistics`` (per-channel mean and std of the latents) set the
    decoder's input whitening before training.

    Each step draws ``batch_size`` clips and one window of ``crop / 16`` latent cells per clip,
    anywhere on the latent grid, and decodes it against the clip's pixels under it. In the first
    ``still_rows`` of them every future latent frame is replaced by frame 0's and every future
    frame by the observation: the still future (the ``"still"`` video target of
    train/trainer.py) decodes as the scene held still.
    """
    factor = int(vae.config.scale_factor_spatial)
    cells = crop // factor
    grid_h, grid_w = latents.shape[-2:]
    if crop % factor or not 0 < cells <= min(grid_h, grid_w):
        raise ValueError(
            f"vae crop: expected a multiple of {factor} px within the {grid_h * factor}x"
            f"{grid_w * factor} content, got {crop}"
        )
    if latents.shape[0] != len(clips) or latents.shape[-2:] != (
        clips.shape[2] // factor, clips.shape[3] // factor
    ):
        raise ValueError(
            f"vae training: {latents.shape[0]} latents of {tuple(latents.shape[-2:])} cells for "
            f"{len(clips)} clips of {clips.shape[2:4]} px; expected one per clip at 1/{factor}"
        )
    whiten_decoder_input(vae, *statistics)
    vae.requires_grad_(False)
    trained = [*vae.decoder.parameters(), *vae.post_quant_conv.parameters()]
    for param in trained:
        param.requires_grad_(True)
    generator = torch.Generator().manual_seed(seed)
    vae.train()
    optimizer = torch.optim.AdamW(trained, lr=lr, weight_decay=0.0, betas=(0.9, 0.99))
    curve: list[dict[str, float]] = []
    window: list[float] = []
    bar = progress_bar(enabled=progress, total=steps, desc="vae", unit="step")
    for step in range(steps):
        index = torch.randint(len(clips), (batch_size,), generator=generator)
        tops = torch.randint(grid_h - cells + 1, (batch_size,), generator=generator).tolist()
        lefts = torch.randint(grid_w - cells + 1, (batch_size,), generator=generator).tolist()
        z = torch.stack([latents[i, :, :, t : t + cells, left : left + cells]
                         for i, t, left in zip(index.tolist(), tops, lefts, strict=True)])
        x = clips_as_pixels(np.stack([
            clips[i, :, t * factor : (t + cells) * factor, left * factor : (left + cells) * factor]
            for i, t, left in zip(index.tolist(), tops, lefts, strict=True)
        ]))
        # The still future the generator is trained to predict (every future latent frame the
        # observation's) is drawn as the observation held still.
        z[:still_rows, :, 1:] = z[:still_rows, :, :1]
        x[:still_rows, :, 1:] = x[:still_rows, :, :1]
        for group in optimizer.param_groups:
            group["lr"] = lr * _lr_factor(step, warmup_steps, steps)
        loss = (vae.decode(z).sample - x).square().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        window.append(loss.item())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            mse = float(np.mean(window))
            curve.append({"step": step + 1, "mse": mse, "lr": optimizer.param_groups[0]["lr"]})
            bar.set_postfix({"mse": f"{mse:.4f}"}, refresh=False)
            window = []
        bar.update(1)
    bar.close()
    vae.eval().requires_grad_(False)
    return curve


@torch.no_grad()
def whiten_decoder_input(vae: Any, mean: list[float], std: list[float]) -> None:
    """Set the decoder's 1x1 input convolution to ``(z - mean) / std`` per channel."""
    conv = vae.post_quant_conv
    m = torch.tensor(mean, dtype=conv.weight.dtype)
    s = torch.tensor(std, dtype=conv.weight.dtype)
    if conv.weight.shape[:2] != (m.numel(), m.numel()) or conv.weight[0, 0].numel() != 1:
        raise ValueError(f"post_quant_conv: expected a 1x1 {m.numel()}-channel convolution, got "
                         f"weight {tuple(conv.weight.shape)}")
    conv.weight.copy_(torch.diag(1.0 / s).view(conv.weight.shape))
    conv.bias.copy_(-m / s)


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    return 0.5 * (1.0 + math.cos(math.pi * (step - warmup) / max(total - warmup, 1)))


@torch.no_grad()
def encode_clips(vae: Any, clips: np.ndarray, plan: CanvasPlan) -> torch.Tensor:
    """uint8 ``[B, T, S, S, 3]`` clips -> the posterior mode ``[B, z, T', h, w]`` of the canvas
    encode, cropped to the content (raw, not normalised; ``T' = 1 + (T - 1) / 4``)."""
    mu = vae.encode(clips_on_canvas(clips, plan)).latent_dist.mode()
    return crop_latent_to_content(mu, plan)


@torch.no_grad()
def reconstruction_psnr(
    vae: Any, clips: np.ndarray, plan: CanvasPlan, batch_size: int = 8
) -> dict[str, Any]:
    """PSNR (dB, peak 255, uint8 pixels) of the pipeline's reconstruction of each frame index:
    the clip encoded on the canvas, cropped to the content, decoded, rounded to uint8.

    Returns ``{"per_frame": [dB for frame 0, 1, ...], "future": dB over frames 1.., "clips": n}``;
    each figure is the PSNR of the mean squared error over all clips (not a mean of PSNRs).
    """
    errors = []
    for start in range(0, len(clips), batch_size):
        part = clips[start : start + batch_size]
        decoded = vae.decode(encode_clips(vae, part, plan)).sample  # [b, 3, T, h, w]
        pixels = ((decoded + 1.0) * 127.5).round().clamp(0, 255)
        truth = torch.from_numpy(part).permute(0, 4, 1, 2, 3).float()
        errors.append((pixels - truth).square().mean(dim=(1, 3, 4)))  # [b, T]
    mse = torch.cat(errors)  # [n, T]
    return {
        "per_frame": [round(psnr(float(m)), 2) for m in mse.mean(0)],
        "future": round(psnr(float(mse[:, 1:].mean())), 2),
        "clips": int(mse.shape[0]),
    }


def psnr(mse: float, peak: float = 255.0) -> float:
    """Peak signal-to-noise ratio in dB of a mean squared error (infinite for 0)."""
    return math.inf if mse <= 0 else 10.0 * math.log10(peak * peak / mse)
