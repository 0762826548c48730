"""GRPO over seeds: one ``cosmos3-gym rl grpo`` command per seed (and per variant), then the
table and the curves the docs show (docs/rl.md, "What holds the gains").

``python -m cosmos3_gym.bench.grpo_seeds --out runs/grpo_seeds --seeds 0,1,2,3,4 -- ARGS`` runs
``cosmos3-gym rl grpo ARGS --seed S --out OUT/default/seed-S`` for each seed, one run at a
time, every variant's first seed before any second seed (each run in its own process, so one
run's threads and memory never meet the next's), and writes ``OUT/summary.json``,
``OUT/summary.md`` and ``OUT/curves.png``: per seed the held-out success at the start, its best
measurement and its final one (a ``--keep best`` run: the start and the kept weights on the
test episodes, beside the best held-out measurement that chose them); per variant the mean and
the range over seeds at every measured iteration. ``--variant NAME="--lr 1e-5"`` adds a
variant: the same command with those flags appended (repeat it; ``default`` is the command as
given). A run folder that already holds a finished run of the requested ``--iterations`` is
read, not run again (one of fewer iterations is resumed to the new count, one of more is
refused), and a killed run resumes (a rerun of this command goes on where it stopped), so the
measurement can be spread over sessions. ``--report-only`` aggregates what is there.
``--figure PATH`` also writes the figure and the summary there (``docs/grpo_curve``: PATH.png
and PATH.json).

The acceptance the docs state is computed for each run: final >= start + ``--min-gain`` points
and final >= its own best - ``--max-drop`` points.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

DEFAULT = "default"


def run_folder(out: Path, variant: str, seed: int) -> Path:
    return out / variant / f"seed-{seed}"


def grpo_settings(argv: list[str]) -> Any:
    """The settings (``GRPOConfig``) of the ``rl grpo`` command line ``argv``, resolved as
    ``rl grpo`` resolves them (its parser, then the settings' defaults): an abbreviated or
    repeated flag counts as it will there, and a typo is refused before anything runs."""
    from cosmos3_gym.eval.cli import build_parser, command_settings, parse_command_line
    from cosmos3_gym.train.config import GRPOConfig

    return command_settings(parse_command_line(build_parser(), ["rl", "grpo", *argv]),
                            GRPOConfig)


def requested_iterations(commands: dict[str, list[str]]) -> dict[str, int]:
    """The ``--iterations`` each ``rl grpo`` command line asks for (:func:`grpo_settings`)."""
    return {name: grpo_settings(argv).iterations for name, argv in commands.items()}


def finished(folder: Path, iterations: int | None = None) -> dict[str, Any] | None:
    """The run's curve.json where the run finished (its summary is written last) and, given
    ``iterations``, ran that many: a finished run asked for more is not finished (rerunning
    ``rl grpo`` resumes it to the new count); one that ran more is refused, since its curve and
    its kept weights would not be those of the shorter run."""
    path = folder / "curve.json"
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if "after" not in data:
        return None
    ran = data["config"]["iterations"]
    if iterations is None or ran == iterations:
        return data
    if ran > iterations:
        raise SystemExit(f"{folder} holds a run of {ran} iterations; this command asks for "
                         f"{iterations}: give another --out, or the same --iterations")
    return None


def run_seed(args: list[str], variant_args: list[str], seed: int, folder: Path) -> None:
    """One ``rl grpo`` run in its own process; its output goes to ``folder.log``."""
    command = [sys.executable, "-m", "cosmos3_gym.eval.cli", "rl", "grpo", *args,
               *variant_args, "--seed", str(seed), "--out", str(folder), "--no-progress"]
    folder.parent.mkdir(parents=True, exist_ok=True)
    log = folder.with_suffix(".log")
    started = time.perf_counter()
    with open(log, "a") as handle:
        handle.write("$ " + " ".join(shlex.quote(c) for c in command) + "\n")
        handle.flush()
        code = subprocess.call(command, stdout=handle, stderr=subprocess.STDOUT)
    print(f"{folder}: exit {code} after {(time.perf_counter() - started) / 60:.1f} min",
          flush=True)
    if code != 0:
        raise SystemExit(f"{folder} failed (exit {code}); see {log}")


def seed_row(curve: list[dict[str, Any]], min_gain: float, max_drop: float,
             kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """Start, best and final held-out success of one run (in points), and its acceptance.
    ``kept`` (a ``--keep best`` run's summary entry): the final is the kept weights' success on
    the test episodes and the start the start's on the same episodes (``curve[0]``); the best
    stays the best held-out measurement, the one that chose them."""
    held = [(p["iteration"], p["held_out_success"]) for p in curve if "held_out_success" in p]
    start, final, final_it = held[0][1], held[-1][1], held[-1][0]
    if kept is not None:
        start, final, final_it = curve[0]["test_success"], kept["test_success"], kept["iteration"]
    best_it, best = max(held, key=lambda ir: (ir[1], -ir[0]))
    return {"start": 100 * start, "best": 100 * best, "best_iteration": best_it,
            "final": 100 * final, "final_iteration": final_it,
            "gain": 100 * (final - start), "below_best": 100 * (best - final),
            "holds": final - start >= min_gain / 100 - 1e-9
            and best - final <= max_drop / 100 + 1e-9}


def band(curves: list[list[dict[str, Any]]], key: str = "held_out_success"
         ) -> dict[str, list[float]]:
    """Mean, lowest and highest of ``key`` over runs at every iteration all of them measured."""
    per_run = [{p["iteration"]: p[key] for p in c if key in p and not _nan(p[key])}
               for c in curves]
    common = sorted(set.intersection(*(set(r) for r in per_run))) if per_run else []
    values = [[r[i] for r in per_run] for i in common]
    return {"iteration": common, "mean": [sum(v) / len(v) for v in values],
            "low": [min(v) for v in values], "high": [max(v) for v in values]}


def _nan(value: Any) -> bool:
    return isinstance(value, float) and math.isnan(value)


def summarise(out: Path, variants: dict[str, list[str]], seeds: list[int], min_gain: float,
              max_drop: float, iterations: dict[str, int] | None = None) -> dict[str, Any]:
    """The table's numbers over the finished runs (of ``iterations[variant]`` iterations, where
    given: :func:`finished`)."""
    iterations = iterations or {}
    summary: dict[str, Any] = {"seeds": seeds, "min_gain": min_gain, "max_drop": max_drop,
                               "variants": {}}
    for name, extra in variants.items():
        runs = {s: finished(run_folder(out, name, s), iterations.get(name)) for s in seeds}
        done = {s: r for s, r in runs.items() if r is not None}
        if not done:
            continue
        rows = {s: seed_row(r["curve"], min_gain, max_drop, r.get("kept"))
                for s, r in done.items()}
        curves = [r["curve"] for r in done.values()]
        summary["variants"][name] = {
            "flags": extra, "seeds": {str(s): row for s, row in rows.items()},
            "missing": [s for s in seeds if s not in done],
            "held_out": band(curves), "train": band(curves, "train_success"),
            "approx_kl": band(curves, "approx_kl"),
            "mean_final": sum(r["final"] for r in rows.values()) / len(rows),
            "mean_gain": sum(r["gain"] for r in rows.values()) / len(rows),
            "all_hold": all(r["holds"] for r in rows.values()) and len(rows) == len(seeds),
            "wall_min": [round(r["wall_s"] / 60, 1) for r in done.values()],
            "command": done[min(done)]["config"],
        }
    return summary


def table(summary: dict[str, Any]) -> str:
    """The Markdown table of the docs: one row per variant, each seed's held-out success at the
    start / its best / its final measurement (%)."""
    lines = ["| variant | flags | " + " | ".join(f"seed {s}" for s in summary["seeds"])
             + " | mean final | seeds that hold |", "|---" * (len(summary["seeds"]) + 4) + "|"]
    for name, v in summary["variants"].items():
        cells = []
        for s in summary["seeds"]:
            row = v["seeds"].get(str(s))
            cells.append("" if row is None else
                         f"{row['start']:.1f} / {row['best']:.1f} / {row['final']:.1f}")
        flags = " ".join(v["flags"]) or "(as given)"
        lines.append(f"| {name} | `{flags}` | " + " | ".join(cells)
                     + f" | {v['mean_final']:.1f} | "
                     f"{sum(r['holds'] for r in v['seeds'].values())} of {len(v['seeds'])} |")
    return "\n".join(lines)


def plot(summary: dict[str, Any], stem: Path) -> None:
    """Held-out success against iterations: the mean over seeds and its range, per variant."""
    from cosmos3_gym.plotting import new_figure, save_figure

    fig = new_figure(6.4, 3.8)
    ax = fig.add_subplot(1, 1, 1)
    for k, (name, v) in enumerate(summary["variants"].items()):
        b = v["held_out"]
        n = len(v["seeds"])
        ax.fill_between(b["iteration"], b["low"], b["high"], color=f"C{k}", alpha=0.15, lw=0)
        ax.plot(b["iteration"], b["mean"], "o-", color=f"C{k}", ms=3,
                label=f"{name}: mean of {n} seeds (band: lowest to highest)")
    ax.set_xlabel("GRPO iteration")
    ax.set_ylabel("held-out success")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=7)
    save_figure(fig, stem)


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, flags = text.partition("=")
    if not sep or not name.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=\"--flag value ...\"; found {text!r}")
    return name.strip(), shlex.split(flags)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seeds", default="0,1,2,3,4",
                        type=lambda t: [int(s) for s in t.split(",")])
    parser.add_argument("--variant", action="append", type=parse_variant, default=[],
                        help='NAME="--flag value ...": the command with these flags appended')
    parser.add_argument("--no-default", action="store_true",
                        help="run only the --variant commands, not the command as given")
    parser.add_argument("--min-gain", type=float, default=20.0)
    parser.add_argument("--max-drop", type=float, default=10.0)
    parser.add_argument("--report-only", action="store_true")
    parser.add_argument("--figure", type=Path, help="also write the figure and the summary "
                        "here (PATH.png, PATH.json)")
    parser.add_argument("args", nargs=argparse.REMAINDER,
                        help="-- then the rl grpo arguments every run shares")
    ns = parser.parse_args(argv)
    args = ns.args[1:] if ns.args[:1] == ["--"] else ns.args
    variants = {} if ns.no_default else {DEFAULT: []}
    variants.update(dict(ns.variant))
    iterations = requested_iterations({name: [*args, *extra] for name, extra in variants.items()})
    ns.out.mkdir(parents=True, exist_ok=True)
    if not ns.report_only:
        for seed in ns.seeds:  # seed by seed: every variant's first seed comes in first
            for name, extra in variants.items():
                folder = run_folder(ns.out, name, seed)
                if finished(folder, iterations[name]) is None:
                    run_seed(args, extra, seed, folder)
    summary = summarise(ns.out, variants, ns.seeds, ns.min_gain, ns.max_drop, iterations)
    summary["args"] = args
    (ns.out / "summary.json").write_text(json.dumps(summary, indent=1))
    text = table(summary)
    (ns.out / "summary.md").write_text(text + "\n")
    print(text)
    if summary["variants"]:
        plot(summary, ns.out / "curves")
        if ns.figure is not None:
            plot(summary, ns.figure)
            ns.figure.with_suffix(".json").write_text(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
