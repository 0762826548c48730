"""The command line answers before the model stack loads, and every run reruns from what it wrote.

* A mistyped option, ``--help`` of every command, a folder another run holds, a checkpoint
  without the statistics its env needs, an env without a prompt: each is answered with neither
  torch, diffusers nor transformers imported (checked in a fresh interpreter, which is what a
  user's shell starts).
* ``--config RUN/config.json`` (or ``rollout.json``) takes back whatever the command wrote
  there, for every kind of run the suite makes: synthetic, a registered gym id of one's own
  module (``--import`` from the current directory, as ``python -m`` finds it), LIBERO, rollouts.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cosmos3_gym.eval.cli import build_parser, main, parsers
from cosmos3_gym.runner.folder import RunFolder
from cosmos3_gym.tiny import write_tiny_checkpoint

HEAVY = ("torch", "diffusers", "transformers")
ROOT = Path(__file__).resolve().parent.parent
CONSOLE = Path(sys.executable).with_name("cosmos3-gym")

# Runs ``main`` on each command line of argv[1] (a JSON list) in this one fresh interpreter,
# printing per command: its exit status, its stderr's last line, its wall time, and the heavy
# modules imported so far (a command that imports one is named, the ones after it too).
PROBE = textwrap.dedent("""
    import contextlib, io, json, sys, time
    from cosmos3_gym.eval.cli import main
    rows = []
    for argv in json.loads(sys.argv[1]):
        err, start = io.StringIO(), time.perf_counter()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        rows.append({"argv": argv, "code": code, "last": lines[-1] if lines else "",
                     "s": time.perf_counter() - start,
                     "heavy": [m for m in HEAVY if m in sys.modules]})
    print(json.dumps(rows))
""").replace("HEAVY", repr(HEAVY))


def answered(commands: list[list[str]], cwd: Path | None = None) -> list[dict]:
    """Each command's answer from one fresh interpreter (see PROBE)."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps(commands)], cwd=cwd,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_bad_flags_help_busy_folders_and_missing_prompts_are_answered_without_torch(
        tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    commands = [["eval", "--trails", "2"], ["rl", "grpo", "--grup-size", "3"]]
    commands += [[*name.split(), "--help"] for name in parsers(build_parser())]
    commands += [
        ["eval", "--synthetic", "tiny", "--no-progress", "--out", str(busy)],
        ["eval", "--env", "gym:cosmos3_gym/ColorReach-v0", "--no-progress", "--prompt", "x",
         "--max-episode-steps", "5", "--env-kwargs", '{"speed": 3}',
         "--out", str(tmp_path / "kwargs")],
        ["eval", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "o")],
        ["rl", "grpo", "--checkpoint", str(tmp_path / "nothing"), "--out", str(tmp_path / "g")],
    ]
    with RunFolder(busy, kind="evaluation"):  # another run holds it
        start = time.perf_counter()
        rows = answered(commands)
        wall = time.perf_counter() - start
    by_command = {" ".join(r["argv"][:3]): r for r in rows}
    for row in rows:
        assert not row["heavy"], f"{row['argv']} imported {row['heavy']}: {row['last']}"
        assert row["code"] in (0, 2), row
    assert "did you mean --trials" in by_command["eval --trails 2"]["last"]
    assert "did you mean --group-size" in by_command["rl grpo --grup-size"]["last"]
    assert f"{busy} is in use by another run" in rows[-4]["last"]
    assert "--env-kwargs" in rows[-3]["last"] and "speed" in rows[-3]["last"]
    assert "no checkpoint folder at" in rows[-2]["last"] and rows[-2]["code"] == 2
    assert "no checkpoint folder at" in rows[-1]["last"] and rows[-1]["code"] == 2
    torch_s = timed([sys.executable, "-c", "import torch"])
    print(f"\n{len(rows)} answers in one fresh interpreter: {wall:.1f} s in all "
          f"(slowest {max(r['s'] for r in rows):.2f} s); `python -c 'import torch'` alone: "
          f"{torch_s:.1f} s")


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - start


@pytest.mark.libero
def test_statistics_missing_or_present_and_a_busy_folder_are_answered_without_torch(
        tmp_path: Path) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "nostats", policy_overrides={"stats": None})
    gym_id = ["eval", "--env", "gym:CartPole-v1", "--out", str(tmp_path / "cartpole")]
    # A LeRobot policy folder with its statistics (read and checked first) and a busy folder.
    busy = tmp_path / "busy"
    lerobot = ["eval", "--env", "libero", "--suite", "libero_10", "--checkpoint",
               str(ROOT / "tests" / "fixtures" / "lerobot_cosmos3" / "libero"),
               "--out", str(busy)]
    with RunFolder(busy, kind="evaluation"):
        row, cartpole, held = answered([
            ["eval", "--env", "libero", "--suite", "libero_4", "--protocol", "official",
             "--checkpoint", str(checkpoint), "--out", str(tmp_path / "out")], gym_id, lerobot])
    assert row["code"] == 2 and "has no action statistics" in row["last"], row
    assert not row["heavy"], row
    assert "names no task" in cartpole["last"] and not cartpole["heavy"], cartpole
    assert f"{busy} is in use by another run" in held["last"] and not held["heavy"], held
    assert not (tmp_path / "out").exists()


def test_an_unknown_flag_names_the_command_and_the_closest_flag(capsys) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["rollout", "--env-step", "8", "--out", "x", "--shard-stpes", "4"])
    err = capsys.readouterr().err
    # Abbreviations argparse takes (--env-step for --env-steps) are not refused.
    assert stop.value.code == 2 and err.splitlines()[0].startswith("usage: cosmos3-gym rollout")
    assert err.splitlines()[-1] == ("cosmos3-gym rollout: error: unrecognized argument "
                                    "--shard-stpes; did you mean --shard-steps?")


# ---------------------------------------------------------------------- reruns


def stored(folder: Path, name: str = "config.json") -> dict:
    return json.loads((folder / name).read_text())


def episodes(folder: Path) -> list[dict]:
    """The folder's episode records, in (task, trial) order, without their wall times."""
    rows = [json.loads(line) for line in (folder / "episodes.jsonl").read_text().splitlines()]
    return sorted(({k: v for k, v in r.items() if k != "wall_time_s"} for r in rows),
                  key=lambda r: (r["task"], r["trial"]))


def test_a_synthetic_run_and_a_rollout_rerun_from_what_they_wrote(tmp_path: Path) -> None:
    first, again = tmp_path / "eval", tmp_path / "eval-again"
    assert main(["eval", "--synthetic", "tiny", "--trials", "1", "--no-progress",
                 "--out", str(first)]) == 0
    assert main(["eval", "--config", str(first / "config.json"), "--out", str(again)]) == 0
    assert stored(again)["identity"] == stored(first)["identity"]
    assert stored(first)["session"]["checkpoint"] is None  # as given: not rewritten to tiny
    assert episodes(again) == episodes(first)

    rolled, rerolled = tmp_path / "rollout", tmp_path / "rollout-again"
    main(["rollout", "--synthetic", "tiny", "--env-steps", "8", "--num-envs", "2",
          "--no-progress", "--out", str(rolled)])
    main(["rollout", "--config", str(rolled / "rollout.json"), "--out", str(rerolled)])
    assert (stored(rerolled, "rollout.json")["identity"]["command"]
            == stored(rolled, "rollout.json")["identity"]["command"])


def test_a_folder_written_when_synthetic_runs_stored_checkpoint_tiny_resumes(
        tmp_path: Path) -> None:
    """Before, a synthetic run stored ``checkpoint: "tiny"`` beside ``synthetic``: such a folder
    still resumes and reruns."""
    first = tmp_path / "old"
    assert main(["eval", "--synthetic", "tiny", "--trials", "1", "--no-progress",
                 "--out", str(first)]) == 0
    written = stored(first)
    for part in ("identity", "session"):
        written[part]["checkpoint"] = "tiny"
    (first / "config.json").write_text(json.dumps(written))
    assert main(["eval", "--synthetic", "tiny", "--trials", "1", "--no-progress",
                 "--out", str(first)]) == 0  # complete: resumes, runs nothing
    assert main(["eval", "--config", str(first / "config.json"), "--no-progress",
                 "--out", str(tmp_path / "again")]) == 0
    # A user who names both is still refused.
    with pytest.raises(SystemExit):
        main(["eval", "--synthetic", "tiny", "--checkpoint", "tiny", "--out", str(tmp_path / "x")])


MY_ENVS = '''
import gymnasium
gymnasium.register("mytest/Reach-v0", entry_point="cosmos3_gym.envs.color_reach:ColorReachEnv",
                   max_episode_steps=6)
'''


def test_one_s_own_module_imports_from_the_current_folder_and_its_run_reruns(
        tmp_path: Path) -> None:
    """The console script (whose path starts at its bin folder, not here) finds ``--import``'s
    module in the current folder, as ``python -m`` would; the run reruns from config.json."""
    (tmp_path / "my_reach_envs.py").write_text(MY_ENVS)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    command = [str(CONSOLE), "eval", "--synthetic", "tiny", "--env", "gym:mytest/Reach-v0",
               "--import", "my_reach_envs", "--trials", "1", "--num-envs", "1", "--no-progress"]
    for argv in ([*command, "--out", "first"],
                 [str(CONSOLE), "eval", "--config", "first/config.json", "--out", "again"]):
        done = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
    assert stored(tmp_path / "again")["identity"] == stored(tmp_path / "first")["identity"]
    # Elsewhere, the module is not found: the error says where it was looked for.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run([*command, "--out", "x"], cwd=elsewhere, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 2
    assert (f"--import my_reach_envs: no module 'my_reach_envs' in the current directory "
            f"({elsewhere})") in done.stderr.splitlines()[-1]


@pytest.mark.libero
@pytest.mark.slow
def test_a_libero_run_reruns_from_what_it_wrote(tmp_path: Path) -> None:
    first, again = tmp_path / "libero", tmp_path / "libero-again"
    assert main(["eval", "--synthetic", "tiny", "--env", "libero", "--suite", "libero_10",
                 "--tasks", "0", "--trials", "1", "--num-envs", "1", "--max-episode-steps", "2",
                 "--no-progress", "--out", str(first)]) == 0
    assert main(["eval", "--config", str(first / "config.json"), "--out", str(again)]) == 0
    assert stored(again)["identity"] == stored(first)["identity"]
    assert episodes(again) == episodes(first)
