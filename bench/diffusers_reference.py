"""diffusers' Cosmos3 as the project's independent reference: its forward, and its pipeline.

The tests compare our generator's velocities with :func:`reference_forward`, and the synthetic
benchmark (:mod:`cosmos3_gym.bench.synthetic`) times it beside ours. diffusers'
``Cosmos3OmniTransformer.forward`` takes one packed, unbatched sample; this helper builds that
sample the way diffusers' pipeline does (``get_3d_mrope_ids_*`` for positions, text first, then
vision, then actions) and returns its vision and action velocities.

:func:`load_reference_pipeline` and :func:`reference_policy_actions` run diffusers' whole
``Cosmos3OmniPipeline`` in policy mode on a checkpoint folder, from the same initial noise as
ours, for the end-to-end parity tests.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
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


def load_reference_pipeline(root: str | Path, **config: Any) -> Any:
    """diffusers' ``Cosmos3OmniPipeline`` over the folder ``root`` (a diffusers layout), on the
    CPU in fp32, without its safety checker; ``config`` goes to its constructor
    (``default_use_system_prompt``, ``use_native_flow_schedule``).

    Built from its parts (diffusers' own classes, every transformer key checked strictly) since
    ``Cosmos3OmniPipeline.from_pretrained`` needs ``accelerate`` for the fp32-kept modules.
    """
    from diffusers import (
        AutoencoderKLWan,
        Cosmos3OmniPipeline,
        Cosmos3OmniTransformer,
        UniPCMultistepScheduler,
    )
    from safetensors.torch import load_file
    from transformers import AutoTokenizer

    root = Path(root)
    transformer = Cosmos3OmniTransformer.from_config(
        Cosmos3OmniTransformer.load_config(root / "transformer")
    ).eval()
    weights: dict[str, torch.Tensor] = {}
    for shard in sorted((root / "transformer").glob("*.safetensors")):
        weights.update(load_file(shard))
    transformer.load_state_dict(weights, strict=True)
    return Cosmos3OmniPipeline(
        transformer=transformer,
        text_tokenizer=AutoTokenizer.from_pretrained(root / "text_tokenizer"),
        vae=AutoencoderKLWan.from_pretrained(root / "vae", low_cpu_mem_usage=False).eval(),
        scheduler=UniPCMultistepScheduler.from_pretrained(root / "scheduler"),
        enable_safety_checker=False,
        **config,
    )


def reference_policy_actions(
    reference: Any,
    image: np.ndarray,
    prompt: str,
    *,
    video_noise: np.ndarray,
    action_noise: np.ndarray,
    domain: str,
    chunk: int,
    tier: int,
    fps: float,
    num_inference_steps: int,
    guidance_scale: float = 1.0,
) -> np.ndarray:
    """diffusers' policy-mode actions ``[chunk, raw]`` for one uint8 ``[H, W, 3]`` image.

    ``video_noise`` ``[48, T, h, w]`` and ``action_noise`` ``[chunk, 64]`` are the initial
    latents (ours: ``ActionOutput.action_noise`` and the item's seeded draw); diffusers takes
    caller latents as the whole initial state, so latent frame 0 is set to the conditioning
    latent diffusers itself encodes. The image goes in as PIL (diffusers' uint8 ndarray branch
    scales to [-1, 509]).
    """
    from diffusers import CosmosActionCondition
    from PIL import Image

    condition = CosmosActionCondition(
        mode="policy", chunk_size=chunk, domain_name=domain, resolution_tier=tier,
        image=Image.fromarray(image),
    )
    own = reference.prepare_latents(action=condition, num_frames=chunk + 1, fps=fps,
                                    device="cpu", dtype=torch.float32)[0]  # [1, 48, T, h, w]
    latents = torch.from_numpy(np.asarray(video_noise, np.float32))[None].clone()
    latents[:, :, :1] = own[:, :, :1]
    _, _, actions = reference(
        prompt, action=condition, fps=fps, num_inference_steps=num_inference_steps,
        guidance_scale=guidance_scale, latents=latents,
        action_latents=torch.from_numpy(np.asarray(action_noise, np.float32)),
        output_type="latent", return_dict=False, enable_safety_check=False,
    )
    return actions[0].numpy()
