"""Every hot-path optimisation leaves outputs bit-identical on CPU fp32."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.model.rope import apply_rope
from cosmos3_gym.model.transformer import RMSNorm
from cosmos3_gym.pipeline import InferenceOptions
from cosmos3_gym.tiny import build_tiny_transformer, write_tiny_checkpoint


def _rotate_half_reference(x, cos, sin):
    """The textbook NeoX rotation with torch.cat, over full-width tables."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * torch.cat([cos, cos], -1) + rotated * torch.cat([sin, sin], -1)


def test_rope_without_cat_equals_rotate_half_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, 37, 16, generator=gen)
    angles = torch.randn(3, 1, 37, 8, generator=gen) * 50
    expected = _rotate_half_reference(x, angles.cos(), angles.sin())
    assert torch.equal(apply_rope(x, angles.cos(), angles.sin()), expected)
    # The autograd path (training) gives the same numbers and a gradient.
    x.requires_grad_(True)
    trained = apply_rope(x, angles.cos(), angles.sin())
    assert torch.equal(trained.detach(), expected)
    trained.sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


def test_fused_rms_norm_equals_the_written_out_formula() -> None:
    norm = RMSNorm(16, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 16))
    x = torch.randn(4, 8, 37, 16, generator=torch.Generator().manual_seed(1))
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
    assert torch.equal(norm(x), expected)


def _gen_inputs(model, lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ids = torch.zeros(b, max(lengths), dtype=torch.long)
    mask = torch.zeros(b, max(lengths), dtype=torch.bool)
    for i, n in enumerate(lengths):
        ids[i, :n] = torch.randint(1, model.config.vocab_size, (n,), generator=gen)
        mask[i, :n] = True
    vision = torch.randn(b, 48, 2, 4, 6, generator=gen)
    actions = torch.randn(b, 4, 64, generator=gen)
    return dict(
        ids=ids, mask=mask, vision=vision, vision_noisy=(torch.arange(2) > 0)[None].expand(b, 2),
        actions=actions, action_noisy=torch.ones(b, 4, dtype=torch.bool),
        domains=torch.full((b,), 5), timesteps=torch.full((b,), 731.0),
    )


def _gen_forward(model, inp, preallocate_kv):
    text = model.encode_text(inp["ids"], inp["mask"])
    layout = model.gen_layout(text, latent_shape=(2, 4, 6), num_actions=4, fps=20.0,
                              preallocate_kv=preallocate_kv)
    outs = []
    for _ in range(2):  # buffers are reused across steps
        outs.append(model.forward_gen(text, layout, inp["vision"], inp["vision_noisy"],
                                      inp["actions"], inp["action_noisy"], inp["domains"],
                                      inp["timesteps"]))
    return outs


@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_fused_projections_kv_buffers_and_folded_groups_are_bit_identical(hidden_act: str) -> None:
    plain = build_tiny_transformer(97, seed=3, hidden_act=hidden_act)
    for layer in plain.layers:  # SDPA with enable_gqa, as diffusers calls it
        layer.self_attn.fold_query_groups = False
    assert plain.config.num_attention_heads > plain.config.num_key_value_heads  # GQA is on
    fused = build_tiny_transformer(97, seed=3, hidden_act=hidden_act).fuse_gen_projections()
    inp = _gen_inputs(plain, [9, 5, 12])
    with torch.no_grad():
        reference = _gen_forward(plain, inp, preallocate_kv=False)
        optimised = _gen_forward(fused, inp, preallocate_kv=True)
    for (ref_vis, ref_act), (opt_vis, opt_act) in zip(reference, optimised, strict=True):
        assert torch.equal(ref_vis, opt_vis) and torch.equal(ref_act, opt_act)
    # Fusion keeps the checkpoint's names and values.
    assert plain.state_dict().keys() == fused.state_dict().keys()
    for key, value in plain.state_dict().items():
        assert torch.equal(value, fused.state_dict()[key]), key


def test_folded_gen_attention_accepts_any_sdpa_output_layout(monkeypatch) -> None:
    """CUDA's fp32 SDPA returns its output in the [B, queries, heads, D] memory layout; the
    folded GQA path must not assume a contiguous result (it crashed with ``view`` there)."""
    import cosmos3_gym.model.transformer as transformer_module

    model = build_tiny_transformer(97, seed=3).fuse_gen_projections()
    inp = _gen_inputs(model, [9, 5])
    with torch.no_grad():
        expected = _gen_forward(model, inp, preallocate_kv=True)
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def transposed_layout_sdpa(*args, **kwargs):
        out = sdpa(*args, **kwargs)  # same values, strides of [B, queries, heads, D]
        return out.transpose(1, 2).contiguous().transpose(1, 2)

    monkeypatch.setattr(transformer_module.F, "scaled_dot_product_attention",
                        transposed_layout_sdpa)
    with torch.no_grad():
        actual = _gen_forward(model, inp, preallocate_kv=True)
    for (e_vis, e_act), (a_vis, a_act) in zip(expected, actual, strict=True):
        assert torch.equal(e_vis, a_vis) and torch.equal(e_act, a_act)


def test_kv_buffers_refuse_autograd() -> None:
    model = build_tiny_transformer(97)
    inp = _gen_inputs(model, [4])
    with pytest.raises(RuntimeError, match="no_grad"):
        _gen_forward(model, inp, preallocate_kv=True)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def test_pipeline_optimisations_leave_the_actions_equal(checkpoint) -> None:
    """Fused projections and folded query groups: bit for bit. The text cache and the K/V
    buffers: bit for bit on the CPUs this ran on until 2026-12-04, within 1.5e-6 on an AMD EPYC
    (2026-12-05, the same torch 2.13, one thread or two: each alone 1.43e-6; the cause is not
    pinned down); the bound is fp32 rounding, 1e-5."""
    images = np.random.default_rng(0).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    prompts = ["pick up the bowl", "open the top drawer and put the bowl inside", "push"]
    kwargs = dict(seed=[4, 5, 6], num_inference_steps=3, progress=False)

    all_off = InferenceOptions(
        fuse_projections=False, text_cache=False, kv_buffers=False, fold_query_groups=False
    )
    expected = Cosmos3ActionPipeline.from_pretrained(checkpoint, options=all_off)(
        images, prompts, **kwargs).actions
    for attr, exact in (("fuse_projections", True), ("fold_query_groups", True),
                        ("text_cache", False), ("kv_buffers", False)):
        alone = Cosmos3ActionPipeline.from_pretrained(
            checkpoint, options=replace(all_off, **{attr: True}))
        actions = alone(images, prompts, **kwargs).actions
        if exact:
            assert np.array_equal(actions, expected), attr
        else:
            np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-5, err_msg=attr)
    fast = Cosmos3ActionPipeline.from_pretrained(checkpoint)  # every switch on, as shipped
    np.testing.assert_allclose(fast(images, prompts, **kwargs).actions, expected, rtol=0,
                               atol=1e-5)


def test_inference_options_reach_the_transformer_and_the_stages(checkpoint) -> None:
    shipped = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    assert shipped.options == InferenceOptions().resolve("cpu")  # auto switches decided
    off = InferenceOptions(text_cache=False, kv_buffers=False, fuse_projections=False,
                           fold_query_groups=False, frame_encoder=False)
    for pipe, on in ((shipped, True), (Cosmos3ActionPipeline.from_pretrained(checkpoint,
                                                                             options=off), False)):
        attentions = [layer.self_attn for layer in pipe.transformer.layers]
        assert pipe.denoise.text_cache is on and pipe.denoise.preallocate_kv is on
        assert pipe.encode.use_frame_encoder is on
        assert all(a.fold_query_groups is on for a in attentions)
        assert all((a.gen_qkv is not None) is on for a in attentions)


@pytest.mark.slow
def test_compiled_gen_layers_match_eager_mode() -> None:
    """torch.compile (CPU inductor here) fuses kernels: equal to float rounding, not bitwise."""
    eager = build_tiny_transformer(97, seed=5).fuse_gen_projections()
    compiled = build_tiny_transformer(97, seed=5).fuse_gen_projections().compile_gen_layers()
    inp = _gen_inputs(eager, [7, 11])
    with torch.no_grad():
        expected = _gen_forward(eager, inp, preallocate_kv=True)
        actual = _gen_forward(compiled, inp, preallocate_kv=True)
    for (e_vis, e_act), (a_vis, a_act) in zip(expected, actual, strict=True):
        torch.testing.assert_close(a_vis, e_vis, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(a_act, e_act, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_fused_qk_norm_keeps_each_family_rounding_in_bf16(hidden_act: str) -> None:
    """The joint q/k norm with a gain table rounds like the two separate norms in bf16 too
    (Qwen3: normalise in fp32, cast, scale; Nemotron: scale in fp32, cast)."""
    model = build_tiny_transformer(97, seed=4, hidden_act=hidden_act).to(torch.bfloat16)
    attn = model.layers[0].self_attn
    with torch.no_grad():
        attn.norm_added_q.weight.copy_(torch.linspace(0.5, 1.5, attn.head_dim))
        attn.norm_added_k.weight.copy_(torch.linspace(1.5, 0.5, attn.head_dim))
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(2, 7, model.config.hidden_size, generator=gen).to(torch.bfloat16)
    angles = torch.randn(2, 1, 7, attn.head_dim // 2, generator=gen)
    cos, sin = angles.cos().to(torch.bfloat16), angles.sin().to(torch.bfloat16)
    with torch.no_grad():
        q_sep, k_sep, v_sep = attn.gen_qkv_rotated(h, cos, sin)
        qkv = torch.cat([q_sep, k_sep, v_sep], dim=1)
        attn.fuse()
        q, k, v = attn.gen_qkv_rotated(h, cos, sin)
    # The projections may differ in the last bit (one bf16 GEMM vs three); compare the norms
    # and RoPE on identical inputs by feeding the fused path's projections to both.
    assert q.shape == q_sep.shape and k.shape == k_sep.shape and v.shape == v_sep.shape
    torch.testing.assert_close(torch.cat([q, k, v], dim=1), qkv, rtol=2e-2, atol=2e-2)
    hq = attn.num_heads
    raw = torch.nn.functional.linear(h, *attn.gen_qkv)
    d = attn.head_dim
    q_raw = attn._heads(raw[..., : hq * d], hq)
    k_raw = attn._heads(raw[..., hq * d : (hq + attn.num_kv_heads) * d], attn.num_kv_heads)
    with torch.no_grad():
        q_ref = apply_rope(attn.norm_added_q(q_raw), cos, sin)
        k_ref = apply_rope(attn.norm_added_k(k_raw), cos, sin)
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
