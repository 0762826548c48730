"""docs/bench_gpu_nano.json: the H200 numbers docs/benchmarks.md quotes, in the shape fixed for
it, and rebuilt byte for byte from the raw device outputs committed beside it
(docs/gpu_results/<date>/) by scripts/collect_gpu_results.py."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
COMMITTED = ROOT / "docs" / "bench_gpu_nano.json"
RAW = ROOT / "docs" / "gpu_results" / "2026-11-30"
REQUIRED_ROW = {"case": str, "batch_size": int, "steps": int, "call_s": float,
                "denoise_tflops": float, "gpu_busy": float}


def _collector() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "collect_gpu_results", ROOT / "scripts" / "collect_gpu_results.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_gpu_results_have_the_fixed_shape() -> None:
    result = json.loads(COMMITTED.read_text())
    assert isinstance(result["gpu"], str) and result["gpu"]
    assert isinstance(result["rows"], list) and result["rows"]
    for row in result["rows"]:
        for key, kind in REQUIRED_ROW.items():
            assert type(row[key]) is kind, (key, row)
        assert row["case"] in ("libero_256x512", "droid_480x832"), row
        assert row["batch_size"] > 0 and row["steps"] > 0, row
        assert math.isfinite(row["call_s"]) and row["call_s"] > 0, row
        assert math.isfinite(row["denoise_tflops"]) and row["denoise_tflops"] > 0, row
        assert 0 < row["gpu_busy"] <= 1, row


def test_every_number_names_a_committed_raw_file_and_its_command() -> None:
    result = json.loads(COMMITTED.read_text())
    entries = result["rows"] + result["reference"] + result["flips"]
    sources = {entry["source"] for entry in entries}
    assert sources == set(result["sources"])
    for name, source in result["sources"].items():
        assert (RAW / name).is_file(), name
        assert source["command"], name
    # Two runs of one (case, batch size, steps) are both kept, told apart by their source.
    keys = [(r["case"], r["batch_size"], r["steps"], r["source"]) for r in result["rows"]]
    assert len(keys) == len(set(keys))


def test_the_collector_rebuilds_the_committed_file_from_the_raw_outputs(tmp_path) -> None:
    collector = _collector()
    assert collector.render(collector.collect(RAW)) == COMMITTED.read_text()
    out = tmp_path / "bench_gpu_nano.json"
    assert collector.main([str(RAW), str(out)]) == 0
    assert out.read_text() == COMMITTED.read_text()
