"""The FP8 GEN tower against plain dequantise-then-matmul references.

torch's CPU build runs ``torch._scaled_mm`` on e4m3 tensors (the same arithmetic as the GPU's,
emulated), so every check here runs without a GPU; the Triton kernels that quantise the GEMM
inputs run in Triton's interpreter (tests/conftest.py), compiled where there is a GPU.
"""

from __future__ import annotations

import logging
import platform

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosmos3_gym.model import fp8
from cosmos3_gym.model.fp8 import E4M3, Fp8Rows, expand_tensor_scales, fp8_linear, quantize_rows
from cosmos3_gym.model.kernels import TorchGenOps
from cosmos3_gym.model.presets import GENERATOR_PRESETS, random_transformer
from cosmos3_gym.model.transformer import RMSNorm

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
triton_only = pytest.mark.skipif(
    platform.system() != "Linux" or platform.machine() != "x86_64",
    reason="Triton ships for Linux x86_64 only (the test extra installs it there)",
)


def _reference_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantise then dequantise, written out: per row, an fp32 scale = amax / 448 (floored),
    the values divided by it (in float64 here) and rounded to e4m3."""
    x = x.double()
    scale = (x.abs().amax(-1, keepdim=True).clamp_min(fp8.AMAX_FLOOR) / 448.0).float().double()
    q = (x / scale).clamp(-448, 448).float().to(E4M3)
    return q.double() * scale, scale


def _e4m3_steps(a: torch.Tensor, b: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Distance in e4m3 rounding steps of values scaled by ``scale`` (per row)."""
    mag = torch.maximum(a.abs(), b.abs()) / scale
    step = 2.0 ** (torch.floor(torch.log2(mag.clamp_min(2.0**-6))) - 3)
    return (a - b).abs() / scale / step


def test_row_quantisation_is_quantise_then_dequantise_and_zero_rows_stay_zero() -> None:
    x = torch.randn(5, 96, generator=torch.Generator().manual_seed(0)) * 3
    x[2] = 0.0  # a padded batch item
    q = quantize_rows(x)
    expected, scale = _reference_quantize(x)
    assert q.data.dtype == E4M3 and q.scale.shape == (5, 1)
    torch.testing.assert_close(q.data.double() * q.scale.double(), expected, rtol=0, atol=0)
    torch.testing.assert_close(q.scale.double(), scale, rtol=0, atol=0)
    assert not torch.isnan(q.dequantize()).any() and (q.dequantize()[2] == 0).all()
    assert q.scale[2].item() > 0  # floored, not 0 (0/0 would be NaN)
    assert (q.data.float().abs().amax(1)[[0, 1, 3, 4]] == 448).all()  # range used in full


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
def test_scaled_mm_with_row_and_channel_scales_is_the_dequantised_matmul(out_dtype) -> None:
    gen = torch.Generator().manual_seed(1)
    x, w = torch.randn(7, 64, generator=gen), torch.randn(48, 64, generator=gen) / 8
    w[5] *= 100  # one loud output row: a per-tensor scale would crush the others
    xq, wq = quantize_rows(x), fp8.quantize_weight(w)
    reference = xq.dequantize().double() @ wq.dequantize().double().t()
    out = fp8_linear(xq, wq, out_dtype)
    assert out.dtype == out_dtype and out.shape == (7, 48)
    tolerance = 1e-5 if out_dtype == torch.float32 else 8e-3
    torch.testing.assert_close(out.double(), reference, rtol=tolerance, atol=tolerance)
    # Each row keeps its own precision: the quiet rows lose nothing to the loud one.
    assert fp8.sqnr_db(x @ w.t(), out.float()) > 25


def test_fused_groups_keep_each_rows_scale() -> None:
    """Quantising Q/K/V (or gate/up) fused is quantising each separately: rows are independent."""
    gen = torch.Generator().manual_seed(2)
    parts = [torch.randn(16, 32, generator=gen) * s for s in (0.01, 1.0, 30.0)]
    fused = fp8.quantize_weight(torch.cat(parts))
    separate = [fp8.quantize_weight(p) for p in parts]
    assert torch.equal(fused.weight.view(torch.uint8),
                       torch.cat([s.weight for s in separate]).view(torch.uint8))
    assert torch.equal(fused.scale, torch.cat([s.scale for s in separate]))


def test_checkpoint_fp8_weights_with_tensor_scales_are_expanded_not_requantised() -> None:
    gen = torch.Generator().manual_seed(3)
    shipped = [((torch.randn(8, 32, generator=gen) * 100).clamp(-448, 448).to(E4M3),
                torch.tensor(s)) for s in (0.002, 0.5)]
    weight = expand_tensor_scales(shipped)
    assert torch.equal(weight.weight.view(torch.uint8),
                       torch.cat([w for w, _ in shipped]).view(torch.uint8))  # the same bits
    expected = torch.cat([w.float() * s for w, s in shipped])
    torch.testing.assert_close(weight.dequantize(), expected, rtol=0, atol=0)
    x = quantize_rows(torch.randn(4, 32, generator=gen))
    torch.testing.assert_close(fp8_linear(x, weight, torch.float32),
                               x.dequantize() @ expected.t(), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="one scale each"):
        expand_tensor_scales([(shipped[0][0], torch.ones(8))])


def test_eager_fp8_ops_match_a_layer_run_on_dequantised_values() -> None:
    """One GEN MLP through the FP8 ops equals the same MLP computed from the quantise-then-
    dequantise values of its inputs and weights."""
    model = random_transformer("tiny", seed=4).fuse_gen_projections().quantize_gen_fp8()
    mlp = model.layers[0].mlp_moe_gen
    h = torch.randn(2, 9, 64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        out = TorchGenOps(fp8=True).mlp(mlp, h)
        inner = quantize_rows(h).dequantize() @ mlp.fp8_in.dequantize().t()
        gate, up = inner.chunk(2, -1)
        act = quantize_rows(F.silu(gate) * up).dequantize()
        expected = act @ mlp.fp8_down.dequantize().t()
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert fp8.sqnr_db(mlp(h), out) > 20  # and close to the unquantised MLP (three roundings)


# ---------------------------------------------------------------- the quantising Triton kernels


@pytest.fixture(scope="module")
def triton_fp8():
    from cosmos3_gym.model.kernels import TritonGenOps

    return TritonGenOps(fp8=True)


def _assert_same_quantisation(fused: Fp8Rows, reference: Fp8Rows, exact: bool = True) -> None:
    """Interpreted, from the same inputs: the same bits. Compiled (its division may differ in
    the last bit) or from inputs that differ by float rounding (the fp32 norm sums in another
    order): scales within 1e-5 and values at most one e4m3 step apart."""
    assert fused.data.dtype == E4M3 and fused.data.shape == reference.data.shape
    assert not torch.isnan(fused.data.float()).any() and not torch.isnan(fused.scale).any()
    if exact and DEVICE == "cpu":
        assert torch.equal(fused.data.view(torch.uint8), reference.data.view(torch.uint8))
        assert torch.equal(fused.scale, reference.scale)
    else:
        torch.testing.assert_close(fused.scale, reference.scale, rtol=1e-5, atol=0)
        a, b = fused.dequantize(), reference.dequantize()
        assert _e4m3_steps(a, b, reference.scale).max() <= 1.0


def _rows_with_zeros(*shape: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * 2
    x[0, 1] = 0.0  # an all-zero row: a padded batch item
    x[-1, -1, :5] = torch.tensor([1e-3, -2e-4, 3e-6, 0.0, -0.0])  # tiny values: subnormals
    return x.to(DEVICE, dtype)


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_rms_norm_kernel_quantises_its_output_per_row(triton_fp8, dtype) -> None:
    norm = RMSNorm(96, 1e-6).to(DEVICE, dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 96))
    x = _rows_with_zeros(2, 5, 96, dtype=dtype, seed=6)
    delta = torch.zeros_like(x)
    delta[1] = torch.randn(5, 96, generator=torch.Generator().manual_seed(7)).to(DEVICE, dtype)
    with torch.no_grad():
        residual, h = triton_fp8.add_norm(x, delta, norm, feeds_gemm=True)
        reference = quantize_rows(norm(x + delta))
        _, plain = triton_fp8.add_norm(x, delta, norm)  # feeding no GEMM: not quantised
    assert torch.equal(residual, x + delta)
    assert isinstance(h, Fp8Rows) and h.scale.shape == (2, 5, 1)
    _assert_same_quantisation(h, reference, exact=dtype == torch.bfloat16)
    assert plain.dtype == dtype and (h.dequantize()[0, 1] == 0).all()


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_activation_kernel_quantises_the_down_projections_input(triton_fp8, dtype,
                                                                hidden_act) -> None:
    """Width 1536 > one 1024-wide block: the row's amax spans blocks."""
    from cosmos3_gym.model import Cosmos3Config

    config = Cosmos3Config.from_dict({**GENERATOR_PRESETS["tiny"], "hidden_act": hidden_act,
                                      "intermediate_size": 1536})
    model = random_transformer(config, dtype=dtype, device=DEVICE, seed=8)
    mlp = model.fuse_gen_projections().quantize_gen_fp8().layers[0].mlp_moe_gen
    h = _rows_with_zeros(2, 6, 64, dtype=dtype, seed=9)
    captured = {}
    real_linear = fp8.fp8_linear

    def spy(x, weight, out_dtype):
        if weight is mlp.fp8_down:
            captured["down_input"] = x
        return real_linear(x, weight, out_dtype)

    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr("cosmos3_gym.model.kernels.fp8_linear", spy)
        out = triton_fp8.mlp(mlp, h)
        inner = real_linear(quantize_rows(h), mlp.fp8_in, dtype)
        if hidden_act == "relu2":
            act = torch.relu(inner).square()
        else:
            gate, up = inner.chunk(2, -1)
            act = F.silu(gate) * up
    _assert_same_quantisation(captured["down_input"], quantize_rows(act),
                              exact=dtype == torch.bfloat16)
    assert not torch.isnan(out).any()


@triton_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_quantise_kernel_matches_the_reference(triton_fp8, dtype) -> None:
    x = _rows_with_zeros(3, 4, 1100, dtype=dtype, seed=10)
    _assert_same_quantisation(triton_fp8.quantize(x), quantize_rows(x))


@triton_only
@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_gen_forward_with_fp8_kernels_matches_eager_fp8(triton_fp8, hidden_act) -> None:
    """A whole denoising forward (padded prompts, key mask): the fused FP8 kernels give the
    eager FP8 ops' result, and both stay close to the unquantised forward."""
    from cosmos3_gym.model import Cosmos3Config

    config = Cosmos3Config.from_dict({**GENERATOR_PRESETS["tiny"], "hidden_act": hidden_act})
    model = random_transformer(config, device=DEVICE, seed=11).fuse_gen_projections()
    model.quantize_gen_fp8()
    lengths = [7, 3]
    gen = torch.Generator().manual_seed(12)  # every input from it: not the suite's global RNG
    ids = torch.randint(1, 1000, (2, 7), generator=gen).to(DEVICE)
    mask = torch.arange(7, device=DEVICE)[None] < torch.tensor(lengths, device=DEVICE)[:, None]
    args = (torch.randn(2, 48, 2, 4, 4, generator=gen).to(DEVICE),
            (torch.arange(2, device=DEVICE) > 0)[None].expand(2, 2),
            torch.randn(2, 8, 64, generator=gen).to(DEVICE),
            torch.ones(2, 8, dtype=torch.bool, device=DEVICE), torch.tensor([0, 5], device=DEVICE),
            torch.full((2,), 640.0, device=DEVICE))
    outs = []
    with torch.no_grad():
        text = model.encode_text(ids, mask)
        for ops in (TorchGenOps(), TorchGenOps(fp8=True), triton_fp8):
            layout = model.gen_layout(text, latent_shape=(2, 4, 4), num_actions=8, fps=20.0,
                                      preallocate_kv=True)
            outs.append(model.forward_gen(text, layout, *args, ops=ops))
    plain, eager_fp8, fused_fp8 = outs
    for p, e, f in zip(plain, eager_fp8, fused_fp8, strict=True):
        torch.testing.assert_close(f, e, rtol=1e-4, atol=1e-5)
        assert fp8.sqnr_db(p, e) > 20 and not torch.isnan(f).any()


# ---------------------------------------------------------------- the pipeline option


def test_fp8_needs_fused_projections_and_counts_its_steps() -> None:
    from cosmos3_gym.pipeline import InferenceOptions

    with pytest.raises(ValueError, match="fp8 needs fuse_projections=True"):
        InferenceOptions(fp8=True, fuse_projections=False)
    with pytest.raises(ValueError, match="fp8_bf16_steps must be an int >= 0"):
        InferenceOptions(fp8=True, fp8_bf16_steps=-1)
    with pytest.raises(ValueError, match="fp8_min_tokens must be an int >= 0"):
        InferenceOptions(fp8=True, fp8_min_tokens=True)
    assert InferenceOptions(fp8=True).fp8_steps(30, 1024) == range(3, 27)
    assert InferenceOptions(fp8=True, fp8_bf16_steps=0).fp8_steps(10, 5000) == range(0, 10)
    assert len(InferenceOptions(fp8=True).fp8_steps(6, 5000)) == 0
    assert len(InferenceOptions(fp8=True).fp8_steps(30, 1023)) == 0  # small batches: bf16
    assert len(InferenceOptions(fp8=True, fp8_min_tokens=0).fp8_steps(30, 1)) == 24
    assert len(InferenceOptions().fp8_steps(30, 5000)) == 0


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    return np.random.default_rng(13).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)


PROMPTS = ["reach the red square", "reach the blue square", "reach the green square"]


def _actions(checkpoint, images, steps, dtype=None, **options) -> np.ndarray:
    """Actions of the tiny checkpoint; FP8 at its small token counts (fp8_min_tokens=0)."""
    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.pipeline import InferenceOptions

    options.setdefault("fp8_min_tokens", 0)
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, dtype=dtype,
                                                 options=InferenceOptions(**options))
    assert pipe.disabled_options == {}
    return pipe(images, PROMPTS, seed=[1, 2, 3], num_inference_steps=steps,
                progress=False).actions


def test_pipeline_fp8_steps_are_the_middle_ones(checkpoint, images) -> None:
    """The first and last fp8_bf16_steps steps run unquantised: with no step left between
    them the actions are the unquantised ones, bit for bit; with FP8 steps they move, within
    a tenth of the actions' range (the accuracy gates measure how far: bench/fp8_gate.py)."""
    plain = _actions(checkpoint, images, 6)
    np.testing.assert_array_equal(_actions(checkpoint, images, 6, fp8=True), plain)
    quantised = _actions(checkpoint, images, 6, fp8=True, fp8_bf16_steps=1)
    assert not np.array_equal(quantised, plain) and np.isfinite(quantised).all()
    assert np.abs(quantised - plain).max() < 0.1 * np.abs(plain).max()
    # Below fp8_min_tokens GEN tokens a call runs every step unquantised (small batches).
    np.testing.assert_array_equal(
        _actions(checkpoint, images, 6, fp8=True, fp8_bf16_steps=1, fp8_min_tokens=10**6), plain)


@triton_only
def test_pipeline_fp8_with_fused_kernels_gives_the_eager_fp8_actions(checkpoint, images) -> None:
    kwargs = dict(fp8=True, fp8_bf16_steps=1)
    eager = _actions(checkpoint, images, 4, dtype=torch.bfloat16, **kwargs)
    fused = _actions(checkpoint, images, 4, dtype=torch.bfloat16, triton_kernels=True, **kwargs)
    np.testing.assert_allclose(fused, eager, atol=2e-2)


def test_fp8_that_fails_on_the_device_is_switched_off_with_one_warning(
    checkpoint, images, monkeypatch, caplog
) -> None:
    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.pipeline import InferenceOptions, stages

    def no_fp8(device, dtype):
        raise RuntimeError("FP8 GEMMs need compute capability >= 8.9; found 8.0")

    monkeypatch.setattr(stages, "check_fp8_device", no_fp8)
    with caplog.at_level(logging.WARNING):
        pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint,
                                                     options=InferenceOptions(fp8=True))
    assert pipe.options.fp8 is False and pipe.denoise.fp8_ops is None
    assert pipe.disabled_options == {
        "fp8": "RuntimeError: FP8 GEMMs need compute capability >= 8.9; found 8.0"}
    assert caplog.text.count("switched off") == 1
    out = pipe(images, PROMPTS, seed=[1, 2, 3], num_inference_steps=8, progress=False)
    np.testing.assert_array_equal(out.actions, _actions(checkpoint, images, 8))
