"""scripts/gpu_session.sh, the prepared device check, run here at CPU size: a stage that breaks
on the device wastes a whole lent session, so each is tried on the CPU first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_eval_stage_and_the_summary_run_at_cpu_size(tmp_path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "SKIP_INSTALL": "1",
           "EVAL_BATCHES": "2", "OVERLAP_BATCHES": "2", "STEPS": "1", "OUT": str(out),
           "RUNS": str(tmp_path / "runs"), "PYTHON": sys.executable, "TIMEOUT_SCALE": "5"}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "eval", "summary"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loop = json.loads((out / "eval_loop_tiny.json").read_text())
    run = loop["runs"]["2"]
    assert run["complete"] and run["episodes"] == 8  # 2 trials of each of the 4 colours
    t = run["throughput"]
    assert t["synthetic"] == "tiny" and t["devices"] == ["cpu"] and t["pipeline_s"] > 0
    overlapped = loop["runs"]["2_overlap"]
    assert overlapped["complete"] and overlapped["identical_episodes"] is True
    assert overlapped["throughput"]["overlap"] is True
    summary = (out / "summary.txt").read_text()
    assert done.stdout.endswith(summary)  # stage lines, then the summary
    assert "eval --synthetic tiny on ColorReach" in summary and "B=2" in summary
    assert "B=2 with --overlap" in summary and "the same episodes: yes" in summary
    assert "episodes/h" in summary and "LIBERO bench (tiny): no result" in summary
    assert sorted(p.name for p in out.iterdir()) == [
        "eval_loop_tiny.json", "log.txt", "summary.txt"]  # the eval folders stay outside OUT


@pytest.mark.slow
def test_the_fp8_stage_runs_at_cpu_size(tmp_path) -> None:
    """FP8 beside bf16 in one bench run, the accuracy gates merged into the same file (OUT's
    file count is capped), and the summary's FP8 lines."""
    out = tmp_path / "out"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "SKIP_INSTALL": "1", "STEPS": "1",
           "FP8_BATCH": "2", "OUT": str(out), "RUNS": str(tmp_path / "runs"),
           "PYTHON": sys.executable, "TIMEOUT_SCALE": "5"}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "fp8", "summary"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_gpu_tiny_fp8.json", "log.txt", "summary.txt"]
    bench = json.loads((out / "bench_gpu_tiny_fp8.json").read_text())
    assert [(r["batch_size"], r["steps"]) for r in bench["rows"]] == [(2, 1)]
    flip = bench["flips"]["libero_256x512"]["2"]["fp8"]
    assert flip["flipped_to"] is True and flip["flipped_call_s"] > 0
    assert flip["flipped_denoise_tflops"] > 0 and flip["configured_denoise_tflops"] > 0
    assert bench["fp8_gates"]["sqnr"]["min_db"].keys() == {"qkv", "out", "gate_up", "down"}
    summary = (out / "summary.txt").read_text()
    assert "LIBERO B=2 1 steps: fp8" in summary and "per-layer SQNR" in summary


def _stage_timeouts(script: str) -> dict[str, list[int]]:
    """Each stage's fixed timeouts (``timeout "$(t N)"``), by the stage whose ``has`` block
    holds them."""
    import re

    found: dict[str, list[int]] = {}
    stage = None
    for line in script.splitlines():
        opened = re.match(r'^if has (\w+)', line)
        if opened:
            stage = opened.group(1)
        limit = re.match(r'^\s*timeout "\$\(t (\d+)\)" ', line)
        if limit and stage:
            found.setdefault(stage, []).append(int(limit.group(1)))
    return found


def test_the_stage_timeouts_fit_the_device_budget() -> None:
    """Every default stage's timeout, the eval stage's per batch size (and per overlapped one),
    sum to at most 560 s;
    the GRPO stage, run as a command of its own with the install, fits too."""
    import re

    script = (ROOT / "scripts" / "gpu_session.sh").read_text()
    stages = _stage_timeouts(script)
    defaults = re.search(r'stages="\$\{\*:-([\w ]+)\}"', script).group(1).split()
    assert "grpo" not in defaults and "grpo" in stages
    fixed = [t for name in defaults for t in stages.get(name, [])]
    assert sum(stages["install"]) + sum(stages["grpo"]) <= 560
    assert f"(2 x 15 + {sum(stages['grpo'])} = {sum(stages['install']) + sum(stages['grpo'])} s " \
           "at most)" in script
    batches = re.search(r'EVAL_BATCHES="\$\{EVAL_BATCHES:-([\d ]+)\}"', script).group(1).split()
    overlapped = re.search(r'OVERLAP_BATCHES="\$\{OVERLAP_BATCHES:-([\d ]+)\}"',
                           script).group(1).split()
    plain, overlap = (int(t) for t in re.findall(r"limit=\$\(\( (\d+) \+ b \)\)", script))
    assert set(overlapped) <= set(batches)
    total = sum(fixed) + sum(plain + int(b) for b in batches) + sum(
        overlap + int(b) for b in overlapped)
    assert total <= 560, (fixed, batches, total)
    assert f"= {total} s at most" in script  # the header states the sum


@pytest.mark.slow
def test_the_droid_stage_runs_the_released_recipes_at_cpu_size(tmp_path) -> None:
    """The 30-step DROID row, then both Policy-DROID recipes at their 4 steps with a state
    row, FP8 beside bf16 for each, in one file, and their summary lines."""
    out = tmp_path / "out"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "SKIP_INSTALL": "1", "STEPS": "1",
           "OUT": str(out), "RUNS": str(tmp_path / "runs"), "PYTHON": sys.executable,
           "TIMEOUT_SCALE": "5"}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "droid", "summary"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_gpu_tiny_droid.json", "log.txt", "summary.txt"]
    bench = json.loads((out / "bench_gpu_tiny_droid.json").read_text())
    assert bench["complete"], (out / "log.txt").read_text()[-2000:]
    rows = {r["case"]: r for r in bench["rows"]}
    assert rows["droid_480x832"]["steps"] == 1 and rows["droid_480x832"]["guided_steps"] == 0
    for case, guided in (("nano-policy-droid_540x640", 4), ("edge-policy-droid_540x640", 1)):
        assert (rows[case]["steps"], rows[case]["guided_steps"]) == (4, guided)
        assert rows[case]["tokens"]["action"] == 33  # the state row and 32 actions
        flip = bench["flips"][case]["1"]["fp8"]
        assert flip["flipped_to"] is True and flip["fp8_bf16_steps"] == 1
        assert flip["flipped_call_s"] > 0
    assert bench["samplers"]["edge-policy-droid_540x640"]["guidance_interval"]["value"] == [
        960.0, 1001.0]
    summary = (out / "summary.txt").read_text()
    assert "recipe nano-policy-droid B=1 4 steps, 4 guided" in summary
    assert "recipe edge-policy-droid B=1 4 steps, 1 guided" in summary


@pytest.mark.slow
def test_the_lerobot_folder_stage_runs_at_cpu_size(tmp_path) -> None:
    """The formats stage: a LeRobot-format folder written by this project's writer, loaded back
    and run at B=1 and 8, its line in the summary; one file under OUT besides the log."""
    out = tmp_path / "out"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "SKIP_INSTALL": "1",
           "FORMAT_LAYERS": "1", "OUT": str(out), "RUNS": str(tmp_path / "runs"),
           "PYTHON": sys.executable, "TIMEOUT_SCALE": "12"}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "formats", "summary"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads((out / "lerobot_folder_tiny.json").read_text())
    assert found["layers"] == 1 and found["calls"]["B8"]["shape"] == [8, 16, 10]
    assert all(call["finite"] for call in found["calls"].values())
    assert "diffusers UniPCMultistepScheduler" in found["sampler"]
    summary = (out / "summary.txt").read_text()
    assert "LeRobot folder (tiny, 1 layers" in summary
    assert sorted(p.name for p in out.iterdir()) == [
        "lerobot_folder_tiny.json", "log.txt", "summary.txt"]


@pytest.mark.slow
def test_the_grpo_stage_runs_at_cpu_size(tmp_path) -> None:
    """One GRPO iteration of the tiny shape with LoRA and gradient checkpointing: every chunk
    carries an advantage, the update steps, and the summary's line."""
    out = tmp_path / "out"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "SKIP_INSTALL": "1",
           "GRPO_GROUPS": "1", "GRPO_GROUP_SIZE": "2", "GRPO_STEPS": "2",
           "GRPO_EPISODE_STEPS": "16", "GRPO_MICROBATCH": "2", "OUT": str(out),
           "RUNS": str(tmp_path / "runs"), "PYTHON": sys.executable, "TIMEOUT_SCALE": "3"}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "grpo", "summary"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["grpo_tiny.json", "log.txt", "summary.txt"]
    step = json.loads((out / "grpo_tiny.json").read_text())
    assert step["complete"], (out / "log.txt").read_text()[-2000:]
    assert step["train"] == "lora" and step["gradient_checkpointing"]
    assert step["chunks"] == step["chunks_with_signal"] == 2  # 16 steps: one 16-action chunk each
    assert step["update_steps"] == 1 and step["update_s"] > 0 and step["collect_s"] > 0
    assert 0 < step["trained_parameters"] < step["parameters"]
    summary = (out / "summary.txt").read_text()
    assert "GRPO iteration (tiny, --train lora, gradient checkpointing, 1x2 episodes" in summary
    assert "s per iteration" in summary


@pytest.mark.slow
def test_the_latency_stage_runs_at_cpu_size(tmp_path) -> None:
    """--latency measured at two batch sizes on one model build: each batch size's calls of
    that many envs, the delay they cost at 20 Hz, and the summary's lines."""
    out = tmp_path / "out"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "SKIP_INSTALL": "1", "STEPS": "1",
           "LATENCY_BATCHES": "1,2", "OUT": str(out), "RUNS": str(tmp_path / "runs"),
           "PYTHON": sys.executable, "TIMEOUT_SCALE": "8"}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "latency", "summary"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sorted(p.name for p in out.iterdir()) == ["latency_tiny.json", "log.txt",
                                                     "summary.txt"]
    found = json.loads((out / "latency_tiny.json").read_text())
    assert found["complete"], (out / "log.txt").read_text()[-2000:]
    for b in ("1", "2"):
        row = found["batches"][b]
        assert row["calls"] >= 1 and row["call_s_median"] > 0
        assert row["delay_steps_median"] == pytest.approx(
            np.ceil(row["call_s_median"] * 20), abs=2)
    summary = (out / "summary.txt").read_text()
    assert "latency measured (tiny, 1 steps, at 20 Hz)" in summary
    assert "B=2   call" in summary and "every env waits d =" in summary
