"""Preprocess: fit observation images onto the model's resolution-tier canvas, as the official
cosmos-framework action pipeline does (``find_closest_target_size`` + ``reflection_pad_to_target``
in its data transforms, used verbatim by its LIBERO policy server):

1. The tier comes from the image's *shorter* side: ≤256 → "256", ≤640 → "480", ≤960 → "720",
   ≤2048 → "768" (the five exact 768-tier canvases map to "768" too).
2. The canvas is the tier bin whose H/W ratio is closest to the image's (first bin wins ties).
3. The image is resized, aspect preserved, to fit the canvas, never upscaled
   (``scale = min(W_c/W, H_c/H, 1)``, sizes rounded half up), bicubic with antialiasing on the
   uint8 pixels (rounded and clamped back to uint8, as torchvision does for uint8 tensors).
4. It is padded at the bottom and right to the canvas: reflect padding, or edge replication when
   a pad is at least as large as the content (reflection cannot cover it).
5. Pixels map to ``x / 127.5 − 1`` in [-1, 1].

After VAE encoding, the latent is cropped back to the content region
(:func:`latent_content_shape`), so the padding conditions nothing. For LIBERO's 256×512
(third-person | wrist) image: canvas 192×320, content 160×320, latent content 10×20.

LeRobot's Cosmos3 policy (huggingface/lerobot PR #3745) runs the same steps with two
differences, which a LeRobot folder's policy selects (``PolicyConfig.resize`` and
``canvas_bins``): the bins are diffusers' ``_ACTION_RESOLUTION_BINS`` (cosmos-framework's table
without tier 480's 2:3 bin and without tier 768: :func:`tier_bins`), and the resized pixels stay
in float (no rounding back to uint8).

sglang (PR #36301) instead resizes and centre-crops to a fixed ``height × width`` (LANCZOS), which
for LIBERO's 2:1 image at 192×320 cuts 32 px off both the third-person and the wrist views and
never matches what the official post-training saw; diffusers reproduces the official recipe but
resizes in float without the uint8 rounding (a difference of at most one grey level). We follow
the official recipe exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

# Canvas bins per tier as {aspect name: (width, height)}, in the official table order.
TIER_BINS: dict[str, dict[str, tuple[int, int]]] = {
    "256": {"1,1": (256, 256), "4,3": (320, 256), "3,4": (256, 320), "16,9": (320, 192),
            "9,16": (192, 320)},
    "480": {"1,1": (640, 640), "4,3": (736, 544), "3,4": (544, 736), "16,9": (832, 480),
            "9,16": (480, 832), "2,3": (512, 768)},
    "704": {"1,1": (960, 960), "4,3": (1088, 832), "3,4": (832, 1088), "16,9": (1280, 704),
            "9,16": (704, 1280)},
    "720": {"1,1": (960, 960), "4,3": (1104, 832), "3,4": (832, 1104), "16,9": (1280, 720),
            "9,16": (720, 1280)},
    "768": {"1,1": (1024, 1024), "4,3": (1184, 880), "3,4": (880, 1184), "16,9": (1360, 768),
            "9,16": (768, 1360)},
}
# The bins diffusers' pipeline_cosmos3_omni._ACTION_RESOLUTION_BINS lists (diffusers 0.42.1), in
# the same order: cosmos-framework's tiers 256, 480, 704 and 720 without tier 480's 2:3 bin.
_DIFFUSERS_TIERS = ("256", "480", "704", "720")
_NOT_IN_DIFFUSERS = {("480", "2,3")}


def tier_bins(tier: str, bins: str = "cosmos-framework") -> dict[str, tuple[int, int]]:
    """The canvases of ``tier`` as ``{name: (width, height)}`` in the table ``bins`` names:
    ``"cosmos-framework"`` (:data:`TIER_BINS`) or ``"diffusers"`` (what LeRobot reads).

    >>> sorted(tier_bins("480", "diffusers")) == sorted(set(TIER_BINS["480"]) - {"2,3"})
    True
    """
    if bins == "cosmos-framework":
        table = TIER_BINS
    elif bins == "diffusers":
        table = {t: {name: size for name, size in TIER_BINS[t].items()
                     if (t, name) not in _NOT_IN_DIFFUSERS} for t in _DIFFUSERS_TIERS}
    else:
        raise ValueError(f"bins: expected 'cosmos-framework' or 'diffusers', got {bins!r}")
    if tier not in table:
        raise ValueError(f"tier: expected one of {sorted(table, key=int)} ({bins} bins), got "
                         f"{tier!r}")
    return table[tier]


# The official tier function compares (H, W) against these pairs as listed.
_EXACT_768_SHAPES = ((1024, 1024), (1184, 880), (880, 1184), (1360, 768), (768, 1360))


def resolution_tier(height: int, width: int) -> str:
    """The official tier for an image of ``height × width`` (from its shorter side)."""
    if (height, width) in _EXACT_768_SHAPES:
        return "768"
    shorter = min(height, width)
    for limit, tier in ((256, "256"), (640, "480"), (960, "720"), (2048, "768")):
        if shorter <= limit:
            return tier
    raise ValueError(f"image size: expected a shorter side <= 2048, got {height} x {width}")


@dataclass(frozen=True)
class CanvasPlan:
    """Where an image of ``source_h × source_w`` lands: ``content`` inside ``target`` (canvas)."""

    source_h: int
    source_w: int
    tier: str
    target_h: int
    target_w: int
    content_h: int
    content_w: int


def plan_canvas(height: int, width: int, tier: str | int | None = None,
                bins: str = "cosmos-framework") -> CanvasPlan:
    """Plan the canvas for a ``height × width`` image; ``tier`` overrides the automatic choice,
    ``bins`` names the canvas table (:func:`tier_bins`)."""
    if not (isinstance(height, int) and isinstance(width, int) and height > 0 and width > 0):
        raise ValueError(f"image size: expected positive int H and W, got {height!r} x {width!r}")
    tier = resolution_tier(height, width) if tier is None else str(tier)
    ratio = height / width
    best = None
    for cand_w, cand_h in tier_bins(tier, bins).values():
        diff = abs(ratio - cand_h / cand_w)
        if best is None or diff < best[0]:
            best = (diff, cand_w, cand_h)
    assert best is not None
    _, target_w, target_h = best
    scale = min(target_w / width, target_h / height, 1.0)  # never upscale
    content_h = max(int(scale * height + 0.5), 1)
    content_w = max(int(scale * width + 0.5), 1)
    return CanvasPlan(height, width, tier, target_h, target_w, content_h, content_w)


def latent_content_shape(plan: CanvasPlan, spatial_factor: int = 16) -> tuple[int, int]:
    """Latent rows and columns holding image content (the rest is padding to crop away)."""
    return max(plan.content_h // spatial_factor, 1), max(plan.content_w // spatial_factor, 1)


def crop_latent_to_content(latent: torch.Tensor, plan: CanvasPlan,
                           spatial_factor: int = 16) -> torch.Tensor:
    """``[B, C, T, H_c/f, W_c/f]`` canvas latents -> float32 ``[B, C, T, h, w]`` content (``f``:
    the VAE's spatial compression, 16 for Wan2.2)."""
    h, w = latent_content_shape(plan, spatial_factor)
    return latent[..., :h, :w].float().contiguous()


def preprocess(
    images: Sequence[np.ndarray | torch.Tensor],
    plan: CanvasPlan,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
    round_resized: bool = True,
) -> torch.Tensor:
    """Resize and pad B uint8 ``[H, W, 3]`` images of the plan's size to ``[B, 3, H_c, W_c]``.

    ``round_resized=False`` keeps the resized pixels in float (LeRobot's and diffusers' way)
    instead of rounding them back to uint8 as the official transforms do.

    All images must have the plan's source size (group images by plan before calling). Each is
    a numpy array or a tensor; a tensor already on ``device`` is used there (no host round
    trip). The arithmetic runs in float32 on ``device``; the result is cast to ``dtype`` at the
    end.
    """
    if len(images) == 0:
        raise ValueError("images: expected at least one image, got 0")
    sizes = [tuple(int(s) for s in img.shape) for img in images]
    expected = (plan.source_h, plan.source_w, 3)
    uint8 = [img.dtype in (np.uint8, torch.uint8) for img in images]
    if any(s != expected for s in sizes) or not all(uint8):
        raise ValueError(
            f"images: expected uint8 {expected} for this plan (group images by size), got "
            f"{[(s, str(img.dtype)) for s, img in zip(sizes, images, strict=True)]}"
        )
    pixels = torch.stack([  # [B, H, W, 3] uint8, a copy
        torch.as_tensor(img).to(device) for img in images
    ])
    pixels = pixels.permute(0, 3, 1, 2).float()  # [B, 3, H, W] in [0, 255]
    if (plan.content_h, plan.content_w) != (plan.source_h, plan.source_w):
        pixels = F.interpolate(
            pixels,
            size=(plan.content_h, plan.content_w),
            mode="bicubic",
            align_corners=False,
            antialias=True,
        )  # [B, 3, content_h, content_w]
        if round_resized:
            # The official resize runs on uint8 tensors, which round and clamp back to uint8.
            pixels = pixels.round_().clamp_(0.0, 255.0)
    pad_right = plan.target_w - plan.content_w
    pad_bottom = plan.target_h - plan.content_h
    if pad_right or pad_bottom:
        # Reflection needs pad < content; the official code switches to edge padding otherwise.
        too_big = pad_right >= plan.content_w or pad_bottom >= plan.content_h
        pixels = F.pad(
            pixels, (0, pad_right, 0, pad_bottom), mode="replicate" if too_big else "reflect"
        )  # [B, 3, target_h, target_w]
    return pixels.div_(127.5).sub_(1.0).to(dtype)
