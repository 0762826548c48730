"""Floating-point operations of the generator's passes, counted from its config and token counts.

A multiply-add counts as 2 FLOPs; only matrix products are counted (projections, attention's
two products, the MLP, the patch, timestep and action heads): norms, RoPE and activations are
bandwidth-bound extras, and a rate computed from this count is the rate of useful matrix work.

For Cosmos3-Nano at LIBERO's shapes (266 GEN tokens, ~120 text tokens, B=1) one GEN step is
~3.75 TFLOP, so a 30-step chunk is ~113 TFLOP.
"""

from __future__ import annotations

from cosmos3_gym.model.config import Cosmos3Config


def _layer_flops(
    config: Cosmos3Config, queries: int, keys: float, *, q: bool = True, out: bool = True
) -> float:
    c, d = config.hidden_size, config.head_dim
    hq, hkv = config.num_attention_heads, config.num_key_value_heads
    mlp_matrices = 3 if config.hidden_act == "silu" else 2  # gate/up/down vs up/down
    flops = 2 * queries * c * 2 * hkv * d  # K and V projections
    if q:
        flops += 2 * queries * c * hq * d  # Q projection
    if out:
        flops += 4 * queries * keys * hq * d  # Q K^T and P V
        flops += 2 * queries * hq * d * c  # output projection
        flops += 2 * queries * c * config.intermediate_size * mlp_matrices
    return flops


def gen_step_flops(
    config: Cosmos3Config,
    *,
    batch_size: int,
    text_tokens: int,
    vision_tokens: int,
    action_tokens: int,
) -> float:
    """One denoising forward of the GEN pathway for ``batch_size`` items (double it for CFG).

    ``text_tokens`` is the key length each item attends to before its own GEN tokens (its
    prompt length; with padding, the padded length is what the kernels compute over).
    """
    n = vision_tokens + action_tokens
    per_item = config.num_hidden_layers * _layer_flops(config, n, text_tokens + n)
    per_item += 2 * 2 * vision_tokens * config.patch_latent_dim * config.hidden_size  # in/out
    per_item += 2 * (256 + config.hidden_size) * config.hidden_size  # timestep embedder
    if config.action_dim:
        per_item += 2 * 2 * action_tokens * config.action_dim * config.hidden_size
    return float(batch_size * per_item)


def text_flops(config: Cosmos3Config, *, batch_size: int, text_tokens: int) -> float:
    """The UND pathway over ``text_tokens`` prompt tokens, once per request (causal attention
    counts half of its square; the last layer computes keys and values only)."""
    causal_keys = (text_tokens + 1) / 2
    full = _layer_flops(config, text_tokens, causal_keys)
    last = _layer_flops(config, text_tokens, causal_keys, q=False, out=False)
    return float(batch_size * ((config.num_hidden_layers - 1) * full + last))
