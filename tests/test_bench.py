"""cosmos3-gym bench: runs end to end on a tiny checkpoint and writes the documented JSON; its
bit-identity flags are checked against an independent comparison."""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import pytest
import torch
from PIL import Image

from cosmos3_gym.bench.latency import kernel_microbench
from cosmos3_gym.bench.plots import plot_bench
from cosmos3_gym.eval.cli import main
from cosmos3_gym.model import rope, transformer
from cosmos3_gym.model.rope import apply_rope
from cosmos3_gym.model.transformer import RMSNorm
from cosmos3_gym.plotting import PlottingUnavailable
from cosmos3_gym.tiny import write_tiny_checkpoint


def test_bench_writes_speedups_stages_and_optimisation_ratios(tmp_path, capsys) -> None:
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny")
    out = tmp_path / "bench.json"
    code = main([
        "bench", "--checkpoint", str(checkpoint), "--out", str(out), "--batch-sizes", "1,2",
        "--input-size", "64x64", "--denoising-steps", "2", "--warmup", "0",
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
    printed = capsys.readouterr().out
    assert "vs serial" in printed
    # The plot beside the JSON: one batched and one serial line per panel, a stage bar per B.
    png, svg = out.with_suffix(".png"), out.with_suffix(".svg")
    assert f"plot: {png}, {svg}" in printed
    with Image.open(png) as image:
        image.verify()
    ids = re.findall(r'id="((?:latency|actions|stage)-[^"]+)"', svg.read_text())
    assert {"latency-batched", "latency-serial", "actions-batched", "actions-serial"} <= set(ids)
    assert sorted(i for i in ids if i.startswith("stage-denoise")) == [
        "stage-denoise-B1", "stage-denoise-B2"
    ]


def _nano_gen_heads(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query heads at Cosmos3-Nano GEN shapes (32 heads x 128 dims, 266 tokens) and RoPE tables."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 32, 266, 128, generator=gen)
    angles = torch.randn(1, 1, 266, 64, generator=gen) * 50
    return x, angles.cos(), angles.sin()


def test_kernels_are_bit_identical_at_the_benchs_shapes() -> None:
    """Checked here with our own inputs and textbook formulas, not taken from the bench."""
    x, cos, sin = _nano_gen_heads(seed=11)
    rotated = torch.cat([-x[..., 64:], x[..., :64]], dim=-1)
    textbook_rope = x * torch.cat([cos, cos], -1) + rotated * torch.cat([sin, sin], -1)
    assert torch.equal(apply_rope(x, cos, sin), textbook_rope)
    norm = RMSNorm(128, 1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 128))
        textbook_norm = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight
        assert torch.equal(norm(x), textbook_norm)


def test_bench_bit_identity_flags_turn_false_when_a_kernel_differs(monkeypatch) -> None:
    """The flags report a comparison: as shipped both hold; a kernel one rounding off fails."""
    shipped = kernel_microbench(batch=1, repeats=1)
    assert shipped["rope_bit_identical"] is True and shipped["rmsnorm_bit_identical"] is True

    one_ulp = 1.0 + 2.0**-20
    monkeypatch.setattr(rope, "apply_rope", lambda x, cos, sin: apply_rope(x, cos, sin) * one_ulp)

    class OffNorm(RMSNorm):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * one_ulp

    monkeypatch.setattr(transformer, "RMSNorm", OffNorm)
    broken = kernel_microbench(batch=1, repeats=1)
    assert broken["rope_bit_identical"] is False and broken["rmsnorm_bit_identical"] is False


def test_synthetic_bench_measures_a_preset_without_a_checkpoint(tmp_path, capsys) -> None:
    """`bench --synthetic tiny` (the CPU-sized preset; nano/super/edge run the same code on a
    GPU) writes the documented rows, the reference ratio and the option flips."""
    out = tmp_path / "synthetic.json"
    code = main([
        "size", "--synthetic", "tiny", "--cases", "libero_256x512", "--step-counts", "1,2",
        "--batch-sizes", "1", "--warmup", "0", "--repeats", "1", "--compare-batch", "2",
        "--out", str(out),
    ])
    assert code == 0
    result = json.loads(out.read_text())
    assert result["gpu"] == "none (cpu)" and result["preset"] == "tiny" and result["complete"]
    rows = result["rows"]
    assert [(r["case"], r["batch_size"], r["steps"]) for r in rows] == [
        ("libero_256x512", 1, 1), ("libero_256x512", 1, 2)
    ]
    for row in rows:
        assert row["call_s"] > 0 and math.isfinite(row["denoise_tflops"])
        assert row["denoise_tflops"] > 0
        assert row["gpu_busy"] is None  # measured on CUDA only
        # LIBERO's 256x512 concat: 5 latent frames of 5x10 patches, then 16 action tokens.
        assert row["tokens"]["vision"] == 250 and row["tokens"]["action"] == 16
    reference = result["reference"]["libero_256x512"]
    assert reference["diffusers_step_s"] > 0 and reference["speedup"]["1"] > 0
    flips = result["flips"]["libero_256x512"]
    assert set(flips) == {"1", "2"}
    # the CUDA-only flips are skipped on a CPU; FP8 runs emulated
    assert set(flips["1"]) == {"text_cache", "kv_buffers", "frame_encoder", "prompt_cache", "fp8"}
    fp8 = flips["2"]["fp8"]
    assert fp8["flipped_to"] is True and fp8["steps"] == 1
    assert fp8["flipped_call_s"] > 0 and fp8["configured_denoise_tflops"] > 0
    printed = capsys.readouterr().out
    assert "one step, diffusers" in printed and "B=2: 1 steps, fp8 " in printed


SMALL_SYNTHETIC = dict(
    cases=("libero_256x512",), batch_sizes={"libero_256x512": (1,)}, steps=(1,), warmup=0,
    repeats=1, compare_batches=(1,), reference=False,
)


def test_synthetic_self_check_agrees_with_eager_when_the_fused_kernels_run() -> None:
    """The Triton kernels (interpreted here) as the configuration: the self-check keeps them and
    finds the actions of the eager configuration."""
    from cosmos3_gym.bench.synthetic import run_synthetic
    from cosmos3_gym.pipeline.options import InferenceOptions

    result = run_synthetic("tiny", options=InferenceOptions(triton_kernels=True),
                           **SMALL_SYNTHETIC)
    check = result["self_check"]
    assert check["disabled"] == {} and result["options"]["triton_kernels"] is True
    assert check["max_abs_action_diff_vs_eager"] < 1e-4  # fp32: the kernels match within 1e-5
    # Switching the K/V buffers off takes the kernels that need them along (the GPU default).
    flips = result["flips"]["libero_256x512"]["1"]
    assert flips["kv_buffers"]["also"] == ["triton_kernels"] and flips["kv_buffers"]["ratio"] > 0
    assert flips["triton_kernels"]["also"] == [] and flips["triton_kernels"]["ratio"] > 0


def test_an_option_that_fails_on_the_device_is_switched_off_and_reported(
    tmp_path, monkeypatch, capsys
) -> None:
    """A fused-kernel path that raises (no compiler on the device, say) costs its own numbers,
    not the benchmark: it is switched off, its error kept, and the rest is measured."""
    from cosmos3_gym.bench import synthetic
    from cosmos3_gym.pipeline import stages
    from cosmos3_gym.pipeline.options import InferenceOptions

    class NoCompiler:
        def __init__(self) -> None:
            raise RuntimeError("no Triton compiler for this device\nsecond line")

    monkeypatch.setattr(stages, "TritonGenOps", NoCompiler)
    out = tmp_path / "synthetic.json"
    result = synthetic.run_synthetic("tiny", options=InferenceOptions(triton_kernels=True),
                                     out=out, **SMALL_SYNTHETIC)
    check = result["self_check"]
    assert check["disabled"] == {
        "triton_kernels": "RuntimeError: no Triton compiler for this device"
    }
    assert result["options"]["triton_kernels"] is False and check["options"] == result["options"]
    assert check["max_abs_action_diff_vs_eager"] == 0.0  # now the eager configuration itself
    assert len(result["rows"]) == 1 and json.loads(out.read_text())["complete"]
    table = synthetic.format_synthetic(result)
    assert "self-check: triton_kernels switched off, it failed on this device: Runtime" in table


def test_a_flip_that_fails_is_recorded_and_the_others_measured(monkeypatch) -> None:
    from cosmos3_gym.bench import synthetic

    real = synthetic.synthetic_pipeline

    def no_frame_encoder_off(*args, options, **kwargs):
        if not options.frame_encoder:
            raise MemoryError("out of memory building the other encoder")
        return real(*args, options=options, **kwargs)

    monkeypatch.setattr(synthetic, "synthetic_pipeline", no_frame_encoder_off)
    result = synthetic.run_synthetic("tiny", **SMALL_SYNTHETIC)
    flips = result["flips"]["libero_256x512"]["1"]
    assert flips["frame_encoder"] == {
        "flipped_to": False, "also": [], "ratio": None, "denoise_ratio": None,
        "error": "MemoryError: out of memory building the other encoder",
    }
    assert flips["text_cache"]["ratio"] > 0 and "error" not in flips["text_cache"]
    table = synthetic.format_synthetic(result)
    assert "frame_encoder->False failed" in table
    assert "flipping frame_encoder failed: MemoryError" in table


def test_synthetic_bench_without_flips_or_reference(tmp_path) -> None:
    """The GPU session's DROID stage: rows only (flips and diffusers' reference skipped)."""
    out = tmp_path / "synthetic.json"
    assert main([
        "size", "--synthetic", "tiny", "--cases", "droid_480x832", "--step-counts", "1",
        "--batch-sizes", "1", "--warmup", "0", "--repeats", "1", "--flips", "none",
        "--no-reference",
        "--out", str(out),
    ]) == 0
    result = json.loads(out.read_text())
    assert result["complete"] and [r["case"] for r in result["rows"]] == ["droid_480x832"]
    assert result["flips"] == {"droid_480x832": {}}
    assert result["reference"] == {"droid_480x832": None}


def test_synthetic_bench_refuses_an_unknown_preset(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["size", "--synthetic", "mega", "--out", str(tmp_path / "x.json")])
    assert exit_info.value.code == 2
    assert "--synthetic: invalid choice: 'mega'" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()
    from cosmos3_gym.bench.synthetic import SizeConfig

    with pytest.raises(ValueError, match="unknown preset 'mega'"):  # the Python API refuses too
        SizeConfig(synthetic="mega")


def test_droid_case_has_sglangs_token_count() -> None:
    """480x832 at the 480 tier: 5 latent frames of 15x26 patches (1950) + 16 actions = 1966."""
    from cosmos3_gym.bench.synthetic import CASES, synthetic_pipeline, token_counts
    from cosmos3_gym.pipeline import InferenceOptions

    pipe, _ = synthetic_pipeline("tiny", CASES["droid_480x832"], device=torch.device("cpu"),
                                 dtype=torch.float32, options=InferenceOptions())
    counts = token_counts(pipe, CASES["droid_480x832"], ["put the bowl on the plate"])
    assert counts["vision"] + counts["action"] == 1966


def test_bench_plot_without_matplotlib_says_how_to_get_it(monkeypatch) -> None:
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(PlottingUnavailable, match=r"pip install 'cosmos3-gym\[plot\]'"):
        plot_bench({"batched": {"1": {}}}, Path("unused"))
