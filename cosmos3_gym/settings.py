"""Settings: every knob of a run as a dataclass field with its default and its help, written once.

A field made with :func:`setting` carries what the command line needs to offer it: its help
(the field's documentation), its group in ``--help``, and, where the field's name is not the flag
(``--denoising-steps`` for ``num_inference_steps``) or its type does not say how to read it, the
flag and a parser. ``cosmos3-gym``'s parsers are generated from these classes
(:mod:`cosmos3_gym.eval.cli`), so a setting's default, help and type live in one place.

The help's first clause (before any ``;``) states the setting's meaning; a flag name that appears
in several commands means the same there (the test suite walks the parsers to check it).

The groups that commands share are defined here: which model runs (:class:`ModelSettings`),
where and in which precision (:class:`RuntimeSettings`), and which envs (:class:`EnvSettings`).
The sampler's settings are the pipeline's (:class:`~cosmos3_gym.pipeline.SamplerConfig`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# The published model shapes a run can build with random weights (cosmos3_gym.synthetic).
SYNTHETIC_PRESETS = ("nano", "super", "edge", "tiny")

GROUPS = {
    "model": "model: which checkpoint (or published shape) runs",
    "runtime": "runtime: where it runs and how the run reports",
    "env": "env: the benchmark and its env slots",
    "sampler": "sampler: how each chunk is denoised",
    "latency": "latency: real-time execution, the env going on while the policy computes",
    "evaluation": "evaluation",
    "rollout": "rollout",
    "bench": "benchmark",
    "train": "training",
    "rl": "reinforcement learning",
}


def setting(default: Any, help: str, *, group: str, flag: str | None = None,
            parse: Callable[[str], Any] | None = None, choices: tuple[Any, ...] | None = None,
            metavar: str | None = None, const: Any = None, cli: bool = True,
            factory: bool = False) -> Any:
    """A dataclass field with its command-line description.

    ``flag``: the option's name without ``--`` (default: the field name with ``-``); a bool
    field whose flag starts with ``no-`` stores False. ``parse`` reads the option's text
    (default: from the field's type). ``const``: the value of the flag given without one.
    ``cli=False``: a setting of the Python API only.
    ``factory``: ``default`` is a zero-argument callable making the default (a mutable one).
    """
    if group not in GROUPS:
        raise ValueError(f"setting group must be one of {sorted(GROUPS)}; found {group!r}")
    meta = {"help": help, "group": group, "flag": flag, "parse": parse, "choices": choices,
            "metavar": metavar, "const": const, "cli": cli}
    if factory:
        return dataclasses.field(default_factory=default, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def meaning(help_text: str) -> str:
    """A setting's meaning: its help up to the first ``;`` (what the flag is, whatever the
    command; what follows is that command's detail)."""
    return help_text.split(";", 1)[0].strip()


# ---------------------------------------------------------------------- readers for the CLI


def _int_at_least(text: str, low: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected an integer >= {low}; found {text!r}") from None
    if value < low:
        raise ValueError(f"expected an integer >= {low}; found {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int_at_least(text, 1)


def seed_value(text: str) -> int:
    """A seed: an integer in [0, 2**64) (:func:`cosmos3_gym.seeding.check_seed`)."""
    from cosmos3_gym.seeding import check_seed

    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"expected an integer seed in [0, 2**64); found {text!r}") from None
    return check_seed(value)


def nonnegative_int(text: str) -> int:
    """An integer >= 0."""
    return _int_at_least(text, 0)


def positive_number(text: str) -> float:
    """A number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected a number > 0; found {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise ValueError(f"expected a finite number > 0; found {text!r}")
    return value


def _number_or_none(text: str, low: float, high: float, expected: str) -> float | None:
    """``none`` (off), or a number strictly between ``low`` and ``high``."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"expected {expected} or none; found {text!r}") from None
    if not low < value < high:
        raise ValueError(f"expected {expected} or none; found {text!r}")
    return value


def ratio_above_one(text: str) -> float | None:
    """A ratio > 1, or ``none`` (off).

    >>> ratio_above_one("3"), ratio_above_one("none")
    (3.0, None)
    """
    return _number_or_none(text, 1.0, float("inf"), "a finite number > 1")


def unit_fraction(text: str) -> float | None:
    """A number strictly between 0 and 1, or ``none`` (off).

    >>> unit_fraction("0.9"), unit_fraction("none")
    (0.9, None)
    """
    return _number_or_none(text, 0.0, 1.0, "a number between 0 and 1 (both excluded)")


# ``--sde-steps`` by name: one random step per chunk, the same but never the last (narrowest)
# step, or every step; otherwise step indices (cosmos3_gym.pipeline.sde.StochasticSampling).
SDE_STEP_NAMES = ("random", "random-but-last", "all")


def sde_steps_value(text: str) -> str | tuple[int, ...]:
    """``--sde-steps``: a name of :data:`SDE_STEP_NAMES` or comma-separated step indices.

    >>> sde_steps_value("2,3"), sde_steps_value("all"), sde_steps_value("random-but-last")
    ((2, 3), 'all', 'random-but-last')
    """
    if text in SDE_STEP_NAMES:
        return text
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"expected one of {', '.join(SDE_STEP_NAMES)} or comma-separated step "
                         f"indices; found {text!r}") from None


def latency_values(text: str) -> str:
    """``--latency``: one latency or a comma list, in its canonical spelling
    (:func:`~cosmos3_gym.policy.realtime.parse_latencies`).

    >>> latency_values("0, 0.15s,3steps")
    '0,150ms,3steps'
    """
    from cosmos3_gym.policy.realtime import parse_latencies

    return ",".join(lat.text for lat in parse_latencies(text))


def csv(text: str) -> list[str]:
    """A comma-separated list of names."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise ValueError(f"expected a comma-separated list; found {text!r}")
    return items


def int_list(text: str) -> tuple[int, ...]:
    """Comma-separated integers >= 1."""
    return tuple(positive_int(t) for t in csv(text))


def json_object(text: str) -> dict[str, Any]:
    """A JSON object (``'{"obs_type": "pixels"}'``)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"expected a JSON object; found {text!r} ({err.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"expected a JSON object; found {type(value).__name__}")
    return value


def env_name(text: str) -> str:
    """A name of the env table (``EVAL_ENVS``), a benchmark preset, or ``gym:ID``."""
    from cosmos3_gym.envs.names import check_env_name

    return check_env_name(text)


def render_size(text: str) -> tuple[int, int]:
    """``HxW`` (``96x128``), or one number for a square frame.

    >>> render_size("96x128"), render_size("64")
    ((96, 128), (64, 64))
    """
    parts = text.lower().replace(" ", "").split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise ValueError(f"expected HxW (e.g. 96x128) or one size; found {text!r}") from None
    if len(sizes) not in (1, 2) or min(sizes) < 1:
        raise ValueError(f"expected HxW with sizes >= 1 (e.g. 96x128); found {text!r}")
    return (sizes[0], sizes[-1])


def shard_spec(text: str) -> str:
    """``I/N``: shard ``I`` of ``N`` (``0 <= I < N``), written back without spaces.

    >>> shard_spec(" 1 / 4 ")
    '1/4'
    """
    index, slash, count = str(text).partition("/")
    try:
        i, n = int(index), int(count)
    except ValueError:
        i = n = -1
    if not slash or n < 1 or not 0 <= i < n:
        raise ValueError(f"expected I/N with 0 <= I < N (shard I of N, e.g. 0/4); found "
                         f"{text!r}")
    return f"{i}/{n}"


def text_or_json_object(text: str) -> str | dict[str, str]:
    """Plain text, or a JSON object of text (``{"task": "instruction", ...}``)."""
    return json_object(text) if text.lstrip().startswith("{") else text


# ---------------------------------------------------------------------- one check per rule


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _reads(reader: Callable[[str], Any], text: str) -> bool:
    try:
        reader(text)
    except ValueError:
        return False
    return True


# The rule each reader stands for, checked on a value given from Python or a config file (the
# command line's text went through the reader already): reader -> (holds, what is expected).
RULES: dict[Callable[[str], Any], tuple[Callable[[Any], bool], str]] = {
    positive_int: (lambda v: _is_int(v) and v >= 1, "an integer >= 1"),
    nonnegative_int: (lambda v: _is_int(v) and v >= 0, "an integer >= 0"),
    positive_number: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                      and 0 < v < float("inf"), "a finite number > 0"),
    ratio_above_one: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                      and 1 < v < float("inf"), "a finite number > 1 (or None: off)"),
    unit_fraction: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
                    and 0 < v < 1, "a number between 0 and 1, both excluded (or None: off)"),
    sde_steps_value: (lambda v: v in SDE_STEP_NAMES or (
        isinstance(v, (list, tuple)) and bool(v) and all(_is_int(x) and x >= 0 for x in v)
        and len(set(v)) == len(v)), f"{', '.join(SDE_STEP_NAMES)} or distinct step indices >= 0"),
    latency_values: (lambda v: isinstance(v, str) and _reads(latency_values, v),
                     "0, a duration (150ms, 0.3s), a step count (3steps), measured or "
                     "replay:DIR, or several comma-separated"),
    int: (_is_int, "an integer"),
    float: (lambda v: isinstance(v, (int, float)) and not isinstance(v, bool), "a number"),
    csv: (lambda v: isinstance(v, (list, tuple)) and bool(v)
          and all(isinstance(x, str) and x for x in v), "a non-empty list of names"),
    int_list: (lambda v: isinstance(v, (list, tuple)) and bool(v)
               and all(_is_int(x) and x >= 1 for x in v), "a list of integers >= 1"),
    json_object: (lambda v: isinstance(v, dict), "a JSON object"),
    render_size: (lambda v: isinstance(v, (list, tuple)) and len(v) == 2
                  and all(_is_int(x) and x >= 1 for x in v), "(height, width) >= 1"),
    shard_spec: (lambda v: isinstance(v, str) and _holds(shard_spec, v),
                 "'I/N' with 0 <= I < N (e.g. '0/4')"),
}


def _holds(reader: Callable[[str], Any], value: str) -> bool:
    """Whether ``reader`` takes ``value`` as it is written (a value given from Python or a
    config file must already be in the form the command line's reader writes)."""
    try:
        return reader(value) == value
    except ValueError:
        return False


def check_settings(settings: Any) -> None:
    """Each setting of ``settings`` (a dataclass made of :func:`setting` fields) against the
    rule its declaration states: its choices, its reader's rule (:data:`RULES`), its type where
    that is a plain ``bool`` or ``str``. ``None`` passes where the default is ``None``. Every
    settings class calls this from ``__post_init__``: a rule is written once, here, and checked
    once for every command and for the Python API alike; the command line's readers apply the
    same rules to text.

    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Demo:
    ...     num_envs: int = setting(4, "slots", group="env", parse=positive_int)
    ...     def __post_init__(self) -> None:
    ...         check_settings(self)
    >>> Demo(num_envs=0)
    Traceback (most recent call last):
    ...
    ValueError: num_envs must be an integer >= 1; found 0
    """
    for f in dataclasses.fields(settings):
        if "help" not in f.metadata:
            continue
        value = getattr(settings, f.name)
        if value is None and (f.default is None or "None" in str(f.type)):
            continue
        choices = f.metadata.get("choices")
        if choices is not None:
            if value not in choices:
                raise ValueError(f"{f.name} must be one of {list(choices)}; found {value!r}")
            continue
        parse = f.metadata.get("parse")
        if parse is seed_value:  # the one seed rule, whichever layer receives a seed
            from cosmos3_gym.seeding import check_seed

            check_seed(value, f.name)
            continue
        rule = RULES.get(parse) if parse is not None else RULES.get(
            {"int": int, "float": float}.get(str(f.type).split(" |")[0], None))
        if rule is not None:
            holds, expected = rule
            if not holds(value):
                raise ValueError(f"{f.name} must be {expected}; found {value!r}")
        elif str(f.type) == "bool" and not isinstance(value, bool):
            raise ValueError(f"{f.name} must be True or False; found {value!r}")


# ---------------------------------------------------------------------- shared groups


@dataclass
class ModelSettings:
    """Which model a command runs."""

    checkpoint: str | None = setting(
        None, "the checkpoint: a folder as downloaded (a diffusers folder, a LeRobot policy "
        "folder or a cosmos-framework export; docs/checkpoints.md), or a shipped name; default: "
        "tiny", group="model")
    domain: str | None = setting(
        None, "the checkpoint's embodiment (cosmos3_gym.checkpoint.DOMAINS); for a folder without "
        "action_policy.json (a published nvidia/Cosmos3-* folder): libero gives the official "
        "LIBERO recipe", group="model", metavar="NAME")
    recipe: str | None = setting(
        None, "a released checkpoint's published sampler recipe (docs/recipes.md); over the "
        "folder's own settings", group="model", metavar="NAME")
    action_stats: str | None = setting(
        None, "action statistics JSON replacing the checkpoint's (cosmos-framework's global / "
        "global_raw blocks); without statistics the actions stay in the model's normalised space",
        group="model", metavar="FILE")
    vae: str | None = setting(
        None, "the VAE of a cosmos-framework export, which holds none: a diffusers "
        "AutoencoderKLWan folder, or a Cosmos3 diffusers checkpoint whose vae/ is used",
        group="model", metavar="PATH")
    tokenizer: str | None = setting(
        None, "the tokenizer folder of a LeRobot policy folder, instead of the one its config "
        "names (text_processor_name_or_path)", group="model", metavar="PATH")
    synthetic: str | None = setting(
        None, "a published model shape with random weights instead of a checkpoint (nano, super, "
        "edge; tiny on a CPU); its timings are the real model's, its success rates meaningless",
        group="model", choices=SYNTHETIC_PRESETS)

    def check_model_source(self) -> None:
        """``synthetic`` builds a model with random weights, so a checkpoint's settings do not
        go with it: refuse both together (one error naming what would be ignored)."""
        if self.synthetic is not None:
            given = [f"--{name.replace('_', '-')}"
                     for name in ("checkpoint", "domain", "recipe", "action_stats", "vae",
                                  "tokenizer")
                     if getattr(self, name) is not None]
            if given:
                raise ValueError(f"--synthetic {self.synthetic} builds a model with random "
                                 f"weights; {', '.join(given)} would not be used. Give one or "
                                 "the other")

    def model_defaults(self) -> dict[str, Any]:
        """The model fields a run fills in when it is resolved: an unnamed checkpoint is the
        shipped ``tiny``."""
        if self.checkpoint is None and self.synthetic is None:
            return {"checkpoint": "tiny"}
        return {}


def stored_model_source(stored: dict[str, Any]) -> dict[str, Any]:
    """Settings or an identity written before a ``--synthetic`` run kept its checkpoint unset:
    those wrote ``checkpoint: "tiny"`` beside ``synthetic``, a pair only that rewrite made (a
    user who types both is refused), read here as the unset checkpoint it was, so the run
    reruns (``--config``) and resumes."""
    if stored.get("synthetic") is not None and stored.get("checkpoint") == "tiny":
        return {**stored, "checkpoint": None}
    return stored


def stored_latency(stored: dict[str, Any]) -> dict[str, Any]:
    """Settings or an identity written before the latency settings: they ran synchronously
    (latency 0), and read so, so the run resumes."""
    defaults = {"latency": "0", "replan_at": None, "rtc": False, "control_hz": None}
    return {**defaults, **stored}


@dataclass
class ProgressSettings:
    """How a run reports as it goes."""

    progress: bool = setting(True, "progress bars", group="runtime", flag="no-progress")


def device_setting() -> Any:
    """``--device``, as every command that runs the model declares it."""
    return setting(
        "auto", "where the model runs: auto (the GPU where there is one, cuda:LOCAL_RANK under "
        "torchrun, else the CPU), cpu, cuda or cuda:N", group="runtime")


# The model precisions a run may ask for (cosmos3_gym/devices.py resolves them on the machine).
PRECISIONS = ("auto", "fp32", "bf16", "fp8")


def precision_setting() -> Any:
    """``--precision``, as every command that runs the model declares it."""
    return setting(
        "auto", "the model's precision: auto (bf16 on CUDA, fp32 on the CPU), fp32, bf16, or fp8 "
        "(the generation tower's GEMMs in FP8 e4m3, the rest as auto; not the same actions: see "
        "docs/benchmarks.md)", group="runtime", choices=PRECISIONS)


def threads_setting() -> Any:
    """``--threads``, for the commands that time the model."""
    return setting(
        None, "torch intra-op CPU threads; on a shared or busy machine 1 keeps OpenMP from "
        "oversubscribing the cores (default: torch's choice)", group="runtime",
        parse=positive_int)


@dataclass
class RuntimeSettings(ProgressSettings):
    """Where the model runs, in which precision, and how the run reports."""

    device: str = device_setting()
    precision: str = precision_setting()

    def resolve_runtime(self) -> tuple[Any, Any, bool]:
        """``(torch device, dtype, fp8)`` on this machine; a device that is not there is an
        error now, before anything loads."""
        from cosmos3_gym.devices import resolve_device, resolve_precision

        device = resolve_device(self.device)
        dtype, fp8 = resolve_precision(self.precision, device)
        return device, dtype, fp8


@dataclass
class EnvSettings:
    """Which envs a command runs, and how many at once."""

    env: str = setting(
        "color_reach", "the env family; color_reach (built in), libero, metaworld, a benchmark "
        "preset (pusht, aloha, metaworld:mt10, fetch, panda, robosuite, maniskill:ID, ...: "
        "docs/presets.md), or gym:ID (any registered Gymnasium env)", group="env",
        parse=env_name, metavar="ENV")
    suite: str | None = setting(
        None, "the LIBERO suite(s): libero_10, several comma-separated, or libero_4 (spatial, "
        "object, goal, 10)", group="env")
    tasks: list[str] | None = setting(
        None, "the tasks to run, comma-separated; colours for color_reach, task ids for LIBERO, "
        "task names for metaworld, a preset's variants (default: all)", group="env", parse=csv)
    num_envs: int = setting(4, "env slots stepped together", group="env", parse=positive_int)
    async_envs: bool = setting(
        False, "sub-envs in worker processes (crash and hang recovery)", group="env")
    env_timeout: float = setting(
        300.0, "seconds an async env's step or reset may take before its worker counts as hung",
        group="env")
    overlap: bool = setting(
        False, "two groups of env slots take turns: one steps while the other's chunks are "
        "planned (the same episodes, sooner where an env step costs about a model call)",
        group="env")
    image_size: int | None = setting(
        None, "the env's square image size in pixels; default: the env's", group="env",
        parse=positive_int)
    max_episode_steps: int | None = setting(
        None, "the episode's step limit; default: the env's", group="env", parse=positive_int)
    step_budget: str | None = setting(
        None, "LIBERO's episode budget: cosmos3 (the official client's, settle steps counted "
        "inside: 510 on libero_10) or openpi (settle steps on top: 520)", group="env",
        choices=("cosmos3", "openpi"))
    prompt: str | dict[str, str] | None = setting(
        None, "--env gym:ID and presets: the instruction, or a JSON object {task: instruction} "
        "for several tasks (a preset's own by default)", group="env", parse=text_or_json_object,
        metavar="TEXT")
    import_modules: list[str] | None = setting(
        None, "--env gym:ID: modules to import first, comma-separated (the packages that register "
        "the id, e.g. gym_pusht)", group="env", flag="import", parse=csv, metavar="MODULES")
    env_kwargs: dict[str, Any] | None = setting(
        None, "--env gym:ID: keyword arguments of every env, as a JSON object; --env color_reach: "
        "its max_speed; --env metaworld: shadows (false: 5x faster software rendering), "
        "terminate_on_success (false: episodes run to their step limit)",
        group="env", parse=json_object, metavar="JSON")
    success_key: str | None = setting(
        None, "--env gym:ID and presets: the bool info key success is read from (the same as "
        "--success info.KEY)", group="env", metavar="KEY")
    success: str | None = setting(
        None, "--env gym:ID and presets: where success comes from: auto (the env's is_success, "
        "else success; the default, a preset's own rule), info.KEY, 'info.KEY > X', "
        "'return >= X', terminated, or none (returns only, no rate)", group="env",
        metavar="RULE")
    image_key: list[str] | None = setting(
        None, "--env gym:ID and presets: the observation key(s) of the camera image, "
        "comma-separated (several side by side); with a checkpoint that declares its cameras "
        "(a LeRobot folder), one key per camera, in the order inspect lists them",
        group="env", parse=csv, metavar="KEYS")
    state_key: str | None = setting(
        None, "--env gym:ID and presets: the observation key of the robot state, for "
        "state-conditioned heads", group="env", metavar="KEY")
    render_size: tuple[int, int] | None = setting(
        None, "--env gym:ID and presets: the size of render() frames, HxW (the env renders at "
        "it where its constructor takes a size, else frames are resized)", group="env",
        parse=render_size, metavar="HxW")
    flip: str | None = setting(
        None, "--env gym:ID and presets: flip the camera frames: vertical (upside down), "
        "horizontal or both (a preset's own by default)", group="env",
        choices=("vertical", "horizontal", "both", "none"))
    action_map: str | None = setting(
        None, "how the model's actions reach the env's Box: box (an affine map of [-1, 1] onto "
        "its bounds, clipped to them), or none: unchanged (default: a preset's own, else none)",
        group="env", choices=("box", "none"))

    def env_options(self) -> dict[str, Any]:
        """What :func:`~cosmos3_gym.envs.make_eval_env` takes of these settings."""
        from cosmos3_gym.envs.names import GYM_OPTIONS

        base = ("suite", "tasks", "image_size", "max_episode_steps", "step_budget")
        return {name: getattr(self, name) for name in (*base, *GYM_OPTIONS)}

    def make_env(self, **changes: Any) -> Any:
        """The env family these settings name (:func:`~cosmos3_gym.envs.make_eval_env`), with
        ``changes`` over :meth:`env_options`: every command builds its env here, so none drops
        a setting."""
        from cosmos3_gym.envs.names import make_eval_env

        return make_eval_env(self.env, **{**self.env_options(), **changes})



@dataclass
class LatencySettings:
    """Real-time execution: how long the policy takes, in env steps, while the env goes on
    (:mod:`cosmos3_gym.policy.realtime`; docs/evaluation.md, "Latency")."""

    latency: str = setting(
        "0", "the inference latency the envs see: 0 (each env waits for its chunk: the "
        "synchronous protocol), a duration (150ms, 0.3s: steps at the env's control rate, "
        "rounded up), a step count (3steps), measured (each batched call's own wall time) or "
        "replay:DIR (the delays an evaluation in DIR recorded); a comma list runs each value as "
        "an arm of one run folder, the control 0 where the list holds it, else its first value "
        "(eval)", group="latency",
        parse=latency_values, metavar="LATENCY")
    replan_at: int | None = setting(
        None, "ask for the next chunk when this many actions are left in an env's queue "
        "(default: the delay expected, so the queue runs out as the chunk arrives)",
        group="latency", parse=nonnegative_int, metavar="K")
    rtc: bool = setting(
        False, "real-time chunking: the actions an env executes while its next chunk is computed "
        "go into that call as clean leading action rows, so the chunk starts from them",
        group="latency")
    control_hz: float | None = setting(
        None, "the env's control rate in steps per second, for a latency given in time or "
        "measured (default: the env family's own: LIBERO 20, Meta-World 80, ColorReach 10, the "
        "presets'; a gym: id declares none)", group="latency", parse=positive_number,
        metavar="HZ")

    def latencies(self) -> list[Any]:
        """The :class:`~cosmos3_gym.policy.realtime.Latency` values of ``latency``."""
        from cosmos3_gym.policy.realtime import parse_latencies

        return parse_latencies(self.latency)

    def check_latency(self) -> None:
        """The rules that tie the latency settings together (no env, no model needed)."""
        if all(lat.kind == "none" for lat in self.latencies()):
            given = [flag for flag, on in (("--rtc", self.rtc),
                                           ("--replan-at", self.replan_at is not None)) if on]
            if given:
                raise ValueError(f"{' and '.join(given)} shape{'s' if len(given) == 1 else ''} "
                                 "real-time execution; with --latency 0 the env waits for every "
                                 "chunk. Give a --latency")
