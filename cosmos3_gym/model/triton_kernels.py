"""Triton kernels of the fused GEN ops (see :mod:`cosmos3_gym.model.kernels`).

Imported only when :class:`~cosmos3_gym.model.kernels.TritonGenOps` is first built. To run them
in Triton's interpreter (no GPU), set ``TRITON_INTERPRET=1`` before Triton is first imported
(diffusers imports it when it is installed); the test suite's conftest does.

Every rounding to bf16 goes through ``rnd`` (round to nearest, ties to even, done on the bits),
so the kernels round exactly where and as eager PyTorch does, compiled or interpreted (the
interpreter's own float casts truncate). ``BF16`` false means fp32, where ``rnd`` is the
identity. Stored values are then exactly representable, so the final cast changes nothing.
The FP8 outputs (``FP8`` true) go the same way through ``rnd_e4m3``: scaled per row into e4m3's
range, rounded to its grid in fp32, then stored exactly (see :mod:`cosmos3_gym.model.fp8`).
"""

import triton
import triton.language as tl


@triton.jit
def rnd(x, BF16: tl.constexpr):
    if BF16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = tl.where(x != x, x, bits.to(tl.float32, bitcast=True))  # NaN stays NaN
    return x


@triton.jit
def rnd_e4m3(x):
    # fp32 -> the nearest e4m3 value (ties to even), kept in fp32; |x| <= 448 on entry.
    # Normal range: keep 3 mantissa bits. Below 2**-6 the grid is 2**-9 apart (subnormals):
    # adding and removing 1.5 * 2**14 rounds to that grid in fp32 arithmetic.
    bits = x.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (x + 24576.0) - 24576.0
    r = tl.where(tl.abs(x) < 0.015625, sub, normal)
    return tl.where(r == 0.0, x * 0.0, r)  # a zero keeps its sign, as torch's cast keeps it


@triton.jit
def quantize_store(v, amax, q_ptr, scale_ptr, row, offs, mask, AMAX_FLOOR: tl.constexpr):
    # Row values v (one block) with their row's amax -> e4m3 at q_ptr, the row's scale once.
    scale = tl.maximum(amax, AMAX_FLOOR) / 448.0
    q = rnd_e4m3(tl.minimum(tl.maximum(v / scale, -448.0), 448.0))
    tl.store(q_ptr + offs, q.to(q_ptr.dtype.element_ty), mask=mask)
    tl.store(scale_ptr + row, scale)


@triton.jit
def add_rms_norm(x_ptr, delta_ptr, w_ptr, res_ptr, out_ptr, scale_ptr, width, eps,
                 BLOCK: tl.constexpr, LOWP_ROUND: tl.constexpr, BF16: tl.constexpr,
                 FP8: tl.constexpr, AMAX_FLOOR: tl.constexpr):
    # One program per row: the residual sum rounded as eager rounds it, then its norm (FP8:
    # quantised per row, the row's scale to scale_ptr).
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < width
    x = tl.load(x_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
    delta = tl.load(delta_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
    r = rnd(x + delta, BF16)
    tl.store(res_ptr + row * width + cols, r.to(res_ptr.dtype.element_ty), mask=mask)
    inv = tl.rsqrt(tl.sum(r * r, axis=0) / width + eps)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    if LOWP_ROUND:
        normed = rnd(rnd(r * inv, BF16) * w, BF16)
    else:
        normed = rnd(r * inv * w, BF16)
    if FP8:
        amax = tl.max(tl.where(mask, tl.abs(normed), 0.0), axis=0)
        quantize_store(normed, amax, out_ptr, scale_ptr, row, row * width + cols, mask,
                       AMAX_FLOOR)
    else:
        tl.store(out_ptr + row * width + cols, normed.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def qk_norm_rope_kv(qkv_ptr, gain_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, v_ptr,
                    tokens, key_len, text_len, eps,
                    HQ: tl.constexpr, HKV: tl.constexpr, HALF: tl.constexpr,
                    HEAD_BLOCK: tl.constexpr, LOWP_ROUND: tl.constexpr, BF16: tl.constexpr):
    # Program (token, j): heads j*HEAD_BLOCK ... of one GEN token (q heads, then k, then v, as
    # they sit in the fused projection's row), as a [heads, D/2] tile per half.
    token = tl.program_id(0).to(tl.int64)
    b = token // tokens
    n = token % tokens
    head = (tl.program_id(1) * HEAD_BLOCK + tl.arange(0, HEAD_BLOCK))[:, None]
    col = tl.arange(0, HALF)[None, :]
    d = 2 * HALF
    heads = HQ + 2 * HKV
    live = head < heads
    normed = head < HQ + HKV  # q and k heads; the rest are v heads, copied as they are
    row = qkv_ptr + token * heads * d + head * d + col
    x1 = tl.load(row, mask=live, other=0.0).to(tl.float32)
    x2 = tl.load(row + HALF, mask=live, other=0.0).to(tl.float32)
    inv = tl.rsqrt((tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)) / d + eps)[:, None]
    g1 = tl.load(gain_ptr + head * d + col, mask=normed, other=1.0).to(tl.float32)
    g2 = tl.load(gain_ptr + head * d + HALF + col, mask=normed, other=1.0).to(tl.float32)
    if LOWP_ROUND:
        n1 = rnd(rnd(x1 * inv, BF16) * g1, BF16)
        n2 = rnd(rnd(x2 * inv, BF16) * g2, BF16)
    else:
        n1 = rnd(x1 * inv * g1, BF16)
        n2 = rnd(x2 * inv * g2, BF16)
    c = tl.load(cos_ptr + token * HALF + col).to(tl.float32)
    s = tl.load(sin_ptr + token * HALF + col).to(tl.float32)
    # Eager RoPE rounds each product, then the sum: x1*cos - x2*sin, x2*cos + x1*sin.
    r1 = rnd(rnd(n1 * c, BF16) - rnd(n2 * s, BF16), BF16)
    r2 = rnd(rnd(n2 * c, BF16) + rnd(n1 * s, BF16), BF16)
    out1 = tl.where(normed, r1, x1).to(q_ptr.dtype.element_ty)
    out2 = tl.where(normed, r2, x2).to(q_ptr.dtype.element_ty)
    is_q = head < HQ
    q_row = q_ptr + ((b * HQ + head) * tokens + n) * d + col
    tl.store(q_row, out1, mask=is_q)
    tl.store(q_row + HALF, out2, mask=is_q)
    is_k = normed & (head >= HQ)
    k_row = k_ptr + ((b * HKV + head - HQ) * key_len + text_len + n) * d + col
    tl.store(k_row, out1, mask=is_k)
    tl.store(k_row + HALF, out2, mask=is_k)
    is_v = live & (head >= HQ + HKV)
    v_row = v_ptr + ((b * HKV + head - HQ - HKV) * key_len + text_len + n) * d + col
    tl.store(v_row, out1, mask=is_v)
    tl.store(v_row + HALF, out2, mask=is_v)


@triton.jit
def _activation_block(in_ptr, row, cols, mask, width, RELU2: tl.constexpr, BF16: tl.constexpr):
    if RELU2:
        x = tl.load(in_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
        r = tl.maximum(x, 0.0)
        out = rnd(r * r, BF16)
    else:
        base = in_ptr + row * 2 * width + cols
        g = tl.load(base, mask=mask, other=0.0).to(tl.float32)
        up = tl.load(base + width, mask=mask, other=0.0).to(tl.float32)
        out = rnd(rnd(g / (1.0 + tl.exp(-g)), BF16) * up, BF16)
    return out


@triton.jit
def activation(in_ptr, out_ptr, width, BLOCK: tl.constexpr, RELU2: tl.constexpr,
               BF16: tl.constexpr):
    # SiLU(gate) * up over [gate ; up] rows of 2 * width, or relu(x)^2 over rows of width.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < width
    out = _activation_block(in_ptr, row, cols, mask, width, RELU2, BF16)
    tl.store(out_ptr + row * width + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def activation_fp8(in_ptr, q_ptr, scale_ptr, width, BLOCK: tl.constexpr, RELU2: tl.constexpr,
                   BF16: tl.constexpr, AMAX_FLOOR: tl.constexpr):
    # The activation of one row, quantised per row for the down projection. One program per
    # row: a first pass finds the row's amax, a second recomputes each block (cheaper than
    # writing the activation out and reading it back) and stores it in e4m3.
    row = tl.program_id(0).to(tl.int64)
    peak = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        out = _activation_block(in_ptr, row, cols, mask, width, RELU2, BF16)
        peak = tl.maximum(peak, tl.where(mask, tl.abs(out), 0.0))
    amax = tl.max(peak, axis=0)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        out = _activation_block(in_ptr, row, cols, mask, width, RELU2, BF16)
        quantize_store(out, amax, q_ptr, scale_ptr, row, row * width + cols, mask, AMAX_FLOOR)


@triton.jit
def quantize_rows(in_ptr, q_ptr, scale_ptr, width, BLOCK: tl.constexpr,
                  AMAX_FLOOR: tl.constexpr):
    # Per-row quantisation of a finished activation (the attention output before to_add_out):
    # one program per row, amax then quantise.
    row = tl.program_id(0).to(tl.int64)
    peak = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        x = tl.load(in_ptr + row * width + cols, mask=cols < width, other=0.0).to(tl.float32)
        peak = tl.maximum(peak, tl.abs(x))
    amax = tl.max(peak, axis=0)
    for start in range(0, width, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < width
        x = tl.load(in_ptr + row * width + cols, mask=mask, other=0.0).to(tl.float32)
        quantize_store(x, amax, q_ptr, scale_ptr, row, row * width + cols, mask, AMAX_FLOOR)
