"""diffusers' Cosmos3 forward called as diffusers' pipeline calls it, with its own positions.

The independent reference of the project: the tests compare our generator's velocities with it,
and the synthetic benchmark (:mod:`cosmos3_gym.bench.synthetic`) times it beside ours.
diffusers' ``Cosmos3OmniTransformer.forward`` takes one packed, unbatched sample; this helper
builds that sample the way diffusers' pipeline does (``get_3d_mrope_ids_*`` for positions, text
first, then vision, then actions) and returns its vision and action velocities.
"""

from __future__ import annotations

import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
    get_3d_mrope_ids_text_tokens,
    get_3d_mrope_ids_vae_tokens,
)


def reference_forward(
    ref: torch.nn.Module,
    input_ids: torch.Tensor,
    vision: torch.Tensor,
    actions: torch.Tensor,
    timestep: float,
    *,
    domain: int,
    fps: float,
    num_cond_frames: int = 1,
    action_timestep: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Velocities for one sample: ``input_ids [L]``, ``vision [1,48,T,h,w]``, ``actions [H,64]``;
    ``action_timestep`` (default ``timestep``) is the action tokens' own noise level."""
    cfg = ref.config
    length = input_ids.shape[0]
    _, _, t, h, w = vision.shape
    hp, wp = -(-h // 2), -(-w // 2)
    n_vis, n_act = t * hp * wp, actions.shape[0]
    text_ids, next_off = get_3d_mrope_ids_text_tokens(length, 0, use_float_positions=True)
    offset = next_off + cfg.unified_3d_mrope_temporal_modality_margin
    vis_ids, _ = get_3d_mrope_ids_vae_tokens(
        t, hp, wp, offset, fps=fps, base_fps=float(cfg.base_fps), temporal_compression_factor=4
    )
    act_ids, _ = get_3d_mrope_ids_vae_tokens(
        n_act, 1, 1, offset, fps=fps, base_fps=float(cfg.base_fps), temporal_compression_factor=1,
        base_temporal_compression_factor=4, start_frame_offset=1,
    )
    dev = next(ref.parameters()).device
    position_ids = torch.cat([text_ids, vis_ids.float(), act_ids.float()], dim=1).to(dev)
    noisy_frames = torch.arange(num_cond_frames, t)
    vis_loss = torch.cat([length + f * hp * wp + torch.arange(hp * wp) for f in noisy_frames])
    act_idx = torch.arange(length + n_vis, length + n_vis + n_act)
    out = ref(
        input_ids=input_ids.to(dev), text_indexes=torch.arange(length, device=dev),
        position_ids=position_ids, und_len=length, sequence_length=length + n_vis + n_act,
        vision_tokens=[vision], vision_token_shapes=[(t, hp, wp)],
        vision_sequence_indexes=torch.arange(length, length + n_vis, device=dev),
        vision_mse_loss_indexes=vis_loss.to(dev),
        vision_timesteps=torch.full((vis_loss.numel(),), float(timestep), device=dev),
        vision_noisy_frame_indexes=[noisy_frames.to(dev)],
        action_tokens=[actions], action_token_shapes=[(n_act, 1, 1)],
        action_sequence_indexes=act_idx.to(dev), action_mse_loss_indexes=act_idx.to(dev),
        action_timesteps=torch.full(
            (n_act,), float(timestep if action_timestep is None else action_timestep), device=dev
        ),
        action_noisy_frame_indexes=[torch.arange(n_act, device=dev)],
        action_domain_ids=[torch.tensor(domain, device=dev)],
    )
    return out.sample[0], out.action[0]
