"""What a GRPO setting needs in device memory, counted before the first rollout.

Training holds, beside what sampling needs: the trained parameters' fp32 master copies (where the
model runs in bf16), their gradients, AdamW's two moments, a frozen copy of fully trained weights
for the KL reference, the fp32 moving average of the trained weights (``--ema``), and the
activations autograd keeps for the backward of one microbatch of
chunks. The counts come from the model's configuration and the token counts of one chunk (a
GEN forward over the video and action tokens per stochastic step, attending to the prompt's
keys and values); :func:`training_memory` adds them up and :func:`check_fits` refuses a setting
that cannot fit, naming the knob to turn.

The activation count is per GEN layer and token, in the model's dtype (what autograd saves:
the residual stream and its norms, the queries, keys and attention output, the MLP's gate, up
and product, the concatenated text+GEN keys and values; LoRA adds its rank-``r``
intermediates). With gradient checkpointing a layer keeps only its two residual-stream inputs,
and one layer's intermediates are alive at a time during the recompute.
``tests/test_train_grpo.py`` holds the count against the bytes autograd actually saves.
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
    average: int  # --ema: the fp32 moving average of the trained weights
    activations: int  # autograd's saved tensors for one microbatch
    sampling: int  # the rollout batch's keys/values and one layer's working tensors

    @property
    def total(self) -> int:
        return sum(asdict(self).values())

    def table(self) -> str:
        """One line: each part in GiB and the total."""
        parts = ", ".join(f"{name} {value / GIB:.2f}" for name, value in asdict(self).items())
        return f"{parts}; total {self.total / GIB:.2f} GiB"


# What autograd saves per GEN layer and token, in multiples of each width (``C`` the hidden
# size, ``Q`` = Hq·D, ``K`` = Hkv·D, ``I`` the MLP width), counted from the saved tensors of a
# scoring forward (tests/test_train_grpo.py measures them again): bf16 keeps fp32 copies in its
# norms (Qwen3's rounding order), fp32 runs one fused norm.
SAVED_PER_TOKEN = {
    # dtype bytes: (C, Q, K) multiples in elements of the model's dtype
    2: (9.5, 6.0, 3.0),
    4: (7.0, 5.0, 2.0),
}


def activation_bytes_per_chunk(config: Any, tokens: ChunkTokens, *, dtype_bytes: int,
                               lora_rank: int = 0, checkpointing: bool = False,
                               text_trains: bool = False) -> int:
    """Bytes autograd keeps for one chunk's scoring forward (one stochastic step).

    Per GEN layer and token: :data:`SAVED_PER_TOKEN`'s multiples of the widths (the residual
    stream, its norms and the attention output; the queries before and after their norm and
    rotation; the keys), the concatenated text+GEN keys and values (``2K`` per key: ``text +
    gen`` keys over ``gen`` queries), the MLP's four ``I``-wide tensors (squared-ReLU: three)
    and LoRA's rank-``r`` intermediates (seven projections). ``text_trains`` (full training):
    the text pass is recorded too, at the same cost per token (and the patch-in layer's input).
    With ``checkpointing`` a layer
    keeps its two residual inputs (``2C``) and one layer's tensors are alive in its recompute.
    """
    c, q = config.hidden_size, config.num_attention_heads * config.head_dim
    k = config.num_key_value_heads * config.head_dim
    per_c, per_q, per_k = SAVED_PER_TOKEN.get(dtype_bytes, SAVED_PER_TOKEN[2])
    mlp = (4 if config.hidden_act == "silu" else 3) * config.intermediate_size
    base = per_c * c + per_q * q + per_k * k + mlp + 7 * lora_rank
    keys = (tokens.text + tokens.gen) / tokens.gen
    layer = (base + 2 * k * keys) * tokens.gen * dtype_bytes
    text = base * tokens.text * dtype_bytes if text_trains else 0
    layers = config.num_hidden_layers
    # The heads: the final norm, fp32 velocities and transition means (and the patch-in
    # input, where proj_in trains).
    heads = tokens.gen * c * dtype_bytes * 2 + tokens.action * config.action_dim * 4 * 4
    if text_trains:
        heads += tokens.vision * config.patch_latent_dim * 4
    if checkpointing:
        return int(layers * (2 * c * tokens.gen * dtype_bytes + text) + layer + heads)
    return int(layers * (layer + text) + heads)


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
    kl_reference_params: int = 0, text_trains: bool = False, averaged: bool = False,
) -> MemoryEstimate:
    """The memory of one rank's training setting (see the module notes).

    ``weight_bytes``: the transformer and VAE as loaded; ``trained_params``: how many parameters
    the optimiser updates (``trained_in_fp32``: they are fp32 already, so no master copy);
    ``kl_reference_params``: fully trained parameters whose frozen copy the KL term reads (LoRA's
    reference is the base with adapters off: only its fully trained modules count);
    ``averaged``: ``--ema`` keeps an fp32 average of every trained parameter.
    """
    master = 0 if trained_in_fp32 else trained_params * 4
    grad_bytes = 4 if trained_in_fp32 else dtype_bytes
    act = activation_bytes_per_chunk(config, tokens, dtype_bytes=dtype_bytes,
                                     lora_rank=lora_rank, checkpointing=checkpointing,
                                     text_trains=text_trains)
    return MemoryEstimate(
        weights=int(weight_bytes), trained=int(master),
        gradients=int(trained_params * grad_bytes), optimizer=int(trained_params * 8),
        reference=int(kl_reference_params * dtype_bytes),
        average=int(trained_params * 4) if averaged else 0,
        activations=int(act * microbatch * stochastic_steps),
        sampling=sampling_bytes(config, tokens, rollout_batch, dtype_bytes),
    )


def lora_parameter_count(config: Any, rank: int) -> int:
    """LoRA's parameters on every GEN layer's seven projections (Q, K, V, out, gate, up, down;
    no gate for squared-ReLU): ``r · (in + out)`` each.

    >>> from cosmos3_gym.model.presets import preset_config
    >>> f"{lora_parameter_count(preset_config('nano'), 16) / 1e6:.1f} M"
    '43.6 M'
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
    """Refuse a setting whose estimate exceeds ``available`` bytes, naming the first knob that
    can make it fit (one line): LoRA where what full training optimises does not fit by itself,
    then gradient checkpointing, then smaller microbatches."""
    if available is None or estimate.total <= available:
        return
    held = estimate.weights + estimate.sampling
    optimiser = estimate.trained + estimate.gradients + estimate.optimizer + estimate.average
    if train != "lora" and held + optimiser + estimate.reference > available:
        knob = "train LoRA adapters (--train lora)"
    elif kl and estimate.reference and held + optimiser + estimate.reference > available:
        knob = "train LoRA adapters (--train lora: the reference is then free) or --kl-coef 0"
    elif not checkpointing:
        knob = "turn on --gradient-checkpointing"
    elif microbatch > 1:
        knob = f"lower --microbatch (now {microbatch}; the update stays the same)"
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


def preset_estimate(preset: str, train: str, *, lora_rank: int = 16, microbatch: int = 8,
                    checkpointing: bool = True, rollout_batch: int = 16,
                    tokens: ChunkTokens = ChunkTokens(text=105, vision=250, action=16),
                    dtype_bytes: int = 2) -> MemoryEstimate:
    """The estimate for a published shape (``nano``, ``super``, ``edge``) in bf16, before any
    weights exist: the parameter counts of the model and the Wan2.2 VAE built on the meta
    device. ``tokens`` default to a LIBERO chunk (256x512 at the 256 tier, 16 actions, a
    ~100-token caption); ``train`` is ``full`` or ``lora`` (the action heads in full beside the
    adapters)."""
    import torch
    from diffusers import AutoencoderKLWan

    from cosmos3_gym.model.presets import preset_config, vae_preset
    from cosmos3_gym.model.transformer import Cosmos3Transformer

    config = preset_config(preset)
    with torch.device("meta"):
        model = Cosmos3Transformer(config)
        vae = AutoencoderKLWan(**vae_preset(preset))
    params = sum(p.numel() for p in model.parameters())
    heads = sum(p.numel() for name in ("action_proj_in", "action_proj_out")
                for p in getattr(model, name).parameters())
    vae_bytes = sum(p.numel() for p in vae.parameters()) * 4  # the VAE runs in fp32
    if train == "lora":
        trained = lora_parameter_count(config, lora_rank) + heads
        weights = params * dtype_bytes + vae_bytes + trained * 4 + heads * dtype_bytes
    else:
        trained, weights = params, params * dtype_bytes + vae_bytes
    return training_memory(
        config, weight_bytes=weights, trained_params=trained, trained_in_fp32=False,
        dtype_bytes=dtype_bytes, tokens=tokens, microbatch=microbatch, stochastic_steps=1,
        rollout_batch=rollout_batch, lora_rank=lora_rank if train == "lora" else 0,
        checkpointing=checkpointing, text_trains=train == "full")


def stochastic_steps(cfg: Any, default_steps: int) -> int:
    """How many denoising steps each chunk's scoring forward runs with gradients: one for
    ``--sde-steps random`` or ``random-but-last``, every stochastic step for ``all`` or a list
    of indices."""
    from cosmos3_gym.pipeline.sde import stochastic_sampling

    sampling = stochastic_sampling(cfg.sampler, cfg.noise_level, cfg.sde_steps, None)
    return len(sampling.steps_for(0, cfg.num_inference_steps or default_steps))


def run_estimate(learner: Any, cfg: Any, eval_env: Any, envs: Any, adapter: Any, device: Any,
                 rollout_batch: int, max_chunks: int) -> MemoryEstimate:
    """This rank's training memory for a GRPO run (``learner``: its pipeline and what trains,
    ``cfg``: its :class:`~cosmos3_gym.train.config.GRPOConfig`); refuses one that cannot fit
    (:func:`check_fits`)."""
    import torch

    pipe = learner.pipe
    hw = image_hw(envs, adapter)
    tokens = chunk_tokens(pipe, hw, eval_env.task_prompt(0)) if hw is not None else ChunkTokens(
        text=128, vision=pipe.noise.num_latent_frames * (pipe.policy.resolution_tier // 32) ** 2,
        action=pipe.history_length + pipe.action_horizon)
    weight_bytes = sum(t.numel() * t.element_size() for module in (pipe.transformer, pipe.vae)
                       for t in (*module.parameters(), *module.buffers()))
    trained = learner.trainable
    microbatch = cfg.microbatch or cfg.minibatch_size(max_chunks)
    estimate = training_memory(
        pipe.transformer.config, weight_bytes=weight_bytes, trained_params=trained.count,
        trained_in_fp32=not learner.masters.copies and all(
            p.dtype == torch.float32 for p in trained.parameters()),
        dtype_bytes=pipe.transformer.dtype.itemsize, tokens=tokens, microbatch=microbatch,
        stochastic_steps=stochastic_steps(cfg, pipe.policy.num_inference_steps),
        rollout_batch=rollout_batch,
        lora_rank=cfg.lora_rank if cfg.train == "lora" else 0,
        checkpointing=cfg.gradient_checkpointing,
        kl_reference_params=trained.fully_trained_count if cfg.kl_coef > 0 else 0,
        text_trains=cfg.train == "full", averaged=cfg.ema is not None)
    check_fits(estimate, device_memory_bytes(device), train=cfg.train,
               checkpointing=cfg.gradient_checkpointing, microbatch=microbatch,
               kl=cfg.kl_coef > 0)
    return estimate


def image_hw(envs: Any, adapter: Any) -> tuple[int, int] | None:
    """The model image's height and width for this env, from an empty observation of its space
    (None where the adapter cannot read one: the image is then known at the first chunk)."""
    import numpy as np
    from gymnasium.vector.utils import create_empty_array

    try:
        probe = create_empty_array(envs.single_observation_space, n=1)
        images = np.asarray(adapter.images(probe))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return (int(images.shape[1]), int(images.shape[2])) if images.ndim == 4 else None
