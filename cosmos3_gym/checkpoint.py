"""How a Cosmos3 checkpoint's action head is used: :class:`PolicyConfig`, the embodiments
(:data:`DOMAINS`), statistics, and where each setting comes from (:func:`resolve_policy`).

A checkpoint's on-disk formats are :mod:`cosmos3_gym.formats`' (diffusers folders, LeRobot
policy folders, cosmos-framework exports). A diffusers folder holds ``transformer/``, ``vae/``,
``text_tokenizer/`` (and ``model_index.json``, ``scheduler/``), plus ``action_policy.json``: how
a fine-tuned policy ships its head. A folder without one loads with an embodiment of
:data:`DOMAINS` or a recipe named by argument; a LeRobot folder declares its head in its
``config.json``.

The layout, the domains, statistics and tiny checkpoints: docs/checkpoints.md; the order of
the sampler defaults: docs/recipes.md, "Where the sampler defaults come from".
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos3_gym.jsonio import check_range, check_types, read_json_object, write_text_atomic
from cosmos3_gym.recipes import RECIPES, get_recipe

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

# Domains whose recipe PolicyConfig.for_domain starts from (statistics excepted: they are the
# user's, or the actions stay normalised): libero, cosmos-framework's LIBERO post-training.
DOMAIN_RECIPES: dict[str, str] = {"libero": "libero"}

# The sampler settings: where each came from is recorded (PolicyConfig.sampler_sources).
SAMPLER_FIELDS = ("num_inference_steps", "guidance_scale", "guidance_interval", "flow_shift")
# The sources a sampler setting can have, besides "recipe NAME".
DEFAULT_SOURCE = "PolicyConfig default"
GIVEN_SOURCE = "PolicyConfig given"
SCHEDULER_SOURCE = f"{SCHEDULER}/scheduler_config.json"

NORMALIZATIONS = ("quantile", "quantile_rot", "meanstd", "minmax", "quantile10", "none")
# The largest values a policy may declare (docs/checkpoints.md, "What is checked"): far above
# every published recipe (30 steps, guidance 1 to 7, shift 1 to 10, chunks of 16 to 32), low
# enough that a typo is refused when the folder is read instead of surfacing as an allocation
# of terabytes (a chunk of 2^30 actions) or a run that never ends (10^9 denoising steps).
POLICY_BOUNDS = {"num_inference_steps": 1000, "action_horizon": 1024, "guidance_scale": 100.0,
                 "flow_shift": 100.0, "fps": 1000.0, "action_fps": 1000.0,
                 "history_length": 64, "max_sequence_length": 131072}
VIEW_POINTS = ("concat_view", "ego_view", "third_person_view", None)
# How a task becomes the caption (pipeline/prompt.py): cosmos-framework's JSON caption, or
# LeRobot's plain-text one.
CAPTION_FORMATS = ("json", "lerobot")
# How the conditioning frame is resized (pipeline/preprocess.py): rounded back to uint8 as the
# official transforms do, or kept in float as LeRobot's and diffusers' pipelines do.
RESIZES = ("uint8", "float")
# Which canvas table a tier's bins come from (pipeline/preprocess.py).
CANVAS_BINS = ("cosmos-framework", "diffusers")


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
    # Classifier-free guidance only on the steps whose model timestep t (0..1000) satisfies
    # lo < t < hi, as cosmos-framework's generate_samples_from_batch compares; the other steps
    # run the conditional rows alone. None: every step (when guidance_scale != 1).
    guidance_interval: tuple[float, float] | None = None
    # The official LIBERO server runs with generate_samples_from_batch's default shift 5.0.
    flow_shift: float = 5.0
    # Clean leading action rows holding the robot state (the official DROID server's
    # history_length; 1 = the current state): the call takes state=[B, history_length,
    # raw_action_dim], normalised like the actions, and returns only the H predicted rows.
    history_length: int = 0
    # The caption's "idle_frame" entry ("0 out of H."): the LIBERO server sends it, the DROID
    # server does not.
    idle_frame: bool = True
    # Appended to the view point's framing sentence (the DROID server's camera layout).
    view_description: str | None = None
    max_sequence_length: int = 4096
    negative_prompt: str = ""
    # The caption around the task (CAPTION_FORMATS): "json", the structured caption of
    # cosmos-framework's format_prompt_as_json (the official LIBERO recipe); "lerobot", the
    # plain-text caption LeRobot's Cosmos3 processor writes (task, view sentences, duration,
    # resolution).
    caption_format: str = "json"
    # The two ids appended after the chat template: eos, then the start of generation
    # (<|vision_start|>); None takes the tokenizer's own. LeRobot folders state both.
    eos_token_id: int | None = None
    vision_start_token_id: int | None = None
    # How the conditioning frame is resized (RESIZES): "uint8" rounds the bicubic result back to
    # uint8 as cosmos-framework's transforms do; "float" keeps it in float (LeRobot, diffusers).
    resize: str = "uint8"
    # The table of canvases per tier (CANVAS_BINS): cosmos-framework's (tier 480 has a 2:3 bin,
    # and there is a 768 tier), or diffusers' _ACTION_RESOLUTION_BINS (what LeRobot reads).
    canvas_bins: str = "cosmos-framework"
    # The denoising scheduler: None runs the official FlowUniPC (pipeline/scheduler.py); a
    # diffusers UniPCMultistepScheduler config (a LeRobot folder's scheduler_config) runs that
    # scheduler, as LeRobot's Cosmos3 policy does.
    scheduler_config: dict[str, Any] | None = None
    # The model sees the gripper as 1 - g (LeRobot's invert_gripper): the sampled gripper is
    # turned back before un-normalisation, and a state row's after its normalisation.
    invert_gripper: bool = False
    # State rows normalised with statistics of their own (LeRobot's observation.state) in this
    # mode (NORMALIZATIONS); None: like the actions, with the action statistics.
    state_normalization: str | None = None
    state_stats: dict[str, Any] | None = None
    # The sampled actions clipped to the normalised range [-1, 1] before un-normalisation, as
    # Diffusion Policy clips its samples: a head trained on actions inside that range, whose
    # samples of an action on its bound land on both sides of it (the tiny ColorReach head's
    # saturated velocities). False: as sampled (the released heads, whose data reach past it).
    clip_actions: bool = False
    extra: dict[str, Any] = field(default_factory=dict)
    # Where each sampler setting (SAMPLER_FIELDS) came from: "recipe NAME", "action_policy.json",
    # "scheduler/scheduler_config.json", "PolicyConfig default" or "PolicyConfig given"; filled
    # by resolve_policy, never saved. Empty: every setting was given with the PolicyConfig.
    sampler_sources: dict[str, str] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.domain_id is None:
            if self.domain_name not in DOMAINS:
                raise ValueError(
                    f"unknown domain_name {self.domain_name!r}: pass domain_id explicitly or use "
                    f"one of {sorted(DOMAINS)}"
                )
            self.domain_id = DOMAINS[self.domain_name].embodiment_id
        bounds = POLICY_BOUNDS
        check_range("action_horizon", self.action_horizon, 1, bounds["action_horizon"],
                    integer=True, why="actions per chunk")
        if self.action_horizon % 4:
            raise ValueError(
                f"action_horizon must be a positive multiple of 4 (num_frames = H + 1 must fit "
                f"the VAE's 4x temporal compression), got {self.action_horizon}"
            )
        check_range("raw_action_dim", self.raw_action_dim, 1, 64, integer=True,
                    why="the action channels of the head")
        check_range("num_inference_steps", self.num_inference_steps, 1,
                    bounds["num_inference_steps"], integer=True, why="denoising steps per chunk")
        check_range("guidance_scale", self.guidance_scale, 0, bounds["guidance_scale"],
                    why="1 runs no classifier-free guidance")
        check_range("flow_shift", self.flow_shift, 0, bounds["flow_shift"], above=True)
        check_range("fps", self.fps, 0, bounds["fps"], above=True)
        if self.action_fps is not None:
            check_range("action_fps", self.action_fps, 0, bounds["action_fps"], above=True)
        check_range("max_sequence_length", self.max_sequence_length, 1,
                    bounds["max_sequence_length"], integer=True, why="prompt tokens")
        for name in ("eos_token_id", "vision_start_token_id"):
            if getattr(self, name) is not None:
                check_range(name, getattr(self, name), 0, 2**31, integer=True)
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                f"normalization must be one of {NORMALIZATIONS}, got {self.normalization!r}"
            )
        if self.stats is not None:  # finite vectors of one length, checked once, here
            _check_statistics(self.stats, self.normalization, "action statistics")
        widths = _stats_widths(self.stats) if self.normalization != "none" else {}
        wrong = sorted({n for n in widths.values() if n != self.raw_action_dim})
        if wrong:
            raise ValueError(
                f"the action statistics do not match the head: raw_action_dim is "
                f"{self.raw_action_dim} but the statistics are {'/'.join(map(str, wrong))}-D; "
                f"give statistics of width {self.raw_action_dim} (or normalization='none' and "
                "stats=None)"
            )
        if self.guidance_interval is not None:
            self.guidance_interval = check_guidance_interval(self.guidance_interval)
        check_range("history_length", self.history_length, 0, bounds["history_length"],
                    integer=True, why="state rows")
        for name, allowed in (("caption_format", CAPTION_FORMATS), ("resize", RESIZES),
                              ("canvas_bins", CANVAS_BINS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.state_normalization not in (None, *NORMALIZATIONS):
            raise ValueError(f"state_normalization must be None or one of {NORMALIZATIONS}, got "
                             f"{self.state_normalization!r}")
        if self.state_stats is not None:
            _check_statistics(self.state_stats, self.state_normalization or "none",
                              "state statistics")
        if self.state_normalization not in (None, "none") and self.state_stats is None:
            raise ValueError(f"state_normalization {self.state_normalization!r} needs "
                             "state_stats (the state's own statistics)")
        if self.scheduler_config is not None and not isinstance(self.scheduler_config, dict):
            raise ValueError(f"scheduler_config must be a diffusers scheduler config (a dict) or "
                             f"None, got {type(self.scheduler_config).__name__}")

    @property
    def sampler(self) -> dict[str, Any]:
        """The sampler settings in force, each with its source: what a run records.

        >>> PolicyConfig().sampler["flow_shift"]
        {'value': 5.0, 'source': 'PolicyConfig given'}
        """
        return {
            name: {"value": getattr(self, name),
                   "source": self.sampler_sources.get(name, GIVEN_SOURCE)}
            for name in SAMPLER_FIELDS
        }

    @property
    def recipe(self) -> str | None:
        """The recipe (:mod:`cosmos3_gym.recipes`) the sampler settings come from, where they
        all come from one."""
        names = {source.removeprefix("recipe ") for source in self.sampler_sources.values()
                 if source.startswith("recipe ")}
        return names.pop() if len(names) == 1 else None

    @property
    def scheduler(self) -> dict[str, Any]:
        """The denoising scheduler in force, for a run's record: ``flow_unipc`` (the official
        FlowUniPC on cosmos-framework's sigmas) or ``diffusers_unipc`` with the config it is
        built from, and where that came from.

        >>> PolicyConfig().scheduler["name"]
        'flow_unipc'
        """
        name = "flow_unipc" if self.scheduler_config is None else "diffusers_unipc"
        return {"name": name, "config": self.scheduler_config,
                "source": self.sampler_sources.get("scheduler", GIVEN_SOURCE)}

    def describe_sampler(self) -> str:
        """One line naming the sampler settings and where each came from (the scheduler too
        where it is not the official FlowUniPC).

        >>> PolicyConfig(guidance_scale=3.0, guidance_interval=(960, 1001)).describe_sampler()
        'sampler 30 steps, guidance 3 on timesteps (960, 1001), shift 5 (all: PolicyConfig given)'
        """
        guidance = f"guidance {self.guidance_scale:g}"
        if self.guidance_scale != 1.0 and self.guidance_interval is not None:
            lo, hi = self.guidance_interval
            guidance += f" on timesteps ({lo:g}, {hi:g})"
        text = (f"sampler {self.num_inference_steps} steps, {guidance}, "
                f"shift {self.flow_shift:g}")
        if self.scheduler_config is not None:
            text += ", diffusers UniPCMultistepScheduler"
        sources = {name: s["source"] for name, s in self.sampler.items()}
        if len(set(sources.values())) == 1:
            return f"{text} (all: {next(iter(sources.values()))})"
        short = {"num_inference_steps": "steps", "guidance_scale": "guidance",
                 "guidance_interval": "interval", "flow_shift": "shift"}
        return text + " (" + "; ".join(f"{short[k]}: {v}" for k, v in sources.items()) + ")"

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

        A domain with a published recipe (:data:`DOMAIN_RECIPES`: ``"libero"``, the official
        LIBERO one) starts from it; any other takes the table's embodiment id and raw width,
        quantile normalisation and the ``ego_view`` framing (diffusers' defaults for an action
        request), and this class's sampler defaults. ``overrides`` replace any field:
        ``stats=...`` to get actions in the domain's units, ``action_horizon=32``, ...

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
        if name in DOMAIN_RECIPES:
            base = dict(RECIPES[DOMAIN_RECIPES[name]].settings)
        else:
            base = {"domain_name": name, "raw_action_dim": domain.raw_action_dim,
                    "normalization": "quantile", "view_point": "ego_view"}
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
        return cls.from_dict(read_json_object(path, what="action policy file "
                                              "(action_policy.json)"), str(path))

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str) -> PolicyConfig:
        """A policy from its JSON form (``action_policy.json`` as read), every key known and of
        its type; errors name ``source``."""
        known = {f.name for f in dataclasses.fields(cls)} - {"sampler_sources"}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"{source}: unknown policy keys {unknown}; known keys: "
                             f"{sorted(known)}")
        check_types(cls, raw, source)
        try:
            return cls(**raw)
        except ValueError as err:
            raise ValueError(f"{source}: {err}") from None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        fields = dataclasses.asdict(self)
        del fields["sampler_sources"]  # where the settings came from is not a setting
        write_text_atomic(path, json.dumps(fields, indent=2))
        return path


def _check_statistics(stats: dict[str, Any], mode: str, noun: str) -> None:
    """Statistics as a head of normalisation ``mode`` reads them: every block finite and of
    one length, and the block the mode reads holding its two vectors with a spread data can have
    (:meth:`~cosmos3_gym.pipeline.normalization.ActionStats.block_for`); errors begin with
    ``noun`` (``action statistics``, ``state statistics``), so a state block is not blamed on
    the actions."""
    from cosmos3_gym.pipeline.normalization import ActionStats

    try:
        parsed = ActionStats.from_dict(stats, source="stats")
        if mode != "none":
            parsed.block_for(mode)
    except ValueError as err:
        raise ValueError(f"{noun}: {err}") from None


def check_guidance_interval(interval: Any) -> tuple[float, float]:
    """``(lo, hi)`` model timesteps (0..1000, ``lo < hi``) as floats; a ``ValueError`` otherwise.

    >>> check_guidance_interval([960, 1001])
    (960.0, 1001.0)
    """
    try:
        lo, hi = (float(v) for v in interval)
    except (TypeError, ValueError):
        raise ValueError(
            f"guidance_interval: expected two timesteps (lo, hi), got {interval!r}"
        ) from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"guidance_interval: expected finite lo < hi, got {interval!r}")
    return lo, hi


def read_scheduler_defaults(root: Path) -> tuple[dict[str, Any], str | None]:
    """The sampler settings a folder's ``scheduler/scheduler_config.json`` states, and why the
    file states none when it does not (``None`` when it does, or has no such file).

    A diffusers ``UniPCMultistepScheduler`` config with ``use_flow_sigmas`` gives its
    ``flow_shift``; cosmos-framework's ``FlowUniPCMultistepScheduler`` its ``shift``; either its
    ``num_inference_steps`` where it has one. A config with ``use_karras_sigmas`` (the one
    diffusers' conversion script writes: Karras sigmas approximating FlowUniPC) is ignored, since
    its ``flow_shift`` key does not describe the schedule it samples.
    """
    path = root / SCHEDULER / "scheduler_config.json"
    if not path.is_file():
        return {}, None
    try:
        config = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path}: expected a JSON object, found {type(config).__name__}")
    if config.get("use_karras_sigmas"):
        return {}, "Karras sigmas: its flow_shift does not describe the schedule"
    found: dict[str, Any] = {}
    shift_key = "shift" if "FlowUniPC" in str(config.get("_class_name", "")) else "flow_shift"
    if shift_key == "flow_shift" and not config.get("use_flow_sigmas"):
        shift_key = None  # not a flow-sigma schedule: no shift to take
    shift = config.get(shift_key) if shift_key else None
    if shift is not None:
        if isinstance(shift, bool) or not isinstance(shift, (int, float)) or not shift > 0:
            raise ValueError(f"{path}: {shift_key} must be a number > 0, found {shift!r}")
        found["flow_shift"] = float(shift)
    steps = config.get("num_inference_steps")
    if steps is not None:
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"{path}: num_inference_steps must be an int >= 1, found {steps!r}")
        found["num_inference_steps"] = steps
    return found, None if found else "states no flow shift or step count"


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


def resolve_policy(
    root: Path,
    policy: PolicyConfig | None = None,
    domain: str | None = None,
    *,
    recipe: str | None = None,
    declared: PolicyConfig | None = None,
) -> PolicyConfig:
    """How the checkpoint at ``root`` is used, with the source of each sampler setting.

    ``policy`` as given; else a ``recipe`` (:data:`~cosmos3_gym.recipes.RECIPES`; over the
    folder's own policy where it has one, keeping its statistics); else the embodiment
    ``domain`` (:meth:`PolicyConfig.for_domain`); else the policy the folder declares:
    ``declared`` (what a LeRobot folder's ``config.json`` says, read by
    :mod:`cosmos3_gym.formats`) or its ``action_policy.json``. Sampler settings no recipe or
    folder policy states come from the folder's scheduler config where it states them
    (:func:`read_scheduler_defaults`), else from ``PolicyConfig``'s defaults; docs/recipes.md
    gives the whole order.

    Reads no weights, so a command can check its policy before it loads the model.
    """
    given = {"policy": policy, "domain": domain, "recipe": recipe}
    named = [k for k, v in given.items() if v is not None]
    if policy is not None and len(named) > 1:
        raise ValueError(
            f"pass either policy or domain (or recipe), not {' and '.join(named)} (found "
            f"policy for {policy.domain_name!r} and {', '.join(repr(given[k]) for k in named[1:])})"
        )
    if policy is not None:
        sources = {k: policy.sampler_sources.get(k, GIVEN_SOURCE) for k in SAMPLER_FIELDS}
        return dataclasses.replace(policy, sampler_sources=sources)
    policy_file = root / POLICY_CONFIG
    raw = (read_json_object(policy_file, what="action policy file (action_policy.json)")
           if policy_file.exists() else None)
    folder = None if raw is None else PolicyConfig.from_dict(raw, str(policy_file))
    if declared is not None:
        if domain is not None and recipe is None:
            raise ValueError(
                f"{root} declares its own policy (domain {declared.domain_name!r}, config.json); "
                f"--domain {domain} would not be used: leave it out (or name a recipe)")
        if recipe is not None:
            return _apply_recipe(get_recipe(recipe), None, declared, root / "config.json")
        return declared
    if recipe is not None:
        return _apply_recipe(get_recipe(recipe), domain, folder, policy_file)
    if domain is not None:
        resolved = PolicyConfig.for_domain(domain)
        stated = RECIPES[DOMAIN_RECIPES[domain]].settings if domain in DOMAIN_RECIPES else {}
        source = f"recipe {DOMAIN_RECIPES.get(domain)}"
    elif folder is not None:
        # An action_policy.json written before a setting existed does not state it.
        stated = set(raw) & set(SAMPLER_FIELDS)
        resolved, source = folder, POLICY_CONFIG
    else:
        raise FileNotFoundError(
            f"{root} has no {POLICY_CONFIG} saying how its action head is used (a diffusers "
            "folder such as a published nvidia/Cosmos3-* checkpoint, or a cosmos-framework "
            "export); choose the embodiment with domain=NAME (command line: --domain NAME), NAME "
            f"one of {sorted(DOMAINS)} ('libero' gives the official LIBERO recipe), a "
            f"recipe=NAME of {sorted(RECIPES)}, or pass policy=PolicyConfig(...)"
        )
    scheduler, _ = read_scheduler_defaults(root)
    sources, changes = {}, {}
    for name in SAMPLER_FIELDS:
        if name in stated:
            sources[name] = source
        elif name in scheduler:
            sources[name], changes[name] = SCHEDULER_SOURCE, scheduler[name]
        else:
            sources[name] = DEFAULT_SOURCE
    return dataclasses.replace(resolved, **changes, sampler_sources=sources)


def _apply_recipe(
    recipe: Any, domain: str | None, folder: PolicyConfig | None, policy_file: Path
) -> PolicyConfig:
    """``recipe``'s settings, over the folder's own policy (``action_policy.json``, or what a
    LeRobot folder's ``config.json`` declares) where it has one. A sampler setting the recipe
    leaves to the folder keeps the folder's value and source; a recipe that leaves settings to
    the folder needs one."""
    own = recipe.settings["domain_name"]
    for what, found in (("domain", domain), (str(policy_file), folder and folder.domain_name)):
        if found is not None and found != own:
            raise ValueError(
                f"recipe {recipe.name!r} is for {own!r} action heads, but the {what} is "
                f"{found!r}; choose a recipe of that domain or leave the recipe out"
            )
    settings = dict(recipe.settings)
    if folder is None:
        if recipe.from_folder:
            raise ValueError(
                f"recipe {recipe.name!r} leaves {list(recipe.from_folder)} to the checkpoint "
                f"folder ({recipe.checkpoints}), and {policy_file.parent} declares no policy")
        settings["domain_id"] = None  # from the domain table
        resolved = PolicyConfig(**settings)
    else:
        resolved = dataclasses.replace(folder, **settings)
    folder_sources = folder.sampler_sources if folder is not None else {}
    sources = {k: f"recipe {recipe.name}" if k in settings
               else folder_sources.get(k, policy_file.name) for k in SAMPLER_FIELDS}
    return dataclasses.replace(resolved, sampler_sources={**folder_sources, **sources})


def read_action_stats(path: str | Path) -> dict[str, Any]:
    """An action statistics JSON as cosmos-framework writes it (``global`` and, for
    ``quantile_rot``, ``global_raw`` blocks of mean/std/min/max/q01/q99), checked: every
    vector finite and of one length."""
    from cosmos3_gym.pipeline.normalization import ActionStats

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"no action statistics file at {str(path)!r}; expected a JSON file with a 'global' "
            "block (and 'global_raw' for quantile_rot) of mean, std, min, max, q01 and q99"
        )
    stats = read_json_object(path, what="action statistics JSON")
    ActionStats.from_dict(stats, source=str(path))
    return stats


def check_action_stats(stats: dict[str, Any], policy: PolicyConfig, source: str) -> None:
    """Refuse statistics that the policy head cannot use: the block its normalisation reads
    (``global_raw`` for ``quantile_rot``, else ``global``) must exist, be finite and be as wide
    as its raw actions."""
    from cosmos3_gym.pipeline.normalization import ActionStats

    if policy.normalization == "none":
        return
    parsed = ActionStats.from_dict(stats, source=source)
    try:
        parsed.block_for(policy.normalization)
    except ValueError as err:
        raise ValueError(f"{source}: {err} (the checkpoint's {policy.domain_name!r} head)") \
            from None
    if parsed.raw_action_dim != policy.raw_action_dim:
        raise ValueError(
            f"{source} holds {parsed.raw_action_dim}-D statistics; the checkpoint's "
            f"{policy.domain_name!r} head makes {policy.raw_action_dim}-D actions"
        )


def check_statistics_present(policy: PolicyConfig, format_name: str, root: Path) -> None:
    """Refuse a cosmos-framework export without statistics: it carries none, and its own server
    then silently un-normalises with min-max defaults; here that is one error instead."""
    if format_name == "cosmos-framework" and policy.normalization != "none" and (
            policy.stats is None):
        raise ValueError(
            f"{root} is a cosmos-framework export, which carries no action statistics, and its "
            f"{policy.domain_name!r} head un-normalises with {policy.normalization!r}: give "
            "--action-stats FILE (for LIBERO: cosmos-framework's data/generator/action/"
            "normalizer_stats/libero_native_frame_wise_relative_rot6d.json)")
