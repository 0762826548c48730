"""Encode stage: the conditioning frame through the Wan2.2 VAE into normalised latents.

Cosmos3 uses ``diffusers.AutoencoderKLWan`` in the Wan2.2 layout (48 latent channels, 16x
spatial and 4x temporal compression, causal in time). The clean conditioning latent is the
posterior *mode* (not a sample), normalised per channel with the 48-vectors of the VAE config:
``z = (μ − latents_mean) · (1 / latents_std)`` (multiplying by the reciprocal, as Wan's own
interface and diffusers' Cosmos3 pipeline do).

Policy mode needs latent frame 0 only. The official server encodes the image repeated over all
``H + 1`` frames and keeps latent frame 0; sglang encodes the single frame (``T = 1``). Because
the encoder is causal and processes frame 0 on its own, the two agree: bit-identical in float64
and within float32 rounding (~6e-8 on the tiny test VAE) in float32 (see the tests). We encode
``T = 1`` by default (17x less encoder work); ``num_frames`` selects the official repeat.
With a ``WanFrameEncoder`` (``cosmos3_gym/model/wan_frame_encoder.py``, what the pipeline
uses) the ``T = 1`` encode runs as the equivalent 2-D network, with fewer multiply-adds (what
that saves on a CPU: docs/benchmarks.md, "CPU, shipped tiny checkpoint").
"""

from __future__ import annotations

import torch


def latent_normalization(vae: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """``(latents_mean, 1 / latents_std)`` from the VAE config, float32 ``[z_dim]`` each."""
    config = vae.config
    z_dim = int(config.z_dim)
    mean = torch.tensor(config.latents_mean, dtype=torch.float32)
    std = torch.tensor(config.latents_std, dtype=torch.float32)
    if mean.shape != (z_dim,) or std.shape != (z_dim,):
        raise ValueError(
            f"vae config: expected latents_mean/latents_std of length z_dim={z_dim}, got "
            f"{tuple(mean.shape)} and {tuple(std.shape)}"
        )
    return mean, 1.0 / std


@torch.no_grad()
def encode_conditioning_frames(
    vae: torch.nn.Module,
    frames: torch.Tensor,
    *,
    num_frames: int = 1,
    frame_encoder: torch.nn.Module | None = None,
) -> torch.Tensor:
    """Encode ``[B, 3, H, W]`` frames in [-1, 1] to normalised latents ``[B, z_dim, 1, h, w]``.

    Args:
        vae: a Wan2.2-layout ``AutoencoderKLWan``; frames are cast to its dtype and device.
        frames: the preprocessed canvas, ``H`` and ``W`` multiples of the spatial factor (16).
        num_frames: ``1`` encodes the frame alone; ``H + 1`` (e.g. 17) repeats it over the clip
            as the official server does and keeps latent frame 0 (same result, more work).
        frame_encoder: a ``WanFrameEncoder`` of ``vae``: the ``T = 1`` encode as 2-D
            convolutions (equal to diffusers' up to float summation order). Only with
            ``num_frames=1``.

    Returns:
        float32 latents ``[B, z_dim, 1, H/16, W/16]``.
    """
    factor = int(getattr(vae.config, "scale_factor_spatial", 16))
    if frames.ndim != 4 or frames.shape[1] != 3:
        raise ValueError(f"frames: expected [B, 3, H, W], got shape {tuple(frames.shape)}")
    if frames.shape[-2] % factor or frames.shape[-1] % factor:
        raise ValueError(
            f"frames: expected H and W divisible by {factor}, got {tuple(frames.shape[-2:])}"
        )
    if num_frames < 1 or (num_frames - 1) % 4:
        raise ValueError(f"num_frames: expected 1 + 4k (1, 5, 9, 13, 17, ...), got {num_frames}")
    if frame_encoder is not None and num_frames != 1:
        raise ValueError(f"frame_encoder encodes one frame; got num_frames={num_frames}")
    param = next(vae.parameters())
    frames = frames.to(device=param.device, dtype=param.dtype)
    if frame_encoder is not None:
        mu = frame_encoder(frames).unsqueeze(2)  # [B, z_dim, 1, h, w]
    else:
        video = frames.unsqueeze(2)  # [B, 3, 1, H, W]
        if num_frames > 1:
            video = video.expand(-1, -1, num_frames, -1, -1)  # [B, 3, T, H, W], a view
        mu = vae.encode(video).latent_dist.mode()[:, :, :1]  # [B, z_dim, 1, h, w]
    mean, inv_std = latent_normalization(vae)
    mean = mean.to(mu.device).view(1, -1, 1, 1, 1)
    inv_std = inv_std.to(mu.device).view(1, -1, 1, 1, 1)
    return (mu.float() - mean) * inv_std


@torch.no_grad()
def decode_latents(vae: torch.nn.Module, latents: torch.Tensor) -> torch.Tensor:
    """Inverse of the normalisation + VAE decode: ``[B, z_dim, T, h, w]`` → ``[B, 3, T', H, W]``.

    For optional video output only (the action path never decodes). Output is float32 in
    [-1, 1] (the decoder clamps), with ``T' = 4·(T − 1) + 1`` frames.
    """
    if latents.ndim != 5:
        raise ValueError(f"latents: expected [B, z_dim, T, h, w], got shape {tuple(latents.shape)}")
    mean, inv_std = latent_normalization(vae)
    if latents.shape[1] != mean.shape[0]:
        raise ValueError(
            f"latents: expected {mean.shape[0]} channels, got {latents.shape[1]}"
        )
    param = next(vae.parameters())
    z = latents.float() / inv_std.to(latents.device).view(1, -1, 1, 1, 1)
    z = z + mean.to(latents.device).view(1, -1, 1, 1, 1)
    return vae.decode(z.to(device=param.device, dtype=param.dtype)).sample.float()
