"""The ``cosmos3-gym`` console script: every command's options generated from its settings.

Each command runs one settings dataclass (``eval``: :class:`~cosmos3_gym.eval.evaluate.EvalConfig`,
``rollout``: :class:`~cosmos3_gym.eval.rollout.RolloutConfig`, ``bench``:
:class:`~cosmos3_gym.bench.latency.BenchConfig`, ``size``:
:class:`~cosmos3_gym.bench.synthetic.SizeConfig`, ``train``:
:class:`~cosmos3_gym.train.TrainConfig`, ``rl grpo``: :class:`~cosmos3_gym.train.grpo.GRPOConfig`),
and its parser is made from that class here (:func:`add_settings`): one option per field, its help
the field's, grouped in ``--help`` (model, runtime, env, sampler, the command's own), so a
setting is declared once. ``eval`` and ``rollout`` take ``--config FILE`` (JSON or YAML): a run
folder's ``config.json`` (or ``rollout.json``) given back with a new ``--out`` runs the same
episodes; options on the command line override the file.

Examples:

    cosmos3-gym eval --trials 10 --out runs/color_reach            # built-in env, tiny checkpoint
    cosmos3-gym eval --checkpoint PATH --env libero --suite libero_10 --tasks 0,3 \\
        --trials 50 --num-envs 8 --async-envs --seed 7 --out runs/libero_10
    cosmos3-gym eval --checkpoint PATH --env libero --suite libero_4 --protocol official \\
        --num-envs 8 --async-envs --out runs/libero_4     # NVIDIA's LIBERO table (docs/libero.md)
    cosmos3-gym eval --config runs/libero_10/config.json --out runs/again   # the same episodes
    torchrun --nproc_per_node 2 -m cosmos3_gym.eval.cli eval ... --out DIR   # rank 0 merges
    cosmos3-gym rollout --env-steps 256 --num-envs 4 --sampler flow_sde --out runs/rollouts
    cosmos3-gym bench --checkpoint PATH --out bench.json          # on the GPU where there is one
    cosmos3-gym size --synthetic nano --out nano.json             # a published shape, no weights
    cosmos3-gym train --out runs/tiny                              # the shipped tiny checkpoint
    cosmos3-gym rl grpo --env-kwargs '{"max_speed": 0.28}' --out runs/grpo   # GRPO, ColorReach
    cosmos3-gym report runs/right runs/shuffled --out compare.png  # two runs in one plot
    cosmos3-gym eval --shard 0/2 --out runs/part0   # one of two jobs; then:
    cosmos3-gym merge runs/part0 runs/part1 --out runs/whole
    cosmos3-gym inspect /models/Cosmos3-Nano-Policy-LIBERO_10       # format, head, sampler
    cosmos3-gym convert /models/export OUT --vae /models/Cosmos3-Nano \
        --recipe nano-libero10-export --action-stats stats.json    # a diffusers folder
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cosmos3_gym.settings import GROUPS, ProgressSettings

# The commands and the settings class each runs (imported when the parser is built).
COMMAND_HELP = {
    "eval": "success-rate evaluation: resumable, torchrun-shardable, one record per episode",
    "rollout": "RL rollouts into .npz shards (resumable), or a LeRobot dataset",
    "bench": "a checkpoint's latency and throughput: batched vs serial, each option on and off",
    "size": "a published model shape with random weights: time and memory before the weights",
    "train": "train the tiny checkpoint on ColorReach expert demos (CPU, deterministic)",
    "rl": "reinforcement learning fine-tuning: rl grpo (GRPO on any env family, resumable, "
          "LoRA, torchrun)",
    "report": "print a run's results table and redraw its plot (finished or partial runs; "
              "several runs side by side)",
    "inspect": "what a checkpoint folder is and how it would run (any format), before any weight "
               "loads; or, with --env NAME, a benchmark preset (variants, cameras, action map, "
               "success rule, versions) as JSON",
    "convert": "write a checkpoint of any format as a diffusers folder (+ action_policy.json and "
               "its statistics)",
    "merge": "join the folders of one evaluation's shards (eval --shard I/N) into the folder one "
             "run writes",
}


def _settings_classes() -> dict[str, type]:
    from cosmos3_gym.bench.latency import BenchConfig
    from cosmos3_gym.bench.synthetic import SizeConfig
    from cosmos3_gym.eval.evaluate import EvalConfig
    from cosmos3_gym.eval.rollout import RolloutConfig
    from cosmos3_gym.train.config import GRPOConfig, TrainConfig

    return {"eval": EvalConfig, "rollout": RolloutConfig, "bench": BenchConfig,
            "size": SizeConfig, "train": TrainConfig, "rl grpo": GRPOConfig}


# ---------------------------------------------------------------------- the generator


def _is_dataclass_type(hint: Any) -> bool:
    return isinstance(hint, type) and dataclasses.is_dataclass(hint)


def _reader(hint: Any, parse: Callable[[str], Any] | None) -> Callable[[str], Any] | None:
    """How an option's text becomes the field's value (None: a bool flag)."""
    if parse is None:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        base = args[0] if typing.get_origin(hint) in (typing.Union, types.UnionType) else hint
        if base is bool:
            return None
        parse = base if base in (int, float, str) else str

    def read(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None

    read.__name__ = getattr(parse, "__name__", "value")
    return read


def _groups_of(cls: type, exclude: Sequence[str]) -> list[str]:
    """The ``--help`` groups ``cls``'s settings fall in, in :data:`GROUPS` order."""
    hints = typing.get_type_hints(cls)
    found: set[str] = set()
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        if _is_dataclass_type(hints[f.name]):
            found.update(_groups_of(hints[f.name], exclude))
        elif f.metadata.get("cli", True) and "help" in f.metadata:
            found.add(f.metadata["group"])
    return [g for g in GROUPS if g in found]


def add_settings(parser: argparse.ArgumentParser, cls: type, *, required: Sequence[str] = (),
                 exclude: Sequence[str] = (), prefix: str = "",
                 groups: dict[str, Any] | None = None) -> None:
    """One option per field of ``cls`` (nested settings dataclasses included), in ``--help``
    groups (model, runtime, env, sampler, then the command's own). Options are absent from the
    namespace unless given (so ``--config`` values and the classes' own defaults stay below
    what the command line says); ``required`` fields must be given. Each option's dest is the
    field's dotted path (``sampling.flow_shift``)."""
    if groups is None:
        groups = {g: parser.add_argument_group(GROUPS[g]) for g in _groups_of(cls, exclude)}
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude:
            continue
        hint = hints[f.name]
        if _is_dataclass_type(hint):
            add_settings(parser, hint, exclude=exclude, prefix=f"{prefix}{f.name}.",
                         groups=groups)
            continue
        meta = f.metadata
        if not meta.get("cli", True) or "help" not in meta:
            continue
        group = groups[meta["group"]]
        name = _flag_name(f)
        default = _default_of(f)
        dest = prefix + f.name
        read = _reader(hint, meta.get("parse"))
        help_text = meta["help"].replace("%", "%%")  # argparse formats help with %
        if read is None:  # a bool: the flag turns the default over
            text = f"turn off: {help_text}" if name.startswith("no-") else help_text
            group.add_argument(f"--{name}", dest=dest, action="store_const",
                               const=not default, default=argparse.SUPPRESS, help=text)
            continue
        if f.name in required:
            text = f"{help_text} (required)"
        elif "default" in help_text:
            text = help_text  # the help says what the default is
        else:
            text = f"{help_text} (default: {_shown(default)})"
        kwargs: dict[str, Any] = {"dest": dest, "type": read, "default": argparse.SUPPRESS,
                                  "help": text, "required": f.name in required,
                                  "metavar": meta.get("metavar") or name.upper().replace("-", "_")}
        if meta.get("choices"):
            kwargs["choices"] = meta["choices"]
            kwargs.pop("metavar")
        if meta.get("const") is not None:
            kwargs.update(nargs="?", const=meta["const"])
        group.add_argument(f"--{name}", **kwargs)


def _flag_name(f: dataclasses.Field) -> str:
    """The option a field is given by, without its dashes (``flow-shift``)."""
    return f.metadata.get("flag") or f.name.replace("_", "-")


def _default_of(f: dataclasses.Field) -> Any:
    """A field's default value (its factory's value; ``None`` for a required field)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def _shown(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return "none" if value is None else str(value)


def settings_from(cls: type, given: dict[str, Any], *, source: str = "the command line") -> Any:
    """An instance of ``cls`` from flat dotted keys (``sampling.flow_shift``) or a nested dict
    (as ``dataclasses.asdict`` writes it); a key ``cls`` does not have is an error naming it."""
    nested: dict[str, Any] = {}
    for key, value in given.items():
        head, _, rest = key.partition(".")
        if rest:
            nested.setdefault(head, {})[rest] = value
        else:
            nested[head] = value
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(nested) - names)
    if unknown:
        raise ValueError(f"{source}: unknown settings {unknown} for {cls.__name__}; known: "
                         f"{sorted(names)}")
    kwargs = {}
    for name, value in nested.items():
        hint = hints[name]
        if _is_dataclass_type(hint) and isinstance(value, dict):
            value = settings_from(hint, value, source=source)
        elif isinstance(value, list) and typing.get_origin(hint) in (typing.Union,
                                                                     types.UnionType):
            if any(typing.get_origin(a) is tuple for a in typing.get_args(hint)):
                value = tuple(value)  # JSON holds a tuple as a list
        kwargs[name] = value
    return cls(**kwargs)


def read_config_file(path: str) -> dict[str, Any]:
    """The settings a ``--config`` file holds: a run folder's ``config.json`` (its
    ``session``), a rollout folder's ``rollout.json`` (its ``session``), or a JSON or YAML
    mapping of settings."""
    from cosmos3_gym.jsonio import read_json

    file = Path(path)
    if file.suffix in (".yaml", ".yml"):
        import yaml

        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise FileNotFoundError(f"--config: no file at {file}") from None
        except yaml.YAMLError as err:
            raise ValueError(f"--config {file}: not valid YAML ({err})") from None
    else:
        data = read_json(file, what="--config file (JSON or YAML settings)")
    if not isinstance(data, dict):
        raise ValueError(f"--config {file}: expected a mapping of settings; found "
                         f"{type(data).__name__}")
    from cosmos3_gym.settings import stored_model_source

    return stored_model_source(dict(data.get("session", data)))


# ---------------------------------------------------------------------- the parser


def build_parser() -> argparse.ArgumentParser:
    """The ``cosmos3-gym`` argument parser, every command's options from its settings."""
    parser = argparse.ArgumentParser(
        prog="cosmos3-gym",
        description="Cosmos3 action policies in Gymnasium envs, in one process:\n"
                    "success-rate evaluation, RL rollouts, benchmarks and training.",
        epilog=__doc__[__doc__.index("Examples:"):],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    classes = _settings_classes()
    for name in ("eval", "rollout"):
        p = sub.add_parser(name, help=COMMAND_HELP[name], description=COMMAND_HELP[name])
        p.add_argument("--config", default=None, metavar="FILE",
                       help="settings from a file (JSON or YAML): a run folder's config.json or "
                            "rollout.json reruns that run; options given here override it")
        p.add_argument("--out", required=True, metavar="DIR",
                       help="where the command writes its results; the run folder (a new one, "
                            "or one this command wrote: it resumes)")
        add_settings(p, classes[name])
    for name in ("bench", "size"):
        p = sub.add_parser(name, help=COMMAND_HELP[name], description=COMMAND_HELP[name])
        add_settings(p, classes[name], exclude=("synthetic", "progress") if name == "bench"
                     else ())
    train = sub.add_parser("train", help=COMMAND_HELP["train"], description=COMMAND_HELP["train"])
    add_settings(train, classes["train"])
    add_settings(train, ProgressSettings)
    rl = sub.add_parser("rl", help=COMMAND_HELP["rl"], description=COMMAND_HELP["rl"])
    algorithms = rl.add_subparsers(dest="algorithm", required=True, metavar="ALGORITHM")
    grpo = algorithms.add_parser(
        "grpo", help="GRPO fine-tuning of a Cosmos3 policy on any env family: groups of "
                     "episodes from one start state, group-relative advantages, PPO's clip",
        description="GRPO fine-tuning of a Cosmos3 policy (docs/rl.md): a run folder that "
                    "resumes, full or LoRA training, data-parallel under torchrun.")
    add_settings(grpo, classes["rl grpo"])
    grpo.add_argument("--init", action=Renamed, new="--checkpoint", help=argparse.SUPPRESS)
    from cosmos3_gym.eval import report

    report.add_arguments(sub.add_parser("report", help=COMMAND_HELP["report"],
                                        description=COMMAND_HELP["report"]))
    from cosmos3_gym.settings import EnvSettings, ModelSettings, meaning

    env_help = meaning(next(f for f in dataclasses.fields(EnvSettings)
                            if f.name == "env").metadata["help"])
    for name in ("inspect", "convert"):
        p = sub.add_parser(name, help=COMMAND_HELP[name], description=COMMAND_HELP[name])
        if name == "convert":
            p.add_argument("path", metavar="PATH", help="the checkpoint folder (any format), or "
                                                         "a shipped name")
            p.add_argument("out", metavar="OUT", help="the diffusers folder to write (new)")
        else:
            p.add_argument("path", metavar="PATH", nargs="?", default=None,
                           help="the checkpoint folder (any format), or a shipped name")
            p.add_argument("--env", metavar="ENV", default=None,
                           help=f"{env_help}; inspect shows a benchmark preset, NAME or "
                                "NAME:VARIANT (instead of a checkpoint)")
            p.add_argument("--json", action="store_true", help="print the rows as JSON")
        add_settings(p, ModelSettings, exclude=("checkpoint", "synthetic"))
    merge = sub.add_parser("merge", help=COMMAND_HELP["merge"], description=COMMAND_HELP["merge"])
    merge.add_argument("shards", metavar="SHARD_DIR", nargs="+",
                       help="the shard folders, every shard of the run once (any order)")
    merge.add_argument("--out", required=True, metavar="DIR",
                       help="where the command writes its results; the merged run folder "
                            "(new): the run's identity, episodes, results.json, plot")
    return parser


class Renamed(argparse.Action):
    """An option that was renamed: refused with one error naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, nargs="?", default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        parser.error(f"{option_string} is now {self.new} (the same value: a checkpoint folder "
                     f"or a shipped name); run again with {self.new}")


def parsers(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name (``rl grpo`` for the nested one)."""
    parser = parser or build_parser()
    found: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    found[f"{prefix}{name}"] = child
                    walk(child, f"{prefix}{name} ")

    walk(parser, "")
    return found


def cli_reference() -> str:
    """The command line's reference page (``docs/cli.md``), generated from the parsers: every
    command's ``--help``, as the command prints it."""
    parser = build_parser()
    width = {"COLUMNS": "100"}
    old = {k: os.environ.get(k) for k in width}
    os.environ.update(width)  # argparse wraps help to $COLUMNS: the same page on any terminal
    try:
        pages = [("cosmos3-gym", parser.format_help())]
        pages += [(f"cosmos3-gym {name}", child.format_help())
                  for name, child in parsers(parser).items()]
    finally:
        for key, value in old.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    lines = ["# Command-line reference", "",
             "Generated from the parsers (`python scripts/cli_reference.py`; a test checks it is "
             "current). Every option is a field of the command's settings class "
             "(`cosmos3_gym/settings.py`, `SamplerConfig`, and each command's config), so its "
             "default and help live in one place.", ""]
    for title, text in pages:
        lines += [f"## `{title}`", "", "```text", text.rstrip(), "```", ""]
    return "\n".join(lines)


def settings_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """``(field, flag, default, meaning)`` of every setting of ``cls``, nested ones dotted
    (``sampling.flow_shift``); a field without a flag shows ``-``."""
    hints = typing.get_type_hints(cls)
    rows = []
    for f in dataclasses.fields(cls):
        if _is_dataclass_type(hints[f.name]):
            rows += settings_rows(hints[f.name], f"{prefix}{f.name}.")
            continue
        if "help" not in f.metadata:
            continue
        flag = f"--{_flag_name(f)}" if f.metadata.get("cli", True) else "-"
        rows.append((prefix + f.name, flag, _shown(_default_of(f)), f.metadata["help"]))
    return rows


def settings_reference() -> str:
    """The settings classes' reference page (``docs/settings.md``): each command's settings as
    a table of field, flag, default and meaning, generated from the same fields as the options.
    """
    lines = ["# Settings reference", "",
             "Generated from the settings classes (`python scripts/cli_reference.py`; a test "
             "checks it is current). Each command runs one settings dataclass; its fields are the "
             "command's options (docs/cli.md) and the keywords of the class in Python "
             "(`EvalConfig(env=\"libero\", suite=\"libero_10\", trials=50)`). A run folder's "
             "`config.json` holds them under `session`, and `--config FILE` takes them back.", ""]
    for command, cls in _settings_classes().items():
        lines += [f"## `{cls.__name__}`", "",
                  f"`{cls.__module__}.{cls.__name__}`: `cosmos3-gym {command}`.", "",
                  "| field | flag | default | meaning |", "|---|---|---|---|"]
        for name, flag, default, text in settings_rows(cls):
            cell = text.replace("|", "\\|")
            lines.append(f"| `{name}` | `{flag}` | `{default}` | {cell} |")
        lines.append("")
    return "\n".join(lines)


# ---------------------------------------------------------------------- running


# Entries of a parsed command line that are the parser's own, not the command's settings.
PARSER_ENTRIES = ("command", "algorithm", "config")


def given_settings(args: argparse.Namespace, cls: type) -> dict[str, Any]:
    """The settings the command line gave (dotted keys) that ``cls`` holds."""
    names = {f.name for f in dataclasses.fields(cls)}
    return {k: v for k, v in vars(args).items()
            if k not in PARSER_ENTRIES and k.partition(".")[0] in names}


def command_settings(args: argparse.Namespace, cls: type) -> Any:
    """The command's settings: the class's defaults, then ``--config``'s, then the options."""
    base = read_config_file(args.config) if getattr(args, "config", None) else {}
    flat = {**_flatten(base), **given_settings(args, cls)}
    return settings_from(cls, flat, source=f"--config {args.config}" if base else
                         "the command line")


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict) and key in ("sampling",):
            out.update(_flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``cosmos3-gym`` console script.

    Bad input (a missing or broken checkpoint, a mismatched or busy or unwritable run folder,
    an unknown task...) ends with one ``error:`` line and exit status 2, like argparse's own
    errors, before anything runs; a failure during a run that is not a bug (a full disk, envs
    that keep faulting) ends with one ``error:`` line and exit status 1, the folder resumable;
    Ctrl-C ends with one line saying what was saved and how to go on, exit status 130; other
    exceptions keep their traceback, since they are bugs to report.
    """
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        parser = build_parser()
        check_flags(parser, argv)
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # while the parser is built: nothing ran
        sys.exit("cosmos3-gym: interrupted before anything ran")
    command = args.command if args.command != "rl" else f"rl {args.algorithm}"
    from cosmos3_gym.runner.folder import FolderInUse
    from cosmos3_gym.runner.loop import TooManyFaults

    try:
        return _run(args, command)
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError,
            FolderInUse) as err:
        parser.exit(2, f"cosmos3-gym {command}: error: {err}\n")
    except (OSError, TooManyFaults) as err:
        parser.exit(1, f"cosmos3-gym {command}: error: {_failure(err)}; the run's folder keeps "
                       "what was saved: fix the cause and rerun the same command to go on\n")
    except KeyboardInterrupt:
        parser.exit(130, f"cosmos3-gym {command}: interrupted; {_interrupted(command, args)}\n")


def check_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """Refuse an option the command does not have, before anything else is said about the
    command line: the command's own usage, and the closest option it has
    (``--trails``: did you mean ``--trials``?). argparse alone names it after any missing
    required option, with the top-level usage and no suggestion."""
    import difflib

    commands = parsers(parser)
    name = next((" ".join(argv[:n]) for n in (2, 1) if " ".join(argv[:n]) in commands), None)
    if name is None:
        return  # argparse says what the commands are
    sub = commands[name]
    known = [s for action in sub._actions for s in action.option_strings if s.startswith("--")]
    for token in argv[len(name.split()):]:
        if token == "--":
            return
        flag = token.split("=", 1)[0]
        if not flag.startswith("--") or flag in known:
            continue
        if sum(k.startswith(flag) for k in known) == 1:
            continue  # argparse takes a unique abbreviation
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        hint = (f"; did you mean {close[0]}?" if close else
                f"; see cosmos3-gym {name} --help")
        sub.error(f"unrecognized argument {flag}{hint}")


def _failure(err: BaseException) -> str:
    """An error during a run in one line: an ``OSError`` with its file and what the system
    said (``No space left on device: runs/x/shard-00003.npz (OSError, errno 28)``)."""
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where} ({type(err).__name__}, errno {err.errno})"
    return str(err)


def _interrupted(command: str, args: argparse.Namespace) -> str:
    """What an interrupted command leaves behind and how to go on, in one line."""
    out = getattr(args, "out", None)
    if out is None and command in _settings_classes():  # the class's default
        out = next(f.default for f in dataclasses.fields(_settings_classes()[command])
                   if f.name == "out")
    if command == "train":
        return (f"the checkpoint in {out} is incomplete (training does not resume); rerun the "
                "same command to train from the start")
    if command == "report":
        return "it only reads runs; rerun the same command"
    if command == "merge":
        return "it only reads the shards; rerun the same command to write the merged folder"
    if command == "inspect":
        return "it only reads; rerun the same command"
    if command == "convert":
        return (f"{args.out} may hold a partial conversion: delete it and rerun the same "
                "command")
    if command == "eval":
        from cosmos3_gym.eval.results import read_episode_records

        folder = Path(args.out)
        finished = len(read_episode_records(folder)) if folder.is_dir() else 0
        return (f"{args.out} holds {finished} finished episode{'' if finished == 1 else 's'}; "
                "rerun the same command to resume (finished episodes are not run again)")
    if command == "rollout":
        return (f"the shards saved in {args.out} are kept; rerun the same command to collect "
                "the remaining steps")
    if command == "rl grpo":
        return (f"{out} keeps its newest saved state (state-*/) and held-out evaluations; rerun "
                "the same command to resume from that state")
    return f"nothing written ({out} is written at the end)"


def _run(args: argparse.Namespace, command: str) -> int:
    classes = _settings_classes()
    if command == "report":
        from cosmos3_gym.eval import report

        return report.run(args)
    if command == "merge":
        from cosmos3_gym.eval.shards import run_merge_command

        return run_merge_command(args.shards, args.out)
    if command == "inspect" and args.env is not None:
        if args.path is not None:
            raise ValueError("inspect shows a checkpoint (PATH) or a preset (--env NAME); give one")
        return _inspect(args.env)
    if command in ("inspect", "convert"):
        if args.path is None:
            raise ValueError("inspect: give a checkpoint PATH (or --env NAME for a preset)")
        return _checkpoint_command(args, command)
    config = command_settings(args, classes[command])
    if command == "eval":
        from cosmos3_gym.eval.evaluate import run_eval_command

        return run_eval_command(config, args.out)
    if command == "rollout":
        from cosmos3_gym.eval.rollout import run_rollout_command

        run_rollout_command(config, args.out)
        return 0
    if command == "bench":
        from cosmos3_gym.bench.latency import run as run_bench

        run_bench(config)
        return 0
    if command == "size":
        from cosmos3_gym.bench.synthetic import run as run_size

        run_size(config)
        return 0
    progress = getattr(args, "progress", True)
    if command == "train":
        from cosmos3_gym.runner.folder import RunFolder

        # A folder of another kind of run is refused before torch loads.
        RunFolder(config.out, kind="checkpoint").check_free()
        from cosmos3_gym.train.trainer import run_train_command

        return run_train_command(config, progress=progress)
    run = config.preflight()  # every check that needs no model, before torch loads
    from cosmos3_gym.train.grpo import run_grpo

    run_grpo(config, progress=config.progress, run=run)
    return 0


def _checkpoint_command(args: argparse.Namespace, command: str) -> int:
    """``inspect PATH`` and ``convert PATH OUT``: read the folder (no weights), resolve its
    head as a run would, then describe it or write it as a diffusers folder."""
    from cosmos3_gym.checkpoint import (
        check_action_stats,
        check_statistics_present,
        read_action_stats,
        resolve_policy,
    )
    from cosmos3_gym.formats import contract_of, read_checkpoint
    from cosmos3_gym.settings import ModelSettings

    model = settings_from(ModelSettings, given_settings(args, ModelSettings))
    folder = read_checkpoint(args.path, vae=model.vae, tokenizer=model.tokenizer)
    policy, why = None, None
    try:
        policy = resolve_policy(folder.root, domain=model.domain, recipe=model.recipe,
                                declared=folder.policy)
    except FileNotFoundError as err:
        why = str(err)
        if command == "convert":
            raise
    if policy is not None and model.action_stats is not None:
        stats = read_action_stats(model.action_stats)
        check_action_stats(stats, policy, f"action statistics {model.action_stats}")
        policy = dataclasses.replace(policy, stats=stats)
    contract = contract_of(folder, policy.domain_name if policy else None)
    if command == "convert":
        from cosmos3_gym.formats.convert import convert

        check_statistics_present(policy, folder.format, folder.root)
        out = convert(folder, policy, contract, args.out)
        print(f"wrote {out}: a diffusers folder of the {folder.format} checkpoint {folder.root} "
              f"({policy.domain_name} head, {policy.describe_sampler()}); run it with "
              f"--checkpoint {out}")
        return 0
    from cosmos3_gym.formats.summary import describe, render

    rows = describe(folder, policy, contract, why)
    if args.json:
        import json

        print(json.dumps(dict(rows) | {"notes": [v for k, v in rows if k == "note"]}, indent=2))
    else:
        print(render(rows))
    return 0


def _inspect(env: str) -> int:
    """``cosmos3-gym inspect --env NAME``: the preset, and the variants the name selects."""
    import json

    from cosmos3_gym.envs.presets import PRESETS, split_preset_name

    found = split_preset_name(env)
    if found is None:
        raise ValueError(f"--env {env!r}: inspect shows a benchmark preset; expected one of "
                         f"{', '.join(PRESETS)} (optionally NAME:VARIANT)")
    preset, selector = found
    print(json.dumps({"env": env, "selected": [v.as_dict() for v in preset.select(selector)],
                      "preset": preset.as_dict()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
