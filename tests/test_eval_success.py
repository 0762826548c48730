"""The evaluator's success rate counts what the env calls a success, and nothing else.

The expected outcome of every episode comes from the env itself: each episode is replayed here
in a plain ``ColorReachEnv`` loop (one env, no vector env, no evaluator) with the same policy,
and its outcome is the env's own ``info["is_success"]`` and reward at the step the episode ended.
The policy is a stand-in with the pipeline's call signature that reads the agent and the named
target off the image and heads for it, so that with a 6-step limit some episodes succeed early,
some succeed on their very last step and some are truncated, all decided by the env.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.envs import ColorReachEnv, ColorReachExpert, ColorReachState, derive_seed
from cosmos3_gym.envs.color_reach import AGENT_COLOR, COLORS, prompt_for
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.pipeline.output import ActionOutput
from cosmos3_gym.runner import hash_observation

TASKS = ["red", "green", "blue"]
TRIALS = 3
SEED = 7
IMAGE_SIZE = 64
MAX_STEPS = 6
HORIZON = 4
MAX_SPEED = ColorReachEnv().max_speed


def _centre(image: np.ndarray, rgb: tuple[int, int, int]) -> np.ndarray:
    """Arena (x, y) of the pixels of one colour."""
    ys, xs = np.nonzero(np.all(image == np.array(rgb, np.uint8), axis=-1))
    assert len(xs), f"no {rgb} pixels in the image"
    return (np.array([xs.mean(), ys.mean()]) + 0.5) / image.shape[0]


class ImageReadingExpert:
    """A policy stand-in (the pipeline's call signature): each chunk is the scripted expert's
    plan from the agent and goal positions read off the image, the goal named by the prompt."""

    action_horizon = HORIZON

    def __init__(self) -> None:
        self.calls = 0

    def chunk(self, image: np.ndarray, prompt: str) -> np.ndarray:
        goal = next(c for c in COLORS if prompt == prompt_for(c))
        state = ColorReachState(agent=_centre(image, AGENT_COLOR),
                                targets={goal: _centre(image, COLORS[goal])},
                                goal=goal, max_speed=MAX_SPEED)
        return ColorReachExpert().chunk(state, HORIZON)

    def __call__(self, images, prompts, *, seed=None, **sampler) -> ActionOutput:
        self.calls += 1
        actions = np.stack([self.chunk(img, p) for img, p in zip(images, prompts, strict=True)])
        seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * len(actions)
        noise = np.zeros((*actions.shape[:2], 64), np.float32)
        return ActionOutput(actions, actions.copy(), noise, seeds, {"total_s": 0.0})


class StandStill(ImageReadingExpert):
    """A policy that never moves: every episode runs into the step limit."""

    def chunk(self, image: np.ndarray, prompt: str) -> np.ndarray:
        return np.zeros((HORIZON, 2), np.float32)


def env_outcome(policy: ImageReadingExpert, task: str, trial: int) -> dict:
    """One episode in a plain env loop: whole chunks, replanned when a chunk is used up."""
    return play(policy, derive_seed(SEED, task, trial), {"target": task})


def play(policy: ImageReadingExpert, seed: int, options: dict) -> dict:
    """``env_outcome`` from a reset seed and options; also hashes every observation."""
    env = ColorReachEnv(image_size=IMAGE_SIZE, max_episode_steps=MAX_STEPS)
    obs, _ = env.reset(seed=seed, options=options)
    digest = hashlib.sha256()
    hash_observation(digest, obs[None], 0)  # as the evaluator hashes env 0 of a vector obs
    steps = 0
    while True:
        for action in policy.chunk(obs, env.task_description):
            obs, reward, terminated, truncated, info = env.step(action)
            hash_observation(digest, obs[None], 0)
            steps += 1
            if terminated or truncated:
                assert reward == float(info["is_success"])  # the env's two signals agree
                return {"success": bool(info["is_success"]), "steps": steps,
                        "truncated": bool(truncated), "obs_sha256": digest.hexdigest()}


def config(**overrides) -> EvalConfig:
    fields = dict(tasks=TASKS, trials=TRIALS, num_envs=3, seed=SEED, image_size=IMAGE_SIZE,
                  max_episode_steps=MAX_STEPS, progress=False)
    return EvalConfig(**{**fields, **overrides})


@pytest.fixture(scope="module")
def expected() -> dict[tuple[str, int], dict]:
    policy = ImageReadingExpert()
    return {(t, k): env_outcome(policy, t, k) for t in TASKS for k in range(TRIALS)}


def test_the_episodes_really_succeed_and_really_truncate(expected) -> None:
    """The fixture episodes cover every case: early success, success on the last allowed step,
    truncation; otherwise the tests below could not tell a wrong count from a right one."""
    outcomes = list(expected.values())
    assert any(o["success"] and o["steps"] < MAX_STEPS for o in outcomes)
    assert any(o["success"] and o["steps"] == MAX_STEPS for o in outcomes)
    assert any(o["truncated"] and not o["success"] for o in outcomes)


@pytest.mark.parametrize("num_envs", [1, 3])
def test_success_rate_counts_the_episodes_the_env_calls_successes(
    expected, tmp_path: Path, num_envs: int
) -> None:
    results = evaluate(config(num_envs=num_envs), tmp_path, pipeline=ImageReadingExpert())
    records = {(r["task"], r["trial"]): r for r in read_episode_records(tmp_path)}
    assert records.keys() == expected.keys()
    for key, outcome in expected.items():
        assert (records[key]["success"], records[key]["steps"]) == (
            outcome["success"], outcome["steps"]), key
    successes = sum(o["success"] for o in expected.values())
    assert results["successes"] == successes
    assert results["success_rate"] == pytest.approx(successes / len(expected))
    for task in TASKS:
        mine = [o for (t, _), o in expected.items() if t == task]
        assert results["per_task"][task]["successes"] == sum(o["success"] for o in mine)
    assert json.loads((tmp_path / "results.json").read_text())["successes"] == successes


def test_truncated_episode_is_not_a_success(expected, tmp_path: Path) -> None:
    truncated = [key for key, o in expected.items() if o["truncated"]]
    evaluate(config(), tmp_path, pipeline=ImageReadingExpert())
    records = {(r["task"], r["trial"]): r for r in read_episode_records(tmp_path)}
    assert truncated and all(not records[key]["success"] for key in truncated)
    assert all(records[key]["steps"] == MAX_STEPS for key in truncated)


def test_a_policy_that_never_reaches_its_target_scores_zero(tmp_path: Path) -> None:
    results = evaluate(config(), tmp_path, pipeline=StandStill())
    assert all(env_outcome(StandStill(), t, k)["truncated"]
               for t in TASKS for k in range(TRIALS))
    assert results["successes"] == 0 and results["success_rate"] == 0.0
    assert results["episodes"] == len(TASKS) * TRIALS
    assert all(r["steps"] == MAX_STEPS for r in read_episode_records(tmp_path))


def test_a_record_replays_its_episode_to_the_same_observation_hash(tmp_path: Path) -> None:
    """A record's seed and reset_options restart its episode in a plain env; the same policy
    then sees the observations whose hash the record holds."""
    evaluate(config(), tmp_path, pipeline=ImageReadingExpert())
    records = read_episode_records(tmp_path)
    assert len(records) == len(TASKS) * TRIALS
    for record in records:
        replayed = play(ImageReadingExpert(), record["seed"], record["reset_options"])
        assert (replayed["obs_sha256"], replayed["steps"]) == (
            record["obs_sha256"], record["steps"]), (record["task"], record["trial"])
