"""``n_action_steps`` end to end: with a horizon H > k, an episode plans ceil(steps / k) chunks,
its record says so, and the env executes rows [:k] of each chunk in order (the evaluator, the
disk rollouts and the on-policy collector alike)."""

from __future__ import annotations

import math
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from cosmos3_gym.envs import ColorReachEval, make_color_reach_vector_env
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.pipeline import SamplerConfig
from cosmos3_gym.policy import VectorPolicy
from cosmos3_gym.runner import collect_on_policy, collect_rollouts, load_rollouts

STEPS = 7  # every episode runs out its budget: the coded actions move the agent too little
ROW_CODE = 0.1  # action[1] = row * ROW_CODE; action[0] = chunk serial * 1e-3


class _CodedChunks:
    """The real pipeline, but each planned chunk's actions say which chunk and row they are."""

    def __init__(self, pipeline) -> None:
        self.pipeline, self.serial = pipeline, 0
        self.action_dim, self.action_horizon = pipeline.action_dim, pipeline.action_horizon
        self.policy = pipeline.policy

    def __call__(self, images, prompts, **kwargs):
        out = self.pipeline(images, prompts, **kwargs)
        for i in range(len(prompts)):
            self.serial += 1
            out.actions[i, :, 0] = self.serial * 1e-3
            out.actions[i, :, 1] = np.arange(out.actions.shape[1]) * ROW_CODE
        return out


class _ActionLog(gym.Wrapper):
    """Every action a sub-env receives, one list per episode (a reset starts the next)."""

    def __init__(self, env: gym.Env, log: list[list[np.ndarray]]) -> None:  # this env's log
        super().__init__(env)
        self.log = log

    def reset(self, **kwargs):
        self.log.append([])
        return self.env.reset(**kwargs)

    def step(self, action):
        self.log[-1].append(np.array(action, np.float32))
        return self.env.step(action)


class _LoggedColorReach(ColorReachEval):
    def __init__(self, log: list, **kwargs) -> None:
        super().__init__(**kwargs)
        self.log = log

    def make(self, num_envs, async_, autoreset_mode=AutoresetMode.DISABLED):
        def logged(env: gym.Env) -> gym.Env:  # one log per sub-env
            self.log.append([])
            return _ActionLog(env, self.log[-1])

        return make_color_reach_vector_env(
            num_envs, autoreset_mode=autoreset_mode, image_size=self.image_size,
            max_episode_steps=self.max_episode_steps, wrappers=[logged],
        )


def _check_segment(actions: np.ndarray, k: int) -> int:
    """The actions of one episode are rows 0..k-1 of successive chunks; returns the chunks."""
    rows = np.rint(actions[:, 1] / ROW_CODE).astype(int)
    np.testing.assert_array_equal(rows, np.arange(len(actions)) % k)
    serials = np.rint(actions[:, 0] / 1e-3).astype(int)
    starts = np.arange(0, len(actions), k)
    for s in starts:  # one chunk per k steps, never mixed
        assert (serials[s : s + k] == serials[s]).all()
    assert len(set(serials[starts].tolist())) == len(starts)  # a new chunk each time
    return len(starts)


@pytest.mark.parametrize("k", [3, None])
def test_evaluator_executes_the_first_k_rows_of_each_chunk(checkpoint: Path, pipeline,
                                                           tmp_path: Path, k) -> None:
    horizon = pipeline.action_horizon
    assert k is None or horizon > k
    log: list[list[list[np.ndarray]]] = []  # per sub-env, per episode
    eval_env = _LoggedColorReach(log, tasks=["red", "green", "blue"], image_size=32,
                                 max_episode_steps=STEPS)
    config = EvalConfig(checkpoint=str(checkpoint), tasks=["red", "green", "blue"], trials=2,
                        num_envs=2, seed=3, image_size=32, max_episode_steps=STEPS,
                        sampling=SamplerConfig(num_inference_steps=2), n_action_steps=k,
                        progress=False)
    evaluate(config, tmp_path, pipeline=_CodedChunks(pipeline), eval_env=eval_env)
    per_chunk = k or horizon
    records = read_episode_records(tmp_path)
    assert len(records) == 6
    for r in records:
        assert r["steps"] == STEPS and r["chunks"] == math.ceil(STEPS / per_chunk)
    segments = [np.stack(seg) for env_log in log for seg in env_log if seg]
    assert len(segments) == 6
    found = sorted((len(seg), _check_segment(seg, per_chunk)) for seg in segments)
    assert found == sorted((r["steps"], r["chunks"]) for r in records)


def test_disk_rollouts_execute_the_first_k_rows_of_each_chunk(pipeline, tmp_path: Path) -> None:
    k = 3
    eval_env = ColorReachEval(image_size=32, max_episode_steps=STEPS)
    policy = VectorPolicy(_CodedChunks(pipeline), n_action_steps=k, seed=1, num_inference_steps=2)
    collect_rollouts(policy, eval_env, 2 * STEPS + 2, tmp_path, num_envs=2, seed=1)
    data = load_rollouts(tmp_path)
    finished = np.flatnonzero(data["episode_finished"])
    assert len(finished) == 4
    for e in data["episode_id"][finished]:
        t, env = np.nonzero(data["episode_ids"] == e)
        assert (np.diff(t) == 1).all() and len(t) == STEPS and data["valid"][t, env].all()
        ids = data["chunk_ids"][t, env]
        rows = data["chunk_raw_actions"][ids, np.arange(len(t)) % k]
        np.testing.assert_array_equal(data["raw_actions"][t, env], rows)
        assert _check_segment(data["actions"][t, env], k) == math.ceil(STEPS / k)
        assert len(set(ids.tolist())) == math.ceil(STEPS / k)
        assert (data["chunk_episode"][ids] == e).all()


def test_on_policy_batches_execute_the_first_k_rows_of_each_chunk(pipeline) -> None:
    k = 3
    eval_env = ColorReachEval(image_size=32, max_episode_steps=STEPS)
    envs = eval_env.make(2, False, autoreset_mode=AutoresetMode.DISABLED)
    policy = VectorPolicy(_CodedChunks(pipeline), n_action_steps=k, seed=1, num_inference_steps=2)
    batch = collect_on_policy(policy, envs, 2 * STEPS + 3, eval_env=eval_env, seed=1)
    envs.close()
    finished = np.flatnonzero(batch["episode_finished"].numpy())
    assert len(finished) == 4
    for e in finished:
        t, env = np.nonzero(batch["episode_ids"].numpy() == e)
        assert (np.diff(t) == 1).all() and len(t) == STEPS
        ids = batch["chunk_ids"].numpy()[t, env]
        rows = batch["chunk_actions"].numpy()[ids, np.arange(len(t)) % k]
        np.testing.assert_array_equal(batch["actions"].numpy()[t, env], rows)
        assert _check_segment(batch["actions"].numpy()[t, env], k) == math.ceil(STEPS / k)
        assert (batch["chunk_episode"].numpy()[ids] == e).all()
