"""A 2-process torchrun evaluation (gloo, CPU) records the same episodes as one process."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint

FIELDS = ("task", "trial", "seed", "steps", "chunks", "success", "out_of_range_steps")


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_rank_torchrun_matches_single_process(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", policy_overrides=COLOR_REACH_POLICY)
    args = ["eval", "--checkpoint", str(ckpt), "--tasks", "red,blue", "--trials", "2",
            "--num-envs", "2", "--seed", "5", "--image-size", "32", "--max-episode-steps", "5",
            "--denoising-steps", "2", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single, multi = tmp_path / "single", tmp_path / "multi"
    # Each run is waited for to its end, however long a busy machine makes it: torchrun ends
    # the launch itself when a rank fails, so a broken run ends too and fails the asserts.
    subprocess.run([sys.executable, "-m", "cosmos3_gym.eval.cli", *args, "--out", str(single)],
                   check=True, env=env)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(_free_loopback_port()),
         "-m", "cosmos3_gym.eval.cli", *args, "--out", str(multi)],
        env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    assert sorted(p.name for p in multi.glob("episodes*.jsonl")) == [
        "episodes.rank0.jsonl", "episodes.rank1.jsonl"]
    ranks = {r["rank"] for r in read_episode_records(multi)}
    assert ranks == {0, 1}
    table = [[r[k] for k in FIELDS] for r in read_episode_records(single)]
    assert [[r[k] for k in FIELDS] for r in read_episode_records(multi)] == table
    results = json.loads((multi / "results.json").read_text())
    assert results["complete"] and results["episodes"] == 4
    assert results["throughput"]["processes"] == 2
    assert "all" in run.stdout  # rank 0 printed the table
