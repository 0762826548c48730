"""A checkpoint named by its Hugging Face repository id resolves through huggingface_hub's cache
(offline with ``HF_HUB_OFFLINE=1``), and a run records the revision it ran."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3_gym.formats import resolve_checkpoint, revision_of

REPO = "cosmos3-gym-test/Tiny-Policy"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory) -> Path:
    """A Hugging Face cache holding one snapshot of REPO at COMMIT (main points at it), laid out
    as ``hf download`` leaves it."""
    cache = tmp_path_factory.mktemp("hub")
    repo = cache / f"models--{REPO.replace('/', '--')}"
    shutil.copytree(resolve_checkpoint("tiny"), repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return cache


def cli(cache: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    return subprocess.run([sys.executable, "-m", "cosmos3_gym.eval.cli", *args],
                          capture_output=True, text=True, env=env, cwd=cwd, timeout=900)


def test_revision_is_read_from_a_cache_snapshot_folder() -> None:
    assert revision_of(Path(f"/c/models--a--b/snapshots/{COMMIT}")) == COMMIT
    assert revision_of(Path("/models/Cosmos3-Nano")) is None


def test_inspect_eval_and_grpo_take_a_repo_id_offline_and_record_its_revision(
        hub_cache: Path, tmp_path: Path) -> None:
    found = cli(hub_cache, "inspect", REPO, cwd=tmp_path)
    assert found.returncode == 0, found.stderr
    assert COMMIT in found.stdout  # the snapshot folder inspect describes

    done = cli(hub_cache, "eval", "--checkpoint", f"{REPO}@main", "--tasks", "red", "--trials",
               "1", "--num-envs", "1", "--max-episode-steps", "4", "--no-progress", "--out",
               str(tmp_path / "eval"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    identity = json.loads((tmp_path / "eval" / "config.json").read_text())["identity"]
    assert identity["checkpoint"] == f"{REPO}@main"
    assert identity["checkpoint_revision"] == COMMIT

    trained = cli(hub_cache, "rl", "grpo", "--checkpoint", REPO, "--tasks", "red",
                  "--iterations", "1", "--groups", "1", "--group-size", "2", "--num-envs", "2",
                  "--eval-trials", "1", "--max-episode-steps", "4", "--denoising-steps", "2",
                  "--no-progress", "--out", str(tmp_path / "grpo"), cwd=tmp_path)
    assert trained.returncode == 0, trained.stderr
    grpo = json.loads((tmp_path / "grpo" / "grpo.json").read_text())["identity"]
    assert grpo["checkpoint_revision"] == COMMIT


def test_a_repo_id_missing_from_the_offline_cache_is_one_line(hub_cache: Path,
                                                               tmp_path: Path) -> None:
    done = cli(hub_cache, "eval", "--checkpoint", "nobody/Nothing-Here", "--out",
               str(tmp_path / "out"), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "nobody/Nothing-Here" in lines[0] and "HF_HUB_OFFLINE" in lines[0]
    assert "hf download nobody/Nothing-Here" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_missing_relative_path_under_an_existing_folder_is_not_taken_for_a_repo_id(
        tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "runs").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="no checkpoint folder at 'runs/tiyn'"):
        resolve_checkpoint("runs/tiyn")
