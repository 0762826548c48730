"""The ``cosmos3-gym`` console script: every command's options generated from its settings.

Each command runs one settings dataclass (``eval``: :class:`~cosmos3_gym.eval.evaluate.EvalConfig`,
``rollout``: :class:`~cosmos3_gym.eval.rollout.RolloutConfig`, ``bench``:
:class:`~cosmos3_gym.bench.latency.BenchConfig`, ``size``:
:class:`~cosmos3_gym.bench.synthetic.SizeConfig`, ``train``:
:class:`~cosmos3_gym.train.TrainConfig`, ``rl grpo``: :class:`~cosmos3_gym.train.grpo.GRPOConfig`),
and its parser is made from that class here (:func:`add_settings`): one option per field, its help
the field's, grouped in ``--help`` (model, runtime, env, sampler, the command's own), so a
setting is declared once. :data:`COMMANDS` is the table of commands: each one's settings class,
the function that runs it (in the command's own module, imported only when it runs) and what an
interrupt leaves behind. ``eval`` and ``rollout`` take ``--config FILE`` (JSON or YAML): a run
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
import importlib
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from cosmos3_gym.settings import GROUPS

# ---------------------------------------------------------------------- the commands


def _imported(reference: str) -> Any:
    """The object ``module:name`` names, its module imported now."""
    module, _, name = reference.partition(":")
    return getattr(importlib.import_module(module), name)


def lazy(reference: str) -> Callable[..., Any]:
    """The function ``module:name``, its module imported when it is called (so building the
    table of commands imports none of them)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return _imported(reference)(*args, **kwargs)

    call.__qualname__ = call.__name__ = reference
    return call


def _run_folder_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", default=None, metavar="FILE",
                        help="settings from a file (JSON or YAML): a run folder's config.json or "
                             "rollout.json reruns that run; options given here override it")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="where the command writes its results; the run folder (a new one, "
                             "or one this command wrote: it resumes)")


def _merge_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shards", metavar="SHARD_DIR", nargs="+",
                        help="the shard folders, every shard of the run once (any order)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="where the command writes its results; the merged run folder "
                             "(new): the run's identity, episodes, results.json, plot")


def _renamed_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--init", action=Renamed, new="--checkpoint", help=argparse.SUPPRESS)


def _finished_episodes(out: str | None) -> str:
    from cosmos3_gym.eval.results import read_episode_records

    folder = Path(str(out))
    finished = len(read_episode_records(folder)) if folder.is_dir() else 0
    return (f"{out} holds {finished} finished episode{'' if finished == 1 else 's'}; rerun the "
            "same command to resume (finished episodes are not run again)")


@dataclasses.dataclass(frozen=True)
class Command:
    """One command of the console script.

    ``run`` is called with the command's settings (an instance of the first of ``settings``,
    from its options and ``--config``) and, by name, those of the parsed arguments ``passes``
    lists that the command line gave; a command without settings gets the parsed arguments.
    An int it returns is the exit status; anything else (``None``, what it wrote) means 0.
    The parser has ``arguments``' arguments (added first), then one option per field of each
    ``settings`` class (``module:Class``) but ``exclude``. ``interrupted`` says, from the
    run's output (``--out``, or the settings' default), what a Ctrl-C leaves behind and how to
    go on.
    """

    help: str
    run: Callable[..., Any]
    interrupted: Callable[[str | None], str]
    settings: tuple[str, ...] = ()
    passes: tuple[str, ...] = ()
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    exclude: tuple[str, ...] = ()
    description: str | None = None


RL_HELP = ("reinforcement learning fine-tuning: rl grpo (GRPO on any env family, resumable, LoRA, "
           "torchrun)")
MODEL = "cosmos3_gym.settings:ModelSettings"

# Every command, in the order ``--help`` lists them (``rl grpo``: ``grpo`` under ``rl``).
COMMANDS: dict[str, Command] = {
    "eval": Command(
        "success-rate evaluation: resumable, torchrun-shardable, one record per episode",
        lazy("cosmos3_gym.eval.evaluate:run_eval_command"), _finished_episodes,
        settings=("cosmos3_gym.eval.evaluate:EvalConfig",), passes=("out",),
        arguments=_run_folder_arguments),
    "rollout": Command(
        "RL rollouts into .npz shards (resumable), or a LeRobot dataset",
        lazy("cosmos3_gym.eval.rollout:run_rollout_command"),
        lambda out: (f"the shards saved in {out} are kept; rerun the same command to collect "
                     "the remaining steps"),
        settings=("cosmos3_gym.eval.rollout:RolloutConfig",), passes=("out",),
        arguments=_run_folder_arguments),
    "bench": Command(
        "a checkpoint's latency and throughput: batched vs serial, each option on and off",
        lazy("cosmos3_gym.bench.latency:run_bench_command"),
        lambda out: f"nothing written ({out} is written at the end)",
        settings=("cosmos3_gym.bench.latency:BenchConfig",), exclude=("synthetic", "progress")),
    "size": Command(
        "a published model shape with random weights: time and memory before the weights",
        lazy("cosmos3_gym.bench.synthetic:run_size_command"),
        lambda out: f"nothing written ({out} is written at the end)",
        settings=("cosmos3_gym.bench.synthetic:SizeConfig",)),
    "train": Command(
        "train the tiny checkpoint on ColorReach expert demos (CPU, deterministic)",
        lazy("cosmos3_gym.train.commands:run_train_command"),
        lambda out: (f"{out} is as it was (the checkpoint is written whole at the end; training "
                     "does not resume); rerun the same command to train from the start"),
        settings=("cosmos3_gym.train.config:TrainConfig", "cosmos3_gym.settings:ProgressSettings"),
        passes=("progress",)),
    "rl grpo": Command(
        "GRPO fine-tuning of a Cosmos3 policy on any env family: groups of episodes from one "
        "start state, group-relative advantages, PPO's clip",
        lazy("cosmos3_gym.train.commands:run_grpo_command"),
        lambda out: lazy("cosmos3_gym.train.grpo_state:interrupted_note")(Path(out)),
        settings=("cosmos3_gym.train.config:GRPOConfig",), arguments=_renamed_options,
        description="GRPO fine-tuning of a Cosmos3 policy (docs/rl.md): a run folder that "
                    "resumes, full or LoRA training, data-parallel under torchrun."),
    "merge": Command(
        "join the folders of one evaluation's shards (eval --shard I/N) into the folder one run "
        "writes",
        lambda args: lazy("cosmos3_gym.eval.shards:run_merge_command")(args.shards, args.out),
        lambda out: "it only reads the shards; rerun the same command to write the merged folder",
        arguments=_merge_arguments),
    "report": Command(
        "print a run's results table and redraw its plot (finished or partial runs; several "
        "runs side by side)",
        lazy("cosmos3_gym.eval.report:run"),
        lambda out: "it only reads runs; rerun the same command",
        arguments=lazy("cosmos3_gym.eval.report:add_arguments")),
    "inspect": Command(
        "what a checkpoint folder is and how it would run (any format), before any weight "
        "loads; or, with --env NAME, a benchmark preset (variants, cameras, action map, success "
        "rule, versions) as JSON",
        lazy("cosmos3_gym.eval.checkpoint_commands:run_inspect"),
        lambda out: "it only reads; rerun the same command",
        settings=(MODEL,), passes=("path", "env", "as_json"),
        arguments=lazy("cosmos3_gym.eval.checkpoint_commands:add_inspect_arguments"),
        exclude=("checkpoint", "synthetic")),
    "convert": Command(
        "write a checkpoint of any format as a diffusers folder (+ action_policy.json and its "
        "statistics)",
        lazy("cosmos3_gym.eval.checkpoint_commands:run_convert"),
        lambda out: (f"nothing was written to {out} (it is written whole at the end); rerun "
                     "the same command"),
        settings=(MODEL,), passes=("path", "out"),
        arguments=lazy("cosmos3_gym.eval.checkpoint_commands:add_convert_arguments"),
        exclude=("checkpoint", "synthetic")),
}


def settings_classes() -> dict[str, type]:
    """Each command that runs a settings class of its own, and the class (imported now); not
    inspect and convert, which take the model options alone."""
    return {name: _imported(c.settings[0]) for name, c in COMMANDS.items()
            if c.settings and c.settings[0] != MODEL}


# ---------------------------------------------------------------------- the generator


def is_dataclass_type(hint: Any) -> bool:
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
        if is_dataclass_type(hints[f.name]):
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
        if is_dataclass_type(hint):
            add_settings(parser, hint, exclude=exclude, prefix=f"{prefix}{f.name}.",
                         groups=groups)
            continue
        meta = f.metadata
        if not meta.get("cli", True) or "help" not in meta:
            continue
        group = groups[meta["group"]]
        name = flag_name(f)
        default = default_of(f)
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
            text = f"{help_text} (default: {shown(default)})"
        kwargs: dict[str, Any] = {"dest": dest, "type": read, "default": argparse.SUPPRESS,
                                  "help": text, "required": f.name in required,
                                  "metavar": meta.get("metavar") or name.upper().replace("-", "_")}
        if meta.get("choices"):
            kwargs["choices"] = meta["choices"]
            kwargs.pop("metavar")
        if meta.get("const") is not None:
            kwargs.update(nargs="?", const=meta["const"])
        group.add_argument(f"--{name}", **kwargs)


def flag_name(f: dataclasses.Field) -> str:
    """The option a field is given by, without its dashes (``flow-shift``)."""
    return f.metadata.get("flag") or f.name.replace("_", "-")


def default_of(f: dataclasses.Field) -> Any:
    """A field's default value (its factory's value; ``None`` for a required field)."""
    if f.default is not dataclasses.MISSING:
        return f.default
    return f.default_factory() if f.default_factory is not dataclasses.MISSING else None


def shown(value: Any) -> str:
    """A default as the help and the settings tables show it (`none`, `1,2,4`)."""
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
        if is_dataclass_type(hint) and isinstance(value, dict):
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


class Parser(argparse.ArgumentParser):
    """argparse's parser, whose errors are two lines: the command's usage in brief (its
    positionals and required options; ``--help`` lists the rest) and the error. argparse's own
    print the whole usage above the error, ~30 lines for ``eval``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.brief_usage()}\n{self.prog}: error: {one_line(message)}\n")

    def brief_usage(self) -> str:
        """``usage: cosmos3-gym eval --out DIR [options]; cosmos3-gym eval --help lists them``."""
        needed = [a for a in self._actions if a.required or not a.option_strings]
        formatter = argparse.HelpFormatter(self.prog, width=sys.maxsize)
        formatter.add_usage(None, needed, [])
        return f"{formatter.format_help().strip()} [options]; {self.prog} --help lists them"


def build_parser() -> argparse.ArgumentParser:
    """The ``cosmos3-gym`` argument parser, every command's options from its settings."""
    parser = Parser(
        prog="cosmos3-gym",
        description="Cosmos3 action policies in Gymnasium envs, in one process:\n"
                    "success-rate evaluation, RL rollouts, benchmarks and training.",
        epilog=__doc__[__doc__.index("Examples:"):],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    algorithms = None
    for name, command in COMMANDS.items():
        sub, description = commands, command.description or command.help
        if name.startswith("rl "):
            if algorithms is None:
                rl = commands.add_parser("rl", help=RL_HELP, description=RL_HELP)
                algorithms = rl.add_subparsers(dest="algorithm", required=True,
                                               metavar="ALGORITHM")
            sub = algorithms
        p = sub.add_parser(name.split()[-1], help=command.help, description=description)
        if command.arguments is not None:
            command.arguments(p)
        for settings in command.settings:
            add_settings(p, _imported(settings), exclude=command.exclude)
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


# ---------------------------------------------------------------------- running


# Commands whose output folder is written whole at the end (renamed into place): a failure or
# an interrupt leaves the previous state.
WRITTEN_WHOLE = ("convert", "train")

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
        args = parse_command_line(parser, argv)
    except KeyboardInterrupt:  # while the parser is built: nothing ran
        sys.exit("cosmos3-gym: interrupted before anything ran")
    name = command_name(args)
    from cosmos3_gym.runner.folder import FolderInUse
    from cosmos3_gym.runner.loop import TooManyFaults

    try:
        return run_command(name, args)
    except (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError, PermissionError,
            FolderInUse) as err:
        parser.exit(2, f"cosmos3-gym {name}: error: {one_line(str(err))}\n")
    except (OSError, TooManyFaults) as err:
        kept = ("nothing was written" if name in WRITTEN_WHOLE else
                "the run's folder keeps what was saved")
        parser.exit(1, f"cosmos3-gym {name}: error: {_failure(err)}; {kept}: fix the cause "
                       "and rerun the same command to go on\n")
    except KeyboardInterrupt:
        parser.exit(130, f"cosmos3-gym {name}: interrupted; {interrupted_line(name, args)}\n")


def command_name(args: argparse.Namespace) -> str:
    """The command a parsed command line runs (``rl grpo`` for an algorithm of ``rl``)."""
    return args.command if args.command != "rl" else f"rl {args.algorithm}"


def run_command(name: str, args: argparse.Namespace) -> int:
    """Run command ``name`` (:data:`COMMANDS`) on its parsed arguments; its exit status."""
    command = COMMANDS[name]
    if not command.settings:
        code = command.run(args)
    else:
        settings = command_settings(args, _imported(command.settings[0]))
        code = command.run(settings, **{k: getattr(args, k) for k in command.passes
                                        if hasattr(args, k)})
    return code if isinstance(code, int) else 0


def interrupted_line(name: str, args: argparse.Namespace) -> str:
    """What an interrupted command leaves behind and how to go on, in one line."""
    command = COMMANDS[name]
    out = getattr(args, "out", None)
    if out is None and command.settings:  # the settings' default
        fields = dataclasses.fields(_imported(command.settings[0]))
        out = next((f.default for f in fields if f.name == "out"), None)
    return command.interrupted(out)


def parse_command_line(parser: argparse.ArgumentParser, argv: Sequence[str]
                       ) -> argparse.Namespace:
    """``argv`` read as :func:`main` reads it: an option the command lacks refused first
    (:func:`check_flags`), then the parser's own reading (an error exits with status 2)."""
    check_flags(parser, argv)
    return parser.parse_args(argv)


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


def one_line(text: str) -> str:
    """An error's text on one line: a message that quotes another's (a YAML parser's, which
    points at the column on lines of its own) has its lines joined.

    >>> one_line("--config c.yaml: not valid YAML (while scanning\\n  in line 1\\n    ^)")
    '--config c.yaml: not valid YAML (while scanning / in line 1 / ^)'
    """
    return " / ".join(line.strip() for line in text.splitlines() if line.strip())


def _failure(err: BaseException) -> str:
    """An error during a run in one line: an ``OSError`` with its file and what the system
    said (``No space left on device: runs/x/shard-00003.npz (OSError, errno 28)``)."""
    if isinstance(err, OSError) and err.strerror:
        where = f": {err.filename}" if err.filename else ""
        return f"{err.strerror}{where} ({type(err).__name__}, errno {err.errno})"
    return one_line(str(err))


if __name__ == "__main__":
    sys.exit(main())
