"""The one-screen summary of a device session (scripts/gpu_session.sh's last stage).

Reads what the stages wrote under OUT (any may be missing or partial: a stage cut short by its
timeout) and prints each headline number beside the bar it is measured against.

    python3 scripts/gpu_summary.py OUT [PRESET]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# The bars of the GPU issue (LIBERO B=1 with the prompt cache, the loop around the pipeline).
B1_CALL_S = 0.26
B1_GPU_BUSY = 0.90
LOOP_OVERHEAD = 0.05
# The FP8 issue's bars: DROID B=1 30 steps, and LIBERO B=32 FP8 against bf16 in the same run.
FP8_DROID_S = 1.20
FP8_LIBERO_SPEEDUP = 1.35


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _mark(ok: bool | None) -> str:
    return "" if ok is None else ("  [ok]" if ok else "  [MISSED]")


def _ratio(value: float | None) -> str:
    return "failed" if value is None else f"{value:.2f}x"


def _bench_lines(name: str, bench: dict[str, Any] | None) -> list[str]:
    if bench is None:
        return [f"{name}: no result"]
    state = "" if bench.get("complete") else " (cut short)"
    lines = [f"{name}{state}: {bench.get('gpu')}, {bench.get('dtype')}, options "
             + ", ".join(k for k in ("cuda_graphs", "triton_kernels", "prompt_cache")
                         if (bench.get("options") or {}).get(k))]
    check = bench.get("self_check") or {}
    for option, error in (check.get("disabled") or {}).items():
        lines.append(f"  switched off on this device: {option}: {error}")
    for r in bench.get("rows", []):
        busy = "-" if r.get("gpu_busy") is None else f"{100 * r['gpu_busy']:.0f}%"
        bar = ""
        if r["case"].startswith("libero") and r["batch_size"] == 1 and r["steps"] == 30:
            bar = _mark(r["call_s"] <= B1_CALL_S and (r.get("gpu_busy") or 0) >= B1_GPU_BUSY)
            bar += f" (bar: <= {B1_CALL_S} s, busy >= {B1_GPU_BUSY:.0%})"
        case = f"{r['case']} " if r.get("recipe") else ""
        lines.append(f"  {case}B={r['batch_size']:<3} {r['steps']:>2} steps  {r['call_s']:.3f} s  "
                     f"{r['denoise_tflops']:6.1f} TFLOP/s  busy {busy:>4}"
                     f"  prompt {1e3 * r['stages_s'].get('prompt', 0):.1f} ms{bar}")
        if r["batch_size"] == 1 and r["steps"] == 30 and r.get("top_kernels"):
            lines.append("    top kernels: " + "; ".join(
                f"{k['name'][:40]} {k['ms']:.1f} ms x{k['count']}" for k in r["top_kernels"][:5]))
    for case, per_b in (bench.get("flips") or {}).items():
        for b, flips in per_b.items():
            shown = ", ".join(f"{k} {_ratio(v['ratio'])}" for k, v in flips.items())
            lines.append(f"  {case} B={b} slowdown with each option flipped: {shown}")
    return lines


def _recipe_lines(droid: dict[str, Any] | None) -> list[str]:
    """The released Policy-DROID recipes: each one's B=1 call, its guided steps, FP8 beside
    bf16."""
    lines = []
    for r in (droid or {}).get("rows", []):
        if not r.get("recipe") or r["batch_size"] != 1:
            continue
        pair = _fp8_flip(droid, r["case"], "1")
        fp8 = "no FP8 result" if pair is None else (
            f"fp8 {pair[0]:.3f} s vs bf16 {pair[1]:.3f} s ({pair[1] / pair[0]:.2f}x)")
        lines.append(f"  recipe {r['recipe']} B=1 {r['steps']} steps, {r['guided_steps']} "
                     f"guided: {r['call_s']:.3f} s; {fp8}")
    return ["DROID released recipes (540x640, state row, 32 actions):",
            *(lines or ["  no result"])]


def _eval_lines(loop: dict[str, Any] | None) -> list[str]:
    if loop is None:
        return ["eval --synthetic: no result"]
    lines = [f"eval --synthetic {loop['preset']} on ColorReach (LIBERO's 256x512 input), "
             "default options:"]
    for b, run in loop["runs"].items():
        t = run.get("throughput") or {}
        if b.endswith("_overlap"):
            plain = (loop["runs"].get(b.removesuffix("_overlap")) or {}).get("throughput") or {}
            if not t.get("episodes_per_hour"):
                lines.append(f"  B={b.removesuffix('_overlap')} with --overlap: no throughput")
                continue
            ratio = (f" ({t['episodes_per_hour'] / plain['episodes_per_hour']:.2f}x the plain "
                     "run's)" if plain.get("episodes_per_hour") else "")
            same = {True: "yes", False: "NO", None: "-"}[run.get("identical_episodes")]
            lines.append(f"  B={b.removesuffix('_overlap')} with --overlap: "
                         f"{t['episodes_per_hour']:8.0f} episodes/h{ratio}; the same episodes: "
                         f"{same}")
            continue
        if t.get("loop_overhead") is None:
            lines.append(f"  B={b}: {run['episodes']} episodes, no throughput (cut short)")
            continue
        ok = t["loop_overhead"] <= LOOP_OVERHEAD if b == "32" else None
        off = t.get("disabled_options") or {}
        lines.append(
            f"  B={b:<3} {t['episodes_per_hour']:8.0f} episodes/h  pipeline "
            f"{t['pipeline_s']:.1f} s, env {t['env_s']:.1f} s, other {t['other_s']:.1f} s: "
            f"loop +{100 * t['loop_overhead']:.1f}%{_mark(ok)}"
            + (f" (bar <= {LOOP_OVERHEAD:.0%})" if ok is not None else "")
            + (f"  switched off: {', '.join(off)}" if off else "")
        )
    return lines


def _fp8_flip(bench: dict[str, Any] | None, case: str,
              b: str) -> tuple[float, float, int] | None:
    """(fp8 call s, bf16 call s, steps) of the paired fp8 flip at batch ``b``, if measured."""
    entry = (((bench or {}).get("flips") or {}).get(case) or {}).get(b, {}).get("fp8")
    if not entry or entry.get("ratio") is None:
        return None
    on, off = ("flipped", "configured") if entry["flipped_to"] else ("configured", "flipped")
    return entry[f"{on}_call_s"], entry[f"{off}_call_s"], entry["steps"]


def _fp8_lines(droid: dict[str, Any] | None, fp8: dict[str, Any] | None) -> list[str]:
    lines = ["FP8 (generation tower GEMMs in e4m3, first/last 3 steps bf16):"]
    pair = _fp8_flip(droid, "droid_480x832", "1")
    if pair is None:
        lines.append("  DROID B=1: no FP8 result")
    else:
        lines.append(f"  DROID B=1 {pair[2]} steps: fp8 {pair[0]:.3f} s vs bf16 {pair[1]:.3f} s"
                     f"{_mark(pair[0] <= FP8_DROID_S)} (bar <= {FP8_DROID_S} s; sglang 1.457 s)")
    batch = str(max((r["batch_size"] for r in (fp8 or {}).get("rows", [])), default=32))
    pair = _fp8_flip(fp8, "libero_256x512", batch)
    if pair is None:
        lines.append(f"  LIBERO B={batch}: no FP8 result")
    else:
        speedup = pair[1] / pair[0]
        lines.append(f"  LIBERO B={batch} {pair[2]} steps: fp8 {pair[0]:.3f} s vs bf16 "
                     f"{pair[1]:.3f} s, {speedup:.2f}x{_mark(speedup >= FP8_LIBERO_SPEEDUP)} "
                     f"(bar >= {FP8_LIBERO_SPEEDUP}x)")
    gates = (fp8 or {}).get("fp8_gates")
    if not gates:
        lines.append("  accuracy gates: no result")
        return lines
    sqnr = gates["sqnr"]["min_db"]
    lines.append("  per-layer SQNR, worst layer (dB): "
                 + ", ".join(f"{g} {v:.1f}" for g, v in sqnr.items()))
    a = gates.get("actions")
    if a is None:
        lines.append("  actions vs fp32: no result (cut short)")
        return lines
    lines.append(f"  actions vs fp32, mean |diff|: bf16 {a['vs_fp32']['bf16']['mean']:.4g}, "
                 f"fp8 {a['vs_fp32']['fp8']['mean']:.4g} ({a['mean_ratio']:.2f}x bf16's)"
                 f"{_mark(a['passed'])} (bar <= {a['limit']:.0f}x)")
    return lines


def _grpo_lines(step: dict[str, Any] | None, preset: str) -> list[str]:
    """One GRPO iteration (bench/grpo_step.py): its seconds, and peak memory beside the
    estimate."""
    if step is None:
        return [f"GRPO iteration ({preset}): no result"]
    head = (f"GRPO iteration ({step['preset']}, --train {step['train']}"
            f"{', gradient checkpointing' if step['gradient_checkpointing'] else ''}, "
            f"{step['groups']}x{step['group_size']} episodes, {step['steps']} steps)")
    if not step.get("complete"):
        return [f"{head}: cut short after "
                + ", ".join(k for k in ("build_s", "collect_s") if k in step)]
    estimate = (step.get("estimate_gib") or {}).get("total")
    peak = step.get("update_peak_gib")
    memory = "" if peak is None else (
        f"; peak {peak:.1f} GiB in the update, {step.get('collect_peak_gib') or 0:.1f} GiB "
        f"collecting (estimate {estimate:.1f} GiB)")
    return [f"{head}: {step['iteration_s']:.1f} s per iteration (collect "
            f"{step['collect_s']:.1f} s, update {step['update_s']:.1f} s over "
            f"{step['chunks_with_signal']} chunks, {step['update_steps']} steps){memory}; "
            f"{step['trained_parameters']:,} of {step['parameters']:,} parameters train"]


def summary(out: Path, preset: str = "nano") -> str:
    lines = ["cosmos3-gym device session: summary"]
    tests = out / "pytest_gpu.log"
    if tests.exists():
        text = [line for line in tests.read_text().splitlines() if line.strip()]
        lines += [line for line in text[:1] if line.startswith("gpu: ")]
        # The maniskill stage appends its own part, from a "== maniskill" line on.
        cut = next((i for i, line in enumerate(text) if line.startswith("== maniskill")),
                   len(text))
        tail = [line for line in text[:cut] if not line.startswith("gpu: ")]
        lines.append("gpu tests: " + (tail[-1] if tail else "no output"))
        if cut < len(text):
            result = [line for line in text[cut + 1:] if not line.startswith("maniskill stage")]
            ended = [line for line in text[cut:] if line.startswith("maniskill stage")]
            lines.append("maniskill on the gpu: " + (result[-1] if result else "no output")
                         + (f" ({ended[-1]})" if ended else ""))
    lines += _bench_lines(f"LIBERO bench ({preset})",
                          _load(out / f"bench_gpu_{preset}_libero.json"))
    lines += _eval_lines(_load(out / f"eval_loop_{preset}.json"))
    droid = _load(out / f"bench_gpu_{preset}_droid.json")
    lines += _bench_lines(f"DROID bench ({preset})", droid)
    lines += _recipe_lines(droid)
    lines += _fp8_lines(droid, _load(out / f"bench_gpu_{preset}_fp8.json"))
    lines += _folder_lines(_load(out / f"lerobot_folder_{preset}.json"))
    lines += _latency_lines(_load(out / f"latency_{preset}.json"), preset)
    lines += _grpo_lines(_load(out / f"grpo_{preset}.json"), preset)
    return "\n".join(lines)


def _latency_lines(found: dict[str, Any] | None, preset: str) -> list[str]:
    """The latency stage (scripts/realtime_delays.py): per batch size, the median call and the
    delay it costs every env of the batch at the control rate."""
    if found is None:
        return [f"latency measured ({preset}): not run"]
    state = "" if found.get("complete") else " (cut short)"
    lines = [f"latency measured ({found['synthetic']}, {found['steps']} steps, at "
             f"{found['control_hz']:g} Hz){state}: build {found['build_s']:.1f} s"]
    for b, row in found["batches"].items():
        if row.get("call_s_median") is None:
            lines.append(f"  B={b:<3} no call of {b} envs timed")
            continue
        lines.append(f"  B={b:<3} call {row['call_s_median']:.3f} s (median of {row['calls']}; "
                     f"first {row['first_call_s']:.2f} s): every env waits d = "
                     f"{row['delay_steps_median']:g} steps ({row['delay_ms']:.0f} ms); "
                     f"{row['stalls_per_episode']:.1f} stalled steps per episode")
    return lines


def _folder_lines(found: dict[str, Any] | None) -> list[str]:
    """The LeRobot-format folder stage: load and call times, bf16 against fp32."""
    if found is None:
        return ["LeRobot folder: not run"]
    calls = found.get("calls", {})
    timing = ", ".join(f"{k} {v['median_s']:.3f} s" for k, v in calls.items())
    finite = all(v.get("finite") for v in calls.values()) if calls else None
    return [f"LeRobot folder ({found['preset']}, {found['layers']} layers, "
            f"{found.get('folder_gb', 0):.1f} GB): write {found.get('write_s', 0):.1f} s, load "
            f"{found.get('load_s', 0):.1f} s; calls {timing}; finite {_mark(finite)}; bf16 vs "
            f"fp32 max {found.get('bf16_vs_fp32_max_abs', float('nan')):.3g} of "
            f"{found.get('fp32_action_absmax', float('nan')):.3g}"]


if __name__ == "__main__":
    print(summary(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "nano"))
