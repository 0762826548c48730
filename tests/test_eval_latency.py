"""``--latency`` end to end: the synchronous protocol unchanged at 0, injected latencies
reproducible byte for byte, every chunk's delay and what the env executed meanwhile on record,
RTC's committed rows, sweeps as arms, replays of measured delays, and bad input refused before
anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.eval.arms import arm_folder
from cosmos3_gym.eval.cli import main
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.eval.rollout import RolloutConfig, run_rollout_command
from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.runner import load_rollouts
from cosmos3_gym.runner.folder import RunMismatch

# A slow agent (0.02 arena units per step) keeps episodes going for their whole budget, so each
# spans several chunks of the tiny checkpoint (H=4).
SLOW = {"max_speed": 0.02}


def config(**changes) -> EvalConfig:
    return EvalConfig(**{"trials": 1, "num_envs": 2, "seed": 3, "image_size": 32,
                         "tasks": ["red", "green"], "max_episode_steps": 12, "env_kwargs": SLOW,
                         "sampling": SamplerConfig(num_inference_steps=2), "progress": False,
                         **changes})


def rollout(out: Path, **changes) -> dict:
    cfg = RolloutConfig(**{"env_steps": 16, "shard_steps": 16, "num_envs": 2, "seed": 1,
                           "image_size": 32, "max_episode_steps": 12, "env_kwargs": SLOW,
                           "sampling": SamplerConfig(num_inference_steps=2), "progress": False,
                           **changes})
    run_rollout_command(cfg, out)
    return load_rollouts(out)


def episodes(folder: Path) -> list[tuple]:
    return [(r["task"], r["trial"], r["obs_sha256"], r["steps"], r["success"])
            for r in read_episode_records(folder)]


def test_latency_0_runs_the_episodes_of_no_flag(tmp_path: Path) -> None:
    evaluate(config(), tmp_path / "none", summary=False)
    evaluate(config(latency="0"), tmp_path / "zero", summary=False)
    assert episodes(tmp_path / "none") == episodes(tmp_path / "zero")
    results = json.loads((tmp_path / "zero" / "results.json").read_text())
    assert results["latency"]["model"].startswith("synchronous")
    plain, zero = rollout(tmp_path / "r_none"), rollout(tmp_path / "r_zero", latency="0ms")
    np.testing.assert_array_equal(plain["actions"], zero["actions"])
    np.testing.assert_array_equal(plain["obs"], zero["obs"])
    assert "chunk_delay" not in zero


def test_an_injected_latency_gives_byte_identical_runs_and_shows_in_the_identity(
        tmp_path: Path) -> None:
    for name in ("a", "b"):
        evaluate(config(latency="3steps"), tmp_path / name, summary=False)
    assert episodes(tmp_path / "a") == episodes(tmp_path / "b")
    delays = [[c["delay"] for c in r["chunk_timing"]] for r in read_episode_records(tmp_path / "a")]
    assert delays and all(d == [3] * len(d) for d in delays)
    identity = json.loads((tmp_path / "a" / "config.json").read_text())["identity"]
    assert identity["latency"] == "3steps" and identity["rtc"] is False
    with pytest.raises(RunMismatch, match="latency"):  # resuming with another latency
        evaluate(config(latency="2steps"), tmp_path / "a", summary=False)


def test_every_chunk_shows_its_delay_and_the_env_executed_the_previous_chunk_meanwhile(
        tmp_path: Path) -> None:
    d = 3
    data = rollout(tmp_path / "r", latency=f"{d}steps")
    ids, actions = data["chunk_ids"], data["actions"]
    assert (data["chunk_delay"] == d).all()
    starts = dict(zip(data["episode_id"].tolist(), data["episode_start_step"].tolist(),
                      strict=True))
    by_key = {(int(e), int(c)): k for k, (e, c) in enumerate(
        zip(data["chunk_episode"], data["chunk_index"], strict=True))}
    checked = 0
    for k, (env, episode, index) in enumerate(zip(data["chunk_env"], data["chunk_episode"],
                                                 data["chunk_index"], strict=True)):
        if index == 0:
            assert data["chunk_dropped"][k] == 0
            continue
        assert data["chunk_dropped"][k] == d
        previous = by_key[(int(episode), int(index) - 1)]
        request = starts[int(episode)] + int(data["chunk_request_step"][k])
        for t in range(request, min(request + d, len(ids))):
            if data["episode_ids"][t, env] != episode:
                break  # the episode ended before the chunk arrived
            if ids[t, env] < 0:  # a stall: nothing of the previous chunk was left
                continue
            assert ids[t, env] == previous, (k, t)
            # row j of a chunk is the action for step (its request) + j
            row = t - (starts[int(episode)] + int(data["chunk_request_step"][previous]))
            assert d <= row < 4 or data["chunk_index"][previous] == 0
            np.testing.assert_array_equal(actions[t, env], data["chunk_actions"][previous, row])
            checked += 1
        if request + d < len(ids) and data["episode_ids"][request + d, env] == episode:
            assert ids[request + d, env] == k  # then the chunk runs from its row d
            np.testing.assert_array_equal(actions[request + d, env], data["chunk_actions"][k, d])
    assert checked >= 8


def test_rtc_records_show_the_committed_actions_as_the_next_chunks_first_rows(
        tmp_path: Path) -> None:
    d = 2
    data = rollout(tmp_path / "r", latency=f"{d}steps", rtc=True)
    starts = dict(zip(data["episode_id"].tolist(), data["episode_start_step"].tolist(),
                      strict=True))
    later = np.flatnonzero(data["chunk_index"] > 0)
    assert later.size and (data["chunk_committed"][later] == d).all()
    assert (data["chunk_committed"][data["chunk_index"] == 0] == 0).all()
    compared = 0
    for k in later:
        env, episode = data["chunk_env"][k], data["chunk_episode"][k]
        request = starts[int(episode)] + int(data["chunk_request_step"][k])
        for j in range(d):  # the actions executed while chunk k was computed are its rows 0..d-1
            t = request + j
            if t >= len(data["actions"]) or data["episode_ids"][t, env] != episode:
                break
            np.testing.assert_array_equal(data["chunk_raw_actions"][k, j],
                                          data["raw_actions"][t, env])
            compared += 1
    assert compared >= 8


@pytest.mark.slow
def test_a_sweep_reports_each_latency_as_an_arm_paired_with_the_control(tmp_path: Path,
                                                                        capsys) -> None:
    out = tmp_path / "sweep"
    code = main(["eval", "--latency", "0,2steps,4steps,8steps", "--trials", "3",
                 "--num-envs", "4", "--image-size", "32", "--max-episode-steps", "16",
                 "--denoising-steps", "2", "--no-progress", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert list(results["arms"]) == ["0", "2steps", "4steps", "8steps"]
    assert results["control"] == "0"
    for name, arm in results["arms"].items():
        assert arm["episodes"] == 12 and len(arm["interval"]) == 2
        assert arm["latency"]["chunks"] > 0 or name == "0"
    for name, paired in results["paired"].items():
        assert paired["pairs"] == 12
        assert paired["interval"][0] <= 0.0, (name, paired)  # never better beyond noise
    assert (arm_folder(out, "8steps") / "results.json").exists()
    assert (out / "results.png").exists()
    printed = capsys.readouterr().out
    assert "8steps" in printed and "paired 95% interval" in printed


def test_a_measured_run_replays_with_its_recorded_delays(tmp_path: Path) -> None:
    measured = tmp_path / "measured"
    evaluate(config(latency="measured", control_hz=4.0), measured, summary=False)
    recorded = read_episode_records(measured)
    assert all(c["delay"] >= 1 and c["latency_s"] > 0 for r in recorded
               for c in r["chunk_timing"])
    replay = tmp_path / "replay"
    evaluate(config(latency=f"replay:{measured}", num_envs=1), replay, summary=False)
    assert episodes(replay) == episodes(measured)
    assert [[c["delay"] for c in r["chunk_timing"]] for r in read_episode_records(replay)] == [
        [c["delay"] for c in r["chunk_timing"]] for r in recorded]


def test_an_older_folder_without_latency_settings_resumes(tmp_path: Path) -> None:
    out = tmp_path / "old"
    first = evaluate(config(), out, summary=False)
    path = out / "config.json"
    stored = json.loads(path.read_text())
    for key in ("latency", "replan_at", "rtc", "control_hz"):
        del stored["identity"][key]
    path.write_text(json.dumps(stored))
    again = evaluate(config(), out, summary=False)
    assert again["episodes"] == first["episodes"]


@pytest.mark.parametrize(("argv", "message"), [
    (["--latency", "fast"], "latency 'fast': expected 0, a duration"),
    (["--latency", "4steps", "--rtc"], "as long as a chunk or longer"),
    (["--latency", "2steps", "--rtc", "--sampler", "flow_sde"], "cannot take committed action"),
    (["--rtc"], "--rtc shapes real-time execution; with --latency 0"),
    (["--latency", "2steps", "--replan-at", "-1"], "expected an integer >= 0"),
    (["--latency", "150ms", "--env", "gym:gym_pusht/PushT-v0", "--import", "gym_pusht",
      "--prompt", "push", "--synthetic", "tiny", "--action-map", "box"],
     "declares none: give --control-hz"),
    (["--latency", "replay:/nonexistent/run"], "no evaluation there"),
    # A sweep is one kind of arms: not crossed with the robustness arms, and never sharded.
    (["--latency", "0,2steps", "--repeats", "2"],
     "--latency 0,2steps with --repeats: one kind of arms at a time"),
    (["--latency", "0,2steps", "--trials", "2", "--shard", "0/2"],
     "--shard 0/2 with --latency 0,2steps: a shard is a share of one run's episodes"),
])
def test_bad_latency_input_is_one_error_line_and_writes_nothing(tmp_path: Path, capsys, argv,
                                                               message) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as stop:
        main(["eval", *argv, "--out", str(out)])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert sum("error:" in line for line in err) == 1 and message in err[-1], err
    assert not out.exists()


def test_one_latency_with_repeats_runs_every_repeat_under_it(tmp_path: Path) -> None:
    out = tmp_path / "floor"
    results = evaluate(config(latency="2steps", repeats=2), out, summary=False)
    assert list(results["arms"]) == ["repeat-0", "repeat-1"]
    for name, arm in results["arms"].items():
        assert arm["latency"]["chunks"] > 0 and "2 steps" in arm["latency"]["model"], name
    assert results["noise_floor"]["pairs"] == 2


def test_a_rollout_takes_one_latency(tmp_path: Path, capsys) -> None:
    for value, message in (("0,2steps", "a rollout runs one latency"),
                           ("replay:x", "a replay reads an evaluation")):
        with pytest.raises(SystemExit):
            main(["rollout", "--latency", value, "--out", str(tmp_path / "r")])
        assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()
