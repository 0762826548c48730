"""A run folder is held by one command at a time and bound to one run (cosmos3_gym.runner.folder):
two commands never mix in one folder, a killed run's lock is taken over, and the identity names
no path, so a moved folder resumes."""

from __future__ import annotations

import doctest
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from cosmos3_gym.runner import FolderInUse, RunFolder, RunMismatch, folder

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


def test_docstring_examples_run() -> None:
    assert doctest.testmod(folder).failed == 0


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
