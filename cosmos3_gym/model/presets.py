"""The published Cosmos3 shapes, and random weights at those shapes built straight on the device.

Timing depends on shapes, not on weight values, so a Cosmos3-Nano generator with random bf16
weights runs exactly as fast as the real one: users size their hardware before they have the
weights, and the benchmark (``cosmos3-gym bench --synthetic nano``) needs no checkpoint folder.

The generator configurations are those of the released ``transformer/config.json`` files
(cosmos-framework's Nano/Super/Edge model configs and their diffusers conversions); the VAE
widths are those of the Wan2.2 TI2V-5B ``vae/config.json`` that every Cosmos3 checkpoint ships.
``tiny`` is a CPU-sized configuration of the same architecture, for CI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cosmos3_gym.model.config import Cosmos3Config

if TYPE_CHECKING:  # torch loads when a model is built, so the tables cost nothing to import
    import torch
    from torch import nn

    from cosmos3_gym.model.transformer import Cosmos3Transformer

_QWEN3_VL_ROPE = {"mrope_section": [24, 20, 20], "mrope_interleaved": True}
_ACTION_HEADS = {"action_gen": True, "action_dim": 64, "num_embodiment_domains": 32}

GENERATOR_PRESETS: dict[str, dict[str, Any]] = {
    # Qwen3-VL-8B backbone, 14.55 B generator parameters (both pathways, sound heads included).
    "nano": {
        "hidden_size": 4096, "num_hidden_layers": 36, "num_attention_heads": 32,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 12288,
        "rope_theta": 5_000_000.0, "rope_scaling": _QWEN3_VL_ROPE, "vocab_size": 151936,
        "hidden_act": "silu", "qk_norm_for_text": True, "sound_gen": True, "sound_dim": 64,
        **_ACTION_HEADS,
    },
    # Qwen3-VL-32B backbone.
    "super": {
        "hidden_size": 5120, "num_hidden_layers": 64, "num_attention_heads": 64,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 25600,
        "rope_theta": 5_000_000.0, "rope_scaling": _QWEN3_VL_ROPE, "vocab_size": 151936,
        "hidden_act": "silu", "qk_norm_for_text": True, "sound_gen": True, "sound_dim": 64,
        **_ACTION_HEADS,
    },
    # Nemotron-2B dense backbone: squared-ReLU MLP, no text QK-norm, a separate key norm for
    # the text keys GEN attends to.
    "edge": {
        "hidden_size": 2048, "num_hidden_layers": 28, "num_attention_heads": 16,
        "num_key_value_heads": 8, "head_dim": 128, "intermediate_size": 9216,
        "rope_theta": 100_000_000.0, "rope_axes_dim": [24, 20, 20], "vocab_size": 131072,
        "rms_norm_eps": 1e-5, "hidden_act": "relu2", "qk_norm_for_text": False,
        "use_und_k_norm_for_gen": True, "sound_gen": False, **_ACTION_HEADS,
    },
    # The same architecture at CPU size (GQA, both pathways, action heads), for CI.
    "tiny": {
        "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128,
        "rope_axes_dim": [4, 2, 2], "vocab_size": 1024, **_ACTION_HEADS,
    },
}

# AutoencoderKLWan arguments of the Wan2.2 VAE (48 latent channels, 16x spatial, 4x temporal).
# The latent statistics are left at 0/1: random weights have none of their own.
_WAN22_LAYOUT: dict[str, Any] = {
    "z_dim": 48, "dim_mult": [1, 2, 4, 4], "num_res_blocks": 2, "attn_scales": [],
    "temperal_downsample": [False, True, True], "is_residual": True, "in_channels": 12,
    "out_channels": 12, "patch_size": 2, "scale_factor_temporal": 4, "scale_factor_spatial": 16,
    "latents_mean": [0.0] * 48, "latents_std": [1.0] * 48,
}
VAE_PRESETS: dict[str, dict[str, Any]] = {
    "wan2.2": {**_WAN22_LAYOUT, "base_dim": 160, "decoder_base_dim": 256},
    "tiny": {**_WAN22_LAYOUT, "base_dim": 16, "decoder_base_dim": 16, "dim_mult": [1, 1, 1, 1],
             "num_res_blocks": 1},
}


def preset_config(name: str) -> Cosmos3Config:
    """The generator configuration of a published checkpoint family (or ``tiny``)."""
    if name not in GENERATOR_PRESETS:
        raise ValueError(f"unknown preset {name!r}; expected one of {sorted(GENERATOR_PRESETS)}")
    return Cosmos3Config.from_dict(GENERATOR_PRESETS[name])


def vae_preset(generator_preset: str) -> dict[str, Any]:
    """The VAE that goes with a generator preset: the real Wan2.2 widths, tiny for ``tiny``."""
    return dict(VAE_PRESETS["tiny" if generator_preset == "tiny" else "wan2.2"])


def randomize_(module: nn.Module, generator: torch.Generator) -> nn.Module:
    """Fill every parameter in place with finite, well-scaled random values.

    Matrices and convolution kernels get N(0, 1/fan_in) (activations keep their scale through
    a deep stack); 1-D gains are 1 and biases 0, as after any initialisation. A
    ``DomainAwareLinear`` table row holds an ``[in, out]`` matrix, so its fan-in is ``in``.
    Deterministic for a given generator seed and device.
    """
    import torch

    fan_in_of = {}
    for name, sub in module.named_modules():
        if hasattr(sub, "input_size") and hasattr(sub, "fc"):  # DomainAwareLinear
            fan_in_of[f"{name}.fc.weight"] = sub.input_size
    with torch.no_grad():
        for name, param in module.named_parameters():
            if param.ndim <= 1:
                param.fill_(0.0 if name.endswith("bias") else 1.0)
                continue
            fan_in = fan_in_of.get(name, param[0].numel())
            sample = torch.empty(param.shape, device=param.device, dtype=torch.float32)
            sample.normal_(0.0, fan_in**-0.5, generator=generator)
            param.copy_(sample)
    return module


def _on_device(
    module: nn.Module, device: torch.device, dtype: torch.dtype, seed: int,
    keep_fp32: tuple[str, ...] = (),
) -> nn.Module:
    """Allocate a module built on the meta device once on ``device`` in ``dtype`` (children
    named in ``keep_fp32`` in float32), then randomise it: no CPU copy and no second
    allocation, whatever the model's size."""
    import torch

    if next(module.parameters()).dtype != dtype:
        module = module.to(dtype)
    for name, child in module.named_children():
        if name in keep_fp32:
            child.float()
    module = module.to_empty(device=device)
    generator = torch.Generator(device=device).manual_seed(seed)
    return randomize_(module, generator).eval().requires_grad_(False)


def random_transformer(
    config: Cosmos3Config | str,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    seed: int = 0,
) -> Cosmos3Transformer:
    """A ``Cosmos3Transformer`` with random weights, allocated straight on ``device``.

    ``dtype`` defaults to float32. The same dtype rule as loading a checkpoint: the timestep
    embedder stays fp32.
    """
    import torch

    from cosmos3_gym.model.transformer import Cosmos3Transformer
    from cosmos3_gym.model.weights import KEEP_IN_FP32

    if isinstance(config, str):
        config = preset_config(config)
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
    keep = tuple(prefix.rstrip(".") for prefix in KEEP_IN_FP32)
    return _on_device(model, torch.device(device), dtype or torch.float32, seed, keep_fp32=keep)


def random_vae(
    vae_config: dict[str, Any],
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    seed: int = 0,
):  # -> diffusers.AutoencoderKLWan
    """A diffusers ``AutoencoderKLWan`` with random weights, allocated straight on ``device``."""
    import torch
    from diffusers import AutoencoderKLWan

    with torch.device("meta"):
        vae = AutoencoderKLWan(**vae_config)
    return _on_device(vae, torch.device(device), dtype or torch.float32, seed)
