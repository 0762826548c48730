"""The fused Triton GEN kernels against eager PyTorch.

Without a GPU the kernels run in Triton's interpreter (the same kernel source, executed on the
CPU; tests/conftest.py switches it on), which is how CI checks their arithmetic; on a GPU these
tests run them compiled.
"""

from __future__ import annotations

import platform

import pytest
import torch

from cosmos3_gym.model.kernels import TorchGenOps, TritonGenOps
from cosmos3_gym.model.presets import random_transformer
from cosmos3_gym.model.rope import rope_tables
from cosmos3_gym.model.transformer import RMSNorm

pytestmark = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="Triton ships for Linux x86_64 only (the test extra installs it there)",
)
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
EAGER = TorchGenOps()


@pytest.fixture(scope="module")
def triton_ops() -> TritonGenOps:
    return TritonGenOps()


def _bf16_ulps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in bf16 rounding steps (units in the last place of the larger value)."""
    scale = torch.maximum(a.float().abs(), b.float().abs()).clamp_min(1e-30)
    ulp = 2.0 ** (torch.floor(torch.log2(scale)) - 7)
    return (a.float() - b.float()).abs() / ulp


def _assert_matches_eager(fused: torch.Tensor, eager: torch.Tensor, dtype: torch.dtype) -> None:
    assert fused.shape == eager.shape and fused.dtype == eager.dtype
    if dtype == torch.float32:
        torch.testing.assert_close(fused, eager, rtol=1e-5, atol=1e-6)
    else:
        # Rounded where eager rounds: at most one bf16 step apart (the sum of squares is
        # added in another order), and almost everywhere the same bits.
        assert _bf16_ulps(fused, eager).max() <= 1.0
        assert (fused == eager).float().mean() > 0.97


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("nemotron", [False, True])
def test_residual_add_and_rms_norm_in_one_pass(triton_ops, dtype, nemotron) -> None:
    gen = torch.Generator().manual_seed(0)
    norm = RMSNorm(96, 1e-6, nemotron).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 96))
    x = (torch.randn(3, 7, 96, generator=gen) * 3).to(DEVICE, dtype)
    delta = torch.randn(3, 7, 96, generator=gen).to(DEVICE, dtype)
    with torch.no_grad():
        res_eager, out_eager = EAGER.add_norm(x, delta, norm)
        res_fused, out_fused = triton_ops.add_norm(x, delta, norm)
    assert torch.equal(res_fused, res_eager)  # one rounding of the same sum
    _assert_matches_eager(out_fused, out_eager, dtype)


def _layer_inputs(model, dtype, text_len=5, tokens=9, batch=2):
    gen = torch.Generator().manual_seed(1)
    cfg = model.config
    h = torch.randn(batch, tokens, cfg.hidden_size, generator=gen).to(DEVICE, dtype)
    positions = torch.rand(3, batch, tokens, generator=gen) * 4000
    cos, sin = rope_tables(positions.to(DEVICE), cfg, dtype)
    hkv, d = cfg.num_key_value_heads, cfg.head_dim
    text_k = torch.randn(batch, hkv, text_len, d, generator=gen).to(DEVICE, dtype)
    text_v = torch.randn(batch, hkv, text_len, d, generator=gen).to(DEVICE, dtype)
    return h, cos, sin, (text_k, text_v)


def _buffers(text_kv, tokens):
    k, v = text_kv
    shape = (*k.shape[:2], k.shape[2] + tokens, k.shape[3])
    buffers = (torch.full(shape, float("nan"), dtype=k.dtype, device=k.device),
               torch.full(shape, float("nan"), dtype=v.dtype, device=v.device))
    buffers[0][:, :, : k.shape[2]] = k
    buffers[1][:, :, : v.shape[2]] = v
    return buffers


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("hidden_act", "heads"), [("silu", (4, 2)), ("relu2", (4, 2)),
                                                   ("silu", (6, 3))])
def test_qk_norm_rope_writes_keys_and_values_into_the_buffer(triton_ops, dtype, hidden_act,
                                                             heads):
    """(6, 3): 12 heads per token, more than one program's block of heads, the last partial."""
    config = _tiny_config(hidden_act=hidden_act, num_attention_heads=heads[0],
                          num_key_value_heads=heads[1])
    model = random_transformer(config, dtype=dtype, device=DEVICE, seed=2)
    model.fuse_gen_projections()
    attn = model.layers[0].self_attn
    with torch.no_grad():  # distinct per-head gains, so a wrong head or gain row shows
        attn.norm_added_q.weight.copy_(torch.linspace(0.5, 1.5, attn.head_dim))
        attn.norm_added_k.weight.copy_(torch.linspace(1.5, 0.25, attn.head_dim))
        attn.fuse()
    h, cos, sin, text_kv = _layer_inputs(model, dtype)
    with torch.no_grad():
        q_eager, k_eager, v_eager = EAGER.qkv(attn, h, cos, sin, text_kv, _buffers(text_kv, 9))
        q_fused, k_fused, v_fused = triton_ops.qkv(attn, h, cos, sin, text_kv,
                                                   _buffers(text_kv, 9))
    assert torch.equal(k_fused[:, :, :5], text_kv[0]) and torch.equal(v_fused[:, :, :5],
                                                                      text_kv[1])
    assert not torch.isnan(k_fused).any() and not torch.isnan(v_fused).any()  # all written
    assert torch.equal(v_fused, v_eager)  # values are copied, not normed
    _assert_matches_eager(q_fused, q_eager, dtype)
    _assert_matches_eager(k_fused, k_eager, dtype)


def _tiny_config(**overrides):
    from cosmos3_gym.model import Cosmos3Config
    from cosmos3_gym.model.presets import GENERATOR_PRESETS

    return Cosmos3Config.from_dict({**GENERATOR_PRESETS["tiny"], **overrides})


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_mlp_activation_kernel(triton_ops, dtype, hidden_act) -> None:
    model = random_transformer(_tiny_config(hidden_act=hidden_act), dtype=dtype, device=DEVICE)
    model.fuse_gen_projections()
    mlp = model.layers[1].mlp_moe_gen
    h = torch.randn(2, 11, model.config.hidden_size,
                    generator=torch.Generator().manual_seed(3)).to(DEVICE, dtype)
    with torch.no_grad():
        _assert_matches_eager(triton_ops.mlp(mlp, h), EAGER.mlp(mlp, h), dtype)


@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_gen_forward_with_fused_kernels_matches_eager(triton_ops, hidden_act) -> None:
    """A whole denoising forward, padded prompts of different lengths (key mask) included."""
    config = _tiny_config(hidden_act=hidden_act)
    eager = random_transformer(config, device=DEVICE, seed=5).fuse_gen_projections()
    fused = random_transformer(config, device=DEVICE, seed=5).fuse_gen_projections()
    lengths = [7, 3, 12]
    ids = torch.zeros(3, 12, dtype=torch.long, device=DEVICE)
    mask = torch.arange(12, device=DEVICE)[None] < torch.tensor(lengths, device=DEVICE)[:, None]
    ids[mask] = torch.randint(1, 1000, (sum(lengths),)).to(DEVICE)
    gen = torch.Generator().manual_seed(6)
    vision = torch.randn(3, 48, 3, 4, 6, generator=gen).to(DEVICE)
    actions = torch.randn(3, 8, 64, generator=gen).to(DEVICE)
    args = (vision, (torch.arange(3, device=DEVICE) > 0)[None].expand(3, 3), actions,
            torch.ones(3, 8, dtype=torch.bool, device=DEVICE),
            torch.tensor([0, 5, 7], device=DEVICE), torch.full((3,), 640.0, device=DEVICE))
    outs = []
    with torch.no_grad():
        for model, ops in ((eager, EAGER), (fused, triton_ops)):
            text = model.encode_text(ids, mask)
            layout = model.gen_layout(text, latent_shape=(3, 4, 6), num_actions=8, fps=20.0,
                                      preallocate_kv=True)
            assert layout.key_mask is not None
            outs.append(model.forward_gen(text, layout, *args, ops=ops))
    for expected, actual in zip(*outs, strict=True):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-5)


def test_triton_kernels_need_fused_projections_and_buffers(triton_ops) -> None:
    model = random_transformer("tiny", device=DEVICE)
    h, cos, sin, text_kv = _layer_inputs(model, torch.float32)
    with pytest.raises(RuntimeError, match="fuse_gen_projections.*fused=False, buffers=True"):
        triton_ops.qkv(model.layers[0].self_attn, h, cos, sin, text_kv, _buffers(text_kv, 9))
    model.fuse_gen_projections()
    with pytest.raises(RuntimeError, match="fused=True, buffers=False"):
        triton_ops.qkv(model.layers[0].self_attn, h, cos, sin, text_kv, None)


def test_fused_ops_refuse_autograd(triton_ops) -> None:
    """Training differentiates through eager ops; asking for the kernels under grad is an
    error, not a silent switch."""
    model = random_transformer("tiny", seed=1).fuse_gen_projections()
    text = model.encode_text(torch.randint(1, 1000, (1, 6)), torch.ones(1, 6, dtype=torch.bool))
    layout = model.gen_layout(text, latent_shape=(2, 4, 4), num_actions=4, fps=20.0)
    args = (torch.randn(1, 48, 2, 4, 4), (torch.arange(2) > 0)[None], torch.randn(1, 4, 64),
            torch.ones(1, 4, dtype=torch.bool), torch.tensor([1]), torch.tensor([300.0]))
    with pytest.raises(RuntimeError, match="inference; run under no_grad"):
        model.forward_gen(text, layout, *args, ops=triton_ops)


def test_pipeline_with_fused_kernels_gives_the_eager_actions(tmp_path) -> None:
    import numpy as np

    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.pipeline import InferenceOptions
    from cosmos3_gym.tiny import write_tiny_checkpoint

    path = write_tiny_checkpoint(tmp_path / "tiny")
    images = np.random.default_rng(2).integers(0, 256, (2, 64, 64, 3), dtype=np.uint8)
    prompts = ["pick up the bowl", "open the top drawer and put the bowl inside"]
    kwargs = dict(seed=[1, 2], num_inference_steps=3, progress=False)
    eager = Cosmos3ActionPipeline.from_pretrained(path, device=DEVICE)(images, prompts, **kwargs)
    fused = Cosmos3ActionPipeline.from_pretrained(
        path, device=DEVICE, options=InferenceOptions(triton_kernels=True)
    )(images, prompts, **kwargs)
    # fp32 on CPU (interpreted) or bf16 on a GPU: the same tolerance as the layer tests' scale.
    tolerance = 1e-4 if DEVICE == "cpu" else 5e-2
    np.testing.assert_allclose(fused.actions, eager.actions, rtol=tolerance, atol=tolerance)


def test_fused_kernels_need_fused_projections_and_kv_buffers() -> None:
    from cosmos3_gym.pipeline import InferenceOptions

    with pytest.raises(ValueError, match="triton_kernels needs fuse_projections=True and "
                                         "kv_buffers=True; found fuse_projections=False"):
        InferenceOptions(triton_kernels=True, fuse_projections=False)
    with pytest.raises(ValueError, match="kv_buffers=False"):
        InferenceOptions(triton_kernels=True, kv_buffers=False)


def test_flipping_a_switch_keeps_the_options_valid() -> None:
    """Every switch turned over from every combination of the switches that depend on each
    other gives valid options, with exactly the other switches that had to turn named."""
    import itertools
    from dataclasses import asdict

    from cosmos3_gym.pipeline import InferenceOptions
    from cosmos3_gym.pipeline.options import REQUIRES

    linked = sorted({*REQUIRES, *(n for needs in REQUIRES.values() for n in needs)})
    for values in itertools.product([False, True], repeat=len(linked)):
        try:
            start = InferenceOptions(**dict(zip(linked, values, strict=True)))
        except ValueError:
            continue  # not a valid starting point
        for name in (*linked, "frame_encoder"):
            flipped, also = start.flip(name)  # valid: built through __post_init__
            assert getattr(flipped, name) is not getattr(start, name)
            changed = {k for k, v in asdict(flipped).items() if asdict(start)[k] != v}
            assert changed == {name, *also} and name not in also
    # For instance: the K/V buffers off take the fused kernels off; the graphs on bring the
    # text cache on.
    assert InferenceOptions(triton_kernels=True).flip("kv_buffers")[1] == ("triton_kernels",)
    assert InferenceOptions(text_cache=False).flip("cuda_graphs")[1] == ("text_cache",)
    assert InferenceOptions().flip("frame_encoder")[1] == ()
