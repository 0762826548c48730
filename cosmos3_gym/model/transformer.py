"""The Cosmos3 Mixture-of-Transformers generator, batched.

Every layer holds two parameter sets, one per pathway:
- UND (understanding): text tokens only, causal self-attention. UND never sees GEN tokens, so
  its per-layer keys/values are the same at every denoising step: ``encode_text`` runs it once
  per request and returns a ``TextKVCache``.
- GEN (generation): vision + action tokens. GEN queries attend bidirectionally to
  ``[K_text ; K_gen]`` / ``[V_text ; V_gen]``; padded text keys are masked, so prompts of
  different token lengths share one batch and padding changes nothing.

Parameter names and constructor keys are those of the diffusers checkpoint
(``layers.{i}.self_attn.to_q``, ``add_q_proj``, ``mlp_moe_gen``, ``action_proj_in.fc``, ...),
so ``load_state_dict(strict=True)`` works on a real ``nvidia/Cosmos3-*`` transformer folder.

Shapes: B batch, L text tokens, T latent frames, Hp x Wp patches per frame, H action steps,
N = T*Hp*Wp + H GEN tokens, C hidden size, D head dim.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import torch.utils.checkpoint
from diffusers.models.embeddings import TimestepEmbedding, Timesteps
from torch import nn

from cosmos3_gym.model.config import Cosmos3Config
from cosmos3_gym.model.fp8 import Fp8Weight, quantize_weight
from cosmos3_gym.model.kernels import TORCH_OPS, GenOps
from cosmos3_gym.model.rope import apply_rope, gen_position_ids, rope_tables, text_position_ids


class RMSNorm(nn.Module):
    """RMSNorm over the last dim, with either checkpoint family's rounding order.

    Qwen3 backbones (``silu``): normalise in fp32, cast to the weight's dtype, then scale.
    Nemotron backbones (``relu2``): scale in fp32, then cast to the input dtype. The two agree in
    fp32 and differ in the last bf16 bit, which is why both are kept.
    """

    def __init__(self, dim: int, eps: float, nemotron: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.nemotron = nemotron
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, gain: torch.Tensor | None = None) -> torch.Tensor:
        """Normalise the last dim of ``x``; ``gain`` (broadcastable, e.g. one ``[D]`` row per
        head) replaces ``self.weight``, so several norms can run as one call."""
        weight = self.weight if gain is None else gain
        if self.nemotron or x.dtype == weight.dtype == torch.float32:
            # One fused op; in fp32 both rounding orders are this same computation.
            dim = (x.shape[-1],)
            if gain is None:
                return F.rms_norm(x.float(), dim, weight.float(), self.eps).to(x.dtype)
            return (F.rms_norm(x.float(), dim, None, self.eps) * weight.float()).to(x.dtype)
        variance = x.float().pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.eps)
        if weight.dtype in (torch.float16, torch.bfloat16):
            x = x.to(weight.dtype)
        return x * weight


def fuse_linears(linears: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several linears of the same input, without a second copy.

    The weights are concatenated once and each linear's parameter becomes a view into the
    fused tensor, so ``state_dict`` keeps the checkpoint's names and memory is not doubled.
    Each output element is the same dot product, so fused and separate results are identical
    (the tests check this bit for bit on CPU fp32).
    """
    weight = torch.cat([lin.weight.detach() for lin in linears])
    bias = None
    if linears[0].bias is not None:
        bias = torch.cat([lin.bias.detach() for lin in linears])
    start = 0
    for lin in linears:
        rows = lin.weight.shape[0]
        lin.weight = nn.Parameter(weight[start : start + rows], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start : start + rows], requires_grad=False)
        start += rows
    return weight, bias


class MLP(nn.Module):
    """SwiGLU (``silu``, Qwen3) or squared-ReLU (``relu2``, Nemotron/Edge, no gate)."""

    def __init__(self, hidden_size: int, intermediate_size: int, hidden_act: str) -> None:
        super().__init__()
        self.hidden_act = hidden_act
        if hidden_act == "silu":
            self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.gate_up: torch.Tensor | None = None  # set by fuse(): [gate ; up] rows
        # Set by quantize_fp8(): [gate ; up] (or up) and down in e4m3, per-row scales.
        self.fp8_in: Fp8Weight | None = None
        self.fp8_down: Fp8Weight | None = None

    def fuse(self) -> None:
        if self.hidden_act == "silu":
            self.gate_up = fuse_linears([self.gate_proj, self.up_proj])[0]

    def quantize_fp8(self) -> None:
        inputs = [self.up_proj] if self.hidden_act == "relu2" else [self.gate_proj, self.up_proj]
        self.fp8_in = quantize_weight(torch.cat([lin.weight for lin in inputs]))
        self.fp8_down = quantize_weight(self.down_proj.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.hidden_act == "relu2":
            return self.down_proj(torch.relu(self.up_proj(x)).square())
        if self.gate_up is not None:
            gate, up = F.linear(x, self.gate_up).chunk(2, dim=-1)
            return self.down_proj(F.silu(gate) * up)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DomainAwareLinear(nn.Module):
    """A linear map whose weight and bias are looked up per embodiment domain.

    ``fc`` stores each domain's ``[in, out]`` matrix flattened in one embedding row.
    """

    def __init__(self, input_size: int, output_size: int, num_domains: int) -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.fc = nn.Embedding(num_domains, input_size * output_size)
        self.bias = nn.Embedding(num_domains, output_size)

    def forward(self, x: torch.Tensor, domain_ids: torch.Tensor) -> torch.Tensor:
        # x: [B, H, in], domain_ids: [B] -> [B, H, out]
        weight = self.fc(domain_ids).view(-1, self.input_size, self.output_size)
        return torch.baddbmm(self.bias(domain_ids)[:, None, :], x, weight)


class MoTAttention(nn.Module):
    """Projections and norms of both pathways; attention itself runs in the decoder layer."""

    def __init__(self, config: Cosmos3Config) -> None:
        super().__init__()
        c, d = config.hidden_size, config.head_dim
        hq, hkv = config.num_attention_heads, config.num_key_value_heads
        bias = config.attention_bias
        nemotron = config.hidden_act == "relu2"
        eps = config.rms_norm_eps
        self.num_heads, self.num_kv_heads, self.head_dim = hq, hkv, d
        # UND (text)
        self.to_q = nn.Linear(c, hq * d, bias=bias)
        self.to_k = nn.Linear(c, hkv * d, bias=bias)
        self.to_v = nn.Linear(c, hkv * d, bias=bias)
        self.to_out = nn.Linear(hq * d, c, bias=bias)
        if config.qk_norm_for_text:
            self.norm_q = RMSNorm(d, eps, nemotron)
            self.norm_k = RMSNorm(d, eps, nemotron)
        else:
            self.norm_q = nn.Identity()
            self.norm_k = nn.Identity()
        # Dense/Edge variants normalise the text keys handed to GEN separately.
        if config.use_und_k_norm_for_gen and not config.qk_norm_for_text:
            self.k_norm_und_for_gen = RMSNorm(d, eps, nemotron)
        else:
            self.k_norm_und_for_gen = None
        # GEN (vision + action)
        self.add_q_proj = nn.Linear(c, hq * d, bias=bias)
        self.add_k_proj = nn.Linear(c, hkv * d, bias=bias)
        self.add_v_proj = nn.Linear(c, hkv * d, bias=bias)
        self.to_add_out = nn.Linear(hq * d, c, bias=bias)
        self.norm_added_q = RMSNorm(d, eps, nemotron)
        self.norm_added_k = RMSNorm(d, eps, nemotron)
        self.gen_qkv: tuple[torch.Tensor, torch.Tensor | None] | None = None  # set by fuse()
        self.gen_qk_gain: torch.Tensor | None = None  # set by fuse(): [Hq+Hkv, 1, D]
        # Set by quantize_fp8(): the fused GEN Q/K/V and the output projection in e4m3.
        self.fp8_qkv: Fp8Weight | None = None
        self.fp8_out: Fp8Weight | None = None
        # GEN attention with grouped query heads folded into the query length (see
        # ``gen_attention``); False passes the K/V heads to SDPA with ``enable_gqa``.
        self.fold_query_groups = True

    def fuse(self) -> None:
        """One GEN Q/K/V projection instead of three, and one QK-norm + RoPE over the query
        and key heads together instead of one each (the GEN pathway runs every step).

        The fused norm multiplies by a table of per-head gains (the q-norm weight for each
        query head, then the k-norm weight for each key head), built once here from the
        loaded weights: re-run ``fuse`` after changing them.
        """
        self.gen_qkv = fuse_linears([self.add_q_proj, self.add_k_proj, self.add_v_proj])
        q_gain = self.norm_added_q.weight.detach().expand(self.num_heads, -1)
        k_gain = self.norm_added_k.weight.detach().expand(self.num_kv_heads, -1)
        self.gen_qk_gain = torch.cat([q_gain, k_gain])[:, None, :]

    def quantize_fp8(self) -> None:
        """FP8 copies of the GEN Q/K/V (one matrix, each row its own scale) and output weights;
        the bf16 ones stay for the steps that run in bf16."""
        lins = (self.add_q_proj, self.add_k_proj, self.add_v_proj)
        bias = None if lins[0].bias is None else torch.cat([lin.bias for lin in lins])
        self.fp8_qkv = quantize_weight(torch.cat([lin.weight for lin in lins]), bias)
        self.fp8_out = quantize_weight(self.to_add_out.weight, self.to_add_out.bias)

    def gen_qkv_rotated(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
        qkv: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """GEN ``q`` ``[B, Hq, N, D]`` and ``k`` ``[B, Hkv, N, D]`` projected, QK-normed and
        rotated, and ``v`` ``[B, Hkv, N, D]``.

        After :meth:`fuse`, one matmul gives q/k/v and the q and k heads, adjacent in its
        output, go through one RMSNorm (with the per-head gain table) and one RoPE: the same
        arithmetic per element as the separate norms (bit for bit on CPU fp32, tested).
        ``qkv`` ``[B, N, (Hq + 2 Hkv) D]``: the fused projection's output, made elsewhere (FP8).
        """
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if qkv is None and self.gen_qkv is None:  # fuse() sets it together with gen_qk_gain
            q, k, v = self.add_q_proj(h), self.add_k_proj(h), self.add_v_proj(h)
            q = apply_rope(self.norm_added_q(self._heads(q, hq)), cos, sin)
            k = apply_rope(self.norm_added_k(self._heads(k, hkv)), cos, sin)
            return q, k, self._heads(v, hkv)
        if qkv is None:
            qkv = F.linear(h, *self.gen_qkv)  # [B, N, (Hq + 2 Hkv) D]
        qk = self._heads(qkv[..., : (hq + hkv) * d], hq + hkv)
        qk = apply_rope(self.norm_added_q(qk, gain=self.gen_qk_gain), cos, sin)  # contiguous
        return qk[:, :hq], qk[:, hq:], self._heads(qkv[..., (hq + hkv) * d :], hkv)

    def gen_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Bidirectional GEN attention: ``q`` ``[B, Hq, N, D]`` over ``k``/``v``
        ``[B, Hkv, L+N, D]`` -> ``[B, N, Hq*D]``.

        Query heads ``j*G .. j*G+G-1`` share K/V head ``j`` (``G = Hq / Hkv``). With
        ``fold_query_groups`` the ``G`` heads of a group become one head of ``G*N`` queries,
        a free reshape of a contiguous ``q``: SDPA then reads each K/V head once instead of
        expanding it ``G`` times. Each query row sees the same keys, values and mask, so the
        result is the same (bit for bit on CPU fp32, tested). Not for causal attention, whose
        mask depends on the query position. Under autograd the expanded form is kept: the
        folded backward sums the K/V gradients in another order, and training keeps the
        reference numerics (a retrain reproduces the shipped checkpoint bit for bit).
        """
        b, hq, n, d = q.shape
        groups = hq // self.num_kv_heads
        training = torch.is_grad_enabled() and q.requires_grad
        if self.fold_query_groups and groups > 1 and not training:
            q = q.reshape(b, self.num_kv_heads, groups * n, d)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask)
            # SDPA's output strides depend on the kernel (CUDA's fp32 path returns the
            # [B, queries, heads, D] memory layout): split the query axis without assuming a
            # contiguous result, then the one copy of the transpose below.
            out = out.unflatten(2, (groups, n)).flatten(1, 2)  # [B, Hq, N, D]
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=key_mask, enable_gqa=True)
        return out.transpose(1, 2).flatten(2)

    def _heads(self, x: torch.Tensor, heads: int) -> torch.Tensor:
        # [B, N, heads*D] -> [B, heads, N, D]
        return x.unflatten(-1, (heads, self.head_dim)).transpose(1, 2)


class DecoderLayer(nn.Module):
    def __init__(self, config: Cosmos3Config) -> None:
        super().__init__()
        c, eps = config.hidden_size, config.rms_norm_eps
        nemotron = config.hidden_act == "relu2"
        self.self_attn = MoTAttention(config)
        self.mlp = MLP(c, config.intermediate_size, config.hidden_act)
        self.mlp_moe_gen = MLP(c, config.intermediate_size, config.hidden_act)
        self.input_layernorm = RMSNorm(c, eps, nemotron)
        self.input_layernorm_moe_gen = RMSNorm(c, eps, nemotron)
        self.post_attention_layernorm = RMSNorm(c, eps, nemotron)
        self.post_attention_layernorm_moe_gen = RMSNorm(c, eps, nemotron)

    def forward_text(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        need_output: bool = True,
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """UND step over text ``x`` ``[B, L, C]``.

        Returns ``(x_next or None, k_for_gen, v)`` with ``k_for_gen``/``v`` ``[B, Hkv, L, D]``
        post-norm and post-RoPE: what every GEN step of this layer attends to.
        """
        attn = self.self_attn
        h = self.input_layernorm(x)
        k = attn.norm_k(attn._heads(attn.to_k(h), attn.num_kv_heads))
        v = attn._heads(attn.to_v(h), attn.num_kv_heads)
        k_for_gen = k if attn.k_norm_und_for_gen is None else attn.k_norm_und_for_gen(k)
        k_for_gen = apply_rope(k_for_gen, cos, sin)
        if not need_output:
            # The last layer's text output feeds nothing: only its K/V matter.
            return None, k_for_gen, v
        k = k_for_gen if attn.k_norm_und_for_gen is None else apply_rope(k, cos, sin)
        q = apply_rope(attn.norm_q(attn._heads(attn.to_q(h), attn.num_heads)), cos, sin)
        # Right-padded prompts: under the causal mask a real token never sees a pad, so no
        # padding mask is needed here; pad rows are garbage that GEN masks out.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + attn.to_out(out.transpose(1, 2).flatten(2))
        x = x + self.mlp(self.post_attention_layernorm(x))
        return x, k_for_gen, v

    def forward_gen(
        self,
        x: torch.Tensor,
        h: torch.Tensor,
        text_kv: tuple[torch.Tensor, torch.Tensor],
        key_mask: torch.Tensor | None,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_buffers: tuple[torch.Tensor, torch.Tensor] | None,
        next_norm: RMSNorm,
        ops: GenOps,
        last: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GEN step over the residual stream ``x`` ``[B, N, C]`` attending to ``[text ; gen]``.

        ``h`` is ``input_layernorm_moe_gen(x)``, made by the previous layer's last residual
        add; this layer returns its new stream and ``next_norm`` of it (the next layer's input
        norm, or the final norm), so each residual add and the norm after it are one step of
        ``ops``. ``kv_buffers`` (``[B, Hkv, L+N, D]`` each, text part already filled) receive
        this step's GEN keys/values in place, instead of a fresh ``torch.cat`` per layer.
        ``last``: ``next_norm`` is the final norm, whose output feeds the (bf16) output heads,
        not a GEN layer's GEMMs (FP8 ops quantise the others' outputs).
        """
        attn = self.self_attn
        q, k, v = ops.qkv(attn, h, cos, sin, text_kv, kv_buffers)
        attended = ops.out(attn, attn.gen_attention(q, k, v, key_mask))
        x, h = ops.add_norm(x, attended, self.post_attention_layernorm_moe_gen, feeds_gemm=True)
        return ops.add_norm(x, ops.mlp(self.mlp_moe_gen, h), next_norm, feeds_gemm=not last)


@dataclass
class TextKVCache:
    """Per-layer text keys/values of a batch of prompts, computed once per request.

    ``keys[i]``/``values[i]``: ``[B, Hkv, L, D]``; ``lengths``: ``[B]`` real prompt lengths;
    ``text_mask``: ``[B, L]``, True for real tokens (right padding).
    """

    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    lengths: torch.Tensor
    text_mask: torch.Tensor

    @property
    def padded(self) -> bool:
        return bool((self.lengths != self.text_mask.shape[1]).any())

    def rows(self, index: torch.Tensor) -> TextKVCache:
        """Rows ``index`` of the batch, e.g. each training sample's caption out of the few
        distinct ones encoded once (indexing keeps gradients flowing to the UND pathway)."""
        return TextKVCache(
            [k[index] for k in self.keys], [v[index] for v in self.values],
            self.lengths[index], self.text_mask[index],
        )

    def repeat_interleave(self, repeats: int) -> TextKVCache:
        """The same prompts, each repeated ``repeats`` times (e.g. several candidates)."""
        return TextKVCache(
            [k.repeat_interleave(repeats, 0) for k in self.keys],
            [v.repeat_interleave(repeats, 0) for v in self.values],
            self.lengths.repeat_interleave(repeats, 0),
            self.text_mask.repeat_interleave(repeats, 0),
        )


@dataclass
class GenLayout:
    """What every denoising step of one request shares: RoPE tables and the key mask."""

    cos: torch.Tensor  # [B, 1, N, D/2]
    sin: torch.Tensor
    key_mask: torch.Tensor | None  # [B, 1, 1, L+N] bool, None when no prompt is padded
    grid: tuple[int, int, int]  # (T, Hp, Wp) patch grid
    latent_hw: tuple[int, int]  # unpadded latent (h, w)
    num_actions: int
    # Per layer (K, V) [B, Hkv, L+N, D] with the text prefix written once (inference only).
    kv_buffers: list[tuple[torch.Tensor, torch.Tensor]] | None = None


class Cosmos3Transformer(nn.Module):
    """The Cosmos3 generator (UND text pathway + GEN vision/action pathway).

    Example::

        model = Cosmos3Transformer(Cosmos3Config(hidden_size=64, head_dim=16, ...))
        cache = model.encode_text(input_ids, text_mask)               # once per request
        layout = model.gen_layout(cache, latent_shape=(T, h, w), num_actions=H, fps=20.0)
        v_vision, v_action = model.forward_gen(cache, layout, vision, vision_noisy,
                                               actions, action_noisy, domain_ids, timesteps)
    """

    # Checkpoint entries the generator never uses: the text head of the reasoner. Loading
    # skips them by name (and only them), so they are not allocated.
    UNUSED_CHECKPOINT_KEYS = ("lm_head.weight",)

    def __init__(self, config: Cosmos3Config) -> None:
        super().__init__()
        self.config = config
        c = config.hidden_size
        nemotron = config.hidden_act == "relu2"
        self.embed_tokens = nn.Embedding(config.vocab_size, c)
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(c, config.rms_norm_eps, nemotron)  # UND final norm (unused here)
        self.norm_moe_gen = RMSNorm(c, config.rms_norm_eps, nemotron)
        self.proj_in = nn.Linear(config.patch_latent_dim, c)
        self.proj_out = nn.Linear(c, config.patch_latent_dim)
        self.time_proj = Timesteps(num_channels=256, flip_sin_to_cos=True, downscale_freq_shift=0)
        self.time_embedder = TimestepEmbedding(in_channels=256, time_embed_dim=c)
        # Under autograd, each GEN layer's activations are recomputed in the backward instead of
        # kept (torch.utils.checkpoint): training memory per chunk falls from every layer's
        # intermediates to one residual stream per layer (train/memory.py counts both).
        self.gradient_checkpointing = False
        if config.action_gen:
            n_dom = config.num_embodiment_domains
            self.action_proj_in = DomainAwareLinear(config.action_dim, c, n_dom)
            self.action_proj_out = DomainAwareLinear(c, config.action_dim, n_dom)
            self.action_modality_embed = nn.Parameter(torch.zeros(c))
        if config.sound_gen:
            # Present so sound checkpoints load strictly; policy mode never runs sound tokens.
            self.audio_proj_in = nn.Linear(config.sound_dim, c)
            self.audio_proj_out = nn.Linear(c, config.sound_dim)
            self.audio_modality_embed = nn.Parameter(torch.zeros(c))

    def fuse_gen_projections(self) -> Cosmos3Transformer:
        """Fuse each GEN layer's Q/K/V and gate/up projections (inference; same outputs).

        The GEN pathway runs at every denoising step, so one matmul instead of three (and two)
        per layer saves launches; parameters become views of the fused weights, so the
        state dict and its memory are unchanged.
        """
        for layer in self.layers:
            layer.self_attn.fuse()
            layer.mlp_moe_gen.fuse()
        return self

    def quantize_gen_fp8(self) -> Cosmos3Transformer:
        """FP8 copies of each GEN layer's four GEMM groups (Q/K/V, attention output, gate/up,
        down), one e4m3 scale per output row (:mod:`cosmos3_gym.model.fp8`), for ops built
        with ``fp8=True``. The bf16 weights stay: bf16 steps and the state dict use them.
        Re-run after changing the weights."""
        for layer in self.layers:
            layer.self_attn.quantize_fp8()
            layer.mlp_moe_gen.quantize_fp8()
        return self

    @property
    def fp8_ready(self) -> bool:
        """Whether :meth:`quantize_gen_fp8` has run."""
        return all(layer.self_attn.fp8_qkv is not None for layer in self.layers)

    def compile_gen_layers(self, **compile_kwargs) -> Cosmos3Transformer:
        """``torch.compile`` each layer's GEN step (regional compilation: the part that runs
        every denoising step; UND runs once per request and stays eager).

        Shapes are static per request (batch, prompt length, latent grid), so each new shape
        compiles once. Outputs match eager mode to float rounding (fused kernels reorder sums),
        not bit for bit.
        """
        compile_kwargs.setdefault("dynamic", False)
        for layer in self.layers:
            layer.forward_gen = torch.compile(layer.forward_gen, **compile_kwargs)
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.proj_in.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.proj_in.weight.device

    @classmethod
    def from_pretrained(
        cls,
        folder: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
    ) -> Cosmos3Transformer:
        """Load a diffusers ``transformer/`` folder (config.json + safetensors) strictly."""
        from cosmos3_gym.model.weights import load_transformer

        return load_transformer(cls, folder, device=device, dtype=dtype)

    # ------------------------------------------------------------------ UND, once per request

    def text_parameters(self) -> list[nn.Parameter]:
        """The parameters the UND pathway reads (what ``encode_text``'s output depends on)."""
        params = list(self.embed_tokens.parameters())
        for layer in self.layers:
            attn = layer.self_attn
            for module in (layer.input_layernorm, layer.post_attention_layernorm, layer.mlp,
                           attn.to_q, attn.to_k, attn.to_v, attn.to_out, attn.norm_q,
                           attn.norm_k, attn.k_norm_und_for_gen):
                if module is not None:
                    params.extend(module.parameters())
        return params

    def encode_text(self, input_ids: torch.Tensor, text_mask: torch.Tensor) -> TextKVCache:
        """Run the UND pathway over right-padded prompts ``[B, L]``; cache its K/V per layer."""
        if input_ids.shape != text_mask.shape:
            raise ValueError(
                f"input_ids {tuple(input_ids.shape)} and text_mask {tuple(text_mask.shape)} differ"
            )
        text_mask = text_mask.to(torch.bool)
        lengths = text_mask.sum(1)
        positions = torch.arange(text_mask.shape[1], device=text_mask.device)
        expected = positions[None] < lengths[:, None]
        if not torch.equal(expected, text_mask):
            raise ValueError("text_mask must mark a right-padded prefix of real tokens per row")
        x = self.embed_tokens(input_ids)  # [B, L, C]
        cos, sin = rope_tables(text_position_ids(input_ids), self.config, x.dtype)
        keys, values = [], []
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x, k, v = layer.forward_text(x, cos, sin, need_output=i < last)
            keys.append(k)
            values.append(v)
        return TextKVCache(keys, values, lengths, text_mask)

    def gen_layout(
        self,
        text: TextKVCache,
        *,
        latent_shape: tuple[int, int, int],
        num_actions: int,
        fps: float,
        action_fps: float | None = None,
        action_start: int = 1,
        preallocate_kv: bool = False,
    ) -> GenLayout:
        """RoPE tables and key mask for a GEN stream of ``latent_shape`` (T, h, w) + actions.

        ``num_actions`` counts every action row, leading state rows included; ``action_start``
        is the pixel frame the first row lines up with (:func:`~cosmos3_gym.model.rope.
        gen_position_ids`). ``preallocate_kv`` builds per-layer K/V buffers holding the text
        prefix once, which every denoising step then fills in place (no autograd: inference
        only).
        """
        p = self.config.latent_patch_size
        t, h, w = latent_shape
        grid = (t, -(-h // p), -(-w // p))
        positions = gen_position_ids(
            self.config, text.lengths, grid=grid, num_actions=num_actions, fps=fps,
            action_fps=action_fps, action_start=action_start,
        )
        cos, sin = rope_tables(positions, self.config, self.dtype)
        key_mask = None
        if text.padded:
            n = grid[0] * grid[1] * grid[2] + num_actions
            gen = torch.ones(text.text_mask.shape[0], n, dtype=torch.bool, device=cos.device)
            key_mask = torch.cat([text.text_mask, gen], dim=1)[:, None, None, :]
        buffers = None
        if preallocate_kv:
            n = grid[0] * grid[1] * grid[2] + num_actions
            buffers = []
            for k_text, v_text in zip(text.keys, text.values, strict=True):
                k_buf = k_text.new_empty((*k_text.shape[:2], k_text.shape[2] + n, k_text.shape[3]))
                v_buf = torch.empty_like(k_buf)
                k_buf[:, :, : k_text.shape[2]] = k_text
                v_buf[:, :, : v_text.shape[2]] = v_text
                buffers.append((k_buf, v_buf))
        return GenLayout(cos, sin, key_mask, grid, (h, w), num_actions, buffers)

    # ------------------------------------------------------------------ GEN, every step

    def _patchify(self, latents: torch.Tensor, grid: tuple[int, int, int]) -> torch.Tensor:
        # [B, C, T, h, w] -> [B, T*Hp*Wp, p*p*C], patch layout (t, hp, wp, p, q, c)
        p = self.config.latent_patch_size
        b, c, t, h, w = latents.shape
        _, hp, wp = grid
        if (hp * p, wp * p) != (h, w):
            latents = F.pad(latents, (0, wp * p - w, 0, hp * p - h))
        x = latents.reshape(b, c, t, hp, p, wp, p).permute(0, 2, 3, 5, 4, 6, 1)
        return x.reshape(b, t * hp * wp, p * p * c)

    def _unpatchify(self, x: torch.Tensor, layout: GenLayout) -> torch.Tensor:
        p, c = self.config.latent_patch_size, self.config.latent_channel
        t, hp, wp = layout.grid
        h, w = layout.latent_hw
        x = x.reshape(x.shape[0], t, hp, wp, p, p, c).permute(0, 6, 1, 2, 4, 3, 5)
        return x.reshape(x.shape[0], c, t, hp * p, wp * p)[..., :h, :w]

    def timestep_embedding(self, timesteps: torch.Tensor) -> torch.Tensor:
        """``[B]`` flow timesteps in [0, 1000] -> ``[B, C]`` (fp32 sinusoid, embedder dtype)."""
        emb = self.time_proj(timesteps.float() * self.config.timestep_scale)
        return self.time_embedder(emb.to(self.time_embedder.linear_1.weight.dtype))

    def forward_gen(
        self,
        text: TextKVCache,
        layout: GenLayout,
        vision: torch.Tensor,
        vision_noisy: torch.Tensor,
        actions: torch.Tensor,
        action_noisy: torch.Tensor,
        domain_ids: torch.Tensor,
        timesteps: torch.Tensor,
        ops: GenOps = TORCH_OPS,
        action_timesteps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One denoising forward of the GEN pathway.

        Args:
            vision: ``[B, 48, T, h, w]`` latents; clean frames hold the conditioning.
            vision_noisy: ``[B, T]`` bool, True for frames being denoised.
            actions: ``[B, H, action_dim]``; action_noisy: ``[B, H]`` bool.
            domain_ids: ``[B]`` embodiment ids selecting the action heads.
            timesteps: ``[B]`` flow timesteps (0..1000) of the noisy tokens.
            action_timesteps: ``[B]`` timesteps of the noisy action tokens where they are at
                another noise level than the video's (training draws the two independently,
                train/trainer.py); None: ``timesteps``, as the sampler runs them.
            ops: how the step's elementwise work runs (:mod:`cosmos3_gym.model.kernels`):
                eager by default; fused kernels need K/V buffers and no autograd.

        Returns:
            vision velocity ``[B, 48, T, h, w]`` and action velocity ``[B, H, action_dim]``,
            zero at clean frames/steps.
        """
        dtype = self.dtype
        b = vision.shape[0]
        t, hp, wp = layout.grid
        t_emb = self.timestep_embedding(timesteps).to(dtype)[:, None, :]  # [B, 1, C]
        a_emb = t_emb if action_timesteps is None else (
            self.timestep_embedding(action_timesteps).to(dtype)[:, None, :])  # [B, 1, C]

        vis = self.proj_in(self._patchify(vision.to(dtype), layout.grid))  # [B, T*Hp*Wp, C]
        vis_noisy = vision_noisy[:, :, None].expand(b, t, hp * wp).reshape(b, -1, 1)
        vis = vis + t_emb * vis_noisy.to(dtype)
        act = self.action_proj_in(actions.to(dtype), domain_ids) + self.action_modality_embed
        act = act + a_emb * action_noisy[:, :, None].to(dtype)
        x = torch.cat([vis, act], dim=1)  # [B, N, C]

        if torch.is_grad_enabled() and (layout.kv_buffers is not None or ops is not TORCH_OPS):
            raise RuntimeError(
                "preallocated K/V buffers and fused GEN ops are for inference; run under no_grad"
            )
        buffers = layout.kv_buffers or [None] * len(self.layers)
        next_norms = [layer.input_layernorm_moe_gen for layer in self.layers[1:]]
        h = self.layers[0].input_layernorm_moe_gen(x)
        last = len(self.layers) - 1
        for i, (layer, text_kv, kv, next_norm) in enumerate(zip(
            self.layers, zip(text.keys, text.values, strict=True), buffers,
            [*next_norms, self.norm_moe_gen], strict=True,
        )):
            args = (x, h, text_kv, layout.key_mask, layout.cos, layout.sin, kv, next_norm, ops)
            if self.gradient_checkpointing and torch.is_grad_enabled():
                x, h = torch.utils.checkpoint.checkpoint(
                    layer.forward_gen, *args, last=i == last, use_reentrant=False)
            else:
                x, h = layer.forward_gen(*args, last=i == last)
        x = h  # norm_moe_gen of the last layer's output

        n_vis = t * hp * wp
        v_vision = self._unpatchify(self.proj_out(x[:, :n_vis]), layout)
        v_vision = v_vision * vision_noisy[:, None, :, None, None].to(v_vision.dtype)
        v_action = self.action_proj_out(x[:, n_vis:], domain_ids)
        v_action = v_action * action_noisy[:, :, None].to(v_action.dtype)
        return v_vision, v_action

    def forward(
        self,
        input_ids: torch.Tensor,
        text_mask: torch.Tensor,
        vision: torch.Tensor,
        vision_noisy: torch.Tensor,
        actions: torch.Tensor,
        action_noisy: torch.Tensor,
        domain_ids: torch.Tensor,
        timesteps: torch.Tensor,
        *,
        fps: float,
        action_fps: float | None = None,
        action_timesteps: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Uncached forward (text pathway recomputed): training, and the reference for the cache."""
        text = self.encode_text(input_ids, text_mask)
        layout = self.gen_layout(
            text, latent_shape=tuple(vision.shape[2:]), num_actions=actions.shape[1], fps=fps,
            action_fps=action_fps,
        )
        return self.forward_gen(
            text, layout, vision, vision_noisy, actions, action_noisy, domain_ids, timesteps,
            action_timesteps=action_timesteps,
        )
