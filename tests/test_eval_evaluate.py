"""Evaluation: pool scheduling, per-episode records, resume after a kill, faults, bad actions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.envs import ColorReachEnv, ColorReachEval, EpisodeEndHold, derive_seed
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.pipeline import Cosmos3ActionPipeline, SamplerConfig
from cosmos3_gym.tiny import write_tiny_checkpoint

# What an episode is, independent of where and when it ran.
EPISODE_FIELDS = ("task", "trial", "seed", "init_state_id", "steps", "chunks", "success",
                  "out_of_range_steps", "max_action_excess", "invalid_action")
TASKS = ["red", "green", "blue"]


def small_config(checkpoint: Path, **overrides) -> EvalConfig:
    fields = dict(checkpoint=str(checkpoint), tasks=TASKS, trials=2, num_envs=3, seed=7,
                  image_size=32, max_episode_steps=6,
                  sampling=SamplerConfig(num_inference_steps=2), progress=False)
    return EvalConfig(**{**fields, **overrides})


def episode_table(out: Path) -> list[tuple]:
    # Batch composition changes float rounding (~1e-7) in the model, so the one float field is
    # compared to 4 decimals; steps, chunks and outcomes must match exactly.
    return [tuple(round(r[k], 4) if k == "max_action_excess" else r[k] for k in EPISODE_FIELDS)
            for r in read_episode_records(out)]


def log_keys(out: Path) -> list[tuple[str, int]]:
    lines = [json.loads(x) for p in sorted(out.glob("episodes*.jsonl"))
             for x in p.read_text().splitlines() if x.strip()]
    return sorted((r["task"], r["trial"]) for r in lines)


@pytest.fixture(scope="module")
def reference(checkpoint: Path, pipeline, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One uninterrupted run that other tests compare against."""
    out = tmp_path_factory.mktemp("reference")
    evaluate(small_config(checkpoint), out, pipeline=pipeline)
    return out


def test_results_json_schema_and_numbers(reference: Path) -> None:
    results = json.loads((reference / "results.json").read_text())
    records = read_episode_records(reference)
    assert results["complete"] is True
    assert results["episodes"] == results["episodes_expected"] == len(records) == 6
    assert [r["prompt"] for r in records] == [f"reach the {r['task']} target" for r in records]
    assert results["successes"] == sum(r["success"] for r in records)
    assert results["success_rate"] == pytest.approx(results["successes"] / 6)
    lo, hi = results["interval"]
    assert 0.0 <= lo <= results["success_rate"] <= hi <= 1.0
    assert list(results["per_task"]) == TASKS
    for task, entry in results["per_task"].items():
        mine = [r for r in records if r["task"] == task]
        assert entry["episodes"] == len(mine) == 2
        assert entry["successes"] == sum(r["success"] for r in mine)
        assert len(entry["interval"]) == 2
    assert results["per_suite"]["color_reach"]["episodes"] == 6
    t = results["throughput"]
    assert t["episodes"] == 6 and t["env_steps"] == sum(r["steps"] for r in records)
    assert t["chunks"] == sum(r["chunks"] for r in records)
    assert t["steps_per_s"] > 0 and t["chunks_per_s"] > 0 and t["episodes_per_s"] > 0
    assert results["incidents"] == []
    assert log_keys(reference) == sorted((task, trial) for task in TASKS for trial in range(2))


def test_episode_seeds_derive_from_task_and_trial_only(reference: Path) -> None:
    for r in read_episode_records(reference):
        assert r["seed"] == derive_seed(7, r["task"], r["trial"])
        assert 1 <= r["steps"] <= 6
        assert r["chunks"] == -(-r["steps"] // 4)  # 4-step chunks, executed whole
    # The pool mixes tasks: the first batch holds three different (task, trial) pairs.
    assert len({r["env_slot"] for r in read_episode_records(reference)}) == 3


def test_results_do_not_depend_on_the_number_of_env_slots(
    reference: Path, checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    evaluate(small_config(checkpoint, num_envs=1), tmp_path, pipeline=pipeline)
    assert episode_table(tmp_path) == episode_table(reference)


# The `cosmos3-gym` CLI, except that the pipeline's second call after the episode log reached
# two records says "blocked" on stdout and never returns: the run stops there, mid-run with an
# episode in flight, until the test kills it. No sleeps, no deadlines: the kill waits for the word.
_CLI_THAT_BLOCKS_AFTER_TWO_EPISODES = """
import sys, threading
from pathlib import Path
from cosmos3_gym.eval.cli import main
from cosmos3_gym.pipeline import Cosmos3ActionPipeline

log, calls_after = Path(sys.argv[1]), []
original = Cosmos3ActionPipeline.__call__

def call(self, *args, **kwargs):
    if log.exists() and len(log.read_text().splitlines()) >= 2:
        calls_after.append(1)
        if len(calls_after) == 2:
            print("blocked", flush=True)
            threading.Event().wait()
    return original(self, *args, **kwargs)

Cosmos3ActionPipeline.__call__ = call
sys.exit(main(sys.argv[2:]))
"""


def test_killed_run_resumes_without_losing_or_repeating(
    reference: Path, checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    args = ["eval", "--checkpoint", str(checkpoint), "--tasks", ",".join(TASKS), "--trials", "2",
            "--num-envs", "1", "--seed", "7", "--image-size", "32", "--max-episode-steps", "6",
            "--denoising-steps", "2", "--no-progress", "--out", str(tmp_path)]
    log = tmp_path / "episodes.jsonl"
    proc = subprocess.Popen(
        [sys.executable, "-c", _CLI_THAT_BLOCKS_AFTER_TWO_EPISODES, str(log), *args],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        said = proc.stdout.readline()  # returns at the word, or at the run's end (EOF)
        assert said == "blocked\n", f"the run ended before it could be killed: {said!r}"
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    finished_before = len(read_episode_records(tmp_path))
    assert 2 <= finished_before < 6
    partial = json.loads((tmp_path / "results.json").read_text())
    assert partial["complete"] is False and partial["episodes"] == finished_before

    results = evaluate(small_config(checkpoint, num_envs=2), tmp_path, pipeline=pipeline)
    assert results["complete"] and results["episodes"] == 6
    assert log_keys(tmp_path) == sorted((t, k) for t in TASKS for k in range(2))
    assert episode_table(tmp_path) == episode_table(reference)


def test_rerun_with_other_settings_is_refused(reference: Path, checkpoint: Path) -> None:
    before = (reference / "episodes.jsonl").read_text()
    with pytest.raises(ValueError, match=r"different evaluation.*trials"):
        evaluate(small_config(checkpoint, trials=3), reference)
    assert (reference / "episodes.jsonl").read_text() == before


def test_finished_run_rerun_does_nothing(reference: Path, checkpoint: Path, monkeypatch) -> None:
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def no_loading(path: str, *args, **kwargs):
        raise AssertionError(f"a complete folder must not load the checkpoint; loaded {path}")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", no_loading)
    before = (reference / "episodes.jsonl").read_text()
    results = evaluate(small_config(checkpoint), reference)
    assert results["episodes"] == 6
    assert (reference / "episodes.jsonl").read_text() == before


def test_missing_checkpoints_are_clear_errors(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(FileNotFoundError, match="no checkpoint folder at .*nope"):
        Cosmos3ActionPipeline.from_pretrained(str(tmp_path / "nope"))
    import cosmos3_gym.formats as formats

    # An install without the shipped checkpoint: the error says what is missing and what to do.
    monkeypatch.setattr(formats, "SHIPPED", tmp_path / "checkpoints")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="tiny checkpoint is not shipped"):
        Cosmos3ActionPipeline.from_pretrained("tiny")


def _crashing_env(marker: str, image_size: int, max_episode_steps: int,
                  hang: bool = False) -> EpisodeEndHold:
    return EpisodeEndHold(_CrashOnce(marker, hang=hang, image_size=image_size,
                                     max_episode_steps=max_episode_steps))


class _CrashOnce(ColorReachEnv):
    """Kills its own worker process (like a simulator segfault) at the 3rd step of 'green'
    trial 1, the first time only (a marker file remembers it across worker restarts).
    With ``hang=True`` it stops answering instead (a simulator stuck in a step)."""

    def __init__(self, marker: str, hang: bool = False, **kwargs) -> None:
        super().__init__(**kwargs)
        self.marker = marker
        self.hang = hang

    def reset(self, *, seed=None, options=None):
        self._crash_here = (options or {}).get("target") == "green" and seed == derive_seed(
            7, "green", 1)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self._crash_here and self._elapsed == 2 and not os.path.exists(self.marker):
            Path(self.marker).touch()
            if self.hang:
                threading.Event().wait()  # for good: only the evaluator's env_timeout ends it
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class _CrashingColorReach(ColorReachEval):
    def __init__(self, marker: Path, hang: bool = False, **kwargs) -> None:
        super().__init__(TASKS, **kwargs)
        self.marker = str(marker)
        self.hang = hang

    def make(self, num_envs: int, async_: bool):
        import functools

        import gymnasium as gym
        from gymnasium.vector import AutoresetMode

        fn = functools.partial(_crashing_env, self.marker, self.image_size,
                               self.max_episode_steps, self.hang)
        return gym.vector.AsyncVectorEnv([fn] * num_envs, autoreset_mode=AutoresetMode.DISABLED)


def test_killed_env_worker_is_restarted_and_every_episode_recorded_once(
    reference: Path, checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    marker = tmp_path / "crashed"
    eval_env = _CrashingColorReach(marker, image_size=32, max_episode_steps=6)
    out = tmp_path / "out"
    # A dead worker is noticed when its pipe closes, not by a timeout: a day is "never" here,
    # so a slow step on a busy machine cannot add a hang incident of its own.
    results = evaluate(small_config(checkpoint, async_envs=True, env_timeout=86400.0), out,
                       pipeline=pipeline, eval_env=eval_env)
    assert marker.exists(), "the injected crash never happened"
    assert results["complete"] and results["episodes"] == 6
    assert log_keys(out) == sorted((t, k) for t in TASKS for k in range(2))
    [incident] = results["incidents"]
    assert incident["kind"] == "crash"
    assert {"task": "green", "trial": 1} in [
        {k: e[k] for k in ("task", "trial")} for e in incident["episodes"]]
    restarted = {(r["task"], r["trial"]) for r in read_episode_records(out) if r["restarts"]}
    assert ("green", 1) in restarted and results["restarted_episodes"] == len(restarted)
    # Re-run from the same seed: the same episodes as the run without faults.
    assert episode_table(out) == episode_table(reference)


def test_hung_env_worker_is_killed_restarted_and_its_episode_rerun(
    reference: Path, checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    marker = tmp_path / "hung"
    eval_env = _CrashingColorReach(marker, hang=True, image_size=32, max_episode_steps=6)
    out = tmp_path / "out"
    # The worker hangs for good, so the env timeout is the only way the run can go on. It is
    # short to keep the test quick; on a stalled machine an ordinary step may overrun it too.
    # Such an extra fault must be absorbed like the injected one, so the restart budgets are
    # raised (no episode is abandoned) and every assertion holds whatever the machine's speed.
    config = small_config(checkpoint, async_envs=True, env_timeout=2.0,
                          max_episode_restarts=100, max_consecutive_faults=100)
    results = evaluate(config, out, pipeline=pipeline, eval_env=eval_env)
    assert marker.exists(), "the injected hang never happened"
    assert results["complete"] and results["episodes"] == 6
    assert log_keys(out) == sorted((t, k) for t in TASKS for k in range(2))
    incidents = results["incidents"]
    assert incidents and all(i["kind"] == "hang" for i in incidents)
    assert any({"task": "green", "trial": 1} in [{k: e[k] for k in ("task", "trial")}
                                                  for e in i["episodes"]] for i in incidents)
    restarted = {(r["task"], r["trial"]) for r in read_episode_records(out) if r["restarts"]}
    assert ("green", 1) in restarted
    assert episode_table(out) == episode_table(reference)


def test_videos_are_named_by_task_trial_seed_and_outcome_and_never_overwritten(
    checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    evaluate(small_config(checkpoint, videos="env", trials=1), tmp_path, pipeline=pipeline)
    records = read_episode_records(tmp_path)
    names = sorted(p.name for p in (tmp_path / "videos").iterdir())
    expected = sorted(
        f"{r['task']}__trial{r['trial']:03d}__seed{r['seed']}__"
        f"{'success' if r['success'] else 'failure'}.gif" for r in records
    )
    assert names == expected
    # The same episodes again into a folder whose videos/ already holds those names (as after
    # a resume or a fault re-run): the old files stay byte for byte, the new ones get a suffix.
    again = tmp_path / "again"
    from cosmos3_gym.runner import RunFolder

    with RunFolder(again, kind="evaluation"):  # a folder a run opened (it holds its lock file)
        pass
    (again / "videos").mkdir(parents=True)
    for name in names:
        (again / "videos" / name).write_bytes(b"earlier video")
    evaluate(small_config(checkpoint, videos="env", trials=1), again, pipeline=pipeline)
    for name in names:
        assert (again / "videos" / name).read_bytes() == b"earlier video"
        assert (again / "videos" / name.replace(".gif", "__1.gif")).stat().st_size > 0


class _NaNForBlue:
    """The real pipeline, but every 'blue' chunk is NaN (a diverged policy)."""

    def __init__(self, pipeline) -> None:
        self.pipeline = pipeline

    def __call__(self, images, prompts, **kwargs):
        out = self.pipeline(images, prompts, **kwargs)
        for i, p in enumerate(prompts):
            if "blue" in p:
                out.actions[i] = np.nan
        return out


def test_non_finite_actions_fail_the_episode_and_are_reported(
    checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    results = evaluate(small_config(checkpoint), tmp_path, pipeline=_NaNForBlue(pipeline))
    records = read_episode_records(tmp_path)
    blue = [r for r in records if r["task"] == "blue"]
    assert all(not r["success"] and r["steps"] == 0 for r in blue)
    assert all(r["invalid_action"].startswith("non-finite action at step 0") for r in blue)
    assert all(r["invalid_action"] is None for r in records if r["task"] != "blue")
    assert results["invalid_action_episodes"] == 2 and results["episodes"] == 6


def test_out_of_range_actions_are_counted_or_fail(
    reference: Path, checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    records = read_episode_records(reference)
    # The tiny random checkpoint emits actions beyond [-1, 1]: counted, never clipped here.
    assert any(r["out_of_range_steps"] > 0 and r["max_action_excess"] > 0 for r in records)
    results = evaluate(small_config(checkpoint, out_of_range="fail"), tmp_path, pipeline=pipeline)
    failed = [r for r in read_episode_records(tmp_path) if r["invalid_action"]]
    assert failed and all("out of range" in r["invalid_action"] for r in failed)
    assert all(not r["success"] for r in failed) and results["episodes"] == 6


def test_shuffled_prompts_give_every_episode_another_tasks_prompt(
    checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    seen: list[str] = []

    def recording(images, prompts, **kwargs):
        seen.extend(prompts)
        return pipeline(images, prompts, **kwargs)

    results = evaluate(small_config(checkpoint, shuffle_prompts=True, trials=1), tmp_path,
                       pipeline=recording)
    assert results["episodes"] == 3 and results["config"]["shuffle_prompts"] is True
    # red episodes see green's prompt, green -> blue, blue -> red: never their own.
    assert set(seen) == {f"reach the {c} target" for c in TASKS}
    records = read_episode_records(tmp_path)
    assert {r["task"] for r in records} == set(TASKS)
    # Each record holds the prompt its episode was given: the next task's.
    assert {r["task"]: r["prompt"] for r in records} == {
        "red": "reach the green target", "green": "reach the blue target",
        "blue": "reach the red target"}
    with pytest.raises(ValueError, match="at least 2 tasks"):
        evaluate(small_config(checkpoint, shuffle_prompts=True, tasks=["red"]), tmp_path / "one",
                 pipeline=pipeline)


def test_cli_reports_bad_input_as_one_error_line(tmp_path: Path, capsys) -> None:
    from cosmos3_gym.eval.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("cosmos3-gym eval: error: no checkpoint folder at")
    assert "Traceback" not in err


def test_two_runs_record_identical_episodes_frame_for_frame(
    reference: Path, checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    np.random.seed(12345)  # whatever numpy's global generator holds must not matter
    evaluate(small_config(checkpoint), tmp_path / "again", pipeline=pipeline)
    first, second = read_episode_records(reference), read_episode_records(tmp_path / "again")

    def without_timing(records: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in records]

    assert without_timing(first) == without_timing(second)
    hashes = [r["obs_sha256"] for r in first]
    assert all(len(h) == 64 for h in hashes) and len(set(hashes)) == len(hashes)
    assert [r["reset_options"] for r in first] == [{"target": r["task"]} for r in first]
    # Other seeds start other episodes, and the hashes tell them apart.
    evaluate(small_config(checkpoint, seed=8), tmp_path / "seed8", pipeline=pipeline)
    other = read_episode_records(tmp_path / "seed8")
    assert all(a["obs_sha256"] != b["obs_sha256"] for a, b in zip(first, other, strict=True))


def test_results_record_and_the_summary_prints_the_step_budget(reference: Path) -> None:
    from cosmos3_gym.eval.results import format_table

    results = json.loads((reference / "results.json").read_text())
    assert results["episode_budget"] == {
        "step_budget": None, "settle_steps": 0, "max_episode_steps": {"color_reach": 6}}
    assert "step budget: color_reach 6 policy steps per episode" in format_table(results)
    libero = {**results, "episode_budget": {
        "step_budget": "cosmos3", "settle_steps": 10, "max_episode_steps": {"libero_10": 510}}}
    assert ("step budget cosmos3: libero_10 510 policy steps per episode after 10 settle steps"
            in format_table(libero))


def test_a_checkpoint_of_another_action_width_is_refused_before_anything_runs(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import time

    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def refused(*args, **kwargs):
        raise AssertionError("a mismatched checkpoint must be refused before this runs")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", refused)
    monkeypatch.setattr(ColorReachEnv, "reset", refused)
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt10")  # a LIBERO-style 10-D head
    out = tmp_path / "out"
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--checkpoint", str(checkpoint), "--out", str(out)])
    elapsed = time.perf_counter() - start
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err == (
        f"cosmos3-gym eval: error: the checkpoint's actions do not fit the env: --checkpoint "
        f"{checkpoint} makes 10-D actions (domain 'libero'), which the 'generic' adapter passes "
        "on as 10-D env actions, but --env color_reach's action space is Box(-1.0, 1.0, (2,), "
        "float32), 2-D. Fix: evaluate it with --env libero, or pass a --checkpoint trained for "
        "--env color_reach (domain 'color_reach').\n"
    )
    assert not out.exists()  # nothing written: the corrected rerun may use the same folder
    assert elapsed < 10.0, elapsed  # it took about 25 s (model loaded, env stepped) before


def test_a_pipeline_of_another_action_width_is_refused_before_any_env_runs(
    pipeline, checkpoint: Path, tmp_path: Path, monkeypatch
) -> None:
    def refused(*args, **kwargs):
        raise AssertionError("a mismatched pipeline must be refused before any env is reset")

    monkeypatch.setattr(ColorReachEnv, "reset", refused)

    class LiberoAdapted(ColorReachEval):
        adapter = "libero"  # takes 10-D raw actions; the fixture pipeline makes 2-D ones

    message = (r"the pipeline given makes 2-D actions \(domain 'libero'\), which the "
               r"'libero' adapter cannot take .*--env color_reach's action space is Box")
    with pytest.raises(ValueError, match=message):
        evaluate(small_config(checkpoint), tmp_path / "out", pipeline=pipeline,
                 eval_env=LiberoAdapted(TASKS, image_size=32, max_episode_steps=6))
    assert not (tmp_path / "out").exists()
    # The same checkpoint named by its folder: its head is read from the folder, so it is
    # refused before any weight loads, too.
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def not_loaded(*args, **kwargs):
        raise AssertionError("a mismatched checkpoint must be refused before it loads")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", not_loaded)
    with pytest.raises(ValueError, match=message.replace("the pipeline given",
                                                         f"--checkpoint {checkpoint}")):
        evaluate(small_config(checkpoint), tmp_path / "loaded",
                 eval_env=LiberoAdapted(TASKS, image_size=32, max_episode_steps=6))
    assert not (tmp_path / "loaded").exists()


@pytest.mark.libero
def test_libero_with_a_checkpoint_of_another_width_fails_before_any_simulator(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    import time

    from cosmos3_gym.envs import LiberoEnv
    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def refused(*args, **kwargs):
        raise AssertionError("a mismatched checkpoint must be refused before this runs")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", refused)
    monkeypatch.setattr(LiberoEnv, "_build_sim", refused)
    start = time.perf_counter()
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--env", "libero", "--suite", "libero_spatial", "--tasks", "0",
              "--num-envs", "2", "--out", str(tmp_path / "out")])  # the shipped 2-D checkpoint
    elapsed = time.perf_counter() - start
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--checkpoint tiny makes 2-D actions (domain 'color_reach'), which the 'libero' " \
           "adapter cannot take" in err
    assert "--env libero's action space is Box(-1.0, 1.0, (7,), float32), 7-D. Fix: evaluate " \
           "it with --env color_reach, or pass a --checkpoint trained for --env libero" in err
    assert not (tmp_path / "out").exists()
    assert elapsed < 15.0, elapsed  # it took 23 s (simulators built) before


@pytest.mark.slow
@pytest.mark.libero
def test_two_runs_of_a_libero_eval_command_record_identical_episodes(
    tmp_path: Path, capsys
) -> None:
    from cosmos3_gym.eval.cli import main

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt")  # LIBERO-like 10-D head
    command = ["eval", "--checkpoint", str(checkpoint), "--env", "libero",
               "--suite", "libero_spatial", "--tasks", "0", "--trials", "2", "--num-envs", "2",
               "--image-size", "64", "--max-episode-steps", "3", "--denoising-steps", "1",
               "--no-progress"]
    assert main([*command, "--out", str(tmp_path / "first")]) == 0
    summary = capsys.readouterr().out
    np.random.seed(12345)  # the simulator's randomness must come from the episode alone
    assert main([*command, "--out", str(tmp_path / "second")]) == 0
    first = read_episode_records(tmp_path / "first")
    second = read_episode_records(tmp_path / "second")

    def without_timing(records: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if k != "wall_time_s"} for r in records]

    assert len(first) == 2 and without_timing(first) == without_timing(second)
    assert [r["reset_options"] for r in first] == [
        {"task": ["libero_spatial", 0], "init_state_id": k} for k in (0, 1)]
    assert first[0]["obs_sha256"] != first[1]["obs_sha256"]  # two init states, two episodes
    results = json.loads((tmp_path / "first" / "results.json").read_text())
    assert results["episode_budget"] == {
        "step_budget": "custom", "settle_steps": 10, "max_episode_steps": {"libero_spatial": 3}}
    assert "step budget custom: libero_spatial 3 policy steps per episode after 10 settle " \
           "steps" in summary
