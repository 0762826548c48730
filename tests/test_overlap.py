"""Overlapping inference with env stepping changes the timing, never the episodes: of an
evaluation, and of rollouts on disk (whole, and resumed after a kill)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.bench.overlap import measure_overlap
from cosmos3_gym.envs import ColorReachEval, make_color_reach_vector_env
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.policy import VectorPolicy
from cosmos3_gym.runner import collect_rollouts, load_rollouts
from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny2d"),
        policy_overrides={**COLOR_REACH_POLICY, "num_inference_steps": 2},
    )


@pytest.fixture(scope="module")
def pipe(tiny: Path) -> Cosmos3ActionPipeline:
    return Cosmos3ActionPipeline.from_pretrained(tiny)


def _episodes(folder: Path) -> dict:
    return {(r["task"], r["trial"]): (r["obs_sha256"], r["steps"], r["chunks"], r["success"])
            for r in read_episode_records(folder)}


@pytest.mark.parametrize("async_envs", [False, True])
def test_an_overlapped_evaluation_records_the_same_episodes(pipe, tmp_path, async_envs) -> None:
    config = EvalConfig(trials=3, num_envs=3, seed=4, image_size=32, max_episode_steps=8,
                        n_action_steps=2, async_envs=async_envs, progress=False)
    evaluate(config, tmp_path / "plain", pipeline=pipe)
    from dataclasses import replace

    results = evaluate(replace(config, overlap=True), tmp_path / "overlap", pipeline=pipe)
    assert results["complete"] and results["throughput"]["episodes"] == 12
    assert _episodes(tmp_path / "overlap") == _episodes(tmp_path / "plain")
    slots = {r["env_slot"] for r in read_episode_records(tmp_path / "overlap")}
    assert slots == {0, 1, 2}  # both groups ran episodes


def test_measure_overlap_reports_both_throughputs_and_the_same_episodes(pipe) -> None:
    result = measure_overlap(pipe, num_envs=2, trials=1, image_size=32, async_envs=False)
    assert result["identical_episodes"] and result["episodes"] == 4
    assert result["sequential_steps_per_s"] > 0 and result["overlapped_steps_per_s"] > 0
    assert result["overlap_speedup"] > 0


# ---------------------------------------------------------------------- rollouts


class TaskLength(gym.Wrapper):
    """Ends a ColorReach episode after as many steps as its task says (red 2, blue 5), so that
    the two groups of an overlapped run end their episodes at different steps and plan out of
    step with each other."""

    LENGTHS = {"red": 2, "blue": 5}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.left = self.LENGTHS.get((options or {}).get("target"), 1000)
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.left -= 1
        return obs, reward, terminated, truncated or self.left <= 0, info


class UnevenColorReach(ColorReachEval):
    def make(self, num_envs: int, async_: bool, autoreset_mode: Any = None) -> Any:
        return make_color_reach_vector_env(
            num_envs, async_=async_, image_size=self.image_size,
            max_episode_steps=self.max_episode_steps, wrappers=(TaskLength,),
            **({} if autoreset_mode is None else {"autoreset_mode": autoreset_mode}))


def collect(checkpoint: Path, out: Path, overlap: bool) -> Path:
    """16 steps of 2 envs; micro-batches of one, so that a plain call over both envs computes
    what each overlapped group's call of one env computes: the batches match."""
    pipeline = Cosmos3ActionPipeline.from_pretrained(checkpoint, max_batch_size=1)
    policy = VectorPolicy(pipeline, adapter="generic", seed=0)
    env = UnevenColorReach(["red", "blue"], image_size=32, max_episode_steps=8)
    return collect_rollouts(policy, env, 16, out, num_envs=2, shard_steps=5, overlap=overlap)


CHUNK_KEYS = ("chunk_env", "chunk_episode", "chunk_index", "chunk_seed", "chunk_noise",
              "chunk_raw_actions", "chunk_actions", "chunk_prompts")


def assert_same_rollouts(plain: dict, overlapped: dict) -> None:
    """Every step, every episode row, and behind every executed action the same chunk. Chunk
    ids number the chunks in the order they were planned, which overlap changes, so chunks are
    compared through the actions that link to them."""
    for key in plain:
        if key in ("meta", "chunk_ids", "sde_settings", "weights") or key in CHUNK_KEYS:
            continue
        np.testing.assert_array_equal(overlapped[key], plain[key], err_msg=key)
    valid = plain["valid"]
    np.testing.assert_array_equal(overlapped["valid"], valid)
    assert (plain["chunk_ids"][valid] >= 0).all()
    for key in CHUNK_KEYS:
        np.testing.assert_array_equal(overlapped[key][overlapped["chunk_ids"][valid]],
                                      plain[key][plain["chunk_ids"][valid]], err_msg=key)
    steps, envs = np.nonzero(valid)
    linked = overlapped["chunk_env"][overlapped["chunk_ids"][steps, envs]]
    np.testing.assert_array_equal(linked, envs)
    assert [p["steps"] for p in overlapped["meta"]["parts"]] == [
        p["steps"] for p in plain["meta"]["parts"]]


def test_an_overlapped_rollout_equals_the_plain_one_where_the_batches_match(
    tiny: Path, tmp_path: Path
) -> None:
    plain = load_rollouts(collect(tiny, tmp_path / "plain", overlap=False))
    overlapped = load_rollouts(collect(tiny, tmp_path / "overlap", overlap=True))
    # The groups did fall out of step: red episodes end after 2 steps, blue ones after 5.
    assert {2, 5} <= set(plain["episode_length"].tolist())
    assert set(plain["episode_env"].tolist()) == {0, 1}
    assert_same_rollouts(plain, overlapped)
    # The task names of every episode, whole (the shards' string columns differ in width).
    assert set(plain["episode_task"].tolist()) == {"red", "blue"}


# Kills its own process at the n-th file write of the rollout (argv[1]), like
# tests/test_rollout_folder.py's, on the rollouts of collect() above (argv[2:]: checkpoint, out,
# overlap).
_KILLED_AT_WRITE = """
import os, signal, sys
from pathlib import Path
from cosmos3_gym import jsonio

n, count = int(sys.argv[1]), [0]
real_replace = os.replace

def dying_replace(src, dst):
    count[0] += 1
    if count[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

jsonio.os.replace = dying_replace
sys.path.insert(0, sys.argv[5])
from test_overlap import collect
collect(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4] == "overlap")
"""


@pytest.mark.slow
@pytest.mark.parametrize("write", [4, 6])
def test_an_overlapped_rollout_resumes_after_a_kill_like_the_plain_one(
    tiny: Path, tmp_path: Path, write: int
) -> None:
    # Writes: rollout.json twice (identity, then the part), shards of 5, 5, 5 and 1 steps,
    # meta.json: killed while writing the second shard (4), or the last one (6).
    found = {}
    for mode in ("plain", "overlap"):
        out = tmp_path / mode
        done = subprocess.run([sys.executable, "-c", _KILLED_AT_WRITE, str(write), str(tiny),
                               str(out), mode, str(Path(__file__).parent)],
                              capture_output=True, text=True)
        assert done.returncode == -signal.SIGKILL, (mode, done.stderr)
        saved = sorted(p.name for p in out.glob("shard-*.npz"))
        assert len(saved) == write - 3, saved
        found[mode] = load_rollouts(collect(tiny, out, overlap=mode == "overlap"))
        assert len(found[mode]["meta"]["parts"]) == 2  # the cut part, then the resumed one
        assert not list(out.glob(".*.tmp"))
    assert found["plain"]["actions"].shape[:2] == (16, 2)
    assert_same_rollouts(found["plain"], found["overlap"])
