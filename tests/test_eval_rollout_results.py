"""Rollout files round-trip through the loader; results helpers (Wilson, JSONL) behave."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.envs import ColorReachEval, derive_seed
from cosmos3_gym.eval.results import wilson_interval
from cosmos3_gym.jsonio import append_jsonl, read_jsonl
from cosmos3_gym.pipeline import Cosmos3ActionPipeline
from cosmos3_gym.policy import VectorPolicy
from cosmos3_gym.runner import collect_rollouts, load_rollouts
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


def test_jsonl_append_cuts_a_long_partial_line_or_a_lone_one(tmp_path: Path) -> None:
    """The partial tail is found from the end of the file (an append reads no more than that),
    also when it is longer than one block read, or the whole file."""
    path = tmp_path / "log.jsonl"
    append_jsonl(path, {"a": 1})
    with path.open("a") as f:
        f.write('{"a": 2, "b": "' + "x" * 200_000)
    append_jsonl(path, {"a": 3})
    assert path.read_text() == '{"a": 1}\n{"a": 3}\n'
    lone = tmp_path / "lone.jsonl"
    lone.write_text('{"a": ' + "1" * 70_000)
    append_jsonl(lone, {"a": 4})
    assert lone.read_text() == '{"a": 4}\n'


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
    eval_env = ColorReachEval(image_size=32, max_episode_steps=3)
    collect_rollouts(policy, eval_env, 7, tmp_path / "roll", num_envs=2, shard_steps=4)
    data = load_rollouts(tmp_path / "roll")
    meta = json.loads((tmp_path / "roll" / "meta.json").read_text())
    assert meta["shards"] == ["shard-00000.npz", "shard-00001.npz"] == data["meta"]["shards"]
    assert data["obs"].shape == (7, 2, 32, 32, 3) and data["obs"].dtype == np.uint8
    assert data["last_obs"].shape == (2, 32, 32, 3)
    assert data["actions"].shape == (7, 2, 2) and data["raw_actions"].shape == (7, 2, 2)
    assert data["prompts"].shape == (7, 2) and data["prompts"][0, 0].startswith("reach the")
    # Episodes of 3 steps, each slot restarted at once: step 3 is the next episode's first.
    assert data["truncations"][2].all() and data["valid"].all()
    assert (data["episode_ids"][3] != data["episode_ids"][2]).all()
    # Every action points at the chunk it came from; the chunk's raw actions contain it and
    # its seed is the policy's recorded seed.
    for t, env in zip(*np.nonzero(data["valid"]), strict=True):
        c = data["chunk_ids"][t, env]
        assert c >= 0 and data["chunk_env"][c] == env
        assert any(np.array_equal(data["raw_actions"][t, env], row)
                   for row in data["chunk_raw_actions"][c])
    assert (data["chunk_seed"] >= 0).all() and data["chunk_noise"].shape[1:] == (4, 64)
    # The episode table: one row per episode, finished ones with their 3 steps.
    assert (data["episode_id"] == np.arange(len(data["episode_id"]))).all()
    assert (data["episode_length"][data["episode_finished"]] == 3).all()


@pytest.mark.slow
@pytest.mark.libero
def test_libero_rollout_command_saves_dict_observations_and_both_tasks(tmp_path) -> None:
    from cosmos3_gym.eval.cli import main

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt")  # LIBERO-like 10-D head
    out = tmp_path / "rollouts"
    assert main(["rollout", "--checkpoint", str(checkpoint), "--env", "libero",
                 "--suite", "libero_spatial", "--tasks", "0,1", "--num-envs", "2",
                 "--async-envs", "--env-steps", "3", "--denoising-steps", "1",
                 "--no-progress", "--out", str(out)]) == 0
    data = load_rollouts(out)
    assert data["obs.agentview_image"].shape == (3, 2, 256, 256, 3)
    assert data["obs.agentview_image"].dtype == np.uint8
    assert data["actions"].shape == (3, 2, 7) and data["raw_actions"].shape == (3, 2, 10)
    assert data["prompts"][0, 0] != data["prompts"][0, 1]  # two tasks, one prompt each


def _rollout(out: Path, checkpoint: Path, *extra: str) -> int:
    from cosmos3_gym.eval.cli import main

    return main(["rollout", "--checkpoint", str(checkpoint), "--env-steps", "9", "--shard-steps",
                 "3", "--num-envs", "2", "--image-size", "32", "--max-episode-steps", "2",
                 "--denoising-steps", "2", "--no-progress", "--out", str(out), *extra])


def test_rollout_command_rotates_tasks_and_records_provenance(checkpoint: Path,
                                                              tmp_path: Path) -> None:
    out = tmp_path / "r"
    assert _rollout(out, checkpoint, "--sampler", "flow_sde", "--n-action-steps", "1") == 0
    data = load_rollouts(out)
    meta = data["meta"]
    assert meta["schema_version"] == 3 and len(meta["shards"]) == 3
    prov = meta["provenance"]
    assert prov["checkpoint"] == str(checkpoint) and len(prov["weights_sha256_16"]) == 16
    assert prov["policy"]["sampling"]["sampler"] == "flow_sde" and prov["raw_action_dim"] == 2
    assert prov["env"]["tasks"] == ["red", "green", "blue", "yellow"]
    assert prov["packages"]["torch"] and prov["seed"] == 0
    # Episodes of 2 steps on 2 slots for 9 steps: the 4 tasks in turn, each recorded.
    tasks = data["episode_task"].tolist()
    assert tasks[:8] == ["red", "green", "blue", "yellow"] * 2
    for e, task in enumerate(tasks):
        steps = np.argwhere(data["episode_ids"] == e)
        assert all(data["prompts"][t, env] == f"reach the {task} target" for t, env in steps)
    # Every action's chunk carries its log-probability and its episode.
    ids = data["chunk_ids"]
    assert (ids >= 0).all() and data["chunk_log_prob"].shape == data["chunk_env"].shape
    np.testing.assert_array_equal(data["chunk_episode"][ids], data["episode_ids"])
    np.testing.assert_array_equal(data["chunk_actions"][ids, 0], data["actions"])
    # A shard read alone points at run-wide chunks.
    from cosmos3_gym.runner import iter_rollout_shards

    shard = list(iter_rollout_shards(out))[1]
    assert shard["chunk_ids"].min() == int(shard["chunk_first"])


def test_interrupted_rollout_resumes_and_a_complete_one_runs_nothing(
    checkpoint: Path, tmp_path: Path, capsys
) -> None:
    out = tmp_path / "r"
    assert _rollout(out, checkpoint) == 0
    whole = load_rollouts(out)
    (out / "meta.json").unlink()  # cut while writing the last shard
    (out / "shard-00002.npz").unlink()
    assert _rollout(out, checkpoint) == 0
    resumed = load_rollouts(out)
    assert len(resumed["actions"]) == 9 and [p["steps"] for p in resumed["meta"]["parts"]] == [
        9, 3]
    np.testing.assert_array_equal(resumed["obs"][:6], whole["obs"][:6])  # kept as saved
    assert resumed["episode_ids"][6:].min() >= whole["episode_ids"][:6].max() + 1  # new ones
    before = (out / "meta.json").read_text()
    assert _rollout(out, checkpoint) == 0  # complete: nothing runs
    assert (out / "meta.json").read_text() == before
    with pytest.raises(SystemExit):
        _rollout(out, checkpoint, "--seed", "3")
    assert "holds rollouts of another command" in capsys.readouterr().err


def test_schema_1_rollouts_still_load(tmp_path: Path) -> None:
    """A folder in the first format (shard-local chunk ids) loads, ids made run-wide."""
    out = tmp_path / "v1"
    out.mkdir()
    for k, ids in enumerate(([[0, 1], [0, -1]], [[0, 1], [1, 1]])):
        np.savez_compressed(out / f"shard-{k:05d}.npz", obs=np.zeros((2, 2, 4), np.uint8),
                            chunk_ids=np.array(ids), chunk_env=np.array([0, 1]),
                            actions=np.zeros((2, 2, 2), np.float32))
    (out / "meta.json").write_text(json.dumps({
        "schema_version": 1, "num_envs": 2, "autoreset_mode": "NextStep", "num_steps": 4,
        "shards": ["shard-00000.npz", "shard-00001.npz"]}))
    data = load_rollouts(out)
    np.testing.assert_array_equal(data["chunk_ids"], [[0, 1], [0, -1], [2, 3], [3, 3]])
    assert data["meta"]["schema_version"] == 1
