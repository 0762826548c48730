"""``cosmos3-gym eval --env gym:ID``: foreign benchmarks end to end, with a head sized to them."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from cosmos3_gym.envs.gym_eval import GymEval
from cosmos3_gym.envs.names import make_eval_env
from cosmos3_gym.eval.cli import main
from cosmos3_gym.synthetic import synthetic_policy
from cosmos3_gym.tiny import write_tiny_checkpoint

pytestmark = pytest.mark.gym

PUSHT = ["--env", "gym:gym_pusht/PushT-v0", "--import", "gym_pusht"]


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_pusht_runs_end_to_end_with_a_synthetic_head_and_the_box_map(tmp_path, capsys) -> None:
    out = tmp_path / "pusht"
    code = main(["eval", *PUSHT, "--prompt", "push the T onto the target", "--synthetic", "tiny",
                 "--action-map", "box", "--max-episode-steps", "5", "--trials", "2",
                 "--num-envs", "2", "--no-progress", "--out", str(out)])
    assert code == 0
    records = _records(out)
    assert [(r["task"], r["trial"], r["steps"]) for r in sorted(
        records, key=lambda r: r["trial"])] == [("PushT-v0", 0, 5), ("PushT-v0", 1, 5)]
    assert all(r["reset_options"] == {"task_description": "push the T onto the target"}
               for r in records)
    results = json.loads((out / "results.json").read_text())
    assert results["episode_budget"]["max_episode_steps"] == {"gym:gym_pusht/PushT-v0": 5}
    identity = json.loads((out / "config.json").read_text())["identity"]
    assert identity["action_map"] == "box" and identity["import_modules"] == ["gym_pusht"]
    assert "PushT-v0" in capsys.readouterr().out


def test_the_synthetic_head_is_as_wide_as_the_env(tmp_path) -> None:
    pusht = make_eval_env("gym:gym_pusht/PushT-v0", prompt="push", import_modules=["gym_pusht"])
    assert isinstance(pusht, GymEval) and synthetic_policy(pusht).raw_action_dim == 2
    aloha = make_eval_env("gym:gym_aloha/AlohaInsertion-v0", prompt="insert",
                          import_modules=["gym_aloha"])
    assert synthetic_policy(aloha).raw_action_dim == 14
    assert aloha.max_episode_steps == 300  # the spec's budget


def test_a_checkpoint_of_another_width_is_refused_before_anything_loads(tmp_path, capsys):
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt10")  # a 10-D head
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", *PUSHT, "--prompt", "push", "--checkpoint", str(checkpoint),
              "--out", str(tmp_path / "out")])
    assert exit_info.value.code == 2 and time.perf_counter() - start < 10
    err = capsys.readouterr().err
    assert "makes 10-D actions" in err and "Box(0.0, 512.0, (2,), float32), 2-D" in err
    assert "write_tiny_checkpoint(DIR, policy_overrides={'raw_action_dim': 2})" in err
    assert "--synthetic tiny" in err and not (tmp_path / "out").exists()


def test_a_tiny_checkpoint_of_the_env_s_width_runs_it(tmp_path) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt2", policy_overrides={
        "raw_action_dim": 2, "normalization": "none", "stats": None})
    out = tmp_path / "out"
    assert main(["eval", *PUSHT, "--prompt", "push", "--checkpoint", str(checkpoint),
                 "--action-map", "box", "--max-episode-steps", "3", "--trials", "1",
                 "--no-progress", "--out", str(out)]) == 0
    assert [r["steps"] for r in _records(out)] == [3]


def test_several_tasks_each_with_its_prompt(tmp_path) -> None:
    out = tmp_path / "out"
    prompts = {"push": "push the T", "align": "align the T with the target"}
    assert main(["eval", *PUSHT, "--prompt", json.dumps(prompts), "--synthetic", "tiny",
                 "--max-episode-steps", "2", "--trials", "1", "--num-envs", "1",
                 "--no-progress", "--out", str(out)]) == 0
    got = {r["task"]: r["reset_options"]["task_description"] for r in _records(out)}
    assert got == prompts


def test_gym_options_are_refused_elsewhere_and_misused_ones_named(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--prompt", "x", "--out", str(tmp_path / "a")])
    assert ("--prompt apply to --env gym:ID and the benchmark presets only; found --env "
            "color_reach") in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", "--env", "gym:NoSuchEnv-v9", "--out", str(tmp_path / "b")])
    assert "not in Gymnasium's registry" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", *PUSHT, "--suite", "x", "--out", str(tmp_path / "c")])
    assert "--suite do not apply to --env gym:gym_pusht/PushT-v0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["eval", *PUSHT, "--env-kwargs", "[1]", "--out", str(tmp_path / "d")])
    assert "expected a JSON object" in capsys.readouterr().err


@pytest.mark.slow
def test_aloha_runs_end_to_end(tmp_path) -> None:
    out = tmp_path / "aloha"
    assert main(["eval", "--env", "gym:gym_aloha/AlohaInsertion-v0", "--import", "gym_aloha",
                 "--prompt", "insert the peg into the socket", "--synthetic", "tiny",
                 "--max-episode-steps", "3", "--trials", "1", "--num-envs", "1",
                 "--no-progress", "--out", str(out)]) == 0
    (record,) = _records(out)
    assert record["steps"] == 3 and record["success"] is False
    assert np.isfinite(record["max_action_excess"])


def test_rollouts_collect_from_a_gym_env_with_its_prompt(tmp_path) -> None:
    from cosmos3_gym.eval.rollout import load_rollouts

    out = tmp_path / "roll"
    assert main(["rollout", *PUSHT, "--prompt", "push the T", "--synthetic", "tiny",
                 "--action-map", "box", "--max-episode-steps", "3", "--env-steps", "4",
                 "--num-envs", "2", "--no-progress", "--out", str(out)]) == 0
    data = load_rollouts(out)
    assert data["actions"].shape == (4, 2, 2) and set(data["prompts"].ravel()) == {"push the T"}
    assert data["obs.pixels"].shape[:2] == (4, 2) and data["obs.pixels"].dtype == np.uint8
    # The box map: the raw actions, taken as [-1, 1], land on PushT's [0, 512] pixel targets,
    # clipped onto them.
    expected = np.clip((data["raw_actions"] + 1.0) * 256.0, 0.0, 512.0)
    np.testing.assert_allclose(data["actions"], expected, rtol=1e-5, atol=1e-4)


def test_rollouts_of_a_preset_written_before_real_time_execution_resume(tmp_path) -> None:
    """A rollout folder records its env's identity; one written before the env families
    declared their control rate and hold (and before the split of envs/families.py) holds
    neither, and ran synchronously: it resumes, as with the preset's values."""
    from cosmos3_gym.runner.rollouts import PROGRESS

    out = tmp_path / "roll"
    args = ["rollout", "--env", "pusht", "--synthetic", "tiny", "--max-episode-steps", "3",
            "--env-steps", "4", "--shard-steps", "4", "--num-envs", "2", "--no-progress",
            "--out", str(out)]
    assert main(args) == 0
    document = json.loads((out / PROGRESS).read_text())
    identity = document["identity"]
    assert (identity["env"]["control_hz"], identity["env"]["hold"]) == (10.0, "repeat")
    del identity["env"]["control_hz"], identity["env"]["hold"]
    identity["env"]["family"] = "cosmos3_gym.envs.families.GymEval"
    for key in ("latency", "replan_at", "rtc", "control_hz"):
        del identity["command"][key]
    del identity["policy"]["realtime"]
    (out / PROGRESS).write_text(json.dumps(document))
    assert main(args) == 0  # complete: bound to the upgraded identity, nothing to run
    with pytest.raises(SystemExit):  # a latency is another run all the same
        main([*args, "--latency", "2steps"])
