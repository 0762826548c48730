"""Published shapes with random weights, and the FLOP count the benchmark's rates rest on."""

from __future__ import annotations

import pytest
import torch
from diffusers import AutoencoderKLWan, Cosmos3OmniTransformer
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from cosmos3_gym.model import Cosmos3Transformer
from cosmos3_gym.model.flops import gen_step_flops, text_flops
from cosmos3_gym.model.presets import (
    GENERATOR_PRESETS,
    preset_config,
    random_transformer,
    random_vae,
    vae_preset,
)


@pytest.mark.parametrize("name", ["nano", "super", "edge", "tiny"])
def test_preset_builds_the_same_parameters_as_diffusers_reference(name: str) -> None:
    """Each preset is a config diffusers' own Cosmos3 class accepts, with identical names and
    shapes (built on the meta device: no memory)."""
    with torch.device("meta"):
        ours = Cosmos3Transformer(preset_config(name))
        reference = Cosmos3OmniTransformer(**GENERATOR_PRESETS[name])
    expected = {k: tuple(v.shape) for k, v in reference.state_dict().items()
                if k not in Cosmos3Transformer.UNUSED_CHECKPOINT_KEYS}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == expected


def test_nano_preset_has_the_published_size() -> None:
    with torch.device("meta"):
        nano = Cosmos3Transformer(preset_config("nano"))
        vae = AutoencoderKLWan(**vae_preset("nano"))
    assert 14.5e9 < sum(p.numel() for p in nano.parameters()) < 14.6e9  # "Cosmos3-Nano 16B"
    assert vae.config.z_dim == 48 and vae.config.base_dim == 160  # Wan2.2 TI2V-5B widths


def test_unknown_preset_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown preset 'mega'.*edge.*nano"):
        preset_config("mega")


def test_random_weights_are_seeded_finite_and_leave_the_global_rng_alone() -> None:
    before = torch.random.get_rng_state()
    a = random_transformer("tiny", seed=3)
    b = random_transformer("tiny", seed=3)
    c = random_transformer("tiny", seed=4)
    assert torch.equal(torch.random.get_rng_state(), before)
    for (name, pa), pb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(pa, pb), name
    assert not torch.equal(a.layers[0].mlp_moe_gen.up_proj.weight,
                           c.layers[0].mlp_moe_gen.up_proj.weight)
    ids = torch.randint(0, 1000, (2, 9))
    vision = torch.randn(2, 48, 3, 4, 6)
    with torch.no_grad():
        v_vis, v_act = a(ids, torch.ones(2, 9, dtype=torch.bool), vision,
                         (torch.arange(3) > 0)[None].expand(2, 3), torch.randn(2, 8, 64),
                         torch.ones(2, 8, dtype=torch.bool), torch.tensor([0, 5]),
                         torch.full((2,), 700.0), fps=20.0)
    assert torch.isfinite(v_vis).all() and torch.isfinite(v_act).all()
    assert 0.01 < v_act.std() < 100  # well-scaled, not vanishing or exploding


def test_bf16_random_weights_keep_the_timestep_embedder_in_fp32() -> None:
    model = random_transformer("tiny", dtype=torch.bfloat16)
    assert model.proj_in.weight.dtype == torch.bfloat16
    assert model.layers[1].self_attn.add_q_proj.weight.dtype == torch.bfloat16
    assert model.time_embedder.linear_1.weight.dtype == torch.float32


def test_random_vae_has_the_wan22_latent_layout() -> None:
    vae = random_vae(vae_preset("tiny"), seed=0)
    with torch.no_grad():
        latent = vae.encode(torch.rand(1, 3, 1, 64, 96) * 2 - 1).latent_dist.mode()
    assert latent.shape == (1, 48, 1, 4, 6) and torch.isfinite(latent).all()


def test_flop_count_equals_torch_flop_counter() -> None:
    """Every matrix product of a GEN step counted, checked against torch's own counter (with
    the math attention kernel, whose products the counter sees)."""
    model = random_transformer("tiny").fuse_gen_projections()
    b, length = 3, 11
    with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
        text = model.encode_text(torch.randint(0, 1000, (b, length)),
                                 torch.ones(b, length, dtype=torch.bool))
        layout = model.gen_layout(text, latent_shape=(3, 4, 6), num_actions=8, fps=20.0,
                                  preallocate_kv=True)
        with FlopCounterMode(display=False) as counter:
            model.forward_gen(text, layout, torch.randn(b, 48, 3, 4, 6),
                              (torch.arange(3) > 0)[None].expand(b, 3), torch.randn(b, 8, 64),
                              torch.ones(b, 8, dtype=torch.bool), torch.zeros(b, dtype=torch.long),
                              torch.full((b,), 500.0))
        counted = counter.get_total_flops()
        with FlopCounterMode(display=False) as text_counter:
            model.encode_text(torch.randint(0, 1000, (b, length)),
                              torch.ones(b, length, dtype=torch.bool))
    tokens = dict(text_tokens=length, vision_tokens=3 * 2 * 3, action_tokens=8)
    assert gen_step_flops(model.config, batch_size=b, **tokens) == counted
    # The math kernel computes the whole causal square; the count takes the lower triangle
    # (with its diagonal) of the one layer whose text output is used.
    cfg = model.config
    masked = 4 * length * (length - (length + 1) / 2) * cfg.num_attention_heads * cfg.head_dim
    layers_with_attention = cfg.num_hidden_layers - 1
    expected_text = text_counter.get_total_flops() - b * layers_with_attention * masked
    assert text_flops(cfg, batch_size=b, text_tokens=length) == expected_text


def test_nano_libero_chunk_is_about_113_tflop() -> None:
    flops = 30 * gen_step_flops(preset_config("nano"), batch_size=1, text_tokens=121,
                                vision_tokens=250, action_tokens=16)
    assert 110e12 < flops < 116e12
