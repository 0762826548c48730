"""The GEN step's elementwise work, eager or fused: one pass over memory where eager makes several.

Between its matrix products a GEN layer does norms, RoPE, residual adds and the MLP activation.
In eager PyTorch each is several kernels (an RMSNorm alone is six), so at small batch the step
is bound by kernel launches and at large batch by the memory traffic of the intermediates.
:class:`GenOps` names the three places where that work happens; two implementations:

- :class:`TorchGenOps`: eager PyTorch, the reference. The only one under autograd.
- :class:`TritonGenOps`: three Triton kernels (inference): residual add + RMSNorm in one pass;
  QK-norm + RoPE of the query and key heads with the keys and values written straight into the
  layer's K/V buffer; the MLP activation (SiLU-and-multiply, or squared ReLU).

The kernels round exactly where eager PyTorch rounds (each bf16 product, sum and cast), so they
differ from :class:`TorchGenOps` only in the order of the RMSNorm's sum of squares and the last
bit of ``exp``/``rsqrt``: within 1e-5 in fp32 and one bf16 rounding step in bf16 (tested). On a
machine without a GPU they run in Triton's interpreter (``TRITON_INTERPRET=1``), which is how
CI checks them; the speed only shows on a GPU.

Either implementation also runs the four GEMM groups of a layer in FP8 (``fp8=True``,
:mod:`cosmos3_gym.model.fp8`): each GEMM's input is quantised per token where it is made (the
add + RMSNorm before Q/K/V and gate/up, the activation before down, one row quantisation of the
attention output) and handed on as :class:`~cosmos3_gym.model.fp8.Fp8Rows`. The eager ops
quantise with :func:`~cosmos3_gym.model.fp8.quantize_rows`; the Triton kernels quantise inside
the kernel that makes the input (tested against it in the interpreter).
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from cosmos3_gym.model.fp8 import AMAX_FLOOR, E4M3, Fp8Rows, fp8_linear, quantize_rows

if TYPE_CHECKING:
    from cosmos3_gym.model.transformer import MLP, MoTAttention, RMSNorm

KV = tuple[torch.Tensor, torch.Tensor]
QK_HEAD_BLOCK = 8


class GenOps:
    """The elementwise work of one GEN layer, behind four calls. With ``fp8`` the four GEMM
    groups run in FP8 and the GEMM inputs travel as :class:`Fp8Rows`."""

    name = "ops"

    def __init__(self, fp8: bool = False) -> None:
        self.fp8 = fp8

    def add_norm(
        self, x: torch.Tensor, delta: torch.Tensor, norm: RMSNorm, feeds_gemm: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | Fp8Rows]:
        """``x + delta`` (the new residual stream) and ``norm(x + delta)``; quantised when
        ``feeds_gemm`` (it is the input of a GEN layer's Q/K/V or gate/up) and ``fp8``."""
        raise NotImplementedError

    def out(self, attn: MoTAttention, attended: torch.Tensor) -> torch.Tensor:
        """The attention output projection ``to_add_out`` of ``[B, N, Hq*D]``."""
        if not self.fp8:
            return attn.to_add_out(attended)
        return fp8_linear(self.quantize(attended), attn.fp8_out, attended.dtype)

    def quantize(self, x: torch.Tensor | Fp8Rows) -> Fp8Rows:
        """Per-row quantisation of a GEMM input that is not quantised yet."""
        return x if isinstance(x, Fp8Rows) else quantize_rows(x)

    def project(self, h: torch.Tensor | Fp8Rows, weight: torch.Tensor, fp8_weight: Any,
                dtype: torch.dtype) -> torch.Tensor:
        """``h @ weight.T``, through the FP8 weights when ``fp8``."""
        if self.fp8:
            return fp8_linear(self.quantize(h), fp8_weight, dtype)
        return F.linear(h, weight)

    def qkv(
        self, attn: MoTAttention, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        text_kv: KV, kv_buffers: KV | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GEN queries ``[B, Hq, N, D]`` and the keys/values ``[B, Hkv, L+N, D]`` they attend
        to (text first), the GEN part normed and rotated; written into ``kv_buffers`` (whose
        text prefix is filled) when given."""
        raise NotImplementedError

    def mlp(self, mlp: MLP, h: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class TorchGenOps(GenOps):
    """Eager PyTorch: the reference every fused path is checked against."""

    name = "torch"

    def add_norm(self, x, delta, norm, feeds_gemm=False):
        x = x + delta
        h = norm(x)
        return x, quantize_rows(h) if feeds_gemm and self.fp8 else h

    def qkv(self, attn, h, cos, sin, text_kv, kv_buffers):
        qkv = None
        if self.fp8:
            qkv = fp8_linear(self.quantize(h), attn.fp8_qkv, attn.add_q_proj.weight.dtype)
        q, k, v = attn.gen_qkv_rotated(h, cos, sin, qkv=qkv)
        if kv_buffers is None:
            return q, torch.cat([text_kv[0], k], dim=2), torch.cat([text_kv[1], v], dim=2)
        length = text_kv[0].shape[2]
        kv_buffers[0][:, :, length:].copy_(k)
        kv_buffers[1][:, :, length:].copy_(v)
        return q, *kv_buffers

    def mlp(self, mlp, h):
        if not self.fp8:
            return mlp(h)
        dtype = mlp.down_proj.weight.dtype
        inner = fp8_linear(self.quantize(h), mlp.fp8_in, dtype)
        if mlp.hidden_act == "relu2":
            act = torch.relu(inner).square()
        else:
            gate, up = inner.chunk(2, dim=-1)
            act = F.silu(gate) * up
        return fp8_linear(quantize_rows(act), mlp.fp8_down, dtype)


class TritonGenOps(GenOps):
    """The fused kernels (inference only; needs fused GEN projections and K/V buffers).

    Pass it as ``Cosmos3Transformer.forward_gen(..., ops=TritonGenOps())``; the pipeline does
    so when ``InferenceOptions(triton_kernels=True)``.
    """

    name = "triton"

    def __init__(self, fp8: bool = False) -> None:
        super().__init__(fp8)
        self.kernels = _triton_kernels()  # compiled (or interpreted) on first use
        self.reference = TorchGenOps()

    def add_norm(self, x, delta, norm, feeds_gemm=False):
        c = x.shape[-1]
        rows = x.numel() // c
        quantize = feeds_gemm and self.fp8
        residual = torch.empty_like(x)
        out = torch.empty_like(x, dtype=E4M3 if quantize else x.dtype)
        scale = torch.empty(*x.shape[:-1], 1, dtype=torch.float32, device=x.device)
        weight = norm.weight
        self.kernels.add_rms_norm[(rows,)](
            x.contiguous(), delta.contiguous(), weight, residual, out, scale, c, norm.eps,
            BLOCK=_pow2(c), LOWP_ROUND=_rounds_before_gain(norm, weight), BF16=_bf16(x),
            FP8=quantize, AMAX_FLOOR=AMAX_FLOOR,
        )
        return residual, Fp8Rows(out, scale) if quantize else out

    def quantize(self, x):
        if isinstance(x, Fp8Rows):
            return x
        x = x.contiguous()
        width = x.shape[-1]
        data = torch.empty_like(x, dtype=E4M3)
        scale = torch.empty(*x.shape[:-1], 1, dtype=torch.float32, device=x.device)
        self.kernels.quantize_rows[(x.numel() // width,)](
            x, data, scale, width, BLOCK=min(_pow2(width), 1024), AMAX_FLOOR=AMAX_FLOOR,
        )
        return Fp8Rows(data, scale)

    def qkv(self, attn, h, cos, sin, text_kv, kv_buffers):
        if attn.gen_qkv is None or kv_buffers is None:
            raise RuntimeError(
                "the Triton GEN kernels need fused projections (fuse_gen_projections) and "
                "preallocated K/V buffers (inference); found "
                f"fused={attn.gen_qkv is not None}, buffers={kv_buffers is not None}"
            )
        b, n = (h.data if isinstance(h, Fp8Rows) else h).shape[:2]
        hq, hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        if self.fp8:
            qkv = fp8_linear(self.quantize(h), attn.fp8_qkv, attn.add_q_proj.weight.dtype)
        else:
            qkv = F.linear(h, *attn.gen_qkv)
        qkv = qkv.contiguous()  # [B, N, (Hq + 2 Hkv) D]
        q = torch.empty(b, hq, n, d, dtype=qkv.dtype, device=qkv.device)
        k_buf, v_buf = kv_buffers
        # A few heads per program keep each program's tiles in registers (Nano has 48 heads
        # of 128 per token, Super 80).
        grid = (b * n, -(-(hq + 2 * hkv) // QK_HEAD_BLOCK))
        self.kernels.qk_norm_rope_kv[grid](
            qkv, attn.gen_qk_gain, cos.contiguous(), sin.contiguous(), q, k_buf, v_buf,
            n, k_buf.shape[2], text_kv[0].shape[2], attn.norm_added_q.eps,
            HQ=hq, HKV=hkv, HALF=d // 2, HEAD_BLOCK=QK_HEAD_BLOCK,
            LOWP_ROUND=_rounds_before_gain(attn.norm_added_q, attn.gen_qk_gain),
            BF16=_bf16(qkv),
        )
        return q, k_buf, v_buf

    def mlp(self, mlp, h):
        if self.fp8:
            return self._mlp_fp8(mlp, h)
        if mlp.hidden_act == "relu2":
            inner = mlp.up_proj(h)
            width, relu2 = inner.shape[-1], True
        elif mlp.gate_up is not None:
            inner = F.linear(h, mlp.gate_up)
            width, relu2 = inner.shape[-1] // 2, False
        else:
            return self.reference.mlp(mlp, h)
        inner = inner.contiguous()
        rows = inner.numel() // inner.shape[-1]
        act = torch.empty(*inner.shape[:-1], width, dtype=inner.dtype, device=inner.device)
        block = min(_pow2(width), 1024)
        self.kernels.activation[(rows, -(-width // block))](
            inner, act, width, BLOCK=block, RELU2=relu2, BF16=_bf16(inner),
        )
        return mlp.down_proj(act)

    def _mlp_fp8(self, mlp, h):
        dtype = mlp.down_proj.weight.dtype
        inner = fp8_linear(self.quantize(h), mlp.fp8_in, dtype).contiguous()
        relu2 = mlp.hidden_act == "relu2"
        width = inner.shape[-1] if relu2 else inner.shape[-1] // 2
        data = torch.empty(*inner.shape[:-1], width, dtype=E4M3, device=inner.device)
        scale = torch.empty(*inner.shape[:-1], 1, dtype=torch.float32, device=inner.device)
        self.kernels.activation_fp8[(inner.numel() // inner.shape[-1],)](
            inner, data, scale, width, BLOCK=min(_pow2(width), 1024), RELU2=relu2,
            BF16=_bf16(inner), AMAX_FLOOR=AMAX_FLOOR,
        )
        return fp8_linear(Fp8Rows(data, scale), mlp.fp8_down, dtype)


def _bf16(x: torch.Tensor) -> bool:
    if x.dtype not in (torch.float32, torch.bfloat16):
        raise TypeError(f"the Triton GEN kernels take float32 or bfloat16; found {x.dtype}")
    return x.dtype == torch.bfloat16


def _pow2(n: int) -> int:
    return 1 << (int(n) - 1).bit_length()


def _rounds_before_gain(norm: RMSNorm, weight: torch.Tensor) -> bool:
    """Whether this norm rounds the normalised values to the gain's dtype before scaling
    (Qwen3 family in bf16/fp16), as :class:`RMSNorm` does, or scales in fp32 first."""
    return not norm.nemotron and weight.dtype in (torch.float16, torch.bfloat16)


@functools.cache
def _triton_kernels() -> Any:
    """The kernel module, imported on first use: building the pipeline without the kernels
    never compiles them."""
    return importlib.import_module("cosmos3_gym.model.triton_kernels")


TORCH_OPS = TorchGenOps()

__all__ = ["GenOps", "TORCH_OPS", "TorchGenOps", "TritonGenOps"]
