"""TorchRL's collectors drive a VectorPolicy through the integration's module and env; the
batches carry the env's success, and the module finds the observation entries it reads."""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from cosmos3_gym import VectorPolicy
from cosmos3_gym.envs import make_color_reach_vector_env
from cosmos3_gym.policy.adapters import GenericAdapter

pytestmark = pytest.mark.gym


class RecordSteps(gym.Wrapper):
    """The reference: each step's ``(terminated, info)`` as the sub-env itself returned them,
    before any vector env or TorchRL reader saw them. ``log`` gets one list per sub-env, in the
    order the vector env builds them."""

    def __init__(self, env: gym.Env, log: list[list[tuple[bool, dict[str, Any]]]]) -> None:
        super().__init__(env)
        self.steps: list[tuple[bool, dict[str, Any]]] = []
        log.append(self.steps)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps.append((bool(terminated), dict(info)))
        return obs, reward, terminated, truncated, info


class WithoutFlag(gym.Wrapper):
    """ColorReach with no success flag in its step infos."""

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, {"target_index": info["target_index"]}


class Cameras(gym.ObservationWrapper):
    """ColorReach's frame as a dict observation: the frame under each of ``cameras`` (the
    second one upside down, to tell them apart) and the agent's position under ``"state"``."""

    def __init__(self, env: gym.Env, cameras: tuple[str, ...] = ("pixels",)) -> None:
        super().__init__(env)
        self.cameras = cameras
        self.observation_space = spaces.Dict({
            **{name: env.observation_space for name in cameras},
            "state": spaces.Box(0.0, 1.0, (2,), np.float32)})

    def observation(self, frame: np.ndarray) -> dict[str, np.ndarray]:
        views = [frame, np.ascontiguousarray(frame[::-1])]
        return {**dict(zip(self.cameras, views[:len(self.cameras)], strict=True)),
                "state": self.env.unwrapped.state_dict().agent.astype(np.float32)}


class SeenObservations:
    """A stand-in VectorPolicy: zero actions, and the observations the module handed it."""

    def __init__(self, adapter: Any = None) -> None:
        self.adapter = adapter
        self.seen: list[Any] = []

    def reset(self, mask: Any) -> None:
        pass

    def select_action(self, obs: Any, prompts: list[str]) -> np.ndarray:
        self.seen.append(obs)
        return np.zeros((len(prompts), 2), np.float32)


def recorded_color_reach(num_envs: int, log: list, *wrappers: Any, **kwargs: Any) -> Any:
    return make_color_reach_vector_env(
        num_envs, image_size=32, wrappers=(*wrappers, functools.partial(RecordSteps, log=log)),
        **kwargs)


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


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP],
                         ids=["switched-to-disabled", "same-step"])
def test_collected_success_is_what_each_env_reported_at_that_step(pipeline, mode) -> None:
    from torchrl.collectors import Collector

    from cosmos3_gym.integrations.torchrl import torchrl_env, torchrl_policy

    log: list = []
    # A wide goal and fast moves, so that the tiny model's actions succeed at some steps.
    envs = recorded_color_reach(2, log, max_episode_steps=4, success_radius=0.25,
                                max_speed=0.3, autoreset_mode=mode)
    env = torchrl_env(envs)
    env.set_seed(0)
    for steps in log:
        steps.clear()  # auto's probe step: before the collection
    module = torchrl_policy(VectorPolicy(pipeline, n_action_steps=2, seed=4), env,
                            prompts="reach the red target")
    collector = Collector(env, module, frames_per_batch=16, total_frames=16)
    batch = next(iter(collector))
    collector.shutdown()
    success = batch["next", "success"]
    assert success.shape == batch["next", "done"].shape == (2, 8, 1)
    reported = np.array([[info["is_success"] for _, info in steps] for steps in log])
    assert reported.any() and not reported.all()  # both outcomes occur: the check can fail
    np.testing.assert_array_equal(success[..., 0].numpy(), reported)
    # ColorReach terminates on success: the episodes that ended are where the rate is read.
    ended = batch["next", "done"]
    assert (success & ~ended).sum() == 0 and 0 < success[ended].sum() < ended.sum()
    env.close()


@pytest.mark.parametrize(("rule", "reference"), [
    ("info.target_index > 1", lambda terminated, info: info["target_index"] > 1),
    ("terminated", lambda terminated, info: terminated),
])
def test_a_declared_rule_reads_each_step_s_info(rule, reference) -> None:
    import torch

    from cosmos3_gym.integrations.torchrl import torchrl_env

    log: list = []
    envs = recorded_color_reach(3, log, max_episode_steps=3, success_radius=0.3,
                                max_speed=0.5, autoreset_mode=AutoresetMode.DISABLED)
    env = torchrl_env(envs, success=rule)
    env.set_seed(1)
    torch.manual_seed(0)
    rollout = env.rollout(6, break_when_any_done=False)  # random actions, partial resets
    expected = np.array([[reference(*step) for step in steps] for steps in log])
    assert expected.any() and not expected.all()
    np.testing.assert_array_equal(rollout["next", "success"][..., 0].numpy(), expected)
    assert not rollout["success"][:, 0].any()  # at the reset, before any step: nothing yet
    env.close()


def test_an_env_without_a_flag_gets_no_success_entry_and_a_warning() -> None:
    from cosmos3_gym.integrations.torchrl import torchrl_env

    envs = make_color_reach_vector_env(2, image_size=32, max_episode_steps=3,
                                       wrappers=(WithoutFlag,))
    with pytest.warns(UserWarning, match=r"neither is_success nor success \(found "
                      r"\['target_index'\]\), so its batches carry no \('next', 'success'\)"):
        env = torchrl_env(envs)
    rollout = env.rollout(4, break_when_any_done=False)
    assert "success" not in rollout["next"].keys() and "success" not in env.observation_spec
    env.close()
    none = torchrl_env(make_color_reach_vector_env(1, image_size=32), success=None)
    assert "success" not in none.rollout(2)["next"].keys()
    none.close()


def test_success_rules_torchrl_cannot_read_are_refused_in_one_line() -> None:
    from cosmos3_gym.integrations.torchrl import torchrl_env

    envs = make_color_reach_vector_env(2, image_size=32, autoreset_mode=AutoresetMode.DISABLED)
    refusals = [
        ("reward_dist", r"expected auto, info\.KEY \(a bool flag\).*found 'reward_dist'"),
        (True, r"expected auto, .*or a SuccessRule\); found True"),
        ("return >= 1", r"'return >= 1' needs each episode's return.*RewardSum"),
    ]
    for success, message in refusals:
        with pytest.raises(ValueError, match=message) as err:
            torchrl_env(envs, success=success)
        assert "\n" not in str(err.value)
    env = torchrl_env(envs, success="info.reward_dist > -0.05")  # a key ColorReach lacks
    with pytest.raises(ValueError, match=r"^torchrl_env, env 0: success 'info.reward_dist > "
                       r"-0.05' .*'reward_dist' is not in the env's step info; found keys "
                       r"\['is_success', 'target_index'\]$") as err:
        env.rollout(2)
    assert "\n" not in str(err.value)
    env.close()


def test_a_dict_observation_s_image_and_state_are_found_without_in_keys() -> None:
    from cosmos3_gym.integrations.torchrl import torchrl_env, torchrl_policy

    envs = make_color_reach_vector_env(2, image_size=32, max_episode_steps=3, wrappers=(Cameras,))
    env = torchrl_env(envs)
    policy = SeenObservations(GenericAdapter(state_key="state"))  # the adapter reads the state
    module = torchrl_policy(policy, env, prompts="reach the red target")
    # GymWrapper names a dict's "state" "observation"; the policy gets Gymnasium's names.
    assert module.in_keys == ["pixels", "observation"]
    rollout = env.rollout(3, module, break_when_any_done=False)
    steps = policy.seen[-3:]
    assert all(sorted(obs) == ["pixels", "state"] for obs in steps)
    for t, obs in enumerate(steps):
        np.testing.assert_array_equal(obs["pixels"].numpy(), rollout["pixels"][:, t].numpy())
        np.testing.assert_array_equal(obs["state"].numpy(), rollout["observation"][:, t].numpy())
    without_state = torchrl_policy(SeenObservations(), env, prompts="reach the red target")
    assert without_state.in_keys == ["pixels"]  # a state is read only where one is named
    env.close()


def test_image_key_chooses_among_cameras_and_an_ambiguous_image_is_one_clear_error() -> None:
    from cosmos3_gym.integrations.torchrl import torchrl_env, torchrl_policy

    two = functools.partial(Cameras, cameras=("front", "wrist"))
    envs = make_color_reach_vector_env(2, image_size=32, max_episode_steps=3, wrappers=(two,))
    env = torchrl_env(envs)
    with pytest.raises(ValueError, match=r"expected one uint8 \[H, W, C\] image in the "
                       r"observation, found 2: \{'front': 'uint8 \[32, 32, 3\]', 'state': "
                       r"'float32 \[2\]', 'wrist': 'uint8 \[32, 32, 3\]'\}; name it with "
                       r"image_key=\.\.\.") as err:
        torchrl_policy(SeenObservations(), env, prompts="go")
    assert "\n" not in str(err.value)
    for bad, message in [("top", r"image_key 'top' is not in the observation; found \{'front'"),
                         ("state", r"image_key 'state' holds float32 \[2\], not a uint8")]:
        with pytest.raises(ValueError, match=message):
            torchrl_policy(SeenObservations(), env, prompts="go", image_key=bad)
    policy = SeenObservations()
    module = torchrl_policy(policy, env, prompts="go", image_key="wrist", state_key="state")
    assert module.in_keys == ["wrist", "observation"]
    rollout = env.rollout(2, module, break_when_any_done=False)
    np.testing.assert_array_equal(policy.seen[-1]["wrist"].numpy(), rollout["wrist"][:, 1].numpy())
    assert not np.array_equal(rollout["wrist"].numpy(), rollout["front"].numpy())
    # The adapter's own image key is the default, as in our loop.
    adapter_reads = torchrl_policy(SeenObservations(GenericAdapter(image_key="front")), env,
                                   prompts="go")
    assert adapter_reads.in_keys == ["front"]
    explicit = SeenObservations()
    env.rollout(1, torchrl_policy(explicit, env, prompts="go", in_keys=["front"]))
    assert explicit.seen[-1].shape == (2, 32, 32, 3)  # one in_key: the tensor as it is
    with pytest.raises(ValueError, match="give in_keys, or image_key / state_key, not both"):
        torchrl_policy(SeenObservations(), env, prompts="go", in_keys=["front"], image_key="front")
    env.close()


def test_an_array_observation_must_be_an_image() -> None:
    from cosmos3_gym.integrations.torchrl import torchrl_policy

    envs = gym.make_vec("CartPole-v1", 2, vectorization_mode="sync")  # the Gymnasium env will do
    with pytest.raises(ValueError, match=r"expected a uint8 \[H, W, C\] image as the env's "
                       r"observation; found Box\(.*\(give in_keys=\.\.\.\)$"):
        torchrl_policy(SeenObservations(), envs, prompts="balance")
    with pytest.raises(ValueError, match="image_key / state_key name entries of a dict"):
        torchrl_policy(SeenObservations(), envs, prompts="balance", image_key="pixels")
    envs.close()
