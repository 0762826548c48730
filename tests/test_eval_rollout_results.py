"""Rollout files round-trip through the loader; results helpers (Wilson, JSONL) behave."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.envs import make_color_reach_vector_env
from cosmos3_gym.eval.results import append_jsonl, read_jsonl, wilson_interval
from cosmos3_gym.eval.rollout import collect_rollouts, load_rollouts
from cosmos3_gym.eval.tasks import derive_seed
from cosmos3_gym.pipeline import Cosmos3ActionPipeline
from cosmos3_gym.policy import VectorPolicy
from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint


def test_wilson_interval_known_values() -> None:
    lo, hi = wilson_interval(5, 10)
    assert (round(lo, 4), round(hi, 4)) == (0.2366, 0.7634)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="successes <= trials"):
        wilson_interval(3, 2)


def test_jsonl_partial_last_line_is_skipped_then_cut(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"a": 1})
    with path.open("a") as f:
        f.write('{"a": 2, "b"')  # a write cut by a crash
    assert read_jsonl(path) == [{"a": 1}]
    append_jsonl(path, {"a": 3})
    assert read_jsonl(path) == [{"a": 1}, {"a": 3}]


def test_derived_seeds_depend_on_task_trial_and_chunk() -> None:
    seeds = {derive_seed(0, t, k, c) for t in ("red", "blue") for k in range(3)
             for c in (None, 0, 1)}
    assert len(seeds) == 18
    assert derive_seed(0, "red", 1) == derive_seed(0, "red", 1)
    assert derive_seed(1, "red", 1) != derive_seed(0, "red", 1)


def test_rollouts_round_trip_through_the_loader(tmp_path: Path) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", policy_overrides=COLOR_REACH_POLICY)
    policy = VectorPolicy(Cosmos3ActionPipeline.from_pretrained(ckpt), n_action_steps=2,
                          seed=3, num_inference_steps=2)
    envs = make_color_reach_vector_env(2, image_size=32, max_episode_steps=3)
    try:
        collect_rollouts(policy, envs, 7, tmp_path / "roll", shard_steps=4)
    finally:
        envs.close()
    data = load_rollouts(tmp_path / "roll")
    meta = json.loads((tmp_path / "roll" / "meta.json").read_text())
    assert meta["shards"] == ["shard-00000.npz", "shard-00001.npz"] == data["meta"]["shards"]
    assert data["obs"].shape == (7, 2, 32, 32, 3) and data["obs"].dtype == np.uint8
    assert data["last_obs"].shape == (2, 32, 32, 3)
    assert data["actions"].shape == (7, 2, 2) and data["raw_actions"].shape == (7, 2, 2)
    assert data["prompts"].shape == (7, 2) and data["prompts"][0, 0].startswith("reach the")
    # Episodes of 3 steps under NEXT_STEP: step 3 is the reset step, its action ignored.
    assert data["truncations"][2].all() and not data["valid"][3].any() and data["valid"][4].all()
    # Every valid action points at the chunk it came from; the chunk's raw actions contain it
    # and its seed is the policy's recorded seed.
    for t, env in zip(*np.nonzero(data["valid"]), strict=True):
        c = data["chunk_ids"][t, env]
        assert c >= 0 and data["chunk_env"][c] == env
        assert any(np.array_equal(data["raw_actions"][t, env], row)
                   for row in data["chunk_raw_actions"][c])
    assert (data["chunk_seed"] >= 0).all() and data["chunk_noise"].shape[1:] == (4, 64)
    assert not data["valid"][3].any() and (data["chunk_ids"][3] == -1).all()


@pytest.mark.slow
@pytest.mark.libero
def test_libero_rollout_command_saves_dict_observations_and_both_tasks(tmp_path) -> None:
    from cosmos3_gym.eval.cli import main

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt")  # LIBERO-like 10-D head
    out = tmp_path / "rollouts"
    assert main(["rollout", "--checkpoint", str(checkpoint), "--env", "libero",
                 "--suite", "libero_spatial", "--tasks", "0,1", "--num-envs", "2",
                 "--async-envs", "--steps", "3", "--num-inference-steps", "1",
                 "--no-progress", "--out", str(out)]) == 0
    data = load_rollouts(out)
    assert data["obs.agentview_image"].shape == (3, 2, 256, 256, 3)
    assert data["obs.agentview_image"].dtype == np.uint8
    assert data["actions"].shape == (3, 2, 7) and data["raw_actions"].shape == (3, 2, 10)
    assert data["prompts"][0, 0] != data["prompts"][0, 1]  # two tasks, one prompt each
