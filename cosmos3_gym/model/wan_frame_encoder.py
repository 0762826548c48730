"""The Wan VAE encoder specialised to one frame: the same function as 2-D convolutions.

Policy mode encodes a single conditioning frame (``T = 1``). diffusers' ``AutoencoderKLWan``
runs it through causal 3-D convolutions whose temporal padding is two zero frames, so every
``3x3x3`` kernel spends two of its three temporal taps multiplying zeros, and its channel-wise
RMS norm reduces over a strided axis. For ``T = 1`` the whole encoder collapses exactly to 2-D:

- a causal ``WanCausalConv3d`` (front padding ``2·p_t``) sees the frame at tap ``2·p_t`` only,
  so it equals ``Conv2d`` with ``weight[:, :, 2·p_t]`` (3x fewer multiply-adds);
- ``downsample3d`` only caches its input on the first chunk (its time conv starts at frame 1),
  so it is the same zero-pad + stride-2 ``Conv2d`` as ``downsample2d``;
- ``AvgDown3D`` with temporal factor 2 averages the frame with one zero frame in front;
- attention blocks already work frame by frame.

Activations are kept channels-last, where the convolutions and the channel-wise norm read
contiguous memory. The result equals diffusers' encode up to float summation order (not bit
for bit: the 2-D kernel sums fewer terms in another order); ``tests/test_wan_frame_encoder.py``
checks it against ``AutoencoderKLWan.encode`` for the Wan2.2 (residual, patchified) and Wan2.1
(plain) encoder layouts.

Weights: each 3-D kernel's live temporal slice is copied once (a third of the encoder's conv
weights) and each norm's ``sqrt(C)·gamma`` is folded into one vector; attention blocks and the
stride-2 downsampling convolutions are diffusers' own modules.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from diffusers.models.autoencoders import autoencoder_kl_wan as wan
from torch import nn


def _conv2d_from_causal(conv: wan.WanCausalConv3d) -> nn.Conv2d:
    """The 2-D convolution a causal 3-D one performs on a single frame (no cache)."""
    pad_t = conv._padding[4]  # causal front padding, 2·p_t zero frames
    stride_t = conv.stride[0]
    if conv.kernel_size[0] != pad_t + 1 or stride_t != 1:
        raise ValueError(
            f"single-frame encode: expected a causal temporal kernel of size 2*p_t + 1 with "
            f"stride 1, got kernel {conv.kernel_size}, front padding {pad_t}, stride {conv.stride}"
        )
    # skip_init: no random initialisation (it would be overwritten, and it would advance
    # torch's global RNG every time a pipeline is built).
    out = nn.utils.skip_init(
        nn.Conv2d, conv.in_channels, conv.out_channels, conv.kernel_size[1:],
        stride=conv.stride[1:], padding=(conv._padding[2], conv._padding[0]),
        bias=conv.bias is not None, device=conv.weight.device, dtype=conv.weight.dtype,
    )
    with torch.no_grad():
        # The frame sits at tap pad_t: the taps before it multiply the zero padding.
        out.weight.copy_(conv.weight[:, :, pad_t])
        if conv.bias is not None:
            out.bias.copy_(conv.bias)
    out.weight.data = out.weight.data.contiguous(memory_format=torch.channels_last)
    out.requires_grad_(False)
    return out


class _RMSNorm(nn.Module):
    """``WanRMS_norm`` on ``[B, C, H, W]``: ``F.normalize`` over channels times
    ``sqrt(C)·gamma`` (folded into one ``[C, 1, 1]`` factor), plus the bias when it has one."""

    def __init__(self, norm: wan.WanRMS_norm) -> None:
        super().__init__()
        self.register_buffer("weight", (norm.scale * norm.gamma.detach()).reshape(-1, 1, 1))
        bias = norm.bias.detach().reshape(-1, 1, 1) if isinstance(norm.bias, torch.Tensor) else None
        self.register_buffer("bias", bias)  # a buffer like the weight, so both follow .to()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        upcast = x.dtype in (torch.float16, torch.bfloat16)
        x = F.normalize(x.float() if upcast else x, dim=1).to(x.dtype) * self.weight
        return x if self.bias is None else x + self.bias


class _ResidualBlock(nn.Module):
    """``WanResidualBlock`` on one frame."""

    def __init__(self, block: wan.WanResidualBlock) -> None:
        super().__init__()
        self.nonlinearity = block.nonlinearity
        self.norm1, self.norm2 = _RMSNorm(block.norm1), _RMSNorm(block.norm2)
        self.conv1 = _conv2d_from_causal(block.conv1)
        self.conv2 = _conv2d_from_causal(block.conv2)
        shortcut = block.conv_shortcut
        self.shortcut = (
            _conv2d_from_causal(shortcut) if isinstance(shortcut, wan.WanCausalConv3d) else None
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x if self.shortcut is None else self.shortcut(x)
        x = self.conv1(self.nonlinearity(self.norm1(x)))
        x = self.conv2(self.nonlinearity(self.norm2(x)))  # dropout: identity in eval
        return x + h


class _Attention(nn.Module):
    """``WanAttentionBlock`` (per-frame single-head attention), run as diffusers does."""

    def __init__(self, block: wan.WanAttentionBlock) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x.unsqueeze(2))[:, :, 0]


class _Downsample(nn.Module):
    """``WanResample`` (``downsample2d`` or, on the first frame, ``downsample3d``)."""

    def __init__(self, resample: wan.WanResample) -> None:
        super().__init__()
        if resample.mode not in ("downsample2d", "downsample3d"):
            raise ValueError(f"single-frame encode: unexpected resample mode {resample.mode!r}")
        self.resample = resample.resample  # ZeroPad2d + stride-2 Conv2d, diffusers' modules

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.resample(x)


def _avg_down(shortcut: wan.AvgDown3D, x: torch.Tensor) -> torch.Tensor:
    """``AvgDown3D`` of one frame ``[B, C, H, W]`` (channels-last in, channels-last out).

    diffusers pads the frame with ``factor_t - 1`` zero frames in front, folds each
    ``(factor_t, factor_s, factor_s)`` neighbourhood into channels in the order
    ``(c, t, row, col)`` and averages groups of ``group_size`` consecutive channels. When a group
    is ``k`` whole time slots of one channel (every Wan layout: ``group_size = k·factor_s²``),
    the only non-zero group of channel ``c`` is its last, which holds the spatial
    ``factor_s x factor_s`` average divided by ``k``; the others are zero. Other groupings fall
    back to building the padded neighbourhood tensor as diffusers does.
    """
    ft, fs = shortcut.factor_t, shortcut.factor_s
    b, c, h, w = x.shape
    window, group = fs * fs, shortcut.group_size
    per_channel = ft * window  # neighbourhood values per input channel
    if group % window == 0 and per_channel % group == 0:
        k = group // window  # time slots per group
        pooled = F.avg_pool2d(x, fs) if fs > 1 else x  # [B, C, h, w]
        if k > 1:
            pooled = pooled / k
        slots = per_channel // group  # output channels per input channel
        out = x.new_zeros(b, h // fs, w // fs, c, slots)
        out[..., slots - 1] = pooled.permute(0, 2, 3, 1)
        return out.view(b, h // fs, w // fs, c * slots).permute(0, 3, 1, 2)
    full = x.new_zeros(b, h // fs, w // fs, c, ft, fs, fs)
    # [B, C, h, fs, w, fs] -> [B, h, w, C, fs(row), fs(col)]: the frame is time slot ft - 1.
    full[:, :, :, :, ft - 1] = x.view(b, c, h // fs, fs, w // fs, fs).permute(0, 2, 4, 1, 3, 5)
    pooled = full.view(b, h // fs, w // fs, shortcut.out_channels, group).mean(-1)
    return pooled.permute(0, 3, 1, 2)


class _ResidualDownBlock(nn.Module):
    """``WanResidualDownBlock`` (Wan2.2): residual blocks + downsample + pooled shortcut."""

    def __init__(self, block: wan.WanResidualDownBlock) -> None:
        super().__init__()
        self.avg_shortcut = block.avg_shortcut
        self.resnets = nn.ModuleList(_ResidualBlock(r) for r in block.resnets)
        self.downsampler = None if block.downsampler is None else _Downsample(block.downsampler)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shortcut = _avg_down(self.avg_shortcut, x)
        for resnet in self.resnets:
            x = resnet(x)
        if self.downsampler is not None:
            x = self.downsampler(x)
        return x + shortcut


def _frame_module(module: nn.Module) -> nn.Module:
    """The single-frame counterpart of one of the encoder's ``down_blocks`` entries."""
    if isinstance(module, wan.WanResidualDownBlock):
        return _ResidualDownBlock(module)
    if isinstance(module, wan.WanResidualBlock):
        return _ResidualBlock(module)
    if isinstance(module, wan.WanAttentionBlock):
        return _Attention(module)
    if isinstance(module, wan.WanResample):
        return _Downsample(module)
    raise ValueError(f"single-frame encode: unsupported encoder block {type(module).__name__}")


class WanFrameEncoder(nn.Module):
    """``AutoencoderKLWan.encode(x).latent_dist.mode()`` for ``T = 1``, as a 2-D network.

    Example::

        encoder = WanFrameEncoder(vae)              # shares the VAE's norms and attention
        mu = encoder(frames)                        # [B, 3, H, W] in [-1, 1] -> [B, z, H/16, W/16]
    """

    def __init__(self, vae: Any) -> None:
        super().__init__()
        enc = vae.encoder
        self.patch_size = vae.config.patch_size
        self.z_dim = int(vae.config.z_dim)
        self.nonlinearity = enc.nonlinearity
        self.conv_in = _conv2d_from_causal(enc.conv_in)
        self.down_blocks = nn.ModuleList(_frame_module(m) for m in enc.down_blocks)
        mid = enc.mid_block
        self.mid_resnets = nn.ModuleList(_ResidualBlock(r) for r in mid.resnets)
        self.mid_attentions = nn.ModuleList(_Attention(a) for a in mid.attentions)
        self.norm_out = _RMSNorm(enc.norm_out)
        self.conv_out = _conv2d_from_causal(enc.conv_out)
        self.quant_conv = _conv2d_from_causal(vae.quant_conv)

    @torch.no_grad()
    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        """``[B, C_in, H, W]`` frames (the VAE's dtype and device) -> posterior mode
        ``[B, z_dim, H/16, W/16]``."""
        x = frames
        if self.patch_size is not None:
            x = wan.patchify(x.unsqueeze(2), patch_size=self.patch_size)[:, :, 0]
        x = self.conv_in(x.contiguous(memory_format=torch.channels_last))
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_resnets[0](x)
        for attn, resnet in zip(self.mid_attentions, self.mid_resnets[1:], strict=True):
            x = resnet(attn(x).contiguous(memory_format=torch.channels_last))
        x = self.conv_out(self.nonlinearity(self.norm_out(x)))
        moments = self.quant_conv(x)
        return moments[:, : self.z_dim].contiguous()  # the mean half of the posterior
