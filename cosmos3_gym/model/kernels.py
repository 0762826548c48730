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
"""

from __future__ import annotations

import functools
import importlib
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

if TYPE_CHECKING:
    from cosmos3_gym.model.transformer import MLP, MoTAttention, RMSNorm

KV = tuple[torch.Tensor, torch.Tensor]
QK_HEAD_BLOCK = 8


class GenOps:
    """The elementwise work of one GEN layer, behind three calls."""

    name = "ops"

    def add_norm(
        self, x: torch.Tensor, delta: torch.Tensor, norm: RMSNorm
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x + delta`` (the new residual stream) and ``norm(x + delta)``."""
        raise NotImplementedError

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

    def add_norm(self, x, delta, norm):
        x = x + delta
        return x, norm(x)

    def qkv(self, attn, h, cos, sin, text_kv, kv_buffers):
        q, k, v = attn.gen_qkv_rotated(h, cos, sin)
        if kv_buffers is None:
            return q, torch.cat([text_kv[0], k], dim=2), torch.cat([text_kv[1], v], dim=2)
        length = text_kv[0].shape[2]
        kv_buffers[0][:, :, length:].copy_(k)
        kv_buffers[1][:, :, length:].copy_(v)
        return q, *kv_buffers

    def mlp(self, mlp, h):
        return mlp(h)


class TritonGenOps(GenOps):
    """The fused kernels (inference only; needs fused GEN projections and K/V buffers).

    Pass it as ``Cosmos3Transformer.forward_gen(..., ops=TritonGenOps())``; the pipeline does
    so when ``InferenceOptions(triton_kernels=True)``.
    """

    name = "triton"

    def __init__(self) -> None:
        self.kernels = _triton_kernels()  # compiled (or interpreted) on first use
        self.reference = TorchGenOps()

    def add_norm(self, x, delta, norm):
        c = x.shape[-1]
        rows = x.numel() // c
        residual = torch.empty_like(x)
        out = torch.empty_like(x)
        weight = norm.weight
        self.kernels.add_rms_norm[(rows,)](
            x.contiguous(), delta.contiguous(), weight, residual, out, c, norm.eps,
            BLOCK=_pow2(c), LOWP_ROUND=_rounds_before_gain(norm, weight), BF16=_bf16(x),
        )
        return residual, out

    def qkv(self, attn, h, cos, sin, text_kv, kv_buffers):
        if attn.gen_qkv is None or kv_buffers is None:
            raise RuntimeError(
                "the Triton GEN kernels need fused projections (fuse_gen_projections) and "
                "preallocated K/V buffers (inference); found "
                f"fused={attn.gen_qkv is not None}, buffers={kv_buffers is not None}"
            )
        b, n, _ = h.shape
        hq, hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
        qkv = F.linear(h, *attn.gen_qkv).contiguous()  # [B, N, (Hq + 2 Hkv) D]
        q = torch.empty(b, hq, n, d, dtype=h.dtype, device=h.device)
        k_buf, v_buf = kv_buffers
        # A few heads per program keep each program's tiles in registers (Nano has 48 heads
        # of 128 per token, Super 80).
        grid = (b * n, -(-(hq + 2 * hkv) // QK_HEAD_BLOCK))
        self.kernels.qk_norm_rope_kv[grid](
            qkv, attn.gen_qk_gain, cos.contiguous(), sin.contiguous(), q, k_buf, v_buf,
            n, k_buf.shape[2], text_kv[0].shape[2], attn.norm_added_q.eps,
            HQ=hq, HKV=hkv, HALF=d // 2, HEAD_BLOCK=QK_HEAD_BLOCK,
            LOWP_ROUND=_rounds_before_gain(attn.norm_added_q, attn.gen_qk_gain), BF16=_bf16(h),
        )
        return q, k_buf, v_buf

    def mlp(self, mlp, h):
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
