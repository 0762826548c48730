"""ChunkedActionWrapper: each env runs its chunk until done, under every autoreset mode."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from cosmos3_gym.envs import ChunkedActionWrapper, ColorReachEnv, EpisodeEndHold


class CountingEnv(gym.Env):
    """Episode ``e`` lasts ``lengths[e]`` steps; obs = [episode, t]; reward = the action value.

    It records every action per episode, so a test can see which actions reached which episode.
    Odd episodes end truncated, even ones terminated.
    """

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = lengths
        self.observation_space = spaces.Box(0, 1000, (2,), np.float32)
        self.action_space = spaces.Box(-1000, 1000, (1,), np.float32)
        self.episode = -1
        self.t = 0
        self.actions_per_episode: list[list[float]] = []

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self.episode += 1
        self.t = 0
        self.actions_per_episode.append([])
        return self._obs(), {"episode": self.episode, "t": 0}

    def step(self, action):
        self.t += 1
        self.actions_per_episode[-1].append(float(action[0]))
        done = self.t >= self.lengths[self.episode % len(self.lengths)]
        terminated = done and self.episode % 2 == 0
        truncated = done and self.episode % 2 == 1
        return self._obs(), float(action[0]), terminated, truncated, {"t": self.t}

    def _obs(self) -> np.ndarray:
        return np.array([self.episode, self.t], dtype=np.float32)


def make_envs(
    lengths: list[list[int]], mode: AutoresetMode, async_: bool = False
) -> ChunkedActionWrapper:
    fns = [lambda lens=lens: EpisodeEndHold(CountingEnv(lens)) for lens in lengths]
    vector_cls = AsyncVectorEnv if async_ else SyncVectorEnv
    envs = ChunkedActionWrapper(vector_cls(fns, autoreset_mode=mode))
    envs.reset(seed=0)
    return envs


def chunk(call: int, horizon: int = 4, num_envs: int = 2) -> np.ndarray:
    """Action value 100 * call + 10 * env + h: every action names its call, env and row."""
    rows = [[[100 * call + 10 * i + h] for h in range(horizon)] for i in range(num_envs)]
    return np.array(rows, dtype=np.float32)


def actions_received(envs: ChunkedActionWrapper) -> list[list[list[float]]]:
    return list(envs.get_attr("actions_per_episode"))


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_next_step_returns_final_obs_then_resets_on_the_next_call(async_: bool) -> None:
    envs = make_envs([[2, 3], [5]], AutoresetMode.NEXT_STEP, async_)

    obs, rewards, terminated, truncated, infos = envs.step(chunk(1))
    assert infos["steps_executed"].tolist() == [2, 4]
    assert obs.tolist() == [[0, 2], [0, 4]]  # env 0: its final observation, not a reset one
    assert rewards.tolist() == [100 + 101, 110 + 111 + 112 + 113]
    assert terminated.tolist() == [True, False] and truncated.tolist() == [False, False]
    assert infos["t"].tolist() == [2, 4]

    # Env 0 resets and sits this call out; env 1 finishes its episode after one step.
    obs, rewards, terminated, truncated, infos = envs.step(chunk(2))
    assert infos["steps_executed"].tolist() == [0, 1]
    assert obs.tolist() == [[1, 0], [0, 5]]
    assert rewards.tolist() == [0, 210]
    assert terminated.tolist() == [False, True]
    assert infos["t"].tolist() == [0, 5]

    obs, rewards, terminated, truncated, infos = envs.step(chunk(3))
    assert infos["steps_executed"].tolist() == [3, 0]
    assert obs.tolist() == [[1, 3], [1, 0]]
    assert truncated.tolist() == [True, False]  # env 0's episode 1 ends truncated

    # No action of a chunk reached any episode other than the one it was executed in.
    assert actions_received(envs) == [
        [[100, 101], [300, 301, 302]],
        [[110, 111, 112, 113, 210], []],
    ]
    envs.close()


@pytest.mark.parametrize("async_", [False, True], ids=["sync", "async"])
def test_same_step_resets_at_the_end_of_the_call_with_final_obs_in_infos(async_: bool) -> None:
    envs = make_envs([[2, 3], [5]], AutoresetMode.SAME_STEP, async_)

    obs, rewards, terminated, truncated, infos = envs.step(chunk(1))
    assert infos["steps_executed"].tolist() == [2, 4]
    assert obs.tolist() == [[1, 0], [0, 4]]  # env 0 already reset
    assert infos["_final_obs"].tolist() == [True, False]
    assert infos["final_obs"][0].tolist() == [0, 2]
    assert infos["final_info"]["t"][0] == 2 and infos["final_info"]["_t"].tolist() == [True, False]
    assert infos["t"].tolist() == [0, 4]  # env 0: its reset info
    assert rewards.tolist() == [201, 446]
    assert terminated.tolist() == [True, False]

    # Env 0 acts at once in its new episode, with the new chunk only.
    obs, rewards, terminated, truncated, infos = envs.step(chunk(2))
    assert infos["steps_executed"].tolist() == [3, 1]
    assert truncated.tolist() == [True, False] and terminated.tolist() == [False, True]
    assert obs.tolist() == [[2, 0], [1, 0]]
    assert infos["final_obs"][0].tolist() == [1, 3] and infos["final_obs"][1].tolist() == [0, 5]
    assert actions_received(envs) == [
        [[100, 101], [200, 201, 202], []],
        [[110, 111, 112, 113, 210], []],
    ]
    envs.close()


def test_disabled_requires_an_explicit_reset_of_finished_envs() -> None:
    envs = make_envs([[2], [6]], AutoresetMode.DISABLED)
    obs, _, terminated, _, infos = envs.step(chunk(1))
    assert terminated.tolist() == [True, False]
    assert obs.tolist() == [[0, 2], [0, 4]]
    with pytest.raises(ValueError, match=r"envs \[0\] are still finished"):
        envs.step(chunk(2))

    obs, infos = envs.reset(options={"reset_mask": np.array([True, False])})
    assert obs.tolist() == [[1, 0], [0, 4]]
    _, _, terminated, truncated, infos = envs.step(chunk(2))
    assert infos["steps_executed"].tolist() == [2, 2]
    assert truncated.tolist() == [True, False] and terminated.tolist() == [False, True]
    assert actions_received(envs) == [[[100, 101], [200, 201]], [[110, 111, 112, 113, 210, 211]]]
    envs.close()


def test_all_envs_done_stops_stepping_early() -> None:
    envs = make_envs([[1], [2]], AutoresetMode.NEXT_STEP)
    _, _, terminated, _, infos = envs.step(chunk(1, horizon=8))
    assert infos["steps_executed"].tolist() == [1, 2]
    assert terminated.all()
    assert actions_received(envs) == [[[100]], [[110, 111]]]
    envs.close()


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
def test_single_actions_match_the_plain_vector_env(mode: AutoresetMode) -> None:
    lengths = [[2, 3], [3, 1]]
    wrapped = make_envs(lengths, mode)
    plain = SyncVectorEnv(
        [lambda lens=lens: CountingEnv(lens) for lens in lengths], autoreset_mode=mode
    )
    plain.reset(seed=0)
    for t in range(8):
        actions = np.array([[t], [10 + t]], dtype=np.float32)
        expected = plain.step(actions)
        got = wrapped.step(actions)
        for name, e, g in zip(
            ["obs", "reward", "terminated", "truncated"], expected, got, strict=False
        ):
            np.testing.assert_array_equal(g, e, err_msg=f"{name} at step {t} ({mode})")
        if mode == AutoresetMode.DISABLED and (expected[2] | expected[3]).any():
            mask = expected[2] | expected[3]
            np.testing.assert_array_equal(
                wrapped.reset(options={"reset_mask": mask})[0],
                plain.reset(options={"reset_mask": mask.copy()})[0],
            )
    plain.close()
    wrapped.close()


def test_bad_action_shapes_are_rejected_with_the_expected_shape() -> None:
    envs = make_envs([[3], [3]], AutoresetMode.NEXT_STEP)
    with pytest.raises(ValueError, match=r"\[B, D\] = \[2, 1\].*got \[3, 4, 1\]"):
        envs.step(np.zeros((3, 4, 1)))
    with pytest.raises(ValueError, match=r"got \[2, 0, 1\]"):
        envs.step(np.zeros((2, 0, 1)))
    envs.close()


def test_sub_envs_without_episode_end_hold_are_refused() -> None:
    plain = SyncVectorEnv([lambda: CountingEnv([3])])
    with pytest.raises(TypeError, match="EpisodeEndHold"):
        ChunkedActionWrapper(plain)
    plain.close()


def test_unarmed_hold_passes_episode_ends_through() -> None:
    env = EpisodeEndHold(CountingEnv([1]))
    env.reset()
    _, _, terminated, _, info = env.step(np.array([1.0]))
    assert terminated and "episode_terminated" not in info


def _held_with_statistics(lengths: list[int]) -> gym.Env:
    # CountingEnv's reset info already has an "episode" key (its episode number).
    stats = gym.wrappers.RecordEpisodeStatistics(CountingEnv(lengths), stats_key="stats")
    return EpisodeEndHold(stats)


def test_statistics_inside_the_hold_count_env_steps_under_next_step_chunking() -> None:
    fns = [lambda lens=lens: _held_with_statistics(lens) for lens in ([2, 3], [5])]
    envs = ChunkedActionWrapper(SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP))
    envs.reset(seed=0)

    _, _, _, _, infos = envs.step(chunk(1))  # env 0 ends after 2 of its 4 actions
    assert infos["_stats"].tolist() == [True, False]
    assert infos["stats"]["l"][0] == 2 and infos["stats"]["r"][0] == 100 + 101
    _, _, _, _, infos = envs.step(chunk(2))  # env 0 resets; env 1 ends after 4 + 1 steps
    assert infos["_stats"].tolist() == [False, True]
    assert infos["stats"]["l"][1] == 5 and infos["stats"]["r"][1] == 110 + 111 + 112 + 113 + 210
    _, _, _, _, infos = envs.step(chunk(3))  # env 0's second episode: 3 steps
    assert infos["_stats"].tolist() == [True, False]
    assert infos["stats"]["l"][0] == 3 and infos["stats"]["r"][0] == 300 + 301 + 302
    envs.close()


def test_statistics_inside_the_hold_count_env_steps_under_same_step_chunking() -> None:
    fns = [lambda lens=lens: _held_with_statistics(lens) for lens in ([2, 3], [5])]
    envs = ChunkedActionWrapper(SyncVectorEnv(fns, autoreset_mode=AutoresetMode.SAME_STEP))
    envs.reset(seed=0)

    _, _, _, _, infos = envs.step(chunk(1))
    finished = infos["final_info"]
    assert infos["_final_info"].tolist() == [True, False]
    assert finished["stats"]["l"][0] == 2 and finished["stats"]["r"][0] == 100 + 101
    _, _, _, _, infos = envs.step(chunk(2))  # env 0: 3 steps, env 1: 1 more step, both end
    finished = infos["final_info"]
    assert infos["_final_info"].tolist() == [True, True]
    assert finished["stats"]["l"].tolist() == [3, 5]
    assert finished["stats"]["r"].tolist() == [200 + 201 + 202, 110 + 111 + 112 + 113 + 210]
    envs.close()


def test_vector_statistics_under_the_chunk_wrapper_are_refused() -> None:
    vector = SyncVectorEnv([lambda: EpisodeEndHold(CountingEnv([3]))])
    with pytest.raises(TypeError, match="inside its EpisodeEndHold"):
        ChunkedActionWrapper(gym.wrappers.vector.RecordEpisodeStatistics(vector))
    vector.close()


def test_task_attributes_are_visible_through_the_hold() -> None:
    env = ColorReachEnv()
    held = EpisodeEndHold(gym.wrappers.RecordEpisodeStatistics(env))
    held.reset(seed=3)
    assert hasattr(held, "task_description") and hasattr(held, "task")
    assert held.task_description == held.task == env.task_description
    assert not hasattr(EpisodeEndHold(CountingEnv([1])), "task_description")
