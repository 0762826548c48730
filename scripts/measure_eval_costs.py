"""What evaluation from a training loop and across jobs costs here (docs/evaluation.md, "In a
training loop" and "On many machines"): a checkpoint load, a ``cosmos3_gym.evaluate`` call's
time around its episodes, a ``cosmos3-gym eval --shard`` job's start-up (its process's time
before its first episode, and after its last), and ``cosmos3-gym merge``.

    python scripts/measure_eval_costs.py [--checkpoint tiny] [--shards 2] [--out DIR]

Prints one JSON object (seconds). The episodes are small (2 tasks, 2 trials, 32 px, 6 steps, 2
denoising steps): the costs measured are the ones around them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

EVAL = ["--tasks", "red,green", "--trials", "2", "--num-envs", "2", "--image-size", "32",
        "--max-episode-steps", "6", "--denoising-steps", "2", "--no-progress"]


def loop_seconds(folder: Path) -> float:
    """The episode loop's wall time the run recorded (every throughput file: the slowest)."""
    parts = [json.loads(p.read_text()) for p in folder.glob("throughput*.json")]
    return max(p["wall_s"] for p in parts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default="tiny")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--out", default=None, help="where the runs go (default: a temporary "
                                                    "folder)")
    args = parser.parse_args()
    root = Path(args.out or tempfile.mkdtemp(prefix="eval-costs-"))
    found: dict[str, object] = {"checkpoint": args.checkpoint}

    start = time.perf_counter()
    import cosmos3_gym
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline
    found["import_s"] = time.perf_counter() - start
    for name in ("first_load_s", "second_load_s"):
        start = time.perf_counter()
        pipe = Cosmos3ActionPipeline.from_pretrained(args.checkpoint, trainable=True)
        found[name] = time.perf_counter() - start
    settings = dict(tasks=["red", "green"], trials=2, num_envs=2, image_size=32,
                    max_episode_steps=6, num_inference_steps=2)
    calls = []
    for k in range(3):
        start = time.perf_counter()
        results = cosmos3_gym.evaluate(pipe, "color_reach", seed=k, out=root / f"call{k}",
                                       **settings)
        wall = time.perf_counter() - start
        calls.append({"call_s": wall, "episodes_s": loop_seconds(results.out),
                      "around_s": wall - loop_seconds(results.out)})
    found["evaluate_calls"] = calls

    shards = []
    for index in range(args.shards):
        out = root / f"shard{index}"
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "cosmos3_gym.eval.cli", "eval", "--checkpoint",
                        args.checkpoint, *EVAL, "--shard", f"{index}/{args.shards}",
                        "--out", str(out)], check=True, capture_output=True)
        wall = time.perf_counter() - start
        shards.append({"process_s": wall, "episodes_s": loop_seconds(out),
                       "start_up_s": wall - loop_seconds(out)})
    found["shards"] = shards
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "cosmos3_gym.eval.cli", "merge",
                    *(str(root / f"shard{i}") for i in range(args.shards)),
                    "--out", str(root / "merged")], check=True, capture_output=True)
    found["merge_process_s"] = time.perf_counter() - start
    print(json.dumps(found, indent=2))


if __name__ == "__main__":
    main()
