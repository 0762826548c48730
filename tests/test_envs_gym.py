"""Any registered Gymnasium env as a vector env: prompts, images from render(), success keys."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from cosmos3_gym.envs import (
    EpisodeEndHold,
    ReportSuccess,
    TaskPrompt,
    VectorTaskPrompt,
    make_gym_vector_env,
)
from cosmos3_gym.envs import gym as gym_envs


def test_a_state_only_env_gets_its_images_from_render() -> None:
    envs = make_gym_vector_env("CartPole-v1", 2, prompt="balance the pole")
    obs, _ = envs.reset(seed=[3, 4])
    # The reference: the same env made by hand, rendered after the same reset.
    reference = gym.make("CartPole-v1", render_mode="rgb_array")
    state, _ = reference.reset(seed=4)
    np.testing.assert_array_equal(obs["state"][1], state)
    np.testing.assert_array_equal(obs["pixels"][1], reference.render())
    assert obs["pixels"].dtype == np.uint8 and obs["pixels"].shape == (2, 400, 600, 3)
    # Through Gymnasium's own wrapper, inside the chunk-stepping hold.
    env, chain = envs.envs[0], []
    while isinstance(env, gym.Wrapper):
        chain.append(type(env))
        env = env.env
    assert chain[0] is EpisodeEndHold and gym.wrappers.AddRenderObservation in chain
    reference.close()
    envs.close()


def test_an_env_with_an_image_keeps_its_own_and_renders_nothing() -> None:
    pytest.importorskip("gym_pusht")
    envs = make_gym_vector_env("gym_pusht/PushT-v0", 1, prompt="push the T",
                               import_modules=["gym_pusht"], obs_type="pixels_agent_pos")
    obs, _ = envs.reset(seed=0)
    assert sorted(obs) == ["agent_pos", "pixels"] and obs["pixels"].shape == (1, 96, 96, 3)
    envs.close()


def test_prompts_one_for_all_one_per_env_and_switched_by_reset_option() -> None:
    envs = make_gym_vector_env("CartPole-v1", 3, prompt=["left", "middle", "right"])
    assert envs.call("task_description") == ("left", "middle", "right")
    assert envs.call("task") == ("left", "middle", "right")
    envs.reset(seed=0)
    envs.reset(options={"reset_mask": np.array([False, True, False]),
                                "task_description": "new"})
    assert envs.call("task_description") == ("left", "new", "right")
    envs.close()
    with pytest.raises(ValueError, match=r"one per env \(2\); found 3"):
        make_gym_vector_env("CartPole-v1", 2, prompt=["a", "b", "c"])
    with pytest.raises(ValueError, match="names no task .* --prompt TEXT"):
        make_gym_vector_env("CartPole-v1", 1)
    with pytest.raises(ValueError, match="non-empty instruction"):
        TaskPrompt(gym.make("CartPole-v1"), " ")


def test_the_reset_option_never_reaches_the_env_below() -> None:
    seen = []

    class Recorder(gym.Wrapper):
        def reset(self, *, seed=None, options=None):
            seen.append(options)
            return self.env.reset(seed=seed, options=options)

    env = TaskPrompt(Recorder(gym.make("CartPole-v1")), "a")
    env.reset(seed=0, options={"task_description": "b"})
    env.reset(seed=0, options={"task_description": "c", "other": 1})
    assert seen == [None, {"other": 1}] and env.task_description == "c"


class _Scored(gym.Wrapper):
    """CartPole reporting success the ManiSkill way: info["success"]."""

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {**info, "success": np.array([action == 1])}


def test_success_is_reported_as_is_success_from_the_chosen_key() -> None:
    env = ReportSuccess(_Scored(gym.make("CartPole-v1")))
    env.reset(seed=0)
    assert env.step(1)[4]["is_success"] is True and env.step(0)[4]["is_success"] is False
    plain = ReportSuccess(gym.make("CartPole-v1"))
    plain.reset(seed=0)
    assert "is_success" not in plain.step(0)[4]  # nothing to read: no outcome, never inferred
    named = ReportSuccess(gym.make("CartPole-v1"), "info.solved")
    named.reset(seed=0)
    with pytest.raises(ValueError, match=r"'solved' is not in the env's step info"):
        named.step(0)


def test_a_vector_entry_point_env_answers_prompts_through_call() -> None:
    # CartPole registers its own vector env (no sub-envs), as ManiSkill3 does.
    envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="vector_entry_point")
    prompted = VectorTaskPrompt(envs, ["a", "b"])
    assert prompted.call("task_description") == ("a", "b")
    assert prompted.call("has_wrapper_attr", "task_description") == (True, True)
    prompted.close()
    # Asked for images, make_gym_vector_env falls back to sync sub-envs that render.
    rendered = make_gym_vector_env("CartPole-v1", 2, prompt="p")
    assert isinstance(rendered, gym.vector.SyncVectorEnv)
    rendered.close()
    with pytest.raises(ValueError, match="holds no uint8 image"):
        make_gym_vector_env("CartPole-v1", 2, prompt="p", vectorization_mode="vector_entry_point")


def test_async_envs_and_the_spec_budget() -> None:
    envs = make_gym_vector_env("CartPole-v1", 2, prompt="p", vectorization_mode="async",
                               autoreset_mode=AutoresetMode.SAME_STEP, max_episode_steps=3)
    envs.reset(seed=0)
    for _ in range(3):
        *_, truncated, _ = envs.step(np.zeros(2, np.int64))
    assert envs.call("task_description") == ("p", "p")
    envs.close()
    assert gym_envs.episode_budget("CartPole-v1") == 500
    assert gym_envs.episode_budget("CartPole-v1", 7) == 7


def test_a_missing_benchmark_package_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="--import no_such_benchmark: no module "
                                         "'no_such_benchmark' in the current directory"):
        make_gym_vector_env("CartPole-v1", 1, prompt="p", import_modules=["no_such_benchmark"])


@pytest.mark.gym
def test_aloha_serves_its_camera_and_success_unchanged() -> None:
    envs = make_gym_vector_env("gym_aloha/AlohaInsertion-v0", 1, prompt="insert the peg",
                               import_modules=["gym_aloha"])
    obs, _ = envs.reset(seed=0)
    assert sorted(obs) == ["top"] and obs["top"].shape == (1, 480, 640, 3)
    *_, info = envs.step(np.zeros((1, 14), np.float32))
    assert info["is_success"].tolist() == [False]
    assert envs.single_action_space.shape == (14,)
    envs.close()


@pytest.mark.gym
def test_a_mujoco_env_renders_its_frame_after_another_one_closes() -> None:
    """Gymnasium's MuJoCo envs render in their own GL contexts, made current only when built:
    after another env of the process closed, a frame came back black. Through the gym path's
    render check each frame comes out of the env's own context."""
    pytest.importorskip("mujoco")
    first = gym_envs.CheckedRender(
        gym.make("InvertedPendulum-v5", render_mode="rgb_array", width=64, height=64))
    other = gym.make("Hopper-v5", render_mode="rgb_array", width=64, height=64)
    try:
        first.reset(seed=0)
        alone = first.render()
        other.reset(seed=0)
        other.render()
        other.close()
        first.reset(seed=0)
        np.testing.assert_array_equal(first.render(), alone)
        assert alone.mean() > 1.0  # a scene, not a black frame
    finally:
        first.close()
