"""Official resolution-tier canvas: plan, no upscaling, pad modes, values, resize parity."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosmos3_gym.pipeline.preprocess import (
    latent_content_shape,
    plan_canvas,
    preprocess,
    resolution_tier,
)


def _images(n: int, h: int, w: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8) for _ in range(n)]


def test_libero_concat_image_plan() -> None:
    plan = plan_canvas(256, 512)
    assert plan.tier == "256"
    assert (plan.target_h, plan.target_w) == (192, 320)
    assert (plan.content_h, plan.content_w) == (160, 320)
    assert latent_content_shape(plan) == (10, 20)


@pytest.mark.parametrize(
    ("size", "tier"),
    [((256, 256), "256"), ((256, 4000), "256"), ((257, 300), "480"), ((480, 640), "480"),
     ((641, 800), "720"), ((961, 1000), "768"), ((1360, 768), "768"), ((2048, 2048), "768")],
)
def test_tier_comes_from_the_shorter_side(size: tuple[int, int], tier: str) -> None:
    assert resolution_tier(*size) == tier


def test_closest_aspect_bin_and_explicit_tier() -> None:
    assert (plan_canvas(480, 640).target_h, plan_canvas(480, 640).target_w) == (544, 736)  # 4:3
    assert (plan_canvas(720, 480).target_h, plan_canvas(720, 480).target_w) == (768, 512)  # 2:3
    forced = plan_canvas(256, 512, tier=480)
    assert (forced.target_h, forced.target_w) == (480, 832)
    assert (forced.content_h, forced.content_w) == (256, 512)  # fits: not upscaled
    with pytest.raises(ValueError, match="tier: expected one of .* got '1080'"):
        plan_canvas(256, 256, tier="1080")
    with pytest.raises(ValueError, match="expected a shorter side <= 2048, got 3000 x 3000"):
        plan_canvas(3000, 3000)


def test_small_images_are_not_upscaled_and_edge_padded() -> None:
    plan = plan_canvas(100, 100)
    assert (plan.target_h, plan.target_w, plan.content_h, plan.content_w) == (256, 256, 100, 100)
    img = _images(1, 100, 100)[0]
    out = preprocess([img], plan)
    expected = np.pad(img, ((0, 156), (0, 156), (0, 0)), mode="edge")  # pad >= content: edge
    np.testing.assert_allclose(
        out[0].permute(1, 2, 0).numpy(), expected / 127.5 - 1.0, atol=1e-6
    )


def test_resize_matches_an_independent_bicubic_then_reflect_pad() -> None:
    images = _images(2, 256, 512, seed=1)
    plan = plan_canvas(256, 512)
    out = preprocess(images, plan, dtype=torch.float32)
    assert out.shape == (2, 3, 192, 320) and out.dtype == torch.float32
    for b, img in enumerate(images):
        x = torch.from_numpy(img).permute(2, 0, 1)[None].float()  # torchvision: float32
        resized = F.interpolate(x, size=(160, 320), mode="bicubic", align_corners=False,
                                antialias=True)
        resized = resized.round().clamp(0, 255)[0].permute(1, 2, 0).numpy()  # uint8 semantics
        expected = np.pad(resized, ((0, 32), (0, 0), (0, 0)), mode="reflect")  # 32 < 160
        np.testing.assert_allclose(
            out[b].permute(1, 2, 0).numpy(), expected / 127.5 - 1.0, atol=1e-5
        )


def test_values_are_in_minus_one_one_and_dtype_device_follow() -> None:
    black_white = [np.zeros((64, 64, 3), np.uint8), np.full((64, 64, 3), 255, np.uint8)]
    out = preprocess(black_white, plan_canvas(64, 64), device="cpu", dtype=torch.bfloat16)
    assert out.dtype == torch.bfloat16 and out.device.type == "cpu"
    assert out[0].eq(-1).all() and out[1].eq(1).all()
    mixed = preprocess(_images(1, 300, 500, seed=2), plan_canvas(300, 500))
    assert mixed.min() >= -1 and mixed.max() <= 1


def test_images_must_share_the_plan_size() -> None:
    plan = plan_canvas(64, 64)
    with pytest.raises(ValueError, match=r"expected uint8 \(64, 64, 3\) .* got .*\(64, 80, 3\)"):
        preprocess([*_images(1, 64, 64), *_images(1, 64, 80)], plan)
    with pytest.raises(ValueError, match="float32"):
        preprocess([np.zeros((64, 64, 3), np.float32)], plan)
    with pytest.raises(ValueError, match="expected at least one image, got 0"):
        preprocess([], plan)


def test_inputs_are_not_modified() -> None:
    images = _images(2, 100, 150, seed=3)
    before = [img.copy() for img in images]
    preprocess(images, plan_canvas(100, 150))
    for img, ref in zip(images, before, strict=True):
        np.testing.assert_array_equal(img, ref)
