"""Conditioning-frame encode against diffusers' own posterior mode, and the T=1 vs 17 claim."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from diffusers import AutoencoderKLWan

from cosmos3_gym.pipeline.vae import (
    decode_latents,
    encode_conditioning_frames,
    latent_normalization,
)
from cosmos3_gym.tiny import TINY_LATENTS_MEAN, TINY_LATENTS_STD, write_tiny_vae


@pytest.fixture(scope="module")
def vae(tmp_path_factory: pytest.TempPathFactory) -> AutoencoderKLWan:
    folder = write_tiny_vae(tmp_path_factory.mktemp("vae"), seed=0)
    return AutoencoderKLWan.from_pretrained(folder).eval()


def _frames(b: int = 2, h: int = 32, w: int = 48, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(b, 3, h, w, generator=g) * 2 - 1  # [B, 3, H, W] in [-1, 1]


def test_tiny_vae_has_the_wan22_layout_and_real_stats(vae: AutoencoderKLWan, tmp_path: Path):
    cfg = vae.config
    assert (cfg.z_dim, cfg.is_residual, cfg.patch_size, cfg.in_channels) == (48, True, 2, 12)
    assert cfg.scale_factor_spatial == 16
    assert list(cfg.latents_mean) == TINY_LATENTS_MEAN and list(cfg.latents_std) == TINY_LATENTS_STD
    assert len(set(TINY_LATENTS_MEAN)) > 10 and min(TINY_LATENTS_STD) > 0.4
    assert any(p.name.endswith(".safetensors") for p in write_tiny_vae(tmp_path).iterdir())
    again = AutoencoderKLWan.from_pretrained(write_tiny_vae(tmp_path / "b", seed=0))
    for (name, p), q in zip(vae.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_encode_matches_diffusers_mode_then_per_channel_normalization(vae) -> None:
    frames = _frames()
    latents = encode_conditioning_frames(vae, frames)
    assert latents.shape == (2, 48, 1, 2, 3) and latents.dtype == torch.float32
    with torch.no_grad():
        mu = vae.encode(frames.unsqueeze(2)).latent_dist.mode()  # [B, 48, 1, h, w]
    mean = torch.tensor(TINY_LATENTS_MEAN).view(1, 48, 1, 1, 1)
    std = torch.tensor(TINY_LATENTS_STD).view(1, 48, 1, 1, 1)
    torch.testing.assert_close(latents, (mu - mean) / std, atol=1e-6, rtol=1e-6)


def test_batched_encode_matches_single_items(vae) -> None:
    frames = _frames(b=3, seed=1)
    batched = encode_conditioning_frames(vae, frames)
    for b in range(3):
        torch.testing.assert_close(
            encode_conditioning_frames(vae, frames[b : b + 1]), batched[b : b + 1],
            atol=1e-6, rtol=0,
        )


def test_latent_frame0_of_17_repeated_frames_equals_single_frame_encode(vae) -> None:
    frames = _frames(b=1, h=32, w=32, seed=2)
    single = encode_conditioning_frames(vae, frames)
    official = encode_conditioning_frames(vae, frames, num_frames=17)
    # float32: equal up to rounding (measured ~6e-8); float64: bit-identical (causal encoder).
    torch.testing.assert_close(official, single, atol=1e-6, rtol=0)
    vae64 = AutoencoderKLWan.from_config(vae.config).double().eval()
    vae64.load_state_dict({k: v.double() for k, v in vae.state_dict().items()})
    a = encode_conditioning_frames(vae64, frames.double())
    b = encode_conditioning_frames(vae64, frames.double(), num_frames=17)
    assert torch.equal(a, b)


def test_decode_inverts_the_normalization(vae) -> None:
    latents = encode_conditioning_frames(vae, _frames(b=1, seed=3))
    video = decode_latents(vae, latents)
    assert video.shape == (1, 3, 1, 32, 48) and video.dtype == torch.float32
    mean, inv_std = latent_normalization(vae)
    z = latents / inv_std.view(1, -1, 1, 1, 1) + mean.view(1, -1, 1, 1, 1)
    with torch.no_grad():
        torch.testing.assert_close(video, vae.decode(z).sample, atol=1e-5, rtol=0)


def test_bad_inputs_are_rejected(vae) -> None:
    with pytest.raises(ValueError, match=r"expected \[B, 3, H, W\], got shape \(3, 32, 32\)"):
        encode_conditioning_frames(vae, torch.zeros(3, 32, 32))
    with pytest.raises(ValueError, match=r"divisible by 16, got \(32, 40\)"):
        encode_conditioning_frames(vae, torch.zeros(1, 3, 32, 40))
    with pytest.raises(ValueError, match="num_frames: expected 1 \\+ 4k .* got 16"):
        encode_conditioning_frames(vae, torch.zeros(1, 3, 32, 32), num_frames=16)
    with pytest.raises(ValueError, match="latents: expected 48 channels, got 16"):
        decode_latents(vae, torch.zeros(1, 16, 1, 2, 2))
