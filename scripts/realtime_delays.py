"""What batching does to a robot's delay: ``--latency measured`` at several batch sizes.

The model is built once (a published shape with random weights: ``--synthetic``), then for each
batch size B one evaluation of B envs runs under real-time execution with each call's own wall
time as its delay, at a control rate (LIBERO's 20 Hz by default): every env of a call waits as
long as the whole batch takes. Writes one JSON with, per B, the calls of B envs (their median
wall time) and the delay d in env steps they cost, and the stalls; the GPU session's
``latency`` stage (scripts/gpu_session.sh) runs it on Nano's shapes.

    python3 scripts/realtime_delays.py --synthetic nano --device cuda --batches 1,8,32 \\
        --runs /tmp/runs --out latency_nano.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import time
from pathlib import Path
from typing import Any


def measure(synthetic: str, device: str, batches: list[int], runs: Path, *, control_hz: float,
            steps: int, episode_steps: int, out: Path) -> dict[str, Any]:
    from cosmos3_gym.eval.evaluate import EvalConfig, Evaluator
    from cosmos3_gym.eval.results import read_episode_records
    from cosmos3_gym.eval.run import resolve
    from cosmos3_gym.pipeline.sampling import SamplerConfig

    base = EvalConfig(synthetic=synthetic, device=device, latency="measured",
                      control_hz=control_hz, max_episode_steps=episode_steps,
                      sampling=SamplerConfig(num_inference_steps=steps), progress=False)
    started = time.perf_counter()
    # Resolved and built once; each batch size is a run derived from it (as arms are).
    run = resolve(dataclasses.replace(base, num_envs=batches[0], trials=1),
                  runs / "latency_build", kind="evaluation")
    pipeline = run.load()
    found: dict[str, Any] = {"synthetic": synthetic, "device": device, "control_hz": control_hz,
                             "steps": steps, "episode_steps": episode_steps,
                             "build_s": time.perf_counter() - started, "batches": {}}
    for b in batches:
        folder = runs / f"latency_b{b}"
        # One episode per env slot, the 4 ColorReach tasks spread over the slots.
        config = dataclasses.replace(base, num_envs=b, trials=max(1, -(-b // 4)))
        Evaluator(run.derive("evaluation", config, folder, pipeline=pipeline)).run()
        chunks = [c for r in read_episode_records(folder) for c in r["chunk_timing"]]
        full = [c for c in chunks if c["batch"] == b]
        # The first call of a batch size also captures its CUDA graphs: not a robot's delay.
        timed = full[b:] if len(full) > b else full
        walls = [c["latency_s"] for c in timed]
        delays = [c["delay"] for c in timed]
        records = read_episode_records(folder)
        found["batches"][str(b)] = {
            "calls": len(walls) // b if b else 0,
            "call_s_median": statistics.median(walls) if walls else None,
            "delay_steps_median": statistics.median(delays) if delays else None,
            "delay_ms": None if not delays else 1000.0 * statistics.median(delays) / control_hz,
            "first_call_s": full[0]["latency_s"] if full else None,
            "stalls_per_episode": sum(r["stalls"] for r in records) / max(1, len(records)),
            "episodes": len(records),
        }
        out.write_text(json.dumps(found, indent=2))  # as it goes: a stage cut short keeps it
    found["complete"] = True
    out.write_text(json.dumps(found, indent=2))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synthetic", default="nano")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,8,32")
    parser.add_argument("--control-hz", type=float, default=20.0)
    parser.add_argument("--denoising-steps", type=int, default=30)
    parser.add_argument("--episode-steps", type=int, default=24)
    parser.add_argument("--runs", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    batches = [int(b) for b in args.batches.split(",")]
    for b in batches:  # each run starts afresh
        shutil.rmtree(args.runs / f"latency_b{b}", ignore_errors=True)
    measure(args.synthetic, args.device, batches, args.runs, control_hz=args.control_hz,
            steps=args.denoising_steps, episode_steps=args.episode_steps, out=args.out)


if __name__ == "__main__":
    main()
