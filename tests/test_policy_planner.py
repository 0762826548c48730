"""The chunk planner and the action queues: one planning step for every caller, and every queued
action traceable to the chunk row it came from."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from test_policy_standins import STEP, StandInPipeline, countdown_fns

from cosmos3_gym import VectorPolicy
from cosmos3_gym.envs import ColorReachEval, derive_seed
from cosmos3_gym.pipeline import SamplerConfig
from cosmos3_gym.policy import ChunkPlanner, GenericAdapter, SeedRule
from cosmos3_gym.runner import episode_seed_rule


def test_the_planner_seeds_chunks_by_the_rule_it_is_given() -> None:
    pipe = StandInPipeline()
    rule = SeedRule(lambda env, episode, chunk: 1000 * env + 10 * episode + chunk)
    planner_ = ChunkPlanner(pipe, GenericAdapter(), rule,
                            sampling=SamplerConfig(num_inference_steps=3))
    obs = np.zeros((4, 4, 4, 3), np.uint8)
    record = planner_.plan(obs, np.array([1, 3]), ["a", "b"], episodes=[2, 5], chunks=[0, 7])
    assert pipe.calls[0]["seeds"] == record.seeds == [1020, 3057]
    assert pipe.calls[0]["batch"] == 2 and pipe.calls[0]["num_inference_steps"] == 3
    assert record.fresh_noise and record.prompts == ["a", "b"] and len(record) == 2
    with pytest.raises(ValueError, match="chunks of H=4; expected H=8"):
        planner_.plan(obs, np.array([0]), ["a"], [0], [0], horizon=8)
    with pytest.raises(ValueError, match="6-D actions; earlier chunks were 7-D"):
        planner_.plan(obs, np.array([0]), ["a"], [0], [0], action_dim=7)


def test_every_selected_action_points_back_to_its_chunk_row() -> None:
    envs = SyncVectorEnv(countdown_fns((4, 6, 2)), autoreset_mode=AutoresetMode.NEXT_STEP)
    policy = VectorPolicy(StandInPipeline(), n_action_steps=3, seed=5)
    envs = policy.attach(envs)
    obs, _ = envs.reset(seed=0)
    seen_sources = 0
    for _ in range(12):
        actions = policy.select_action(obs)
        for env, source in enumerate(policy.last_action_sources):
            if source is None:  # the reset step of NEXT_STEP: a zero placeholder
                np.testing.assert_array_equal(actions[env], 0.0)
                continue
            seen_sources += 1
            record, row, step = source.record, source.row, source.step
            assert record.env_indices[row] == env
            np.testing.assert_array_equal(actions[env], record.actions[row, step])
            np.testing.assert_array_equal(source.raw_action, record.raw_actions[row, step])
            assert actions[env, STEP] == obs[env, 0, 0, 1]  # planned for this very step
        obs, *_ = envs.step(actions)
    envs.close()
    assert seen_sources > 24


def test_evaluation_seeds_follow_the_episode_not_the_env_slot() -> None:
    episodes = ColorReachEval(["red", "blue"]).episodes(trials=3, global_seed=7)
    rule = episode_seed_rule(7, episodes.__getitem__)
    for k, episode in enumerate(episodes):
        seeds = {rule.seed_of(slot, k, 2) for slot in range(4)}
        assert seeds == {derive_seed(7, episode.task, episode.trial, 2)}
