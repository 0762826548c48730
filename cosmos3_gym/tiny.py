"""Tiny Cosmos3 checkpoints in the real component formats, built offline (nothing is downloaded).

Tests build them to exercise the same ``from_pretrained`` paths as a real ``nvidia/Cosmos3-*``
checkpoint, and training (:mod:`cosmos3_gym.train`) starts the shipped ``tiny`` checkpoint from
one. Each ``write_tiny_*`` writer saves one checkpoint component with the library that
production loads it with (``transformers`` tokenizer folder, ``diffusers`` model folder):

* :func:`write_tiny_tokenizer` -> ``text_tokenizer/``: a byte-level BPE trained in-process on a
  fixed corpus, with Qwen's special tokens and a Qwen3-style chat template.
* :func:`write_tiny_vae` -> ``vae/``: a random ``AutoencoderKLWan`` in the Wan2.2 layout.

The writers are deterministic (fixed corpus, fixed seeds) and take well under a second each.
:func:`write_tiny_checkpoint` composes them into the full diffusers layout (one sub-folder per
component). :func:`write_tiny_diffusers_folder` writes the bare format of the published
``nvidia/Cosmos3-*`` folders instead, through diffusers' own ``Cosmos3OmniPipeline``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# First, before diffusers or Triton load: Triton's library must keep its own LLVM.
from cosmos3_gym import native_libs  # noqa: F401  (see cosmos3_gym/native_libs.py)

# isort: split
import numpy as np

# Qwen2/Qwen3 special tokens, in their real vocabulary order (<|endoftext|> is 151643 there).
# In the tiny vocabulary they take ids 0..N-1 instead; code must look ids up, never hard-code.
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)

# A ChatML template that behaves like Qwen3-VL-Instruct's for our use: a system turn is emitted
# only when the caller gives one (Qwen2/2.5 templates inject "You are a helpful assistant."; the
# Qwen3 family does not), image parts render as <|vision_start|><|image_pad|><|vision_end|>, and
# add_generation_prompt appends "<|im_start|>assistant\n" with no thinking block.
QWEN3_STYLE_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'system' and not loop.first %}"
    "{{- raise_exception('The system message must come first.') }}"
    "{%- endif %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string %}"
    "{{- message['content'] }}"
    "{%- else %}"
    "{%- for part in message['content'] %}"
    "{%- if part['type'] == 'image' %}"
    "{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif part['type'] == 'text' %}"
    "{{- part['text'] }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)

# The corpus covers what the tiny tokenizer will see in tests: LIBERO-style tasks, the viewpoint
# sentences and the JSON action caption (keys, digits, punctuation). Byte-level BPE encodes any
# other text too, just in more tokens.
_CORPUS = (
    "pick up the black bowl between the plate and the ramekin and place it on the plate",
    "pick up the alphabet soup and place it in the basket",
    "put both the alphabet soup and the tomato sauce in the basket",
    "open the top drawer and put the bowl inside",
    "open the middle drawer of the cabinet",
    "close the microwave and turn on the stove",
    "put the wine bottle on top of the cabinet",
    "push the plate to the front of the stove",
    "put the cream cheese in the bowl",
    "turn on the stove and put the moka pot on it",
    "stack the red block on the blue block",
    "move the green cube to the left of the yellow cube",
    "reach the red target, then the blue one",
    "go left. go right. go up. go down. stop.",
    "This video contains concatenated views from multiple camera perspectives.",
    "The left half shows the third-person view; the right half shows the wrist-mounted camera.",
    "This video is captured from a first-person perspective looking at the scene.",
    "This video is captured from a third-person perspective looking towards the agent from "
    "the front.",
    "This video is captured from a wrist-mounted camera.",
    '{"cinematography": {"framing": "This video"}, "actions": [{"time": "0:00-0:01", '
    '"description": "pick up the bowl.", "idle_frame": "0 out of 16."}], "duration": "0s", '
    '"fps": 20.0, "resolution": {"H": 192, "W": 320}, "aspect_ratio": "16,9"}',
    '{"resolution": {"H": 256, "W": 256}, "aspect_ratio": "1,1", "fps": 15.0, "duration": "1s"}',
    '{"resolution": {"H": 480, "W": 832}, "aspect_ratio": "4,3", "fps": 5.0, "duration": "3s"}',
    "0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 20 32 64 128 192 256 320 480 640 704 720 832",
    "user assistant system",
)


def write_tiny_tokenizer(directory: str | Path, vocab_size: int = 1024) -> Path:
    """Train and save a small Qwen-style fast tokenizer; returns ``directory``.

    The vocabulary holds at most ``vocab_size`` entries (about 630 with the built-in corpus, whose
    merges run out first): byte-level, so any text encodes, and common task words are one token.

    ``transformers.AutoTokenizer.from_pretrained(directory)`` loads it, ``eos_token`` is
    ``<|im_end|>``, ``pad_token`` is ``<|endoftext|>`` and ``apply_chat_template`` renders like
    Qwen3-VL (no default system message).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(QWEN_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so frequent words merge into whole tokens, as in a real vocabulary.
    backend.train_from_iterator([line for line in _CORPUS for _ in range(4)], trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=[
            t for t in QWEN_SPECIAL_TOKENS if t not in ("<|im_end|>", "<|endoftext|>")
        ],
        model_max_length=131072,
        chat_template=QWEN3_STYLE_CHAT_TEMPLATE,
    )
    tokenizer.save_pretrained(directory)
    return directory


# Deterministic, non-trivial per-channel latent statistics (not 0/1, so a test notices if the
# normalisation is skipped or inverted).
_TINY_LATENT_CHANNELS = 48
TINY_LATENTS_MEAN = [round(0.1 * float(np.sin(1.7 * c)), 4) for c in range(_TINY_LATENT_CHANNELS)]
TINY_LATENTS_STD = [round(0.5 + 0.05 * (c % 11), 4) for c in range(_TINY_LATENT_CHANNELS)]


def tiny_vae_config(**overrides: Any) -> dict[str, Any]:
    """``AutoencoderKLWan`` keyword arguments for a tiny Wan2.2-layout VAE.

    The layout (48 latent channels, residual blocks, 2x2 patchify so in/out channels are 12,
    16x spatial and 4x temporal compression) is the real one; only the widths are tiny.
    """
    config: dict[str, Any] = {
        "base_dim": 16,
        "decoder_base_dim": 16,
        "z_dim": _TINY_LATENT_CHANNELS,
        "dim_mult": [1, 1, 1, 1],
        "num_res_blocks": 1,
        "attn_scales": [],
        "temperal_downsample": [False, True, True],
        "is_residual": True,
        "in_channels": 12,
        "out_channels": 12,
        "patch_size": 2,
        "scale_factor_temporal": 4,
        "scale_factor_spatial": 16,
        "latents_mean": list(TINY_LATENTS_MEAN),
        "latents_std": list(TINY_LATENTS_STD),
    }
    config.update(overrides)
    return config


def build_tiny_vae(seed: int = 0, **overrides: Any):  # -> diffusers.AutoencoderKLWan
    """A random tiny ``AutoencoderKLWan`` (float32, eval mode), seeded for reproducibility."""
    import torch
    from diffusers import AutoencoderKLWan

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        vae = AutoencoderKLWan(**tiny_vae_config(**overrides))
    return vae.eval()


def write_tiny_vae(directory: str | Path, seed: int = 0, **overrides: Any) -> Path:
    """Save a random tiny Wan2.2-layout ``AutoencoderKLWan`` (safetensors); returns the folder."""
    directory = Path(directory)
    build_tiny_vae(seed, **overrides).save_pretrained(directory, safe_serialization=True)
    return directory


def tiny_transformer_config(vocab_size: int, **overrides: Any) -> dict[str, Any]:
    """``transformer/config.json`` of a tiny generator: the real architecture, tiny widths.

    Every config key is a real Cosmos3 key; ``rope_axes_dim`` keeps the (T, H, W) split of
    mRoPE at a head dim of 16.
    """
    config: dict[str, Any] = {
        "hidden_size": 64,
        "head_dim": 16,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "intermediate_size": 128,
        "vocab_size": vocab_size,
        "rope_axes_dim": [4, 2, 2],
        "rope_scaling": {"mrope_section": [4, 2, 2], "mrope_interleaved": True},
        "action_gen": True,
        "action_dim": 64,
        "num_embodiment_domains": 32,
    }
    config.update(overrides)
    return config


def tiny_action_stats(raw_action_dim: int = 10) -> dict[str, Any]:
    """Statistics in the cosmos-framework layout (``global`` and ``global_raw`` blocks)."""
    idx = np.arange(raw_action_dim, dtype=np.float64)

    def block(shift: float) -> dict[str, list[float]]:
        q01 = -0.5 - 0.05 * idx + shift
        q99 = 0.5 + 0.1 * idx + shift
        return {
            "mean": list((q01 + q99) / 2), "std": list((q99 - q01) / 4),
            "min": list(q01 - 0.1), "max": list(q99 + 0.1), "q01": list(q01), "q99": list(q99),
        }

    return {"global": block(0.0), "global_raw": block(0.05)}


def build_tiny_transformer(vocab_size: int, seed: int = 0, **overrides: Any):
    """A random tiny ``Cosmos3Transformer`` whose outputs are O(1) (seeded)."""
    import torch

    from cosmos3_gym.model import Cosmos3Config, Cosmos3Transformer

    config = Cosmos3Config.from_dict(tiny_transformer_config(vocab_size, **overrides))
    model = Cosmos3Transformer(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
            else:
                fan_in = param.shape[-1] if param.ndim > 1 else 64
                if name.endswith("fc.weight"):  # DomainAwareLinear rows hold [in, out] matrices
                    fan_in = 64
                param.copy_(torch.randn(param.shape, generator=generator) / fan_in**0.5)
    return model.eval()


# The policy head of a checkpoint for the built-in ColorReach env: 2-D velocities as the model
# makes them (in its normalised [-1, 1], no statistics), one camera. write_tiny_checkpoint(path,
# policy_overrides=COLOR_REACH_POLICY) writes one (random weights: its actions stray past the
# bounds, and runs report them); the shipped tiny checkpoint has this head, trained, with its
# samples clipped to the range its demos lie in (clip_actions, train/config.py).
COLOR_REACH_POLICY: dict[str, Any] = {
    "raw_action_dim": 2, "normalization": "none", "stats": None, "view_point": "ego_view",
}


def write_tiny_checkpoint(
    directory: str | Path,
    seed: int = 0,
    *,
    policy_overrides: dict[str, Any] | None = None,
    **transformer_overrides: Any,
) -> Path:
    """Write a tiny random Cosmos3 checkpoint in the full diffusers layout; returns the folder.

    ``transformer/`` (config.json + safetensors), ``vae/`` (Wan2.2 layout), ``text_tokenizer/``
    (Qwen-style), ``scheduler/``, ``model_index.json`` and ``action_policy.json`` (LIBERO-like
    policy head: domain 5, 10 raw dims, quantile_rot statistics, a 4-step chunk).
    ``Cosmos3ActionPipeline.from_pretrained(directory)`` loads it offline.

    ``policy_overrides`` replace fields of that head. A head of another width for plumbing an
    env (random weights: its actions mean nothing) is ``{"raw_action_dim": D}``: the statistics
    then come at width ``D`` too (unless ``stats`` is given), so the folder loads and runs;
    ``{"raw_action_dim": D, "normalization": "none", "stats": None}`` leaves the actions in the
    model's normalised ``[-1, 1]``, the range ``--action-map box`` maps onto an env's ``Box``.
    """
    import json

    from transformers import AutoTokenizer

    from cosmos3_gym import checkpoint as layout
    from cosmos3_gym.checkpoint import PolicyConfig
    from cosmos3_gym.jsonio import write_text_atomic
    from cosmos3_gym.model.weights import save_transformer

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    write_tiny_tokenizer(root / layout.TEXT_TOKENIZER)
    vocab_size = len(AutoTokenizer.from_pretrained(root / layout.TEXT_TOKENIZER))
    write_tiny_vae(root / layout.VAE, seed=seed)
    save_transformer(
        build_tiny_transformer(vocab_size, seed=seed, **transformer_overrides),
        root / layout.TRANSFORMER,
    )
    (root / layout.SCHEDULER).mkdir(exist_ok=True)
    write_text_atomic(
        root / layout.SCHEDULER / "scheduler_config.json",
        json.dumps({"_class_name": "UniPCMultistepScheduler", "use_flow_sigmas": True,
                    "prediction_type": "flow_prediction", "flow_shift": 5.0})
    )
    write_text_atomic(
        root / layout.MODEL_INDEX,
        json.dumps({
            "_class_name": "Cosmos3OmniPipeline",
            "transformer": ["diffusers", "Cosmos3OmniTransformer"],
            "vae": ["diffusers", "AutoencoderKLWan"],
            "text_tokenizer": ["transformers", "PreTrainedTokenizerFast"],
            "scheduler": ["diffusers", "UniPCMultistepScheduler"],
        }, indent=2)
    )
    policy = {
        "domain_name": "libero", "raw_action_dim": 10, "action_horizon": 4,
        "normalization": "quantile_rot", "stats": tiny_action_stats(10), "fps": 20.0,
        "resolution_tier": 256, "view_point": "concat_view", "num_inference_steps": 8,
    }
    overrides = dict(policy_overrides or {})
    if "raw_action_dim" in overrides and "stats" not in overrides:
        policy["stats"] = tiny_action_stats(int(overrides["raw_action_dim"]))
    policy.update(overrides)
    PolicyConfig(**policy).save(root / layout.POLICY_CONFIG)
    return root


def write_tiny_diffusers_folder(directory: str | Path, seed: int = 3) -> Path:
    """A bare Cosmos3 folder as diffusers' ``Cosmos3OmniPipeline.save_pretrained`` writes it (the
    format of the published ``nvidia/Cosmos3-*`` checkpoints: no ``action_policy.json``), from
    tiny random components built with diffusers' and transformers' own classes; returns the folder.

    Needs a diffusers with ``Cosmos3OmniPipeline`` (the ``test`` extra's). Load it with
    ``Cosmos3ActionPipeline.from_pretrained(directory, domain=...)``.
    """
    import shutil

    from diffusers import Cosmos3OmniPipeline, Cosmos3OmniTransformer, UniPCMultistepScheduler
    from transformers import AutoTokenizer

    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(write_tiny_tokenizer(root / "_tokenizer_source"))
    transformer = Cosmos3OmniTransformer(**tiny_transformer_config(len(tokenizer))).eval()
    # O(1) random weights (the tiny generator's), so the actions are not all near zero; diffusers'
    # class has the language-model head ours leaves out, and nothing else.
    missing, unexpected = transformer.load_state_dict(
        build_tiny_transformer(len(tokenizer), seed=seed).state_dict(), strict=False
    )
    if missing != ["lm_head.weight"] or unexpected:
        raise RuntimeError(
            f"the tiny generator does not match diffusers' Cosmos3OmniTransformer: missing "
            f"{missing}, unexpected {unexpected}"
        )
    scheduler = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=5.0
    )
    Cosmos3OmniPipeline(
        transformer=transformer, text_tokenizer=tokenizer, vae=build_tiny_vae(),
        scheduler=scheduler, enable_safety_checker=False,
    ).save_pretrained(root)
    shutil.rmtree(root / "_tokenizer_source")
    return root
