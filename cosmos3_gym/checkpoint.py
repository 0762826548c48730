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

Folders written by diffusers' ``Cosmos3OmniPipeline.save_pretrained`` (the published
``nvidia/Cosmos3-*`` checkpoints) have no ``action_policy.json``; they load with an embodiment
named by argument (``domain="droid_lerobot"``, see :data:`DOMAINS`), or with a full
``PolicyConfig``. ``action_policy.json`` is how a fine-tuned policy ships its head description.
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



@dataclass(frozen=True)
class Domain:
    """One embodiment of the released action heads."""

    # Row of the DomainAwareLinear tables (action_proj_in / action_proj_out) it selects.
    embodiment_id: int
    # Real action width inside the 64 padded channels; None where it depends on the dataset
    # (libero: the recipe's rotation format) or where the domain predicts no action.
    raw_action_dim: int | None


# The embodiments of the released Cosmos3 action heads: the table diffusers (0.42.1,
# pipeline_cosmos3_omni.py), sglang and cosmos-framework share. Aliases share a row (droid_lerobot
# and robomind-franka are both a Franka arm with a Robotiq gripper). Widths compose 9-D poses
# (translation + rot6d), 1-D grippers and 15-D fingertip blocks: 10 = one arm with its gripper.
DOMAINS: dict[str, Domain] = {
    "no_action": Domain(0, None),
    "av": Domain(1, 9),
    "camera_pose": Domain(2, 9),
    "hand_pose": Domain(3, 57),
    "pusht": Domain(4, 2),
    "libero": Domain(5, None),
    "umi": Domain(6, 10),
    "bridge_orig_lerobot": Domain(7, 10),
    "droid_lerobot": Domain(8, 10),
    "robomind-franka": Domain(8, 10),
    "galbot": Domain(9, 30),
    "robomind-franka-dual": Domain(12, 20),
    "robomind-ur": Domain(13, 10),
    "agibotworld": Domain(15, 29),
    "agibot_gear_gripper": Domain(15, 29),
    "agibot_gear_gripper_ext": Domain(15, 29),
    "fractal": Domain(20, 10),
}

# Policy heads with a published recipe, by domain: what PolicyConfig.for_domain starts from
# (statistics excepted: they are the user's, or the actions stay normalised).
RECIPES: dict[str, dict[str, Any]] = {
    # cosmos-framework's LIBERO post-training and its evaluation server: frame-wise relative
    # [dpos, rot6d, gripper] actions with quantile_rot statistics, 16-action chunks at 20 fps,
    # agentview | wrist side by side on the 256 tier, 30 FlowUniPC steps, shift 5, no CFG.
    "libero": {
        "domain_name": "libero", "raw_action_dim": 10, "action_horizon": 16,
        "normalization": "quantile_rot", "fps": 20.0, "resolution_tier": 256,
        "view_point": "concat_view", "num_inference_steps": 30, "guidance_scale": 1.0,
        "flow_shift": 5.0,
    },
}

NORMALIZATIONS = ("quantile", "quantile_rot", "meanstd", "minmax", "none")
VIEW_POINTS = ("concat_view", "ego_view", "third_person_view", None)


@dataclass
class PolicyConfig:
    """How one checkpoint's action head is used: the knobs of a policy request.

    Defaults are the official LIBERO recipe (cosmos-framework ``action_policy_server_libero``).
    """

    domain_name: str = "libero"
    # Embodiment row of the DomainAwareLinear heads; from DOMAINS when left None.
    domain_id: int | None = None
    # Real action width inside the 64 padded channels (10 = dpos + rot6d + gripper for LIBERO).
    raw_action_dim: int = 10
    # Actions per chunk; num_frames = H + 1 pixel frames, H must be a multiple of 4.
    action_horizon: int = 16
    normalization: str = "quantile_rot"
    # Statistics blocks as cosmos-framework writes them: {"global": {...}, "global_raw": {...}}.
    # None: the actions come back in the model's normalised space (the pipeline warns once).
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
            if self.domain_name not in DOMAINS:
                raise ValueError(
                    f"unknown domain_name {self.domain_name!r}: pass domain_id explicitly or use "
                    f"one of {sorted(DOMAINS)}"
                )
            self.domain_id = DOMAINS[self.domain_name].embodiment_id
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
        widths = _stats_widths(self.stats) if self.normalization != "none" else {}
        wrong = sorted({n for n in widths.values() if n != self.raw_action_dim})
        if wrong:
            raise ValueError(
                f"the action statistics do not match the head: raw_action_dim is "
                f"{self.raw_action_dim} but the statistics are {'/'.join(map(str, wrong))}-D; "
                f"give statistics of width {self.raw_action_dim} (or normalization='none' and "
                "stats=None)"
            )

    @property
    def num_frames(self) -> int:
        return self.action_horizon + 1

    @property
    def denormalizes(self) -> bool:
        """Whether actions come back in the domain's units (False: the model's normalised space,
        because the normalisation is ``"none"`` or no statistics were given)."""
        return self.normalization != "none" and self.stats is not None

    @classmethod
    def for_domain(cls, name: str, **overrides: Any) -> PolicyConfig:
        """The policy head of embodiment ``name`` (a key of :data:`DOMAINS`).

        A domain with a published recipe (:data:`RECIPES`: ``"libero"``, the official LIBERO
        one) starts from it; any other takes the table's embodiment id and raw width, quantile
        normalisation and the ``ego_view`` framing (diffusers' defaults for an action request),
        and this class's sampler defaults. ``overrides`` replace any field: ``stats=...`` to get
        actions in the domain's units, ``action_horizon=32``, ...

        >>> PolicyConfig.for_domain("droid_lerobot").domain_id
        8
        >>> PolicyConfig.for_domain("libero").raw_action_dim
        10
        """
        if name not in DOMAINS:
            raise ValueError(
                f"unknown domain {name!r}; expected one of {sorted(DOMAINS)} (libero: the "
                "official LIBERO recipe)"
            )
        domain = DOMAINS[name]
        base = RECIPES.get(name) or {
            "domain_name": name, "raw_action_dim": domain.raw_action_dim,
            "normalization": "quantile", "view_point": "ego_view",
        }
        fields = {**base, **overrides}
        if fields["raw_action_dim"] is None:
            raise ValueError(
                f"domain {name!r} has no fixed action width in the Cosmos3 table; pass "
                "raw_action_dim=... (domains with a width: "
                f"{sorted(k for k, d in DOMAINS.items() if d.raw_action_dim)})"
            )
        return cls(**fields)

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


def _stats_widths(stats: dict[str, Any] | None) -> dict[str, int]:
    """The length of each statistics vector (``{"global.q01": 10, ...}``) of the ``global`` and
    ``global_raw`` blocks; a dict holding one flat block counts as ``global``. The full checks
    are the pipeline's (``ActionStats.from_dict``); this one only catches a head and statistics
    of different widths when the policy is described, not at its first call."""
    if not isinstance(stats, dict):
        return {}
    blocks = {k: stats[k] for k in ("global", "global_raw") if k in stats} or {"global": stats}
    return {
        f"{name}.{key}": len(block[key])
        for name, block in blocks.items() if isinstance(block, dict)
        for key in ("mean", "std", "min", "max", "q01", "q99")
        if isinstance(block.get(key), (list, tuple))
    }


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


def resolve_policy(
    root: Path, policy: PolicyConfig | None = None, domain: str | None = None
) -> PolicyConfig:
    """How the checkpoint at ``root`` is used: ``policy`` as given, else the embodiment
    ``domain`` (:meth:`PolicyConfig.for_domain`), else the folder's ``action_policy.json``.

    Reads no weights, so a command can check its policy before it loads the model.
    """
    if policy is not None and domain is not None:
        raise ValueError(
            f"pass either policy or domain, not both (found policy for {policy.domain_name!r} "
            f"and domain {domain!r})"
        )
    if policy is not None:
        return policy
    if domain is not None:
        return PolicyConfig.for_domain(domain)
    policy_file = root / POLICY_CONFIG
    if policy_file.exists():
        return PolicyConfig.from_json_file(policy_file)
    raise FileNotFoundError(
        f"{root} has no {POLICY_CONFIG} saying how its action head is used (a diffusers "
        "folder such as a published nvidia/Cosmos3-* checkpoint); choose the embodiment with "
        f"domain=NAME (command line: --domain NAME), NAME one of {sorted(DOMAINS)} ('libero' "
        "gives the official LIBERO recipe), or pass policy=PolicyConfig(...)"
    )


def read_action_stats(path: str | Path) -> dict[str, Any]:
    """An action statistics JSON as cosmos-framework writes it (``global`` and, for
    ``quantile_rot``, ``global_raw`` blocks of mean/std/min/max/q01/q99)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no action statistics file at {str(path)!r}; expected a JSON file with a 'global' "
            "block (and 'global_raw' for quantile_rot) of mean, std, min, max, q01 and q99"
        )
    return json.loads(path.read_text())


def check_layout(root: Path) -> None:
    """Raise FileNotFoundError naming every required part the folder lacks."""
    missing = [name for name in (TRANSFORMER, VAE, TEXT_TOKENIZER) if not (root / name).is_dir()]
    if missing:
        raise FileNotFoundError(f"checkpoint {root} lacks {missing} (diffusers layout expected)")
