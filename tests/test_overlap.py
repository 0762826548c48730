"""Double-buffered rollouts change the timing, never the trajectories."""

from __future__ import annotations

import numpy as np
from gymnasium.vector import AutoresetMode

from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy
from cosmos3_gym.bench.overlap import DoubleBufferedRollout, measure_overlap
from cosmos3_gym.envs import ChunkedActionWrapper, make_color_reach_vector_env
from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint


def _pipe(tmp_path):
    path = write_tiny_checkpoint(
        tmp_path / "tiny2d",
        policy_overrides={**COLOR_REACH_POLICY, "num_inference_steps": 2},
    )
    return Cosmos3ActionPipeline.from_pretrained(path)


def _runner(pipe):
    groups = []
    for index in range(2):
        vec = make_color_reach_vector_env(2, image_size=64, max_episode_steps=6,
                                          autoreset_mode=AutoresetMode.SAME_STEP)
        policy = VectorPolicy(pipe, seed=index)
        groups += [policy.predict_action_chunk, policy.attach(ChunkedActionWrapper(vec))]
    return DoubleBufferedRollout(*groups), groups


def test_overlapped_rollout_plans_exactly_the_same_chunks(tmp_path) -> None:
    pipe = _pipe(tmp_path)
    sequential_runner, groups_a = _runner(pipe)
    overlapped_runner, groups_b = _runner(pipe)
    try:
        sequential = sequential_runner.run(3, overlap=False, keep_trace=True)
        overlapped = overlapped_runner.run(3, overlap=True, keep_trace=True)
    finally:
        for envs in (groups_a[1], groups_a[3], groups_b[1], groups_b[3]):
            envs.close()
    assert len(sequential.trace) == len(overlapped.trace) == 6
    for (g1, c1), (g2, c2) in zip(sequential.trace, overlapped.trace, strict=True):
        assert g1 == g2
        np.testing.assert_array_equal(c1, c2)
    assert sequential.env_steps == overlapped.env_steps > 0
    assert sequential.episodes == overlapped.episodes > 0


def test_measure_overlap_reports_both_throughputs(tmp_path) -> None:
    result = measure_overlap(_pipe(tmp_path), num_envs=2, num_rounds=2, image_size=64)
    assert result["sequential_steps_per_s"] > 0 and result["overlapped_steps_per_s"] > 0
    assert result["overlap_speedup"] > 0
