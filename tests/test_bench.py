"""cosmos3-gym bench: runs end to end on a tiny checkpoint and writes the documented JSON."""

from __future__ import annotations

import json
import math

from cosmos3_gym.eval.cli import main
from cosmos3_gym.tiny import write_tiny_checkpoint


def test_bench_writes_speedups_stages_and_optimisation_ratios(tmp_path, capsys) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny")
    out = tmp_path / "bench.json"
    code = main([
        "bench", "--checkpoint", str(checkpoint), "--out", str(out), "--batch-sizes", "1,2",
        "--image-size", "64x64", "--num-inference-steps", "2", "--warmup", "0",
        "--repeats", "1", "--compare-batch", "2",
    ])
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["speedup_vs_serial"]) == {"1", "2"}
    assert result["statistic"] == "median" and result["repeats"] == 1
    for row in result["batched"].values():
        assert set(row["stages_s"]) == {
            "admission", "preprocess", "prompt", "encode", "noise", "denoise", "decode"
        }
        assert row["latency_s"] > 0 and row["peak_memory_mb"] > 0
    ratios = [result["text_cache_speedup"], result["mixed_vs_equal_prompt_latency"]]
    ratios += [r[k] for r in result["optimisations"].values() for k in ("total", "denoise")]
    assert all(math.isfinite(r) and r > 0 for r in ratios)
    kernels = result["kernels"]
    assert kernels["rope_bit_identical"] and kernels["rmsnorm_bit_identical"]
    assert kernels["rope_speedup"] > 0 and kernels["rmsnorm_speedup"] > 0
    assert "vs serial" in capsys.readouterr().out
