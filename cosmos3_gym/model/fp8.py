"""FP8 (e4m3) GEMMs of the GEN tower: per-output-channel weights, per-token activations.

FP8 tensor cores run the GEN GEMMs faster than bf16 once a micro-batch holds enough tokens
(measured on an H200: docs/benchmarks.md, "FP8 GEMM probe"). Four GEMM groups of every GEN
layer go through them: the fused Q/K/V projection, the attention output, the fused gate/up (or
up) projection and the down projection. Everything else (text tower, embeddings, time embedder,
action heads, norms, attention itself) stays in the model's dtype.

- Weights: quantised once, one scale per output row (``amax(|row|) / 448``). A fused group
  (Q/K/V, gate/up) keeps each row's own scale, so fusing changes nothing; one scale for the whole
  group is what broke quality elsewhere. A checkpoint that ships FP8 weights with one scale per
  tensor is taken as it is: :func:`expand_tensor_scales` repeats each tensor's scale over its
  rows, no re-quantisation.
- Activations: one scale per token row, computed where the GEMM's input is made (the fused
  kernels of :mod:`cosmos3_gym.model.kernels`, or :func:`quantize_rows` in eager mode). A row of
  zeros (a padded batch item) gets the scale ``AMAX_FLOOR / 448``, not 0: its values stay 0, never
  NaN.
- The product: ``torch._scaled_mm`` with both scale vectors, accumulating in fp32 and writing the
  model's dtype. The CPU build of torch runs it too (the same arithmetic, emulated), which is how
  the tests check the path without a GPU.

Rounding to e4m3 is round to nearest, ties to even, saturating at +-448 (values are scaled into
that range first, so saturation only clips rounding overshoot).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0
# The smallest amax a scale is computed from: an all-zero row quantises to zeros, not 0/0.
AMAX_FLOOR = 1e-12


class Fp8Rows(NamedTuple):
    """An activation quantised per row: ``data`` e4m3 ``[..., K]``, ``scale`` fp32 ``[..., 1]``;
    ``data * scale`` is the value it stands for."""

    data: torch.Tensor
    scale: torch.Tensor

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return (self.data.float() * self.scale).to(dtype)


class Fp8Weight(NamedTuple):
    """A linear layer's weight in e4m3, ``[out, in]`` row-major, with one fp32 scale per output
    row ``[out]`` (and the layer's bias in the model's dtype, or None)."""

    weight: torch.Tensor
    scale: torch.Tensor
    bias: torch.Tensor | None

    def dequantize(self) -> torch.Tensor:
        return self.weight.float() * self.scale[:, None]


def row_scale(amax: torch.Tensor) -> torch.Tensor:
    """The fp32 scale that maps a row of largest magnitude ``amax`` onto e4m3's range."""
    return amax.float().clamp_min(AMAX_FLOOR) / E4M3_MAX


def to_e4m3(scaled: torch.Tensor) -> torch.Tensor:
    """fp32 values already scaled into e4m3's range -> e4m3 (nearest, ties to even)."""
    return scaled.clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def quantize_rows(x: torch.Tensor) -> Fp8Rows:
    """Per-row (per-token) dynamic quantisation in eager PyTorch: the reference the fused
    kernels are tested against.

    >>> q = quantize_rows(torch.tensor([[0.0, 0.0], [1.0, -448.0]]))
    >>> q.scale.flatten().tolist()[1], q.dequantize().tolist()
    (1.0, [[0.0, 0.0], [1.0, -448.0]])
    """
    x = x.float()
    scale = row_scale(x.abs().amax(-1, keepdim=True))
    return Fp8Rows(to_e4m3(x / scale), scale)


def quantize_weight(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Fp8Weight:
    """``[out, in]`` weight -> e4m3 with one scale per output row."""
    rows = quantize_rows(weight.detach())
    return Fp8Weight(rows.data.contiguous(), rows.scale[:, 0].contiguous(),
                     None if bias is None else bias.detach())


def expand_tensor_scales(parts: list[tuple[torch.Tensor, torch.Tensor]],
                         bias: torch.Tensor | None = None) -> Fp8Weight:
    """A fused group (Q/K/V, gate/up) from FP8 checkpoint tensors that carry one scale each:
    the e4m3 weights concatenated as they are and each scale repeated over its tensor's rows.
    The values are exactly the checkpoint's (quantising them again would round them twice).

    >>> w = torch.ones(2, 4).to(E4M3)
    >>> expand_tensor_scales([(w, torch.tensor(0.5)), (w, torch.tensor(2.0))]).scale.tolist()
    [0.5, 0.5, 2.0, 2.0]
    """
    weights, scales = [], []
    for weight, scale in parts:
        if weight.dtype != E4M3 or scale.numel() != 1:
            raise ValueError(f"expected e4m3 weights with one scale each; found {weight.dtype} "
                             f"with {scale.numel()} scales")
        weights.append(weight)
        scales.append(scale.float().reshape(1).expand(weight.shape[0]))
    return Fp8Weight(torch.cat(weights).contiguous(), torch.cat(scales).contiguous(), bias)


def fp8_linear(x: Fp8Rows, weight: Fp8Weight, out_dtype: torch.dtype) -> torch.Tensor:
    """``x @ W.T (+ b)`` from a per-row quantised ``x`` ``[..., K]`` -> ``[..., out]`` in
    ``out_dtype``: one ``torch._scaled_mm`` (fp32 accumulation, both scales applied after)."""
    lead = x.data.shape[:-1]
    a = x.data.reshape(-1, x.data.shape[-1])
    out = torch._scaled_mm(
        a, weight.weight.t(), scale_a=x.scale.reshape(-1, 1), scale_b=weight.scale[None],
        out_dtype=out_dtype,
    )
    if weight.bias is not None:
        out = out + weight.bias.to(out_dtype)
    return out.reshape(*lead, out.shape[-1])


def check_fp8_device(device: torch.device, dtype: torch.dtype) -> None:
    """Raise if this device cannot run the FP8 GEMMs: a CUDA GPU below compute capability 8.9
    (no e4m3 tensor cores), or a ``torch._scaled_mm`` that refuses row-wise scales here."""
    if device.type == "cuda":
        capability = torch.cuda.get_device_capability(device)
        if capability < (8, 9):
            raise RuntimeError(f"FP8 GEMMs need compute capability >= 8.9; found "
                               f"{capability[0]}.{capability[1]}")
    probe = quantize_rows(torch.ones(16, 32, device=device))
    fp8_linear(probe, quantize_weight(torch.ones(16, 32, device=device)), dtype)


def sqnr_db(reference: torch.Tensor, approximation: torch.Tensor) -> float:
    """Signal-to-quantisation-noise ratio in dB: ``10 log10(|ref|^2 / |ref - approx|^2)``.

    >>> round(sqnr_db(torch.ones(4), torch.full((4,), 1.01)), 1)
    40.0
    """
    ref = reference.double()
    noise = (ref - approximation.double()).pow(2).sum()
    return float(10 * torch.log10(ref.pow(2).sum() / noise.clamp_min(1e-300)))


__all__ = ["AMAX_FLOOR", "E4M3", "E4M3_MAX", "Fp8Rows", "Fp8Weight", "check_fp8_device",
           "expand_tensor_scales", "fp8_linear", "quantize_rows", "quantize_weight", "row_scale",
           "sqnr_db", "to_e4m3"]
