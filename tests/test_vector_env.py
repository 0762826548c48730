"""The vector-env helpers shared by the chunk wrapper, the policy's feed and the runner."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from cosmos3_gym import VectorPolicy, vector_env
from cosmos3_gym.envs import ChunkedActionWrapper, ColorReachEval, make_color_reach_vector_env
from cosmos3_gym.runner import collect_on_policy


def test_every_wrapper_reads_the_autoreset_mode_the_same_way(tmp_path) -> None:
    envs = make_color_reach_vector_env(2, image_size=32, autoreset_mode=AutoresetMode.SAME_STEP)
    envs.metadata["autoreset_mode"] = "sometimes"
    message = r"autoreset_mode'\] is 'sometimes'; expected one of \['NextStep'"
    with pytest.raises(ValueError, match=message):
        ChunkedActionWrapper(envs)
    with pytest.raises(ValueError, match=message):
        VectorPolicy(lambda *a, **k: None).attach(envs)
    with pytest.raises(ValueError, match=message):
        collect_on_policy(VectorPolicy(lambda *a, **k: None), envs, 1, eval_env=ColorReachEval())
    envs.close()


def test_wrappers_forward_call_get_attr_and_set_attr_to_the_sub_envs() -> None:
    envs = make_color_reach_vector_env(2, image_size=32)
    for wrapped in (ChunkedActionWrapper(envs), VectorPolicy(lambda *a, **k: None).attach(envs)):
        wrapped.set_attr("chunk_hold", [True, False])
        assert wrapped.get_attr("chunk_hold") == (True, False)
        assert wrapped.call("has_wrapper_attr", "task_description") == (True, True)
    envs.close()


def test_a_missing_mode_is_gymnasiums_default() -> None:
    envs = SyncVectorEnv([lambda: gym.make("CartPole-v1")])
    envs.metadata.pop("autoreset_mode", None)
    assert vector_env.autoreset_mode(envs) == AutoresetMode.NEXT_STEP
    envs.close()


def test_the_policy_feed_exposes_the_sub_envs_like_the_vector_env_it_wraps() -> None:
    envs = make_color_reach_vector_env(2, image_size=32, async_=False)
    feed = VectorPolicy(lambda *a, **k: None).attach(envs)
    assert feed.envs is envs.envs and feed.envs[0].task_description  # what LeRobot reads
    chunked = VectorPolicy(lambda *a, **k: None).attach(ChunkedActionWrapper(envs))
    assert chunked.envs is envs.envs  # through a wrapper that has no .envs of its own
    envs.close()
    workers = make_color_reach_vector_env(1, image_size=32, async_=True)
    feed = VectorPolicy(lambda *a, **k: None).attach(workers)
    assert not hasattr(feed, "envs")  # like the AsyncVectorEnv itself
    with pytest.raises(AttributeError, match="AsyncVectorEnv keeps no sub-envs in this process"):
        feed.envs  # noqa: B018
    workers.close()
