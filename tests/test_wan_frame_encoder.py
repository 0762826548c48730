"""The single-frame 2-D encoder against diffusers' ``AutoencoderKLWan.encode`` (the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.model.wan_frame_encoder import WanFrameEncoder
from cosmos3_gym.pipeline import InferenceOptions
from cosmos3_gym.pipeline.vae import encode_conditioning_frames
from cosmos3_gym.tiny import build_tiny_vae, write_tiny_checkpoint

# Wan2.1 layout: plain residual blocks, no patchify, 3 input channels, 8x spatial compression.
WAN21 = dict(
    is_residual=False, patch_size=None, in_channels=3, out_channels=3, z_dim=16, base_dim=8,
    decoder_base_dim=8, dim_mult=[1, 2, 2, 2], num_res_blocks=2, scale_factor_spatial=8,
    latents_mean=[0.0] * 16, latents_std=[1.0] * 16,
)
# Wan2.2 layout whose second block (8 -> 64 channels, pooled over time) groups single values
# in its shortcut (group_size 1: the fallback path); the others pool 1 or 2 time slots.
WIDE = dict(base_dim=8, decoder_base_dim=8, dim_mult=[1, 8, 8, 8])


def _vae(seed: int = 0, **overrides):
    """A random VAE whose norm gains and biases are not the trivial 1 and 0."""
    vae = build_tiny_vae(seed, **overrides)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in vae.named_parameters():
            if name.endswith("gamma"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=g))
    return vae


def _reference(vae, frames: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return vae.encode(frames.unsqueeze(2)).latent_dist.mode()[:, :, 0]


def _frames(b: int, factor: int, seed: int = 0, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    # An odd latent grid (3 x 5) on purpose.
    return (torch.rand(b, 3, 3 * factor, 5 * factor, generator=g) * 2 - 1).to(dtype)


@pytest.mark.parametrize("layout", [{}, WAN21, WIDE], ids=["wan22", "wan21", "wide"])
def test_frame_encoder_matches_diffusers_encode(layout) -> None:
    vae = _vae(**layout)
    factor = vae.config.scale_factor_spatial
    frames = _frames(3, factor)
    expected = _reference(vae, frames)
    actual = WanFrameEncoder(vae)(frames)
    assert actual.shape == expected.shape == (3, vae.config.z_dim, 3, 5)
    # fp32: the 2-D kernels sum the same products in another order (observed ~3e-7 on
    # latents of magnitude ~0.5).
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-5)
    # fp64: the two are the same function, so only rounding at 1e-16 remains.
    vae64 = vae.double()
    torch.testing.assert_close(
        WanFrameEncoder(vae64)(frames.double()), _reference(vae64, frames.double()),
        rtol=0, atol=1e-12,
    )


def test_frame_encoder_batch_rows_are_independent() -> None:
    vae = _vae(seed=3)
    frames = _frames(4, 16, seed=2)
    encoder = WanFrameEncoder(vae)
    batched = encoder(frames)
    for i in range(4):
        single = encoder(frames[i : i + 1])
        torch.testing.assert_close(single, batched[i : i + 1], rtol=0, atol=1e-6)


def test_frame_encoder_is_what_encode_conditioning_frames_uses_when_given() -> None:
    vae = _vae(seed=4)
    frames = _frames(2, 16, seed=5)
    reference = encode_conditioning_frames(vae, frames)
    fast = encode_conditioning_frames(vae, frames, frame_encoder=WanFrameEncoder(vae))
    assert fast.shape == reference.shape == (2, 48, 1, 3, 5)
    torch.testing.assert_close(fast, reference, rtol=0, atol=1e-4)  # normalised by std ~0.5
    with pytest.raises(ValueError, match="num_frames=17"):
        encode_conditioning_frames(vae, frames, num_frames=17, frame_encoder=WanFrameEncoder(vae))


def test_pipeline_actions_with_and_without_the_frame_encoder(tmp_path) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path)
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    images = np.random.default_rng(1).integers(0, 256, (3, 64, 96, 3), dtype=np.uint8)
    prompts = ["pick up the bowl", "open the drawer", "push the plate to the left"]
    kwargs = dict(seed=[1, 2, 3], num_inference_steps=4, progress=False)
    assert pipe.encode.use_frame_encoder  # the default
    fast = pipe(images, prompts, **kwargs).actions
    pipe = Cosmos3ActionPipeline.from_pretrained(
        checkpoint, options=InferenceOptions(frame_encoder=False)
    )
    reference = pipe(images, prompts, **kwargs).actions
    np.testing.assert_allclose(fast, reference, rtol=0, atol=1e-4)
    assert not np.array_equal(fast, np.zeros_like(fast))


def test_frame_encoder_shares_the_vae_modules_and_copies_only_conv_slices() -> None:
    vae = _vae(seed=6)
    encoder = WanFrameEncoder(vae)
    conv = encoder.conv_in
    assert conv.weight.shape == vae.encoder.conv_in.weight.shape[:2] + (3, 3)
    assert torch.equal(conv.weight, vae.encoder.conv_in.weight[:, :, 2])  # the live tap
    assert not conv.weight.requires_grad
    attention = encoder.mid_attentions[0].block
    assert attention is vae.encoder.mid_block.attentions[0]


def test_frame_encoder_in_bf16_is_as_close_to_fp32_as_diffusers_bf16() -> None:
    frames = _frames(2, 16, seed=1)
    reference = _reference(_vae(seed=7), frames)  # fp32 yardstick
    vae16 = _vae(seed=7).to(torch.bfloat16)
    diffusers_error = (_reference(vae16, frames.bfloat16()).float() - reference).abs().max()
    ours = WanFrameEncoder(vae16)(frames.bfloat16())
    assert ours.dtype == torch.bfloat16
    assert (ours.float() - reference).abs().max() <= 1.5 * diffusers_error + 1e-3


def test_building_the_frame_encoder_leaves_the_global_rng_alone() -> None:
    vae = _vae(seed=8)
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    WanFrameEncoder(vae)
    assert torch.equal(torch.rand(4), expected)
