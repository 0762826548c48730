"""The tiny VAE's training (train/vae.py): the decoder learns to draw ColorReach clips from the
frozen encoder's latents, the pipeline's way of encoding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from cosmos3_gym.pipeline.preprocess import plan_canvas
from cosmos3_gym.tiny import build_tiny_vae
from cosmos3_gym.train import TrainConfig
from cosmos3_gym.train.demos import collect_demos
from cosmos3_gym.train.vae import encode_clips, psnr, train_vae, whiten_decoder_input


@pytest.fixture(scope="module")
def clips() -> np.ndarray:
    demos = collect_demos(TrainConfig(seed=11, image_size=64), episodes=range(8))[:6]
    assert len(demos) == 6
    return demos.clips


def test_whitening_makes_the_decoder_input_unit_scale() -> None:
    vae = build_tiny_vae(seed=0)
    z = torch.randn(2, 48, 2, 3, 3) * 0.05 + 0.2
    mean = z.transpose(0, 1).reshape(48, -1).mean(1)
    std = z.transpose(0, 1).reshape(48, -1).std(1)
    whiten_decoder_input(vae, mean.tolist(), std.tolist())
    with torch.no_grad():
        white = vae.post_quant_conv(z)
    torch.testing.assert_close(white, (z - mean.view(1, -1, 1, 1, 1)) / std.view(1, -1, 1, 1, 1),
                               atol=1e-5, rtol=1e-5)


def test_the_decoder_learns_and_the_encoder_stays(clips: np.ndarray) -> None:
    vae = build_tiny_vae(seed=0)
    plan = plan_canvas(64, 64, 256)
    latents = encode_clips(vae, clips, plan)  # [6, 48, 2, 4, 4]
    assert latents.shape == (6, 48, 2, 4, 4)
    encoder = {k: v.clone() for k, v in vae.state_dict().items() if k.startswith("encoder.")}
    channels = latents.transpose(0, 1).reshape(48, -1)
    stats = (channels.mean(1).tolist(), channels.std(1).tolist())
    curve = train_vae(vae, latents, clips, stats, steps=24, batch_size=4, lr=3e-3, crop=32,
                      warmup_steps=2, seed=0, log_every=8, still_rows=1)
    assert [p["step"] for p in curve] == [8, 16, 24]
    assert curve[-1]["mse"] < 0.7 * curve[0]["mse"], curve
    assert all(torch.equal(v, vae.state_dict()[k]) for k, v in encoder.items())
    torch.testing.assert_close(encode_clips(vae, clips, plan), latents, atol=0, rtol=0)


def test_bad_vae_training_input_is_refused(clips: np.ndarray) -> None:
    vae = build_tiny_vae(seed=0)
    latents = torch.zeros(6, 48, 2, 4, 4)
    stats = ([0.0] * 48, [1.0] * 48)
    with pytest.raises(ValueError, match="multiple of 16 px within the 64x64 content, got 24"):
        train_vae(vae, latents, clips, stats, steps=1, batch_size=1, lr=1e-3, crop=24,
                  warmup_steps=1, seed=0, log_every=1)
    with pytest.raises(ValueError, match="5 latents of"):
        train_vae(vae, latents[:5], clips, stats, steps=1, batch_size=1, lr=1e-3, crop=32,
                  warmup_steps=1, seed=0, log_every=1)
    assert psnr(0.0) == math.inf and psnr(255.0**2) == 0.0
