"""TorchRL's collectors drive a VectorPolicy through the integration's module and env."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from cosmos3_gym import VectorPolicy
from cosmos3_gym.envs import make_color_reach_vector_env

pytestmark = pytest.mark.gym


@pytest.fixture(scope="module")
def pipeline():
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    return Cosmos3ActionPipeline.from_pretrained("tiny")


def test_a_collector_fills_a_batch_with_the_policy_s_actions(pipeline) -> None:
    import torch
    from torchrl.collectors import Collector

    from cosmos3_gym.integrations.torchrl import torchrl_env, torchrl_policy

    envs = make_color_reach_vector_env(2, image_size=64, max_episode_steps=3)  # NEXT_STEP
    env = torchrl_env(envs)
    assert envs.metadata["autoreset_mode"] == AutoresetMode.DISABLED  # switched for TorchRL
    prompts = ["reach the red target", "reach the blue target"]
    module = torchrl_policy(VectorPolicy(pipeline, n_action_steps=2, seed=4), env,
                            prompts=prompts)
    collector = Collector(env, module, frames_per_batch=12, total_frames=12)
    batch = next(iter(collector))
    collector.shutdown()
    assert batch.shape == (2, 6) and batch["observation"].dtype == torch.uint8
    # The reference: a fresh policy replaying the collected observations, resetting each env
    # where TorchRL began an episode, must choose the same actions. The collector first runs
    # its policy once on the reset observation (to learn its outputs): so does the replay.
    replay = VectorPolicy(pipeline, n_action_steps=2, seed=4)
    replay.select_action(batch["observation"][:, 0].numpy(), prompts)
    starts = batch["is_init"].reshape(2, 6).numpy()
    assert starts[:, 0].all() and starts[:, 3].all() and starts.sum() == 4  # 3-step episodes
    for t in range(6):
        replay.reset(starts[:, t])
        actions = replay.select_action(batch["observation"][:, t].numpy(), prompts)
        np.testing.assert_array_equal(actions, batch["action"][:, t].numpy())
    assert replay.episode_index.tolist() == [2, 2]  # the dry run's, then two real episodes
    env.close()


def test_without_prompts_the_module_reads_each_env_s_own(pipeline) -> None:
    from torchrl.collectors import Collector

    from cosmos3_gym.integrations.torchrl import torchrl_env, torchrl_policy

    envs = make_color_reach_vector_env(2, image_size=64, max_episode_steps=3,
                                       autoreset_mode=AutoresetMode.DISABLED)
    module = torchrl_policy(VectorPolicy(pipeline, n_action_steps=2), envs)
    collector = Collector(torchrl_env(envs), module, frames_per_batch=8, total_frames=8)
    next(iter(collector))
    collector.shutdown()
    assert module.prompts == list(envs.call("task_description"))  # read at the last reset
    envs.close()


def test_color_reach_infos_pass_torchrl_s_spec_check_under_same_step() -> None:
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import check_env_specs

    envs = make_color_reach_vector_env(2, image_size=32, max_episode_steps=3,
                                       autoreset_mode=AutoresetMode.SAME_STEP)
    env = GymWrapper(envs)
    check_env_specs(env)  # a string target in the infos failed here
    rollout = env.rollout(7, break_when_any_done=False)
    assert rollout["next", "target_index"].shape == (2, 7)
    env.close()


def test_envs_that_cannot_switch_to_torchrl_s_mode_are_refused() -> None:
    from cosmos3_gym.integrations.torchrl import torchrl_env, torchrl_policy

    envs = make_color_reach_vector_env(1, image_size=32, async_=True)
    with pytest.raises(ValueError, match="autoreset_mode=AutoresetMode.DISABLED"):
        torchrl_env(envs)
    envs.close()
    with pytest.raises(ValueError, match="give prompts=..., or the env"):
        torchrl_policy(VectorPolicy(lambda *a, **k: None))
