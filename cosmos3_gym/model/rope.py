"""Interleaved 3-D mRoPE (Qwen3-VL style) for the Cosmos3 joint sequence, batched.

Positions are ``[3, B, N]`` (temporal, height, width), always float32: bf16 cannot represent
consecutive integers past 256, and vision/action positions sit past ``L + 15000``.

Layout of one item with ``L`` text tokens (text first, then the GEN stream):
- text token i: ``(i, i, i)``;
- vision latent frame f, patch row r, column c: ``(f * base_fps / fps + L + margin, r, c)``
  (fps modulation, only when the clip has more than one latent frame);
- action step i: ``((i + 1) * (base_fps / 4) / action_fps + L + margin, 0, 0)``, so action i
  lines up with pixel frame i + 1, the frame it drives. With S clean state rows leading the
  actions (a state-conditioned head) the first row sits at frame ``1 − S``: the current state at
  frame 0, the predicted actions at frames 1.. as before (cosmos-framework's
  ``action_start_frame_offset``).
"""

from __future__ import annotations

import torch

from cosmos3_gym.model.config import Cosmos3Config

VAE_TEMPORAL_FACTOR = 4


def _temporal_ids(
    count: int,
    offsets: torch.Tensor,
    *,
    fps: float | None,
    base_fps: float,
    tokens_per_step: float,
    base_tokens_per_step: float,
    start: int,
) -> torch.Tensor:
    """Temporal position of ``count`` steps for each item: ``[B, count]`` float32."""
    idx = torch.arange(count, dtype=torch.float32, device=offsets.device) + start
    if fps is not None and count > 1:
        # fps modulation: one step lasts 1/(fps/tokens_per_step) s; the model counts time in
        # units of the base rate, so clips at other frame rates keep a consistent timeline.
        scale = (base_fps / base_tokens_per_step) / (fps / tokens_per_step)
        idx = idx * scale
    return idx[None, :] + offsets[:, None]


def gen_position_ids(
    config: Cosmos3Config,
    text_lengths: torch.Tensor,
    *,
    grid: tuple[int, int, int],
    num_actions: int,
    fps: float,
    action_fps: float | None = None,
    action_start: int = 1,
) -> torch.Tensor:
    """Positions of the GEN stream ``[vision (T*Hp*Wp) | action (num_actions)]``: ``[3, B, N]``.

    ``text_lengths`` ``[B]`` are the real (unpadded) prompt lengths; each item's GEN positions
    start after its own prompt, so padding a prompt never moves them. ``action_start`` is the
    pixel frame the first action row lines up with (1; ``1 − S`` with S leading state rows).
    """
    t, hp, wp = grid
    fps_mod = fps if config.enable_fps_modulation else None
    act_fps_mod = (action_fps or fps) if config.enable_fps_modulation else None
    offsets = text_lengths.to(torch.float32) + config.unified_3d_mrope_temporal_modality_margin
    if not config.enable_fps_modulation:
        offsets = offsets.floor()
    bsz = offsets.shape[0]
    device = offsets.device

    vis_t = _temporal_ids(
        t, offsets, fps=fps_mod, base_fps=config.base_fps, tokens_per_step=VAE_TEMPORAL_FACTOR,
        base_tokens_per_step=VAE_TEMPORAL_FACTOR, start=0,
    )  # [B, T]
    vis_t = vis_t[:, :, None].expand(bsz, t, hp * wp).reshape(bsz, -1)
    rows = torch.arange(hp, dtype=torch.float32, device=device)
    cols = torch.arange(wp, dtype=torch.float32, device=device)
    vis_h = rows[None, :, None].expand(t, hp, wp).reshape(1, -1).expand(bsz, -1)
    vis_w = cols[None, None, :].expand(t, hp, wp).reshape(1, -1).expand(bsz, -1)
    if not config.unified_3d_mrope_reset_spatial_ids:
        vis_h = vis_h + offsets.floor()[:, None]
        vis_w = vis_w + offsets.floor()[:, None]

    act_t = _temporal_ids(
        num_actions, offsets, fps=act_fps_mod, base_fps=config.base_fps, tokens_per_step=1,
        base_tokens_per_step=VAE_TEMPORAL_FACTOR, start=action_start,
    )  # [B, S + H]
    act_hw = torch.zeros_like(act_t)
    if not config.unified_3d_mrope_reset_spatial_ids:
        act_hw = act_hw + offsets.floor()[:, None]

    temporal = torch.cat([vis_t, act_t], dim=1)
    height = torch.cat([vis_h, act_hw], dim=1)
    width = torch.cat([vis_w, act_hw], dim=1)
    return torch.stack([temporal, height, width], dim=0)  # [3, B, N]


def text_position_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """Text positions ``(i, i, i)``: ``[3, B, L]`` float32 (pads continue the count; masked)."""
    bsz, length = input_ids.shape
    ids = torch.arange(length, dtype=torch.float32, device=input_ids.device)
    return ids[None, None, :].expand(3, bsz, length)


def rope_tables(
    position_ids: torch.Tensor, config: Cosmos3Config, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin half-tables ``[B, 1, N, head_dim // 2]`` for interleaved mRoPE.

    The T axis owns every third frequency slot except where H (slots 1, 4, ...) and W (slots
    2, 5, ...) take over for their ``mrope_section`` share; the tail slots stay T. Only the half
    table is kept: the full table is the half repeated twice (NeoX ``rotate_half`` layout).
    """
    head_dim = config.head_dim
    device = position_ids.device
    inv_freq = 1.0 / (
        config.rope_theta
        ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=device) / head_dim)
    )  # [D/2]
    with torch.autocast(device_type=device.type, enabled=False):
        freqs = position_ids.to(torch.float32)[..., None] * inv_freq  # [3, B, N, D/2]
    axis_of_slot = torch.zeros(head_dim // 2, dtype=torch.long, device=device)
    for axis, offset in ((1, 1), (2, 2)):
        axis_of_slot[offset : config.rope_axes_dim[axis] * 3 : 3] = axis
    index = axis_of_slot.view(1, 1, 1, -1).expand(1, *freqs.shape[1:])
    freqs = torch.gather(freqs, 0, index)[0]  # [B, N, D/2]
    return freqs.cos().to(dtype)[:, None], freqs.sin().to(dtype)[:, None]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, heads, N, D]`` by half-tables ``[B, 1, N, D/2]``.

    Both halves are written into one contiguous output instead of building ``rotate_half``
    with ``torch.cat``; the arithmetic per element is the same as
    ``x*cos + rotate_half(x)*sin``. Under autograd (training), where ``out=`` writes are not
    differentiable, the two halves are joined with one ``torch.cat`` instead: the same numbers
    either way.
    """
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad):
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    torch.sub(x1 * cos, x2 * sin, out=out[..., :half])
    torch.add(x2 * cos, x1 * sin, out=out[..., half:])
    return out
