"""The one place that knows a Cosmos3 checkpoint folder's layout (diffusers layout).

```
CHECKPOINT/
  model_index.json        _class_name Cosmos3OmniPipeline (older: Cosmos3OmniDiffusersPipeline)
  transformer/            config.json + safetensors (sharded with an index, or one file)
  vae/                    AutoencoderKLWan (Wan2.2: 48 latent channels, 16x spatial)
  text_tokenizer/         the Qwen3-VL tokenizer (note: not tokenizer/)
  scheduler/              ignored: sampling always uses FlowUniPC, like sglang and the official code
  action_policy.json      cosmos3-gym's policy head description (domain, raw width, horizon,
                          normalisation and its statistics, fps, resolution tier, view point)
```

Real ``nvidia/Cosmos3-*`` folders have no ``action_policy.json``: pass the same fields to
``Cosmos3ActionPipeline.from_pretrained(..., policy=PolicyConfig(...))`` or write the file next to
the checkpoint once (see the README).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TRANSFORMER = "transformer"
VAE = "vae"
TEXT_TOKENIZER = "text_tokenizer"
SCHEDULER = "scheduler"
MODEL_INDEX = "model_index.json"
POLICY_CONFIG = "action_policy.json"

# Embodiment domains of the released action heads (sglang / diffusers tables).
DOMAIN_IDS = {"libero": 5, "droid_lerobot": 8, "bridge_orig_lerobot": 3}

NORMALIZATIONS = ("quantile", "quantile_rot", "meanstd", "minmax", "none")
VIEW_POINTS = ("concat_view", "ego_view", "third_person_view", None)


@dataclass
class PolicyConfig:
    """How one checkpoint's action head is used: the knobs of a policy request.

    Defaults are the official LIBERO recipe (cosmos-framework ``action_policy_server_libero``).
    """

    domain_name: str = "libero"
    # Embodiment row of the DomainAwareLinear heads; from DOMAIN_IDS when left None.
    domain_id: int | None = None
    # Real action width inside the 64 padded channels (10 = dpos + rot6d + gripper for LIBERO).
    raw_action_dim: int = 10
    # Actions per chunk; num_frames = H + 1 pixel frames, H must be a multiple of 4.
    action_horizon: int = 16
    normalization: str = "quantile_rot"
    # Statistics blocks as cosmos-framework writes them: {"global": {...}, "global_raw": {...}}.
    stats: dict[str, Any] | None = None
    fps: float = 20.0
    # Action token rate; None = the video fps (the official default).
    action_fps: float | None = None
    # Resolution tier of the official preprocessing (256, 480, 704, 720).
    resolution_tier: int = 256
    view_point: str | None = "concat_view"
    num_inference_steps: int = 30
    guidance_scale: float = 1.0
    # The official LIBERO server runs with generate_samples_from_batch's default shift 5.0.
    flow_shift: float = 5.0
    max_sequence_length: int = 4096
    negative_prompt: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.domain_id is None:
            if self.domain_name not in DOMAIN_IDS:
                raise ValueError(
                    f"unknown domain_name {self.domain_name!r}: pass domain_id explicitly or use "
                    f"one of {sorted(DOMAIN_IDS)}"
                )
            self.domain_id = DOMAIN_IDS[self.domain_name]
        if self.action_horizon < 1 or self.action_horizon % 4:
            raise ValueError(
                f"action_horizon must be a positive multiple of 4 (num_frames = H + 1 must fit "
                f"the VAE's 4x temporal compression), got {self.action_horizon}"
            )
        if not 1 <= self.raw_action_dim <= 64:
            raise ValueError(f"raw_action_dim must be in [1, 64], got {self.raw_action_dim}")
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        if self.normalization != "none" and self.stats is None:
            raise ValueError(
                f"normalization {self.normalization!r} needs action statistics (stats), got none"
            )

    @property
    def num_frames(self) -> int:
        return self.action_horizon + 1

    @classmethod
    def from_json_file(cls, path: str | Path) -> PolicyConfig:
        with open(path) as f:
            raw = json.load(f)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{path}: unknown policy keys {unknown}; known keys: {sorted(known)}")
        return cls(**raw)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.write_text(json.dumps(dataclasses.asdict(self), indent=2))
        return path


def resolve_checkpoint(path: str | Path) -> Path:
    """``path`` as a checkpoint folder, or a name of a checkpoint shipped in the package."""
    candidate = Path(path)
    if candidate.is_dir():
        return candidate
    shipped = Path(__file__).parent / "checkpoints" / str(path)
    if shipped.is_dir():
        return shipped
    raise FileNotFoundError(
        f"no checkpoint folder at {str(path)!r} (and no shipped checkpoint of that name); "
        "expected a diffusers-layout folder with transformer/, vae/ and text_tokenizer/"
    )


def check_layout(root: Path) -> None:
    """Raise FileNotFoundError naming every required part the folder lacks."""
    missing = [name for name in (TRANSFORMER, VAE, TEXT_TOKENIZER) if not (root / name).is_dir()]
    if missing:
        raise FileNotFoundError(f"checkpoint {root} lacks {missing} (diffusers layout expected)")
