"""What a GRPO setting needs in device memory, counted before the first rollout.

Training holds, beside what sampling needs: the trained parameters' fp32 master copies (where the
model runs in bf16), their gradients, AdamW's two moments, a frozen copy of fully trained weights
for the KL reference, and the activations autograd keeps for the backward of one microbatch of
chunks. The counts come from the model's configuration and the token counts of one chunk (a
GEN forward over the video and action tokens per stochastic step, attending to the prompt's
keys and values); :func:`training_memory` adds them up and :func:`check_fits` refuses a setting
that cannot fit, naming the knob to turn.

The activation count is per GEN layer and token, in the model's dtype (what autograd saves:
the layer's input and norms, the Q/K/V and attention output, the MLP's gate, up and product, the
concatenated text+GEN keys and values; LoRA adds its rank-``r`` intermediates). With gradient
checkpointing a layer keeps only its two residual-stream inputs, and one layer's intermediates
are alive at a time during the recompute. ``tests/test_train_grpo.py`` holds the count against
the bytes autograd actually saves on a small model.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

GIB = 2**30


@dataclass(frozen=True)
class ChunkTokens:
    """The token counts of one chunk's scoring forward."""

    text: int  # prompt tokens (the padded caption length)
    vision: int  # GEN video tokens (latent frames x patches)
    action: int  # GEN action tokens (state rows + the chunk's actions)

    @property
    def gen(self) -> int:
        return self.vision + self.action


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per item of a training setting on one device (one rank)."""

    weights: int  # the transformer and the VAE as loaded
    trained: int  # trained parameters' fp32 master copies (0 where they are the weights)
    gradients: int
    optimizer: int  # AdamW's two fp32 moments
    reference: int  # a frozen copy of fully trained weights, for the KL term
    activations: int  # autograd's saved tensors for one microbatch
    sampling: int  # the rollout batch's keys/values and one layer's working tensors

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    def table(self) -> str:
        """One line: each part in GiB and the total."""
        parts = ", ".join(f"{name} {value / GIB:.2f}" for name, value in asdict(self).items())
        return f"{parts}; total {self.total / GIB:.2f} GiB"


def activation_bytes_per_chunk(config: Any, tokens: ChunkTokens, *, dtype_bytes: int,
                               lora_rank: int = 0, checkpointing: bool = False) -> int:
    """Bytes autograd keeps for one chunk's scoring forward (one stochastic step).

    Per GEN layer and token: the residual input and the two norms' outputs (3C), the Q, K, V
    and attention output (2·Hq·D + 2·Hkv·D), the concatenated text+GEN K and V (2·Hkv·D per key,
    ``text + gen`` keys over ``gen`` queries), the MLP's gate, up, activation and product (4I;
    squared-ReLU: up, activation and product, 3I) and the residual before the MLP norm (C);
    LoRA adds ``r`` per adapted projection (7 per layer). With ``checkpointing`` a layer keeps
    its two inputs (2C) and one layer's intermediates are alive during its recompute.
    """
    c, d = config.hidden_size, config.head_dim
    hq, hkv = config.num_attention_heads, config.num_key_value_heads
    inter = config.intermediate_size
    mlp = 4 * inter if config.hidden_act == "silu" else 3 * inter
    keys = (tokens.text + tokens.gen) / tokens.gen
    per_token = 4 * c + 2 * hq * d + 2 * hkv * d + 2 * hkv * d * keys + mlp + 7 * lora_rank
    layer = per_token * tokens.gen * dtype_bytes
    layers = config.num_hidden_layers
    # The heads: patch-in/out and the action projections' inputs, fp32 velocities and means.
    heads = tokens.gen * c * dtype_bytes * 2 + tokens.action * config.action_dim * 4 * 4
    if checkpointing:
        return int(layers * 2 * c * tokens.gen * dtype_bytes + layer + heads)
    return int(layers * layer + heads)


def sampling_bytes(config: Any, tokens: ChunkTokens, batch: int, dtype_bytes: int) -> int:
    """The rollout's working memory beyond the weights: per-layer text+GEN keys/values of the
    batch (the K/V buffers) and one layer's widest intermediates (the MLP's)."""
    kv = config.num_hidden_layers * 2 * config.num_key_value_heads * config.head_dim
    kv *= (tokens.text + tokens.gen) * batch * dtype_bytes
    working = batch * tokens.gen * (3 * config.intermediate_size + 4 * config.hidden_size)
    return int(kv + working * dtype_bytes)


def training_memory(
    config: Any, *, weight_bytes: int, trained_params: int, trained_in_fp32: bool,
    dtype_bytes: int, tokens: ChunkTokens, microbatch: int, stochastic_steps: int,
    rollout_batch: int, lora_rank: int = 0, checkpointing: bool = False,
    kl_reference_params: int = 0,
) -> MemoryEstimate:
    """The memory of one rank's training setting (see the module notes).

    ``weight_bytes``: the transformer and VAE as loaded; ``trained_params``: how many parameters
    the optimiser updates (``trained_in_fp32``: they are fp32 already, so no master copy);
    ``kl_reference_params``: fully trained parameters whose frozen copy the KL term reads (LoRA's
    reference is the base with adapters off: only its fully trained modules count).
    """
    master = 0 if trained_in_fp32 else trained_params * 4
    grad_bytes = 4 if trained_in_fp32 else dtype_bytes
    act = activation_bytes_per_chunk(config, tokens, dtype_bytes=dtype_bytes,
                                     lora_rank=lora_rank, checkpointing=checkpointing)
    return MemoryEstimate(
        weights=int(weight_bytes), trained=int(master),
        gradients=int(trained_params * grad_bytes), optimizer=int(trained_params * 8),
        reference=int(kl_reference_params * dtype_bytes),
        activations=int(act * microbatch * stochastic_steps),
        sampling=sampling_bytes(config, tokens, rollout_batch, dtype_bytes),
    )


def lora_parameter_count(config: Any, rank: int) -> int:
    """LoRA's parameters on every GEN layer's seven projections (Q, K, V, out, gate, up, down;
    no gate for squared-ReLU): ``r · (in + out)`` each.

    >>> from cosmos3_gym.model.presets import preset_config
    >>> f"{lora_parameter_count(preset_config('nano'), 16) / 1e6:.1f} M"
    '43.7 M'
    """
    c, d = config.hidden_size, config.head_dim
    q, kv = config.num_attention_heads * d, config.num_key_value_heads * d
    mlp = [(c, config.intermediate_size), (c, config.intermediate_size),
           (config.intermediate_size, c)]
    if config.hidden_act != "silu":
        mlp = mlp[1:]
    shapes = [(c, q), (c, kv), (c, kv), (q, c), *mlp]
    return config.num_hidden_layers * rank * sum(i + o for i, o in shapes)


def device_memory_bytes(device: Any) -> int | None:
    """What the device holds in all: a GPU's memory, or the CPU's available RAM
    (``MemAvailable``); None where it is not known."""
    import torch

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def check_fits(estimate: MemoryEstimate, available: int | None, *, train: str,
               checkpointing: bool, microbatch: int, kl: bool) -> None:
    """Refuse a setting whose estimate exceeds ``available`` bytes, naming the knob that
    shrinks the largest part (one line)."""
    if available is None or estimate.total <= available:
        return
    parts = asdict(estimate)
    biggest = max(("trained", "gradients", "optimizer", "activations", "reference"),
                  key=parts.__getitem__)
    if biggest == "activations" and not checkpointing:
        knob = "turn on --gradient-checkpointing"
    elif biggest == "activations" and microbatch > 1:
        knob = f"lower --microbatch (now {microbatch}; the update stays the same)"
    elif biggest == "reference" and kl:
        knob = "train LoRA adapters (--train lora: the reference is then free) or --kl-coef 0"
    elif train != "lora":
        knob = "train LoRA adapters (--train lora)"
    else:
        knob = "lower --lora-rank, or shard the groups over more GPUs (torchrun)"
    raise ValueError(
        f"this training setting needs about {estimate.total / GIB:.1f} GiB on one device "
        f"({estimate.table()}) and the device has {available / GIB:.1f} GiB: {knob}")


def chunk_tokens(pipe: Any, image_hw: tuple[int, int], prompt: str) -> ChunkTokens:
    """The token counts of a chunk planned from an ``image_hw`` observation with ``prompt``,
    as the pipeline's prompt stage and canvas make them."""
    from cosmos3_gym.pipeline.preprocess import latent_content_shape, plan_canvas
    from cosmos3_gym.pipeline.stages import MicroBatch, SamplingParams

    plan = plan_canvas(*image_hw, pipe.policy.resolution_tier)
    batch = MicroBatch(indices=[0], images=[], prompts=[prompt], seeds=[0], plan=plan)
    params = SamplingParams(num_inference_steps=1, guidance_scale=1.0, flow_shift=1.0,
                            progress=False)
    text = int(pipe.prompt.tokenize(batch, params)[0].shape[1])
    p = pipe.transformer.config.latent_patch_size
    h, w = latent_content_shape(plan)
    vision = pipe.noise.num_latent_frames * math.ceil(h / p) * math.ceil(w / p)
    return ChunkTokens(text=text, vision=vision, action=pipe.history_length + pipe.action_horizon)
