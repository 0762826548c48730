"""Overlapping inference with env stepping changes the timing, never the episodes."""

from __future__ import annotations

from pathlib import Path

import pytest

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.bench.overlap import measure_overlap
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint


@pytest.fixture(scope="module")
def pipe(tmp_path_factory: pytest.TempPathFactory) -> Cosmos3ActionPipeline:
    path = write_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny2d"),
        policy_overrides={**COLOR_REACH_POLICY, "num_inference_steps": 2},
    )
    return Cosmos3ActionPipeline.from_pretrained(path)


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
