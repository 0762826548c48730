"""The LeRobot integration's LeRobot-free half: the env LeRobot's evaluator gets, and the way its
batches come back to the policy. Runs in the main suite; LeRobot's own evaluator is exercised in
test_lerobot.py (its own venv, .ci/lerobot)."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy
from cosmos3_gym.envs import (
    ChunkedActionWrapper,
    ColorReachEnv,
    ColorReachEval,
    ColorReachExpert,
    EpisodeEndHold,
    make_color_reach_vector_env,
)
from cosmos3_gym.integrations.lerobot import (
    LeRobotConventions,
    TrialBySeed,
    make_lerobot_env,
    observation_from_lerobot_batch,
    uint8_frames,
)

GREY = np.full((1, 8, 8, 3), 128, np.uint8)


def lerobot_scaling(frames: np.ndarray) -> torch.Tensor:
    """What LeRobot's preprocess_observation does to uint8 [B, H, W, C] frames."""
    return torch.from_numpy(frames).permute(0, 3, 1, 2).contiguous().float() / 255


def expert_actions(env: SyncVectorEnv) -> np.ndarray:
    expert = ColorReachExpert()
    return np.stack([expert(sub.unwrapped.state_dict()) for sub in env.envs])


def test_the_env_half_imports_no_lerobot() -> None:
    code = ("import sys, cosmos3_gym.integrations.lerobot, cosmos3_gym.envs, cosmos3_gym.policy; "
            "assert 'lerobot' not in sys.modules, sorted(m for m in sys.modules if 'lerobot' in m)")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_byte_comes_back_exactly_from_lerobots_float_images() -> None:
    levels = np.arange(256, dtype=np.uint8)
    frames = np.stack([np.broadcast_to(levels.reshape(16, 16, 1), (16, 16, 3))] * 2)
    rng = np.random.default_rng(0)
    noise = rng.integers(0, 256, (3, 24, 32, 3), dtype=np.uint8)
    for batch in (frames, noise):
        np.testing.assert_array_equal(uint8_frames(lerobot_scaling(batch)), batch)


@pytest.mark.parametrize(
    "images, problem",
    [
        ((lerobot_scaling(GREY) - 0.485) / 0.229, "not uint8 frames"),  # ImageNet normalisation
        (lerobot_scaling(GREY) + 0.5 / 255, "not uint8 frames"),
        (torch.zeros(1, 8, 8, 3), "channel-first"),
        (torch.zeros(1, 3, 8, 8, dtype=torch.uint8), "float tensor"),
    ],
)
def test_images_a_processor_changed_are_refused(images: torch.Tensor, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        uint8_frames(images)


def test_a_lerobot_batch_becomes_the_adapters_observation_and_prompts() -> None:
    rng = np.random.default_rng(1)
    agent, wrist = (rng.integers(0, 256, (2, 32, 32, 3), dtype=np.uint8) for _ in range(2))
    state = rng.standard_normal((2, 8)).astype(np.float32)
    batch = {
        "observation.images.image": lerobot_scaling(agent),
        "observation.images.image2": lerobot_scaling(wrist),
        "observation.state": torch.from_numpy(state),
        "task": ["open the drawer", "close the drawer"],
    }
    obs, tasks = observation_from_lerobot_batch(batch)
    assert sorted(obs) == ["agentview_image", "state", "wrist_image"]
    np.testing.assert_array_equal(obs["agentview_image"], agent)
    np.testing.assert_array_equal(obs["wrist_image"], wrist)
    np.testing.assert_array_equal(obs["state"], state)
    assert tasks == ["open the drawer", "close the drawer"]

    single = {"observation.image": lerobot_scaling(agent), "task": ["a", "b"]}
    assert list(observation_from_lerobot_batch(single)[0]) == ["image"]


@pytest.mark.parametrize(
    "task, problem",
    [(["reach the red target", ""], "task for env 1"), (["one"], "1 tasks for 2 envs"),
     (None, "expected a list")],
)
def test_batches_without_one_prompt_per_env_are_refused(task: object, problem: str) -> None:
    batch = {"observation.image": torch.zeros(2, 3, 8, 8), "task": task}
    with pytest.raises(ValueError, match=problem):
        observation_from_lerobot_batch(batch)


def test_a_batch_without_images_is_refused() -> None:
    with pytest.raises(ValueError, match="no images"):
        observation_from_lerobot_batch({"observation.state": torch.zeros(2, 8), "task": ["a", "b"]})


def test_a_next_step_env_reports_success_where_lerobot_reads_it() -> None:
    # Our envs default to NEXT_STEP, under which Gymnasium emits no final_info and LeRobot reports
    # 0% success without an error; the LeRobot env is SAME_STEP whatever it was given.
    source = make_color_reach_vector_env(3, image_size=64)
    assert source.metadata["autoreset_mode"] == AutoresetMode.NEXT_STEP
    env = make_lerobot_env(source)
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    obs, _ = env.reset(seed=[0, 1, 2])
    assert sorted(obs) == ["pixels"] and obs["pixels"].shape == (3, 64, 64, 3)
    tasks = list(env.call("task_description"))
    assert tasks == [sub.unwrapped.task_description for sub in env.envs]
    assert all(hasattr(env.envs[0], name) for name in ("task_description", "task"))
    assert env.call("_max_episode_steps") == (40, 40, 40)

    successes = np.zeros(3, bool)
    for _ in range(40):
        obs, _, terminated, truncated, info = env.step(expert_actions(env))
        done = terminated | truncated
        if done.any():
            final = info["final_info"]
            assert final["_is_success"][done].all()
            successes |= done & final["is_success"]
        if successes.all():
            break
    assert successes.all()
    env.close()


def test_observation_keys_follow_lerobots_libero_convention() -> None:
    class TwoCameras(gym.Env):
        image = gym.spaces.Box(0, 255, (16, 16, 3), np.uint8)
        observation_space = gym.spaces.Dict({
            "agentview_image": image, "wrist_image": image,
            "state": gym.spaces.Box(-np.inf, np.inf, (8,), np.float32),
        })
        action_space = gym.spaces.Box(-1, 1, (7,), np.float32)
        max_episode_steps = 5
        task_description = "put the bowl on the plate"

        def reset(self, *, seed=None, options=None):
            super().reset(seed=seed)
            return self.observation_space.sample(), {"is_success": False}

    env = LeRobotConventions(TwoCameras())
    obs, _ = env.reset(seed=0)
    assert sorted(obs["pixels"]) == ["image", "image2"] and obs["agent_pos"].shape == (8,)
    assert env.task == "put the bowl on the plate" and env._max_episode_steps == 5
    assert env.observation_space.contains(obs)


def test_setups_where_lerobot_would_read_no_success_are_refused() -> None:
    with pytest.raises(TypeError, match="async_=False"):
        make_lerobot_env(AsyncVectorEnv([lambda: EpisodeEndHold(ColorReachEnv())]))
    chunked = ChunkedActionWrapper(make_color_reach_vector_env(2))
    with pytest.raises(TypeError, match="not a ChunkedActionWrapper"):
        make_lerobot_env(chunked)
    with pytest.raises(ValueError, match="armed for chunk stepping"):
        make_lerobot_env(chunked.env)  # its sub-envs now hide their episode ends
    budgets = SyncVectorEnv([lambda: ColorReachEnv(max_episode_steps=10),
                             lambda: ColorReachEnv(max_episode_steps=20)])
    with pytest.raises(ValueError, match=r"different step budgets \[10, 20\]"):
        make_lerobot_env(budgets)


def test_an_episode_end_without_is_success_raises() -> None:
    class NoSuccessInfo(gym.Wrapper):
        def step(self, action):
            obs, reward, terminated, truncated, info = self.env.step(action)
            return obs, reward, terminated, truncated, {}

    short = ColorReachEnv(max_episode_steps=2)
    env = make_lerobot_env(SyncVectorEnv([lambda: NoSuccessInfo(short)]))
    env.reset(seed=0)
    env.step(np.zeros((1, 2), np.float32))
    with pytest.raises(ValueError, match=r"without info\['is_success'\]"):
        env.step(np.zeros((1, 2), np.float32))


def test_an_env_that_autoresets_starts_its_new_episode_in_the_policy() -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained("tiny")
    policy = VectorPolicy(pipe, adapter="generic", seed=0)
    env = make_lerobot_env(make_color_reach_vector_env(2, image_size=64, max_episode_steps=3),
                           policy)
    obs, _ = env.reset(seed=[5, 6])
    tasks = list(env.call("task_description"))
    still = np.zeros((2, 2), np.float32)  # the agents stay put, so both envs time out together
    for _ in range(2):
        policy.select_action(obs["pixels"], tasks)
        obs, *_ = env.step(still)
    policy.select_action(obs["pixels"], tasks)
    assert policy.queue_lengths.tolist() == [1, 1]  # 3 of each H = 4 chunk used
    obs, _, _, truncated, _ = env.step(still)
    assert truncated.all()
    # Without the env telling it, each env's last action would run in its new episode.
    assert policy.queue_lengths.tolist() == [0, 0]
    policy.select_action(obs["pixels"], list(env.call("task_description")))
    record = policy.last_chunk_record
    assert record.env_indices.tolist() == [0, 1]
    assert record.episode_indices.tolist() == [1, 1] and record.chunk_indices.tolist() == [0, 0]


def test_the_policy_must_serve_as_many_envs() -> None:
    policy = VectorPolicy(Cosmos3ActionPipeline.from_pretrained("tiny"), adapter="generic")
    policy.reset(mask=np.zeros(3, bool))  # fixes num_envs = 3
    with pytest.raises(ValueError, match="serves 3 envs"):
        make_lerobot_env(make_color_reach_vector_env(2), policy)
    with pytest.raises(TypeError, match="make_lerobot_policy"):
        make_lerobot_env(make_color_reach_vector_env(2), policy=object())


def test_lerobots_seed_starts_the_trial_that_cosmos3_gym_eval_starts() -> None:
    family = ColorReachEval(["red", "yellow"], image_size=32)
    env = LeRobotConventions(TrialBySeed(ColorReachEnv(image_size=32), family, 1, root_seed=5))
    obs, _ = env.reset(seed=4, options={"lerobot_new_rollout": True})
    episode = family.episode(1, 4, 5)  # task 1 (yellow), trial 4, root seed 5
    expected, _ = ColorReachEnv(image_size=32).reset(seed=episode.seed,
                                                     options=family.reset_options(episode))
    np.testing.assert_array_equal(obs["pixels"], expected)
    assert env.task_description == "reach the yellow target"
    # Another trial is another episode, under the same task.
    other, _ = env.reset(seed=5)
    assert env.get_wrapper_attr("episode").key == ("yellow", 5)
    assert not np.array_equal(other["pixels"], expected)


def test_a_trial_needs_a_seed_and_takes_no_foreign_reset_options() -> None:
    env = TrialBySeed(ColorReachEnv(image_size=32), ColorReachEval(image_size=32), 0, 0)
    with pytest.raises(ValueError, match="without a seed"):
        env.reset()
    with pytest.raises(ValueError, match=r"options \['target'\]"):
        env.reset(seed=0, options={"target": "blue"})
    with pytest.raises(ValueError, match="task_index 4"):
        TrialBySeed(ColorReachEnv(), ColorReachEval(), 4, 0)
