"""On-policy collection in memory (cosmos3_gym/runner/onpolicy.py): GRPO groups, task
coverage, and the log-probabilities a learner recomputes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from cosmos3_gym.envs import ColorReachEval
from cosmos3_gym.pipeline import chunk_log_prob
from cosmos3_gym.policy import VectorPolicy
from cosmos3_gym.runner import TaskRotation, collect_on_policy, stochastic_record


def _collect(pipeline, num_envs: int, steps: int, group_size: int = 1, **policy_kwargs):
    eval_env = ColorReachEval(image_size=32, max_episode_steps=6)
    envs = eval_env.make(num_envs, False, autoreset_mode=AutoresetMode.DISABLED)
    policy = VectorPolicy(pipeline, seed=5, num_inference_steps=3, **policy_kwargs)
    try:
        return collect_on_policy(policy, envs, steps, eval_env=eval_env, seed=11,
                                 group_size=group_size)
    finally:
        envs.close()


def test_a_group_shares_its_start_state(pipeline) -> None:
    batch = _collect(pipeline, 4, 14, group_size=2, sampler="flow_sde")
    obs, ids = batch["obs"].numpy(), batch["episode_ids"].numpy()
    groups = batch["episode_group"].numpy()
    firsts = {}
    for e, g in enumerate(groups):
        t, env = batch["episode_start_step"][e].item(), batch["episode_env"][e].item()
        if t == len(obs):  # started after the last step
            continue
        assert ids[t, env] == e
        firsts.setdefault(int(g), []).append((obs[t, env], batch["episode_seed"][e].item(),
                                              batch["episode_task"][e]))
    assert len(firsts) >= 4
    for members in firsts.values():
        assert len(members) <= 2
        for frame, seed, task in members[1:]:
            np.testing.assert_array_equal(frame, members[0][0])
            assert (seed, task) == members[0][1:]
    complete = [m for m in firsts.values() if len(m) == 2]
    assert len({m[0][1] for m in complete}) == len(complete)  # groups differ from each other
    # The members' episodes differ by the policy's noise alone: their first chunks differ.
    first_chunk = {}
    for c, e in enumerate(batch["chunk_episode"].tolist()):
        first_chunk.setdefault(e, c)
    members = [e for e, g in enumerate(groups) if g == 0]
    a, b = (batch["chunk_actions"][first_chunk[e]] for e in members)
    assert not torch.equal(a, b)


def test_a_run_covers_its_tasks_evenly_and_records_them() -> None:
    schedule = TaskRotation(ColorReachEval(), seed=0, num_envs=3)
    tasks = [schedule.next(slot % 3).tag.episode.task for slot in range(22)]
    counts = Counter(tasks)
    assert set(counts) == {"red", "green", "blue", "yellow"}
    assert max(counts.values()) - min(counts.values()) <= 1


def test_batch_log_probs_recompute_under_the_sampling_weights(pipeline) -> None:
    batch = _collect(pipeline, 3, 8, sampler="flow_sde", n_action_steps=2)
    n = len(batch["chunk_env"])
    assert batch["chunk_log_prob"].shape == (n,) and batch["chunk_log_prob"].dtype == torch.float32
    assert batch["weights"] and batch["sde_settings"]["sampler"] == "flow_sde"
    assert batch["chunk_sde_action_mask"][:, 2:].sum() == 0  # only the executed rows count
    with torch.no_grad():
        again = chunk_log_prob(pipeline, stochastic_record(batch), batch["chunk_prompts"])
    torch.testing.assert_close(again, batch["chunk_log_prob"], rtol=0, atol=1e-5)
    assert float(batch["chunk_rewards"].sum()) == float(batch["rewards"].sum())
    assert batch["last_obs"].shape == batch["obs"].shape[1:]
    assert (batch["dones"] == (batch["terminations"] | batch["truncations"])).all()


def test_deterministic_batches_have_no_log_probs(pipeline) -> None:
    batch = _collect(pipeline, 2, 3)
    assert "chunk_log_prob" not in batch and batch["weights"] is None
    with pytest.raises(ValueError, match="deterministically"):
        stochastic_record(batch)


def test_an_autoresetting_env_is_refused(pipeline) -> None:
    eval_env = ColorReachEval(image_size=32)
    envs = eval_env.make(2, False, autoreset_mode=AutoresetMode.NEXT_STEP)
    with pytest.raises(ValueError, match="DISABLED"):
        collect_on_policy(VectorPolicy(pipeline), envs, 2, eval_env=eval_env)
    envs.close()
