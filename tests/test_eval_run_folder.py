"""An evaluation folder as people share machines: two commands into one folder never mix, a kill
at any write leaves a folder the same command finishes, a full disk is one line and resumable,
and a healthy episode is never failed for the env beside it."""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from cosmos3_gym import jsonio
from cosmos3_gym.envs import ColorReachEnv, ColorReachEval, EpisodeEndHold, derive_seed
from cosmos3_gym.eval.cli import main
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.pipeline import SamplerConfig

TASKS = ["red", "green", "blue"]


def eval_args(checkpoint: Path | str, out: Path, *extra: str) -> list[str]:
    return ["eval", "--checkpoint", str(checkpoint), "--tasks", ",".join(TASKS), "--trials", "2",
            "--num-envs", "2", "--seed", "7", "--image-size", "32", "--max-episode-steps", "6",
            "--denoising-steps", "2", "--no-progress", "--out", str(out), *extra]


def episodes(out: Path) -> dict:
    return {(r["task"], r["trial"]): (r["seed"], r["obs_sha256"], r["steps"], r["success"])
            for r in read_episode_records(out)}


def error_line(capsys: pytest.CaptureFixture, exit_info: pytest.ExceptionInfo, code: int) -> str:
    err = capsys.readouterr().err
    assert exit_info.value.code == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def reference(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    assert main(eval_args(checkpoint, out)) == 0
    return out


# The CLI, but its pipeline waits once the log holds an episode (saying "blocked"), until the
# file named by argv[2] exists: the run holds its folder for as long as the test wants.
_CLI_THAT_WAITS = """
import sys, time
from pathlib import Path
from cosmos3_gym.eval.cli import main
from cosmos3_gym.pipeline import Cosmos3ActionPipeline

log, go = Path(sys.argv[1]), Path(sys.argv[2])
original = Cosmos3ActionPipeline.__call__
said = False

def call(self, *args, **kwargs):
    global said
    if log.exists() and log.read_text().strip() and not said:
        said = True
        print("blocked", flush=True)
        while not go.exists():
            time.sleep(0.05)
    return original(self, *args, **kwargs)

Cosmos3ActionPipeline.__call__ = call
sys.exit(main(sys.argv[3:]))
"""


def test_a_second_command_into_a_folder_in_use_is_refused_and_nothing_mixes(
    checkpoint: Path, reference: Path, tmp_path: Path, capsys
) -> None:
    out, go = tmp_path / "run", tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", _CLI_THAT_WAITS, str(out / "episodes.jsonl"), str(go),
         *eval_args(checkpoint, out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert first.stdout.readline() == "blocked\n"
        # Another seed, and the very same command: both refused at once, naming the holder.
        for extra in (("--seed", "1"), ()):
            with pytest.raises(SystemExit) as exit_info:
                main(eval_args(checkpoint, out, *extra))
            line = error_line(capsys, exit_info, 2)
            assert f"{out} is in use by another run (pid {first.pid} on " in line
        go.touch()
        _, stderr = first.communicate(timeout=600)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0, stderr
    # One run's episodes, each once, and the config of that run.
    assert episodes(out) == episodes(reference)
    assert len((out / "episodes.jsonl").read_text().splitlines()) == 6
    assert json.loads((out / "config.json").read_text())["identity"]["seed"] == 7


# Kills its own process at the n-th write of the run (argv[1]): mid-way through writing a
# file's bytes (a JSONL append half written; a replaced file only in its temporary copy).
_CLI_KILLED_AT_WRITE = """
import os, signal, sys
from cosmos3_gym import jsonio

n, count = int(sys.argv[1]), [0]
real_write, real_replace = os.write, os.replace

def dying_write(fd, data):
    count[0] += 1
    if count[0] == n:
        real_write(fd, bytes(data)[: max(1, len(data) // 2)])
        os.kill(os.getpid(), signal.SIGKILL)
    return real_write(fd, data)

def dying_replace(src, dst):
    count[0] += 1
    if count[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

jsonio.os.write = dying_write
jsonio.os.replace = dying_replace
from cosmos3_gym.eval.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_a_run_killed_at_any_write_is_finished_by_the_same_command(
    checkpoint: Path, reference: Path, tmp_path: Path
) -> None:
    # The run's writes: config.json, then per episode a record and results.json, then the
    # throughput and the final results. Kill at each of the first ones and at the last.
    for n in (1, 2, 3, 4, 7, 12, 13, 14):
        out = tmp_path / f"killed{n}"
        done = subprocess.run([sys.executable, "-c", _CLI_KILLED_AT_WRITE, str(n),
                               *eval_args(checkpoint, out)], capture_output=True, text=True)
        assert done.returncode in (-signal.SIGKILL, 0), done.stderr
        assert main(eval_args(checkpoint, out)) == 0
        assert episodes(out) == episodes(reference), n
        assert len((out / "episodes.jsonl").read_text().splitlines()) == 6, n
        results = json.loads((out / "results.json").read_text())
        assert results["complete"] and results["episodes"] == 6
        assert not [p.name for p in out.glob(".*.tmp")], n


def test_a_full_disk_is_one_line_and_the_same_command_goes_on(
    checkpoint: Path, reference: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    out = tmp_path / "run"
    writes = [0]
    real_write = os.write

    def full_disk(fd, data):  # the disk fills after the run's first few writes
        writes[0] += 1
        if writes[0] > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(jsonio.os, "write", full_disk)
    with pytest.raises(SystemExit) as exit_info:
        main(eval_args(checkpoint, out))
    line = error_line(capsys, exit_info, 1)
    assert "No space left on device" in line and "rerun the same command" in line
    assert not list(out.glob(".*.tmp"))
    recorded = (out / "episodes.jsonl").read_text()
    assert recorded.endswith("\n")  # no half record
    monkeypatch.undo()  # space freed
    assert main(eval_args(checkpoint, out)) == 0
    assert episodes(out) == episodes(reference)


# --- one env that faults every time ----------------------------------------------------------


class _BrokenGreen(ColorReachEnv):
    """Raises at the 3rd step of 'green' trial 1, every time (a deterministic env bug)."""

    def reset(self, *, seed=None, options=None):
        self._broken = (options or {}).get("target") == "green" and seed == derive_seed(
            7, "green", 1)
        return super().reset(seed=seed, options=options)

    def step(self, action):
        if self._broken and self._elapsed == 2:
            raise RuntimeError("simulator error in green trial 1")
        return super().step(action)


def _broken_env(image_size: int, max_episode_steps: int) -> EpisodeEndHold:
    return EpisodeEndHold(_BrokenGreen(image_size=image_size,
                                       max_episode_steps=max_episode_steps))


class _BrokenGreenEval(ColorReachEval):
    def make(self, num_envs: int, async_: bool, autoreset_mode=None):
        import functools

        import gymnasium as gym
        from gymnasium.vector import AutoresetMode

        fn = functools.partial(_broken_env, self.image_size, self.max_episode_steps)
        vector = gym.vector.AsyncVectorEnv if async_ else gym.vector.SyncVectorEnv
        return vector([fn] * num_envs, autoreset_mode=AutoresetMode.DISABLED)


@pytest.mark.parametrize("async_envs", [False, True])
def test_a_broken_episode_does_not_fail_its_healthy_batch_mates(
    checkpoint: Path, pipeline, reference: Path, tmp_path: Path, async_envs: bool
) -> None:
    config = EvalConfig(checkpoint=str(checkpoint), tasks=TASKS, trials=2, num_envs=2, seed=7,
                        image_size=32, max_episode_steps=6,
                        sampling=SamplerConfig(num_inference_steps=2), async_envs=async_envs,
                        env_timeout=86400.0, progress=False)
    out = tmp_path / "out"
    results = evaluate(config, out, pipeline=pipeline,
                       eval_env=_BrokenGreenEval(TASKS, image_size=32, max_episode_steps=6))
    records = {(r["task"], r["trial"]): r for r in read_episode_records(out)}
    broken = records.pop(("green", 1))
    assert not broken["success"] and broken["error"].startswith("abandoned after 3 env faults")
    assert broken["restarts"] == 3
    # Every other episode is the one the fault-free run recorded, charged nothing, although
    # the one beside the broken episode was re-run with it after each of the three faults.
    expected = episodes(reference)
    for key, record in records.items():
        assert (record["seed"], record["obs_sha256"], record["steps"],
                record["success"]) == expected[key]
        assert record["restarts"] == 0 and record["error"] is None
    incidents = results["incidents"]
    assert len(incidents) == 3
    for incident in incidents:
        at_fault = [e for e in incident["episodes"] if e["at_fault"]]
        assert [(e["task"], e["trial"]) for e in at_fault] == [("green", 1)]
        assert len(incident["episodes"]) == 2  # its batch-mate was re-run, not blamed
    assert results["restarted_episodes"] == 1


class _BadObservation(_BrokenGreen):
    """From the 2nd step of 'green' trial 1, every time: a frame of another shape, or NaN in
    the state beside the frame."""

    def __init__(self, fault: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.fault = fault
        if fault == "nan":
            self.observation_space = gym.spaces.Dict({
                "pixels": self.observation_space,
                "state": gym.spaces.Box(-1.0, 1.0, (2,), np.float32)})

    def reset(self, *, seed=None, options=None):
        obs, info = super().reset(seed=seed, options=options)
        return self._observe(obs), info

    def step(self, action):
        obs, *rest = ColorReachEnv.step(self, action)
        return (self._observe(obs), *rest)

    def _observe(self, frame):
        bad = self._broken and self._elapsed >= 2
        if self.fault == "shape":
            return frame[:8] if bad else frame
        state = np.full(2, np.nan if bad else 0.0, np.float32)
        return {"pixels": frame, "state": state}


def _bad_observation_env(fault: str, image_size: int, max_episode_steps: int) -> EpisodeEndHold:
    return EpisodeEndHold(_BadObservation(fault, image_size=image_size,
                                          max_episode_steps=max_episode_steps))


class _BadObservationEval(ColorReachEval):
    fault = "shape"

    def make(self, num_envs: int, async_: bool, autoreset_mode=None):
        import functools

        from gymnasium.vector import AutoresetMode

        fn = functools.partial(_bad_observation_env, self.fault, self.image_size,
                               self.max_episode_steps)
        vector = gym.vector.AsyncVectorEnv if async_ else gym.vector.SyncVectorEnv
        return vector([fn] * num_envs, autoreset_mode=AutoresetMode.DISABLED)


@pytest.mark.parametrize("async_envs", [False, True])
@pytest.mark.parametrize(("fault", "detail"), [
    ("shape", "observation has shape [8, 32, 3]; its observation space says [32, 32, 3] at "
              "step 2 of its episode"),
    ("nan", "observation['state'] holds NaN in dims [0, 1] at step 2 of its episode"),
])
def test_an_observation_that_breaks_mid_episode_is_named_with_its_episode(
    checkpoint: Path, pipeline, tmp_path: Path, capsys, fault: str, detail: str,
    async_envs: bool
) -> None:
    config = EvalConfig(checkpoint=str(checkpoint), tasks=TASKS, trials=2, num_envs=2, seed=7,
                        image_size=32, max_episode_steps=6,
                        sampling=SamplerConfig(num_inference_steps=2), async_envs=async_envs,
                        env_timeout=86400.0, progress=False)
    env = _BadObservationEval(TASKS, image_size=32, max_episode_steps=6)
    env.fault = fault
    results = evaluate(config, tmp_path / "out", pipeline=pipeline, eval_env=env)
    broken = {(r["task"], r["trial"]): r for r in read_episode_records(tmp_path / "out")}[
        ("green", 1)]
    assert broken["error"].startswith("abandoned after 3 env faults") and detail in \
        broken["error"]
    for incident in results["incidents"]:  # pinned on its own env slot and episode
        at_fault = [e for e in incident["episodes"] if e["at_fault"]]
        assert [(e["task"], e["trial"]) for e in at_fault] == [("green", 1)]
        assert incident["env_slots_at_fault"] == [at_fault[0]["env_slot"]]
    table = capsys.readouterr().out
    slot = results["incidents"][0]["env_slots_at_fault"][0]
    assert "incidents: 3 env faults (incidents.jsonl has each):" in table
    assert f"  3x crash of env slot {slot}, episode green trial 1: " in table
    assert detail in table


@pytest.mark.parametrize("first", ["eval", "rollout"])
def test_an_evaluation_and_rollouts_never_share_a_folder(checkpoint, tmp_path, capsys,
                                                         first) -> None:
    out = tmp_path / "run"
    rollout = ["rollout", "--checkpoint", str(checkpoint), "--env-steps", "4", "--num-envs", "1",
               "--image-size", "32", "--max-episode-steps", "3", "--denoising-steps", "1",
               "--no-progress", "--out", str(out)]
    evaluation = eval_args(checkpoint, out, "--trials", "1", "--tasks", "red")
    commands = {"eval": evaluation, "rollout": rollout}
    assert main(commands[first]) == 0
    capsys.readouterr()
    def files() -> dict[str, int]:  # the lock file names its holder: each command rewrites it
        return {p.name: p.stat().st_mtime_ns for p in out.iterdir() if p.name != ".lock.rank0"}

    before = files()
    second = "rollout" if first == "eval" else "eval"
    with pytest.raises(SystemExit) as exit_info:
        main(commands[second])
    line = error_line(capsys, exit_info, 2)
    held = "an evaluation (config.json, episodes.jsonl, results.json)" if first == "eval" \
        else "rollouts (meta.json, rollout.json, shard-00000.npz)"
    writes = "rollouts" if first == "eval" else "an evaluation"
    assert f"{out} holds {held}; this command writes {writes}" in line, line
    assert files() == before  # nothing written


def test_up_front_checks_fail_before_anything_is_written(checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "run"
    for extra, message in (
        (("--n-action-steps", "100"), "plans chunks of 4 actions; expected at most 4"),
        (("--async-envs", "--env-timeout", "-1"),
         "env_timeout must be a positive number of seconds or None; found -1.0"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(eval_args(checkpoint, out, *extra))
        assert message in error_line(capsys, exit_info, 2)
        assert not out.exists()


def test_an_evaluation_of_any_length_starts_at_once_in_little_memory(
    checkpoint: Path, pipeline, tmp_path: Path
) -> None:
    import time
    import tracemalloc

    class Stop(Exception):
        pass

    calls = [0]

    def one_call(images, prompts, **kwargs):
        calls[0] += 1
        if calls[0] > 1:
            raise Stop
        return pipeline(images, prompts, **kwargs)

    one_call.action_dim, one_call.action_horizon = pipeline.action_dim, pipeline.action_horizon
    one_call.policy = pipeline.policy
    config = EvalConfig(checkpoint=str(checkpoint), trials=100_000_000, num_envs=2,
                        image_size=32, max_episode_steps=6, progress=False)
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(Stop):
        evaluate(config, tmp_path / "long", pipeline=one_call)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 30 and peak < 64 * 2**20, (seconds, peak)
    assert calls[0] == 2


def test_the_runner_holds_no_thread_after_a_run(checkpoint, pipeline, tmp_path) -> None:
    before = threading.active_count()
    evaluate(EvalConfig(checkpoint=str(checkpoint), tasks=["red"], trials=2, num_envs=2,
                        image_size=32, max_episode_steps=4, overlap=True, progress=False),
             tmp_path, pipeline=pipeline)
    assert threading.active_count() == before
    assert np.all([r["steps"] <= 4 for r in read_episode_records(tmp_path)])


class _OtherRule(ColorReachEval):
    """Another env family that happens to share ColorReach's task names and settings."""


def test_an_env_handed_to_evaluate_owns_its_folder(checkpoint, pipeline, tmp_path) -> None:
    """``evaluate(..., eval_env=...)`` runs an env the config does not name: the folder records
    the env itself, so another env (other settings, or another family with the same task names)
    is refused instead of resuming into its episodes, and the same env resumes."""
    from cosmos3_gym.runner import RunMismatch

    config = EvalConfig(checkpoint=str(checkpoint), tasks=TASKS[:1], trials=1, num_envs=1,
                        seed=7, sampling=SamplerConfig(num_inference_steps=1), progress=False)
    out = tmp_path / "run"

    def env(cls=ColorReachEval, size=32):
        return cls(TASKS[:1], image_size=size, max_episode_steps=3)

    first = evaluate(config, out, pipeline=pipeline, eval_env=env(), summary=False)
    stored = json.loads((out / "config.json").read_text())["identity"]["eval_env"]
    assert stored["family"] == "cosmos3_gym.envs.color_reach.ColorReachEval"
    assert (stored["tasks"], stored["image_size"], stored["max_episode_steps"]) == (
        TASKS[:1], 32, 3)
    for other in (env(size=48), env(cls=_OtherRule)):
        with pytest.raises(RunMismatch, match="eval_env"):
            evaluate(config, out, pipeline=pipeline, eval_env=other, summary=False)
    assert evaluate(config, out, pipeline=pipeline, eval_env=env(), summary=False) == first
    # A folder written while every built-in family lived in envs/families.py resumes.
    document = json.loads((out / "config.json").read_text())
    document["identity"]["eval_env"]["family"] = "cosmos3_gym.envs.families.ColorReachEval"
    (out / "config.json").write_text(json.dumps(document))
    assert evaluate(config, out, pipeline=pipeline, eval_env=env(), summary=False) == first
    with pytest.raises(RunMismatch, match="eval_env"):  # nor the env the config names
        evaluate(config, out, pipeline=pipeline, summary=False)
    assert len(read_episode_records(out)) == 1
