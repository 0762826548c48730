"""``cosmos3-gym inspect`` and ``cosmos3-gym convert``: a checkpoint folder read (no weights load)
and its head resolved as a run would resolve it, then described or written as a diffusers folder;
``inspect --env NAME`` shows a benchmark preset instead.

The folder formats themselves (what is read, what is checked) are :mod:`cosmos3_gym.formats`;
this module holds the two commands' arguments and bodies only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from cosmos3_gym.settings import EnvSettings, ModelSettings, meaning


def add_inspect_arguments(parser: argparse.ArgumentParser) -> None:
    """``inspect [PATH] [--env NAME] [--json]`` and the model options a run would take."""
    env_help = meaning(next(f for f in dataclasses.fields(EnvSettings)
                            if f.name == "env").metadata["help"])
    parser.add_argument("path", metavar="PATH", nargs="?", default=None,
                        help="the checkpoint folder (any format), or a shipped name")
    parser.add_argument("--env", metavar="ENV", default=None,
                        help=f"{env_help}; inspect shows a benchmark preset, NAME or "
                             "NAME:VARIANT (instead of a checkpoint)")
    parser.add_argument("--json", dest="as_json", action="store_true",
                        help="print the rows as JSON")


def add_convert_arguments(parser: argparse.ArgumentParser) -> None:
    """``convert PATH OUT`` and the model options a run would take."""
    parser.add_argument("path", metavar="PATH", help="the checkpoint folder (any format), or "
                                                     "a shipped name")
    parser.add_argument("out", metavar="OUT", help="the diffusers folder to write (new)")


def run_inspect(model: ModelSettings, *, path: str | None, env: str | None,
                as_json: bool) -> int:
    """``cosmos3-gym inspect``: a checkpoint folder (``path``, read with ``model``'s options)
    or a benchmark preset (``env``). 0 where the folder loads as given; 1 where it is described
    but nothing names its head (``--domain`` or ``--recipe`` would); 2 for an error."""
    if env is not None:
        if path is not None:
            raise ValueError("inspect shows a checkpoint (PATH) or a preset (--env NAME); give one")
        return _inspect_preset(env)
    if path is None:
        raise ValueError("give a checkpoint PATH (or --env NAME for a preset)")
    return _checkpoint_command(model, path, None, as_json)


def run_convert(model: ModelSettings, *, path: str, out: str) -> int:
    """``cosmos3-gym convert PATH OUT``: the checkpoint written as a diffusers folder."""
    return _checkpoint_command(model, path, out, False)


def _checkpoint_command(model: ModelSettings, path: str, out: str | None, as_json: bool) -> int:
    """Read the folder (no weights), resolve its head as a run would, then describe it
    (``out`` None: ``inspect``) or write it to ``out`` as a diffusers folder (``convert``)."""
    from cosmos3_gym.formats import check_loads, contract_of, read_checkpoint
    from cosmos3_gym.source import read_head

    folder = read_checkpoint(path, vae=model.vae, tokenizer=model.tokenizer)
    policy, why = None, None
    try:  # the head a run would take (cosmos3_gym.source: one way for runs and these commands)
        policy = read_head(folder, model, path)
    except FileNotFoundError as err:
        why = str(err)
        if out is not None:  # convert writes a head; inspect says why there is none
            raise
    contract = contract_of(folder, policy.domain_name if policy else None)
    check_loads(folder)  # what a load checks before reading a weight: ok here means it loads
    if out is not None:
        from cosmos3_gym.formats.convert import convert

        written = convert(folder, policy, contract, out)
        print(f"wrote {written}: a diffusers folder of the {folder.format} checkpoint "
              f"{folder.root} ({policy.domain_name} head, {policy.describe_sampler()}); run it "
              f"with --checkpoint {written}")
        return 0
    from cosmos3_gym.formats.summary import describe, render

    rows = describe(folder, policy, contract, why)
    if as_json:
        print(json.dumps(dict(rows) | {"notes": [v for k, v in rows if k == "note"]}, indent=2))
    else:
        print(render(rows))
    if policy is None:  # described, but a run of it as given would stop at its head: not ok
        print(f"cosmos3-gym inspect: {path} does not run as given: nothing names its action head "
              "(the policy row says how to name it)", file=sys.stderr)
        return 1
    return 0


def _inspect_preset(env: str) -> int:
    """``cosmos3-gym inspect --env NAME``: the preset, and the variants the name selects."""
    from cosmos3_gym.envs.presets import PRESETS, split_preset_name

    found = split_preset_name(env)
    if found is None:
        raise ValueError(f"--env {env!r}: inspect shows a benchmark preset; expected one of "
                         f"{', '.join(PRESETS)} (optionally NAME:VARIANT)")
    preset, selector = found
    print(json.dumps({"env": env, "selected": [v.as_dict() for v in preset.select(selector)],
                      "preset": preset.as_dict()}, indent=2))
    return 0
