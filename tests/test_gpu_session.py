"""scripts/gpu_session.sh, the prepared device check, run here at CPU size: a stage that breaks
on the device wastes a whole lent session, so each is tried on the CPU first."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_eval_stage_and_the_summary_run_at_cpu_size(tmp_path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "PRESET": "tiny", "DEVICE": "cpu", "SKIP_INSTALL": "1",
           "EVAL_BATCHES": "2", "STEPS": "1", "OUT": str(out), "RUNS": str(tmp_path / "runs"),
           "PYTHON": sys.executable}
    done = subprocess.run(["bash", "scripts/gpu_session.sh", "eval", "summary"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loop = json.loads((out / "eval_loop_tiny.json").read_text())
    run = loop["runs"]["2"]
    assert run["complete"] and run["episodes"] == 8  # 2 trials of each of the 4 colours
    t = run["throughput"]
    assert t["synthetic"] == "tiny" and t["devices"] == ["cpu"] and t["pipeline_s"] > 0
    summary = (out / "summary.txt").read_text()
    assert done.stdout.endswith(summary)  # stage lines, then the summary
    assert "eval --synthetic tiny on ColorReach" in summary and "B=2" in summary
    assert "episodes/h" in summary and "LIBERO bench (tiny): no result" in summary
    assert sorted(p.name for p in out.iterdir()) == [
        "eval_loop_tiny.json", "log.txt", "summary.txt"]  # the eval folders stay outside OUT
