"""The Cosmos3 generator's configuration: the keys of a diffusers ``transformer/config.json``."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos3_gym.jsonio import check_range, check_types

logger = logging.getLogger(__name__)

# The keys whose values set the published models apart (Nano, Super, Edge): a config.json
# must state them (a default here would load as a shape mismatch against the checkpoint, not
# as the missing key it is). The others (latent layout, vocabulary) are the same in every
# Cosmos3 and default to it.
ARCHITECTURE_KEYS = (
    "hidden_size", "intermediate_size", "head_dim", "num_attention_heads", "num_key_value_heads",
    "num_hidden_layers",
)
# Keys a real config.json carries that do not change the generator's math here: bookkeeping of
# diffusers, the load-time dtype hint, and dropout (inference only).
_IGNORED_KEYS = {"dtype", "attention_dropout", "backbone_type"}
# The sizes a config may state, each at least 1 and at most this: far above every published
# Cosmos3 (Super: hidden 5120, 64 layers), low enough that a typo (2**30 layers) is refused here
# rather than met as an allocation of terabytes.
SIZE_BOUNDS = {
    "head_dim": 1024, "hidden_size": 65536, "intermediate_size": 262144,
    "num_attention_heads": 1024, "num_key_value_heads": 1024, "num_hidden_layers": 1024,
    "latent_channel": 1024, "latent_patch_size": 64, "patch_latent_dim": 2**20,
    "base_fps": 1000, "vocab_size": 2**22, "num_embodiment_domains": 4096,
    "unified_3d_mrope_temporal_modality_margin": 2**31, "action_dim": 4096, "sound_dim": 4096,
}
# Positive finite numbers, with the largest value a config may state.
POSITIVE_BOUNDS = {"rope_theta": 1e12, "rms_norm_eps": 1.0, "timestep_scale": 1.0,
                   "sound_latent_fps": 1000.0}


@dataclass
class Cosmos3Config:
    """Constructor arguments of the Cosmos3 Mixture-of-Transformers generator.

    Field names and defaults are those of diffusers' ``Cosmos3OmniTransformer`` (Nano-like
    defaults), so a checkpoint's ``transformer/config.json`` maps onto this class key for key.
    """

    attention_bias: bool = False
    head_dim: int = 128
    hidden_size: int = 4096
    intermediate_size: int = 12288
    base_fps: int = 24
    enable_fps_modulation: bool = True
    latent_channel: int = 48
    unified_3d_mrope_reset_spatial_ids: bool = True
    unified_3d_mrope_temporal_modality_margin: int = 15000
    latent_patch_size: int = 2
    num_attention_heads: int = 32
    num_hidden_layers: int = 36
    num_key_value_heads: int = 8
    patch_latent_dim: int = 192
    rms_norm_eps: float = 1e-6
    rope_scaling: dict[str, Any] | None = None
    rope_theta: float = 5_000_000.0
    action_dim: int | None = None
    action_gen: bool = False
    num_embodiment_domains: int = 32
    sound_dim: int | None = None
    sound_gen: bool = False
    sound_latent_fps: float = 25.0
    timestep_scale: float = 0.001
    vocab_size: int = 151936
    hidden_act: str = "silu"
    qk_norm_for_text: bool = True
    use_und_k_norm_for_gen: bool = False
    rope_axes_dim: list[int] | None = field(default=None)

    def __post_init__(self) -> None:
        for name, high in SIZE_BOUNDS.items():
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), 1, high, integer=True)
        for name, high in POSITIVE_BOUNDS.items():
            check_range(name, getattr(self, name), 0, high, above=True)
        if self.rope_axes_dim is None:
            section = (self.rope_scaling or {}).get("mrope_section", [24, 20, 20])
            self.rope_axes_dim = list(section)
        self.rope_axes_dim = [int(x) for x in self.rope_axes_dim]
        if self.hidden_act not in ("silu", "relu2"):
            raise ValueError(f"hidden_act must be 'silu' or 'relu2', got {self.hidden_act!r}")
        if sum(self.rope_axes_dim) != self.head_dim // 2:
            raise ValueError(
                f"rope_axes_dim {self.rope_axes_dim} must sum to head_dim // 2 = "
                f"{self.head_dim // 2}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        expected_patch_dim = self.latent_patch_size**2 * self.latent_channel
        if self.patch_latent_dim != expected_patch_dim:
            raise ValueError(
                f"patch_latent_dim must be latent_patch_size**2 * latent_channel = "
                f"{expected_patch_dim}, got {self.patch_latent_dim}"
            )
        if self.action_gen and self.action_dim is None:
            raise ValueError("action_dim must be set when action_gen is true")
        if self.sound_gen and self.sound_dim is None:
            raise ValueError("sound_dim must be set when sound_gen is true")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config", *, strict: bool = False
                  ) -> Cosmos3Config:
        """The config of a parsed ``config.json``; values of the wrong JSON type are refused
        (naming ``source``), unused keys logged (``strict``: refused, for formats whose
        configs hold only the constructor's arguments)."""
        known = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in raw.items() if k in known}
        check_types(cls, kwargs, source)
        unknown = sorted(k for k in raw if k not in known and not k.startswith("_"))
        unknown = [k for k in unknown if k not in _IGNORED_KEYS]
        if unknown and strict:
            raise ValueError(f"{source}: keys unknown to cosmos3-gym's Cosmos3 generator: "
                             f"{unknown}; they may change the model, so it is not built")
        if unknown:
            logger.warning("Cosmos3 config keys not used by cosmos3-gym: %s", unknown)
        try:
            return cls(**kwargs)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    @classmethod
    def from_json_file(cls, path: str | Path) -> Cosmos3Config:
        """A checkpoint's ``transformer/config.json``. The keys that fix the generator's shape
        (:data:`ARCHITECTURE_KEYS`) must be there: a default in their place would only show
        later, as tensors of the wrong shape."""
        from cosmos3_gym.jsonio import read_json_object

        raw = read_json_object(path, what="transformer config.json")
        missing = [k for k in ARCHITECTURE_KEYS if k not in raw]
        if missing:
            raise ValueError(f"{path}: missing {missing}; a Cosmos3 transformer config.json "
                             f"states every key that fixes the model's shape "
                             f"({', '.join(ARCHITECTURE_KEYS)})")
        return cls.from_dict(raw, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["_class_name"] = "Cosmos3OmniTransformer"
        return out
