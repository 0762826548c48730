"""VectorPolicy driving the real pipeline (tiny random checkpoint) in real vector envs."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy
from cosmos3_gym.envs import make_color_reach_vector_env
from cosmos3_gym.pipeline import SamplerConfig
from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint

STEPS = 2


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    # A 2-D action head for the built-in env (its actions are already in [-1, 1]).
    path = write_tiny_checkpoint(
        tmp_path_factory.mktemp("tiny2d"),
        policy_overrides=COLOR_REACH_POLICY,
    )
    return Cosmos3ActionPipeline.from_pretrained(path)


def _obs(seed: int = 0, n: int = 3) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, 64, 64, 3), dtype=np.uint8)


# Three token lengths, so the batched text is right-padded and the padding must be masked.
PROMPTS = ["reach the red target", "reach the green target, then stop on it and stay there",
           "go to yellow"]


def test_mixed_tasks_give_each_env_its_own_prompts_chunk(pipe) -> None:
    lengths = [len(pipe.tokenizer(p).input_ids) for p in PROMPTS]
    assert len(set(lengths)) == 3, lengths
    policy = VectorPolicy(pipe, n_action_steps=2, seed=3, noise="fixed",
                          num_inference_steps=STEPS)
    obs = _obs()
    chunks = policy(obs, PROMPTS)
    assert chunks.shape == (3, pipe.action_horizon, 2)
    for i in range(3):
        alone = pipe(obs[i : i + 1], [PROMPTS[i]], seed=3, num_inference_steps=STEPS,
                     progress=False)
        np.testing.assert_allclose(chunks[i], alone.actions[0], rtol=1e-5, atol=1e-5)


def test_swapping_two_envs_prompts_swaps_their_chunks(pipe) -> None:
    policy = VectorPolicy(pipe, seed=3, noise="fixed", num_inference_steps=STEPS)
    obs = np.repeat(_obs(n=1), 3, axis=0)  # same image everywhere: only the prompt differs
    chunks = policy(obs, PROMPTS)
    swapped = policy(obs, [PROMPTS[1], PROMPTS[0], PROMPTS[2]])
    np.testing.assert_allclose(swapped[[1, 0, 2]], chunks, rtol=1e-5, atol=1e-5)
    assert np.abs(chunks[0] - chunks[1]).max() > 1e-4  # the prompt matters


def test_a_chunk_record_replays_its_actions_exactly(pipe) -> None:
    policy = VectorPolicy(pipe, n_action_steps=2, seed=5, num_inference_steps=STEPS)
    obs = _obs(n=2)
    policy.select_action(obs, PROMPTS[:2])  # stochastic: seeds from (seed, env, episode, chunk)
    record = policy.last_chunk_record
    replayed = policy.predict_action_chunk(obs, PROMPTS[:2], action_noise=record.action_noise,
                                           seeds=record.seeds)
    np.testing.assert_array_equal(replayed, record.actions)
    # The seeds are needed: they draw the video noise, which the actions depend on too. The
    # action noise alone (the policy's root seed for the video) gives other actions...
    other = policy.predict_action_chunk(obs, PROMPTS[:2], action_noise=record.action_noise)
    assert np.abs(other - record.actions).max() > 1e-4
    assert policy.last_chunk_record.seeds == [5, 5]
    # ...the same ones on every call: then a chunk is a function of (obs, prompt, noise).
    again = policy.predict_action_chunk(obs, PROMPTS[:2], action_noise=record.action_noise)
    np.testing.assert_array_equal(again, other)


@pytest.mark.parametrize("async_", [False, True])
@pytest.mark.parametrize("mode", [gym.vector.AutoresetMode.NEXT_STEP,
                                  gym.vector.AutoresetMode.SAME_STEP])
def test_select_action_loop_in_a_real_vector_env(pipe, async_, mode) -> None:
    envs = make_color_reach_vector_env(3, image_size=64, max_episode_steps=5, async_=async_,
                                       autoreset_mode=mode)
    calls: list[int] = []

    def counting(images, prompts, **kwargs):
        calls.append(len(prompts))
        return pipe(images, prompts, **kwargs)

    policy = VectorPolicy(counting, n_action_steps=2, seed=0, num_inference_steps=STEPS)
    envs = policy.attach(envs)
    try:
        obs, _ = envs.reset(seed=0)
        dones = 0
        for _ in range(12):
            obs, _, terminated, truncated, _ = envs.step(policy.select_action(obs))
            dones += int(np.sum(terminated | truncated))
        assert dones >= 3  # every env finished at least one 5-step episode
        assert calls[0] == 3 and all(1 <= c <= 3 for c in calls)
        assert policy.last_chunk_record is None or len(policy.last_chunk_record) <= 3
    finally:
        envs.close()


def test_planner_video_rows_hold_the_pipelines_clips_and_leave_actions_alone(pipe) -> None:
    """A plan that asks video for some envs records exactly the clips the pipeline decoded for
    them (equal arrays), None for the others, and the same actions as a plan without video."""
    from cosmos3_gym.policy import ChunkPlanner, GenericAdapter, SeedRule

    planner = ChunkPlanner(pipe, GenericAdapter(), SeedRule.per_chunk(9),
                           sampling=SamplerConfig(num_inference_steps=STEPS))
    obs, envs = _obs(n=3), np.array([0, 1, 2])
    plain = planner.plan(obs, envs, PROMPTS, episodes=[0, 0, 0], chunks=[1, 2, 3])
    asked = planner.plan(obs, envs, PROMPTS, episodes=[0, 0, 0], chunks=[1, 2, 3],
                         video=[False, True, True])
    assert plain.video is None and asked.video[0] is None
    for field in ("actions", "raw_actions", "normalized_actions", "action_noise"):
        np.testing.assert_array_equal(getattr(asked, field), getattr(plain, field))
    direct = pipe(obs, PROMPTS, seed=asked.seeds, num_inference_steps=STEPS, progress=False,
                  return_video=[False, True, True])
    for row in (1, 2):
        assert asked.video[row].shape == (pipe.action_horizon + 1, 64, 64, 3)
        np.testing.assert_array_equal(asked.video[row], direct.video[row])
    with pytest.raises(ValueError, match=r"video: expected one bool per planned env \(3\); "
                                         r"found 2"):
        planner.plan(obs, envs, PROMPTS, [0, 0, 0], [1, 2, 3], video=[True, False])


def test_planner_refuses_a_pipeline_that_returns_no_clip_for_an_asked_row(pipe) -> None:
    from cosmos3_gym.policy import ChunkPlanner, GenericAdapter, SeedRule

    def no_video(*args, **kwargs):
        out = pipe(*args, **kwargs)
        out.video = [None] * len(out)
        return out

    planner = ChunkPlanner(no_video, GenericAdapter(), SeedRule.fixed(0),
                           sampling=SamplerConfig(num_inference_steps=STEPS))
    with pytest.raises(ValueError, match=r"video row 0 as NoneType; expected uint8 \[5, h, w, 3\]"):
        planner.plan(_obs(n=1), np.array([0]), PROMPTS[:1], [0], [0], video=[True])
