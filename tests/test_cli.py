"""The command line, generated from the settings classes: every command and its --help, one
meaning per flag name, GRPO reachable, and any run reproducible from its folder's settings."""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.eval.cli import build_parser, main, parsers
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.settings import meaning

ROOT = Path(__file__).resolve().parent.parent
# The docs generators (scripts/cli_reference.py), which the installed package does not hold.
_spec = importlib.util.spec_from_file_location("cli_reference",
                                               ROOT / "scripts" / "cli_reference.py")
reference = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(reference)

COMMANDS = {"eval", "rollout", "bench", "size", "train", "rl", "rl grpo", "report", "inspect",
            "convert", "merge"}


def test_every_command_and_its_help_runs(capsys) -> None:
    found = parsers()
    assert set(found) == COMMANDS
    for name in found:
        with pytest.raises(SystemExit) as exit_info:
            main([*name.split(), "--help"])
        assert exit_info.value.code == 0
        text = capsys.readouterr().out
        assert text.startswith(f"usage: cosmos3-gym {name}")
    with pytest.raises(SystemExit):
        main(["--help"])
    top = capsys.readouterr().out
    for name in ("eval", "rollout", "bench", "size", "train", "rl", "report"):
        assert f"\n    {name} " in top


def test_a_bad_value_is_one_error_line_under_a_one_line_usage(tmp_path: Path, capsys) -> None:
    """argparse prints the command's whole usage (~30 lines for eval) above its error; ours
    says the error on one line, under at most the command's usage in brief. An error that
    quotes another's lines (YAML's column marker) is joined onto that line too."""
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("trials: [1\nseed: 2\n")
    out = str(tmp_path / "out")
    cases = {
        ("eval", "--trials", "x", "--out", out): "argument --trials: expected an integer >= 1",
        ("eval", "--sampler", "bogus", "--out", out): "invalid choice: 'bogus'",
        ("eval", "--env", "colour_reach", "--out", out): "unknown env 'colour_reach'",
        ("eval", "--trials", "2"): "the following arguments are required: --out",
        ("eval", "--config", str(bad_yaml), "--out", out): "not valid YAML",
        ("rl", "grpo", "--group-size", "0", "--out", out): "argument --group-size",
        ("convert", "only-a-path"): "the following arguments are required: OUT",
        ("inspect",): "give a checkpoint PATH",
    }
    for argv, said in cases.items():
        with pytest.raises(SystemExit) as stop:
            main(list(argv))
        lines = capsys.readouterr().err.splitlines()
        name = " ".join(argv[:2]) if argv[0] == "rl" else argv[0]
        assert stop.value.code == 2, argv
        assert lines[-1].startswith(f"cosmos3-gym {name}: error: ") and said in lines[-1], lines
        assert len(lines) == 1 or (len(lines) == 2 and lines[0] == (
            f"usage: cosmos3-gym {name} {'--out DIR ' if argv[0] == 'eval' else ''}"
            f"{'PATH OUT ' if argv[0] == 'convert' else ''}[options]; cosmos3-gym {name} "
            "--help lists them")), lines
    assert not (tmp_path / "out").exists()


def test_grpo_is_reachable_and_described_from_help(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "rl grpo (GRPO on any env" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["rl", "--help"])
    assert "grpo" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["rl", "grpo", "--help"])
    text = capsys.readouterr().out
    for flag in ("--group-size", "--noise-level", "--iterations", "--eval-trials", "--checkpoint",
                 "--env", "--train", "--lora-rank", "--kl-coef", "--save-every"):
        assert flag in text


def _meanings() -> dict[str, dict[str, str]]:
    """flag -> {command: its meaning (the help's first clause)}."""
    found: dict[str, dict[str, str]] = {}
    for name, parser in parsers().items():
        for action in parser._actions:
            if not action.option_strings or isinstance(action, argparse._HelpAction):
                continue
            text = (action.help or "").removeprefix("turn off: ")
            for tail in (" (required)",):
                text = text.removesuffix(tail)
            text = text.split(" (default: ")[0]
            found.setdefault(action.option_strings[0], {})[name] = meaning(text)
    return found


def test_no_flag_name_has_two_meanings_across_commands() -> None:
    found = _meanings()
    clashes = {flag: per for flag, per in found.items() if len(set(per.values())) > 1}
    assert clashes == {}
    # The names the old command line gave three meanings to now name one thing each.
    assert "--steps" not in found and "--dtype" not in found and "--deterministic" not in found
    assert {"--env-steps", "--train-steps", "--denoising-steps", "--step-counts"} <= set(found)
    assert set(found["--denoising-steps"]) == {"eval", "rollout", "bench", "rl grpo"}
    assert set(found["--precision"]) == {"eval", "rollout", "bench", "size", "rl grpo"}
    for everyday in ("--checkpoint", "--env", "--suite", "--tasks", "--trials", "--num-envs",
                     "--seed", "--out", "--no-progress"):
        assert everyday in found, everyday


def test_every_option_says_what_it_does() -> None:
    for name, parser in parsers().items():
        for action in parser._actions:
            if action.option_strings:
                assert (action.help or "").strip(), (name, action.option_strings)


@pytest.mark.parametrize("name", ["cli.md", "settings.md"])
def test_the_reference_pages_are_current(name: str) -> None:
    path = ROOT / "docs" / name
    assert path.read_text(encoding="utf-8") == reference.PAGES[name]() + "\n", (
        f"docs/{name} is stale: run `python scripts/cli_reference.py`")


def test_the_settings_tables_name_every_option_with_its_default() -> None:
    from cosmos3_gym.eval.evaluate import EvalConfig

    rows = {row[0]: row for row in reference.settings_rows(EvalConfig)}
    assert rows["trials"][1:3] == ("--trials", "none")
    assert rows["sampling.flow_shift"][1] == "--flow-shift"
    assert rows["progress"][1:3] == ("--no-progress", "True")
    flags = {s for a in parsers()["eval"]._actions for s in a.option_strings}
    assert {row[1] for row in rows.values()} - {"-"} <= flags


def _eval_args(checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--checkpoint", str(checkpoint), "--tasks", "red,blue", "--trials", "2",
            "--num-envs", "2", "--seed", "5", "--image-size", "32", "--max-episode-steps", "5",
            "--denoising-steps", "2", "--no-progress", "--out", str(out), *extra]


def _episodes(out: Path) -> list[tuple]:
    return sorted((r["task"], r["trial"], r["seed"], r["success"], r["steps"], r["obs_sha256"])
                  for r in read_episode_records(out))


def test_a_run_folders_config_reruns_the_same_episodes(checkpoint: Path, tmp_path: Path) -> None:
    first = tmp_path / "first"
    assert main(_eval_args(checkpoint, first, "--noise", "fixed")) == 0
    again = tmp_path / "again"
    assert main(["eval", "--config", str(first / "config.json"), "--out", str(again),
                 "--no-progress"]) == 0
    assert _episodes(again) == _episodes(first)
    stored = json.loads((first / "config.json").read_text())["identity"]
    assert json.loads((again / "config.json").read_text())["identity"] == stored
    # An option given on the command line overrides the file.
    other = tmp_path / "other"
    assert main(["eval", "--config", str(first / "config.json"), "--seed", "6", "--out",
                 str(other), "--no-progress"]) == 0
    assert json.loads((other / "config.json").read_text())["identity"]["seed"] == 6
    assert _episodes(other) != _episodes(first)


def test_a_yaml_config_and_its_errors(checkpoint: Path, tmp_path: Path, capsys) -> None:
    config = tmp_path / "run.yaml"
    config.write_text(f"checkpoint: {checkpoint}\ntasks: [red]\ntrials: 1\nnum_envs: 1\n"
                      "image_size: 32\nmax_episode_steps: 3\nsampling:\n"
                      "  num_inference_steps: 2\n")
    assert main(["eval", "--config", str(config), "--out", str(tmp_path / "y"),
                 "--no-progress"]) == 0
    assert len(read_episode_records(tmp_path / "y")) == 1
    config.write_text("trails: 3\n")
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--config", str(config), "--out", str(tmp_path / "z")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "unknown settings ['trails']" in err
    assert not (tmp_path / "z").exists()


def test_a_rollout_folders_settings_rerun_the_same_rollouts(checkpoint: Path,
                                                            tmp_path: Path) -> None:
    from cosmos3_gym.runner import load_rollouts

    first = tmp_path / "first"
    assert main(["rollout", "--checkpoint", str(checkpoint), "--env-steps", "6", "--num-envs",
                 "2", "--image-size", "32", "--max-episode-steps", "3", "--denoising-steps",
                 "2", "--sampler", "flow_sde", "--no-progress", "--out", str(first)]) == 0
    again = tmp_path / "again"
    assert main(["rollout", "--config", str(first / "rollout.json"), "--out", str(again),
                 "--no-progress"]) == 0
    a, b = load_rollouts(first), load_rollouts(again)
    for key in ("obs", "actions", "chunk_ids", "episode_ids", "chunk_log_prob"):
        np.testing.assert_array_equal(a[key], b[key])


def test_the_parser_is_built_from_the_settings_classes() -> None:
    from cosmos3_gym.eval.evaluate import EvalConfig
    from cosmos3_gym.pipeline import SamplerConfig

    args = build_parser().parse_args(["eval", "--out", "x", "--guidance-interval", "960,1001",
                                      "--flow-shift", "3", "--precision", "bf16"])
    assert vars(args)["sampling.guidance_interval"] == (960.0, 1001.0)
    from cosmos3_gym.eval.cli import command_settings

    given = command_settings(args, EvalConfig)
    assert given.sampling == SamplerConfig(guidance_interval=(960.0, 1001.0), flow_shift=3.0)
    assert given.checkpoint is None  # what was given; the run's defaults come when resolved
    config = given.resolved()
    assert config.sampling == SamplerConfig(guidance_interval=(960.0, 1001.0), flow_shift=3.0,
                                            noise="per_chunk")
    assert config.precision == "bf16" and config.checkpoint == "tiny"
