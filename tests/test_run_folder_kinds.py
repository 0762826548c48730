"""A run folder holds one kind of run: every command refuses, before anything loads and changing
nothing, a folder that another kind of command wrote (an evaluation, rollouts, a GRPO run, the
checkpoint ``train`` writes)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3_gym.runner.folder import RUN_KINDS

SMALL = ["--no-progress"]
# Each command, given its --out, as a short run of its own kind.
COMMANDS = {
    "evaluation": ["eval", "--tasks", "red", "--trials", "1", "--num-envs", "1",
                   "--max-episode-steps", "4", *SMALL],
    "rollouts": ["rollout", "--env-steps", "4", "--num-envs", "1", *SMALL],
    "GRPO run": ["rl", "grpo", "--tasks", "red", "--iterations", "1", "--groups", "1",
                 "--group-size", "2", "--num-envs", "2", "--eval-trials", "1",
                 "--max-episode-steps", "4", "--denoising-steps", "2", *SMALL],
    "checkpoint": ["train", "--episodes", "6", "--train-steps", "2", "--batch-size", "4",
                   "--vae-steps", "0", "--vae-clips", "2", "--stats-samples", "4",
                   "--vae-holdout-episodes", "2", "--encode-batch-size", "4"],
}
# A refusal is the process's start-up and imports: 2.2 to 2.3 CPU seconds here (2026-12-05, a
# busy machine); the shortest run that loads the model and steps an env (a 4-step evaluation
# or rollout) used 20 to 22.
CPU_BOUND = 8.0


def cpu_seconds() -> float:
    """The CPU time (user and system) of this process's finished children so far."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def cli(*args: str) -> tuple[subprocess.CompletedProcess, float]:
    """The command's result and the CPU seconds it used: the work it did, which, unlike its
    wall time, a busy machine does not stretch."""
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    before = cpu_seconds()
    done = subprocess.run([sys.executable, "-m", "cosmos3_gym.eval.cli", *args],
                          capture_output=True, text=True, env=env, timeout=900)
    return done, cpu_seconds() - before


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """One finished folder of each kind, written by its own command."""
    root = tmp_path_factory.mktemp("kinds")
    made = {}
    for kind, args in COMMANDS.items():
        out = root / kind.replace(" ", "_")
        done, _ = cli(*args, "--out", str(out))
        assert done.returncode == 0, (kind, done.stderr[-3000:])
        made[kind] = out
    return made


def test_the_table_names_every_kind_a_command_writes() -> None:
    assert set(COMMANDS) == set(RUN_KINDS)


@pytest.mark.slow
@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_refuses_a_folder_of_another_kind(folders: dict[str, Path],
                                                        command: str) -> None:
    for kind, folder in folders.items():
        if kind == command:
            continue
        before = snapshot(folder)
        done, cpu = cli(*COMMANDS[command], "--out", str(folder))
        assert done.returncode == 2, (command, kind, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, (command, kind, done.stderr)
        article = "" if kind.endswith("s") else ("an " if kind[0] in "aeiou" else "a ")
        assert f"holds {article}{kind}" in lines[0], lines[0]
        assert snapshot(folder) == before  # nothing written, nothing removed
        # Refused before the model stack loads: the process's start-up and imports only, in CPU
        # seconds (wall time ran past 6 s on a machine busy with five processes on two cores).
        assert cpu < CPU_BOUND, (command, kind, cpu)


@pytest.mark.slow
def test_merge_refuses_a_folder_of_another_kind(folders: dict[str, Path]) -> None:
    """``merge`` writes an evaluation's folder: another kind's is refused before any shard is
    read (the shard given here is no shard at all), in one line, changing nothing."""
    for kind, folder in folders.items():
        if kind == "evaluation":
            continue
        before = snapshot(folder)
        done, cpu = cli("merge", str(folders["evaluation"]), "--out", str(folder))
        assert done.returncode == 2, (kind, done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "holds" in lines[0] and kind in lines[0], done.stderr
        assert snapshot(folder) == before
        assert cpu < CPU_BOUND, (kind, cpu)
