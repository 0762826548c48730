"""A run folder is held by one command at a time and bound to one run (cosmos3_gym.runner.folder):
two commands never mix in one folder, a killed run's lock is taken over, and the identity names
no path, so a moved folder resumes."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cosmos3_gym.runner import FolderInUse, RunFolder, RunMismatch

HOLD = textwrap.dedent("""
    import sys, time
    from cosmos3_gym.runner import RunFolder
    with RunFolder(sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
""")


def _holder(path: Path) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_held_folder_refuses_a_second_run_naming_the_holder(tmp_path: Path) -> None:
    child = _holder(tmp_path / "run")
    try:
        with pytest.raises(FolderInUse, match=rf"in use by another run \(pid {child.pid} on "):
            RunFolder(tmp_path / "run").open()
    finally:
        child.kill()
        child.wait()


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path: Path) -> None:
    child = _holder(tmp_path / "run")
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    with RunFolder(tmp_path / "run") as held:  # no clean-up needed
        assert held.held


def test_ranks_of_one_launch_hold_their_own_locks(tmp_path: Path) -> None:
    with RunFolder(tmp_path, rank=0, world_size=2), RunFolder(tmp_path, rank=1, world_size=2):
        with pytest.raises(FolderInUse):
            RunFolder(tmp_path).open()  # a single-process run is rank 0 too


def test_an_identity_binds_once_records_exist(tmp_path: Path) -> None:
    with RunFolder(tmp_path):  # an earlier attempt, which recorded an incident and no episode
        removed = tmp_path / "incidents.jsonl"
        removed.write_text("{}\n")
    with RunFolder(tmp_path) as held:
        held.bind("config.json", {"seed": 0}, bound=False)
        # Nothing recorded yet: a corrected command takes the folder over, and the files of
        # the attempt that recorded nothing go.
        held.bind("config.json", {"seed": 1}, bound=False, replaced=lambda: [removed])
        assert not removed.exists()
        assert json.loads((tmp_path / "config.json").read_text())["identity"] == {"seed": 1}
        with pytest.raises(RunMismatch, match=r"holds a different run.*'seed'"):
            held.bind("config.json", {"seed": 2}, bound=True)
        assert json.loads((tmp_path / "config.json").read_text())["identity"] == {"seed": 1}


def test_leftover_temporary_files_of_dead_processes_are_removed(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with RunFolder(tmp_path):  # the killed run's folder holds its lock file
        pass
    stale = tmp_path / f".results.json.{dead.pid}.tmp"
    stale.write_bytes(b"")
    mine = tmp_path / f".x.json.{os.getpid()}.tmp"
    mine.write_bytes(b"")
    with RunFolder(tmp_path):
        assert not stale.exists() and mine.exists()


def test_a_folder_that_cannot_be_written_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).startswith(str(tmp_path / "ro")) and flags & os.O_CREAT:
            raise OSError(30, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(os, "open", read_only)
    with pytest.raises(PermissionError, match=r"cannot write to .*ro \(Read-only file system\)"):
        RunFolder(tmp_path / "ro").open()
    monkeypatch.undo()
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match="is a file; expected a folder"):
        RunFolder(tmp_path / "file" / "run").open()


def test_the_lock_outlives_a_busy_loop(tmp_path: Path) -> None:
    with RunFolder(tmp_path):
        start = time.perf_counter()
        with pytest.raises(FolderInUse):
            RunFolder(tmp_path).open()
        assert time.perf_counter() - start < 1.0  # refused at once, never waits


def test_a_folder_holds_one_kind_of_run(tmp_path: Path) -> None:
    with RunFolder(tmp_path / "ev", kind="evaluation") as held:
        held.bind("config.json", {"seed": 0}, bound=False)
    stored = json.loads((tmp_path / "ev" / "config.json").read_text())
    assert stored["kind"] == "evaluation" and stored["identity"] == {"seed": 0}
    with pytest.raises(RunMismatch, match=r"holds an evaluation \(config.json\); this command "
                                          r"writes rollouts, and a folder holds one kind"):
        RunFolder(tmp_path / "ev", kind="rollouts").open()
    # Refused before anything is written, and the lock is not kept.
    assert sorted(p.name for p in (tmp_path / "ev").iterdir()) == [".lock.rank0", "config.json"]
    with RunFolder(tmp_path / "ev", kind="evaluation"):
        pass
    (tmp_path / "ro").mkdir()
    (tmp_path / "ro" / "shard-00000.npz").write_bytes(b"")
    with pytest.raises(RunMismatch, match=r"holds rollouts \(shard-00000.npz\)"):
        RunFolder(tmp_path / "ro", kind="evaluation").open()
    # An identity file that names another kind (copied by hand) is refused too.
    (tmp_path / "odd").mkdir()
    (tmp_path / "odd" / "config.json").write_text('{"kind": "rollouts", "identity": {}}')
    with pytest.raises(RunMismatch, match=r"config.json is the identity of rollouts"):
        RunFolder(tmp_path / "odd", kind="evaluation").open()
    with RunFolder(tmp_path / "ro"):  # no kind named: any folder
        pass


# Holds the folder with --async-envs' vector env: two ColorReach workers forked after the lock
# was taken, the second one hung in its step (a simulator that never answers), then prints the
# workers' pids and waits to be killed.
HOLD_WITH_WORKERS = textwrap.dedent("""
    import sys, time
    import numpy as np
    from cosmos3_gym.envs import ColorReachEnv
    from cosmos3_gym.runner import RunFolder
    import gymnasium as gym

    class Hangs(ColorReachEnv):
        def step(self, action):
            time.sleep(600)

    with RunFolder(sys.argv[1]):
        envs = gym.vector.AsyncVectorEnv([ColorReachEnv, Hangs], context="fork")
        envs.reset(seed=0)
        envs.step_async(np.zeros((2, 2), np.float32))
        print(" ".join(str(p.pid) for p in envs.processes), flush=True)
        time.sleep(600)
""")


def test_a_killed_holders_env_workers_do_not_keep_its_lock(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLD_WITH_WORKERS, str(tmp_path / "run")],
                              stdout=subprocess.PIPE, text=True)
    workers = [int(pid) for pid in holder.stdout.readline().split()]
    try:
        assert len(workers) == 2
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait()
        assert os.path.exists(f"/proc/{workers[1]}")  # the hung worker outlives its holder
        with RunFolder(tmp_path / "run") as held:  # at once, whatever the workers do
            assert held.held
    finally:
        holder.kill()
        holder.wait()
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_a_forked_child_never_unlocks_its_parents_folder(tmp_path: Path) -> None:
    import multiprocessing

    with RunFolder(tmp_path) as held:
        child = multiprocessing.get_context("fork").Process(target=_close_in_child,
                                                            args=(str(tmp_path),))
        child.start()
        child.join(30)
        assert child.exitcode == 0
        assert held.held
        with pytest.raises(FolderInUse):  # still held by this process
            RunFolder(tmp_path).open()


def _close_in_child(path: str) -> None:
    from cosmos3_gym.runner import folder as module

    assert not module._HELD  # the child holds nothing, so it has nothing to close or unlock
    with pytest.raises(FolderInUse):  # the folder is its parent's
        RunFolder(path).open()
