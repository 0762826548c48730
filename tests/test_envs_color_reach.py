"""ColorReach: a deterministic env whose task depends on the prompt, and its scripted expert."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv

from cosmos3_gym.envs import (
    COLOR_REACH_ID,
    ChunkedActionWrapper,
    ColorReachEnv,
    ColorReachExpert,
    make_color_reach_vector_env,
)


def run_episode(env: ColorReachEnv, seed: int, policy, target: str | None = None) -> bool:
    options = None if target is None else {"target": target}
    env.reset(seed=seed, options=options)
    env.action_space.seed(seed)
    while True:
        _, _, terminated, truncated, info = env.step(policy(env))
        if terminated or truncated:
            return info["is_success"]


def expert_policy(env: ColorReachEnv) -> np.ndarray:
    return ColorReachExpert()(env.state_dict())


def test_passes_gymnasium_env_checker() -> None:
    check_env(gym.make(COLOR_REACH_ID).unwrapped)
    check_env(ColorReachEnv(image_size=64, colors=("red", "blue")))


def test_expert_solves_it_and_a_random_policy_mostly_does_not() -> None:
    env = ColorReachEnv()
    expert = np.mean([run_episode(env, seed, expert_policy) for seed in range(20)])
    random = np.mean(
        [run_episode(env, seed, lambda e: e.action_space.sample()) for seed in range(20)]
    )
    assert expert >= 0.95, f"expert success rate {expert}"
    assert random <= 0.3, f"random success rate {random}"


def test_the_prompt_decides_the_task() -> None:
    env = ColorReachEnv()
    obs_red, _ = env.reset(seed=5, options={"target": "red"})
    assert env.task_description == "reach the red target" == env.task
    obs_blue, _ = env.reset(seed=5, options={"target": "blue"})
    assert env.task_description == "reach the blue target"
    np.testing.assert_array_equal(obs_red, obs_blue)  # same scene, only the words differ

    # Heading for the colour of another prompt fails the episode: prompts must not be mixed up.
    def wrong_target(e: ColorReachEnv) -> np.ndarray:
        state = e.state_dict()
        other = next(c for c in e.colors if c != state.goal)
        return np.clip((state.targets[other] - state.agent) / state.max_speed, -1, 1)

    assert not any(run_episode(env, seed, wrong_target) for seed in range(10))
    assert all(run_episode(env, seed, expert_policy, target="green") for seed in range(10))


def test_reset_is_deterministic_given_the_seed_and_goals_vary() -> None:
    a, b = ColorReachEnv(), ColorReachEnv()
    goals = set()
    for seed in range(12):
        obs_a, _ = a.reset(seed=seed)
        obs_b, _ = b.reset(seed=seed)
        np.testing.assert_array_equal(obs_a, obs_b)
        assert a.task_description == b.task_description
        goals.add(a.state_dict().goal)
        for _ in range(3):
            action = np.array([0.3, -0.7], dtype=np.float32)
            np.testing.assert_array_equal(a.step(action)[0], b.step(action)[0])
    assert goals == {"red", "green", "blue", "yellow"}


def test_layout_is_grid_aligned_and_drawn() -> None:
    env = ColorReachEnv()
    obs, _ = env.reset(seed=1)
    state = env.state_dict()
    centres = [state.agent, *state.targets.values()]
    cells = {tuple(np.floor(c * 4).astype(int)) for c in centres}
    assert len(cells) == 5  # agent and four targets in distinct cells
    for c in centres:
        np.testing.assert_allclose((c * 4) % 1, 0.5)
    x, y = (state.targets["red"] * 128).astype(int)
    assert obs[y, x].tolist() == [230, 40, 40]
    x, y = (state.agent * 128).astype(int)
    assert obs[y, x].tolist() == [255, 255, 255]
    np.testing.assert_array_equal(env.render(), obs)


def test_actions_are_clipped_and_nan_is_rejected() -> None:
    a, b = ColorReachEnv(), ColorReachEnv()
    a.reset(seed=2)
    b.reset(seed=2)
    a.step(np.array([5.0, -9.0]))
    b.step(np.array([1.0, -1.0]))
    np.testing.assert_array_equal(a.state_dict().agent, b.state_dict().agent)
    with pytest.raises(ValueError, match="finite"):
        a.step(np.array([np.nan, 0.0]))
    with pytest.raises(ValueError, match=r"shape \(2,\), got \(3,\)"):
        a.step(np.zeros(3))
    with pytest.raises(ValueError, match="must be one of"):
        a.reset(options={"target": "purple"})


def test_episode_truncates_at_max_steps_without_success() -> None:
    env = ColorReachEnv(max_episode_steps=5)
    env.reset(seed=0)
    outcomes = [env.step(np.zeros(2, dtype=np.float32)) for _ in range(5)]
    assert [o[3] for o in outcomes] == [False] * 4 + [True]
    assert not any(o[2] for o in outcomes) and outcomes[-1][4]["is_success"] is False


def test_expert_chunk_replays_the_closed_loop_expert() -> None:
    env = ColorReachEnv()
    env.reset(seed=4)
    planned = ColorReachExpert().chunk(env.state_dict(), horizon=6)
    for action in planned:
        np.testing.assert_array_equal(action, expert_policy(env))
        env.step(action)


def test_chunked_expert_solves_a_vector_env_with_different_prompts() -> None:
    envs = ChunkedActionWrapper(
        make_color_reach_vector_env(4, autoreset_mode=AutoresetMode.DISABLED)
    )
    envs.reset(seed=10)
    prompts = envs.call("task_description")
    assert len(set(prompts)) > 1
    states = envs.call("state_dict")
    assert [f"reach the {s.goal} target" for s in states] == list(prompts)
    chunks = np.stack([ColorReachExpert().chunk(s, horizon=40) for s in states])
    _, rewards, terminated, _, infos = envs.step(chunks)
    assert terminated.all() and rewards.tolist() == [1.0] * 4
    assert (infos["steps_executed"] < 40).all()
    envs.close()


def reference_obs(seed: int, max_steps: int, actions: list[np.ndarray]) -> list[np.ndarray]:
    """What one env sees, stepped alone, resetting itself (unseeded) after each episode."""
    env = ColorReachEnv(image_size=32, max_episode_steps=max_steps)
    observations = [env.reset(seed=seed)[0]]
    for action in actions:
        obs, _, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        if terminated or truncated:
            observations.append(env.reset()[0])
    return observations


@pytest.mark.parametrize("vector_cls", [SyncVectorEnv, AsyncVectorEnv])
@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_vector_autoreset_gives_the_right_observations(vector_cls, mode) -> None:
    """Episodes of length 2 and 3 end at different steps; check each obs against a lone env."""
    lengths = [2, 3]
    envs = vector_cls(
        [lambda n=n: ColorReachEnv(image_size=32, max_episode_steps=n) for n in lengths],
        autoreset_mode=mode,
    )
    obs, _ = envs.reset(seed=100)
    actions = np.zeros((7, 2, 2), dtype=np.float32)
    seen = [[obs[i]] for i in range(2)]
    dones = [[] for _ in range(2)]
    for t in range(7):
        obs, _, terminated, truncated, infos = envs.step(actions[t])
        for i in range(2):
            done = bool(terminated[i] or truncated[i])
            dones[i].append(done)
            if mode == AutoresetMode.SAME_STEP and done:
                seen[i] += [infos["final_obs"][i], obs[i]]
            elif mode == AutoresetMode.NEXT_STEP and t > 0 and dones[i][t - 1]:
                assert not done and not infos["is_success"][i]
                seen[i].append(obs[i])  # the reset observation; the action was ignored
            else:
                seen[i].append(obs[i])
    envs.close()

    for i, n in enumerate(lengths):
        assert dones[i][n - 1], f"env {i} should end at step {n}"
        executed = sum(
            1
            for t in range(7)
            if not (mode == AutoresetMode.NEXT_STEP and t > 0 and dones[i][t - 1])
        )
        # Under NEXT_STEP the reset after a final done is not seen yet, hence the slice.
        expected = reference_obs(100 + i, n, list(actions[:executed, i]))[: len(seen[i])]
        assert len(seen[i]) == len(expected)
        for k, (got, want) in enumerate(zip(seen[i], expected, strict=True)):
            np.testing.assert_array_equal(got, want, err_msg=f"env {i}, observation {k}")


def test_spec_and_max_episode_steps_report_the_env_own_limit() -> None:
    env = ColorReachEnv(image_size=32, max_episode_steps=7)
    assert env.spec.max_episode_steps == env._max_episode_steps == 7
    assert env.spec.id == COLOR_REACH_ID
    remade = gym.make(env.spec)  # the spec rebuilds the same env
    assert remade.unwrapped.image_size == 32 and remade.unwrapped.max_episode_steps == 7
    assert remade.spec.max_episode_steps == 7
    made = gym.make(COLOR_REACH_ID)
    assert made.spec.max_episode_steps == made.unwrapped.max_episode_steps == 40
    envs = make_color_reach_vector_env(2, max_episode_steps=9)
    assert envs.call("_max_episode_steps") == (9, 9)  # what LeRobot's rollout reads
    envs.close()


def test_statistics_wrappers_inside_the_hold_count_env_steps_under_chunk_stepping() -> None:
    envs = ChunkedActionWrapper(
        make_color_reach_vector_env(
            2, max_episode_steps=5, wrappers=[gym.wrappers.RecordEpisodeStatistics]
        )
    )
    envs.reset(seed=0)
    _, _, _, _, infos = envs.step(np.zeros((2, 4, 2), dtype=np.float32))
    assert "episode" not in infos  # standing still never reaches a target
    _, _, _, truncated, infos = envs.step(np.zeros((2, 4, 2), dtype=np.float32))
    assert truncated.all() and infos["steps_executed"].tolist() == [1, 1]
    assert infos["episode"]["l"].tolist() == [5, 5]
    envs.close()


def test_preview_renders_the_chunk_frames_and_leaves_the_env_as_it_was() -> None:
    env = ColorReachEnv()
    env.reset(seed=5)
    chunk = ColorReachExpert().chunk(env.state_dict(), horizon=4)
    before = env.state_dict()
    frames = env.preview(chunk)
    after = env.state_dict()
    np.testing.assert_array_equal(after.agent, before.agent)
    assert frames.shape == (4, 128, 128, 3) and frames.dtype == np.uint8
    stepped = [env.step(action)[0] for action in chunk]
    np.testing.assert_array_equal(frames, np.stack(stepped))
    assert not np.array_equal(frames[0], frames[-1])  # the agent moved
    assert env.preview(chunk[:0]).shape == (0, 128, 128, 3)
