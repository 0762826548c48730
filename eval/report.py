"""Results as a picture: ``results.png`` / ``results.svg`` and ``cosmos3-gym report``.

The plot shows each task's success rate as a bar with its 95% Wilson interval as whiskers and
``rate (successes/episodes)`` written beside it, then each suite (when a run has several) and
the whole run, below a line. Several runs share one plot (``report RUN_A RUN_B``): each row
then holds one bar per run, one colour per run, named in the legend.

The evaluator redraws ``results.png`` beside ``results.json`` as episodes finish (at most about
a tenth of the run's time goes into drawing) and once at the end. ``cosmos3-gym report RUN_DIR``
recomputes the summary from the episode logs, the source of truth, so it also serves a run
that was interrupted or is still going, and redraws the plot.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cosmos3_gym.eval import results as results_io
from cosmos3_gym.plotting import PlottingUnavailable, new_figure, save_figure

RunResults = tuple[str, dict[str, Any]]  # (label, results.json document)

# One colour per run (matplotlib's default cycle, colour-blind friendly).
RUN_COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
DRAW_SHARE = 0.1  # redraw while running only if drawing takes at most this share of the time


def _rows(runs: Sequence[RunResults]) -> list[tuple[str, str, str]]:
    """(kind, key, label) per plot row, top to bottom: tasks, then suites and their average
    (where a run has several), then the run."""
    tasks: list[str] = []
    suites: list[str] = []
    for _, results in runs:
        tasks += [t for t in results["per_task"] if t not in tasks]
        suites += [s for s in results["per_suite"] if s not in suites]
    rows = [("task", t, t) for t in tasks]
    if len(suites) > 1:
        rows += [("suite", s, f"suite {s}") for s in suites]
        if any(results.get("suite_average") for _, results in runs):
            rows.append(("average", "", "average of the suites"))
    rows.append(("all", "", f"all ({suites[0]})" if len(suites) == 1 else "all"))
    return rows


def _entry(results: dict[str, Any], kind: str, key: str) -> dict[str, Any] | None:
    if kind == "task":
        return results["per_task"].get(key)
    if kind == "suite":
        return results["per_suite"].get(key)
    if kind == "average":
        return results.get("suite_average")
    return results


def _title(runs: Sequence[RunResults]) -> str:
    if len(runs) > 1:
        return "Success rate per task: " + " vs ".join(label for label, _ in runs)
    label, results = runs[0]
    config = results.get("config", {})
    where = config.get("suite") or config.get("env") or ""
    if "," in where:
        where = f"{len(where.split(','))} suites"
    done = f"{results['episodes']} of {results['episodes_expected']} episodes"
    state = "" if results["complete"] else ", partial run"
    return f"{label}: success rate per task\n{where}, checkpoint {config.get('checkpoint')}, " \
           f"{done}{state}"


def plot_results(runs: Sequence[RunResults], stem: Path) -> list[Path]:
    """Draw ``stem.png`` and ``stem.svg`` for one run or several side by side.

    Each bar's SVG element has the id ``bar-{task|suite|all}-{row}-run{r}``, so a reader (or a
    test) can find every bar.
    """
    if not runs:
        raise ValueError("nothing to plot: expected at least one run")
    rows = _rows(runs)
    n_runs = len(runs)
    row_height = 0.34 * max(1.0, 0.75 * n_runs)
    fig = new_figure(8.0, 1.6 + row_height * len(rows) + (0.3 if n_runs > 1 else 0.0))
    ax = fig.add_subplot()
    bar = 0.8 / n_runs
    n_tasks = sum(kind == "task" for kind, _, _ in rows)
    for r, (_, results) in enumerate(runs):
        colour = RUN_COLOURS[r % len(RUN_COLOURS)]
        for y, (kind, key, _) in enumerate(rows):
            # Rows go down the page; runs within a row go down in the legend's order.
            centre = y - 0.4 + bar * (r + 0.5)
            entry = _entry(results, kind, key)
            if entry is None or not entry["episodes"] or entry["success_rate"] is None:
                what = ("not in this run" if entry is None else "no episodes yet"
                        if not entry["episodes"] else "no success signal (returns only)")
                ax.text(0.01, centre, what, va="center", fontsize=8, color="#666666")
                continue
            rate = entry["success_rate"]
            lo, hi = entry["interval"]
            patch = ax.barh(centre, rate, height=bar * 0.9, color=colour,
                            alpha=1.0 if kind == "task" else 0.75)[0]
            patch.set_gid(f"bar-{kind}-{y}-run{r}")
            ax.errorbar(rate, centre, xerr=[[rate - lo], [hi - rate]], fmt="none",
                        ecolor="#222222", elinewidth=1.2, capsize=3)
            ax.text(hi + 0.015, centre, f"{rate:.0%} ({_counts(entry)})",
                    va="center", fontsize=8 if n_runs > 1 else 9)
    ax.set_yticks(range(len(rows)), [label for _, _, label in rows])
    for tick, (kind, _, _) in zip(ax.get_yticklabels(), rows, strict=True):
        if kind != "task":
            tick.set_fontweight("bold")
    ax.axhline(n_tasks - 0.5, color="#888888", linewidth=0.8)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # first task on top
    ax.set_xlim(0.0, 1.28)  # room for the labels right of a whisker at 100%
    ax.set_xticks([0.0, 0.25, 0.5, 0.75, 1.0], ["0%", "25%", "50%", "75%", "100%"])
    ax.set_xlabel("success rate (bar), 95% Wilson interval (whiskers)")
    ax.grid(axis="x", color="#dddddd", linewidth=0.6)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    ax.set_title(_title(runs), fontsize=10, loc="left")
    if n_runs > 1:
        from matplotlib.patches import Patch

        handles = [Patch(color=RUN_COLOURS[r % len(RUN_COLOURS)], label=_legend_label(*run))
                   for r, run in enumerate(runs)]
        fig.legend(handles=handles, loc="outside lower center", ncols=n_runs, frameon=False)
    return save_figure(fig, stem)


def plot_arms(results: dict[str, Any], stem: Path, label: str) -> list[Path]:
    """Draw an arms run (:mod:`~cosmos3_gym.eval.arms`) as ``stem.png`` and ``stem.svg``: left,
    each arm's success rate with its Wilson interval; right, each arm's paired difference to
    the control with its interval, and each task's difference as a dot. Bars have the SVG ids
    ``bar-arm-{row}``, differences ``diff-arm-{row}``."""
    control = results["control"]
    names = [control, *(n for n in results["arms"] if n != control)]
    fig = new_figure(9.0, 1.7 + 0.4 * len(names))
    rates, diffs = fig.subplots(1, 2, sharey=True, width_ratios=(1.0, 1.1))
    for y, name in enumerate(names):
        arm = results["arms"].get(name) or {}
        if arm.get("episodes") and arm.get("success_rate") is not None:
            rate, (lo, hi) = arm["success_rate"], arm["interval"]
            rates.barh(y, rate, height=0.6, color=RUN_COLOURS[0])[0].set_gid(f"bar-arm-{y}")
            rates.errorbar(rate, y, xerr=[[rate - lo], [hi - rate]], fmt="none",
                           ecolor="#222222", elinewidth=1.2, capsize=3)
            rates.text(hi + 0.015, y, f"{rate:.0%} ({arm['successes']}/{arm['episodes']})",
                       va="center", fontsize=8)
        paired = results["paired"].get(name)
        if paired is None or paired.get("difference") is None:
            diffs.text(0.0, y, "control" if name == control else "no pairs yet", va="center",
                       ha="center", fontsize=8, color="#666666")
            continue
        d, (lo, hi) = paired["difference"], paired["interval"]
        tasks = [t["difference"] for t in paired["per_task"].values()
                 if t.get("difference") is not None]
        diffs.scatter(tasks, [y + 0.22] * len(tasks), s=10, color="#999999", zorder=2)
        diffs.errorbar(d, y, xerr=[[d - lo], [hi - d]], fmt="o", color=RUN_COLOURS[1],
                       ecolor=RUN_COLOURS[1], elinewidth=1.6, capsize=4,
                       zorder=3)[0].set_gid(f"diff-arm-{y}")
        diffs.text(hi + 0.03, y, f"{100 * d:+.1f} ({paired['pairs']} pairs)", va="center",
                   fontsize=8)
    rates.set_yticks(range(len(names)), names)
    rates.set_ylim(len(names) - 0.5, -0.5)
    rates.set_xlim(0.0, 1.3)
    rates.set_xticks([0.0, 0.5, 1.0], ["0%", "50%", "100%"])
    rates.set_xlabel("success rate, 95% Wilson interval")
    diffs.axvline(0.0, color="#888888", linewidth=0.8)
    diffs.set_xlim(-1.05, 1.45)
    diffs.set_xticks([-1.0, -0.5, 0.0, 0.5, 1.0], ["-100", "-50", "0", "+50", "+100"])
    diffs.set_xlabel(f"vs {control}, points: paired 95% interval (dots: tasks)")
    for ax in (rates, diffs):
        ax.grid(axis="x", color="#dddddd", linewidth=0.6)
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    title = f"{label}: {len(names)} arms on the same episodes"
    floor = results.get("noise_floor")
    if floor is not None and floor.get("agreement") is not None:
        title += (f"; test-retest agreement {floor['agreement']:.1%} of {floor['pairs']} "
                  "(task, trial) pairs")
    if not results["complete"]:
        title += " (partial)"
    fig.suptitle(title, fontsize=10, x=0.01, ha="left")
    return save_figure(fig, stem)


def draw_arms(results: dict[str, Any], stem: Path, label: str) -> list[Path]:
    """:func:`plot_arms`, or a note on stderr (and nothing drawn) without matplotlib."""
    try:
        return plot_arms(results, stem, label)
    except PlottingUnavailable as err:
        print(f"note: no {Path(stem).name}.png: {err}", file=sys.stderr)
        return []


def _counts(entry: dict[str, Any]) -> str:
    """``successes/episodes``, or for the suites' average ``mean of K suites``."""
    if "suites" in entry:
        return f"mean of {len(entry['suites'])} suites"
    return f"{entry['successes']}/{entry['episodes']}"


def _legend_label(label: str, results: dict[str, Any]) -> str:
    if results["complete"]:
        return label
    return f"{label} (partial: {results['episodes']} of {results['episodes_expected']} episodes)"


class ResultsPlot:
    """``results.png`` / ``.svg`` in a run folder, redrawn as results come in.

    A redraw is skipped while the time since the last one is under ``1/DRAW_SHARE - 1`` times
    what that one took, so drawing stays near a tenth of the run's time at most; the final
    draw always happens. Without matplotlib it draws nothing and says so once.
    """

    def __init__(self, out_dir: Path, label: str | None = None) -> None:
        self.out_dir = Path(out_dir)
        self.label = label or self.out_dir.name
        self.unavailable = False
        self.last_end: float | None = None
        self.last_cost = 0.0

    def update(self, results: dict[str, Any], final: bool = False) -> None:
        if self.unavailable:
            return
        start = time.perf_counter()
        if (not final and self.last_end is not None
                and start - self.last_end < self.last_cost * (1 / DRAW_SHARE - 1)):
            return
        try:
            plot_results([(self.label, results)], self.out_dir / "results")
        except PlottingUnavailable as err:
            self.unavailable = True
            print(f"note: no results.png: {err}", file=sys.stderr)
            return
        self.last_end = time.perf_counter()
        self.last_cost = self.last_end - start


def load_run(run_dir: Path) -> dict[str, Any]:
    """A run's results document, recomputed from its episode logs.

    The task list, expected count, config and throughput come from ``results.json`` (or, before
    the first episode finished, from ``config.json``); the counts and intervals come from the
    logs, so a run that was interrupted, or whose other ranks are ahead, is shown as it is.
    """
    run_dir = Path(run_dir)
    stored_path = run_dir / "results.json"
    config_path = run_dir / "config.json"
    if stored_path.exists():
        stored = json.loads(stored_path.read_text(encoding="utf-8"))
        task_names = list(stored["per_task"])
        expected, config = stored["episodes_expected"], stored["config"]
        budget, protocol = stored.get("episode_budget"), stored.get("protocol")
        source = stored.get("success_source")
    elif config_path.exists():
        from cosmos3_gym.envs import make_eval_env

        stored = {}
        config = json.loads(config_path.read_text(encoding="utf-8"))["identity"]
        from cosmos3_gym.envs.names import GYM_OPTIONS

        eval_env = make_eval_env(
            config["env"], suite=config["suite"], tasks=config["tasks"],
            image_size=config["image_size"], max_episode_steps=config["max_episode_steps"],
            step_budget=config.get("step_budget"),
            **{k: config.get(k) for k in GYM_OPTIONS if config.get(k) is not None},
        )
        task_names, expected = eval_env.tasks, len(eval_env.tasks) * config["trials"]
        budget, protocol = eval_env.episode_budget(), None
        source = eval_env.success_rule.record()
    else:
        raise FileNotFoundError(
            f"{run_dir} holds no evaluation: expected results.json or config.json written by "
            "cosmos3-gym eval"
        )
    records = results_io.read_episode_records(run_dir)
    # The latency model's line as the run wrote it (none before its first episode finished).
    model = (stored.get("latency") or {}).get("model")
    summary = results_io.summarize(
        records,
        config=config,
        task_names=task_names,
        expected_episodes=expected,
        incidents=results_io.read_incidents(run_dir),
        throughput=stored.get("throughput"),
        episode_budget=budget,
        protocol=protocol,
        success_source=source,
        latency_model=model,
    )
    return {**stored, **summary}  # keys a newer results.json holds beyond the summary stay


def format_comparison(runs: Sequence[RunResults]) -> str:
    """One row per task, suite and the whole run; per run ``rate (k/n) [low, high]``."""
    rows = _rows(runs)
    table = [["task", *(label for label, _ in runs)]]
    for kind, key, label in rows:
        cells = [label]
        for _, results in runs:
            entry = _entry(results, kind, key)
            if entry is None or not entry["episodes"] or entry["success_rate"] is None:
                cells.append("-")
                continue
            lo, hi = entry["interval"]
            cells.append(f"{entry['success_rate']:.1%} ({_counts(entry)}) [{lo:.1%}, {hi:.1%}]")
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
             for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR",
                        help="evaluation output folders (finished or not); two or more are "
                             "compared in one plot")
    parser.add_argument("--labels", default=None,
                        help="comma-separated names of the runs in the plot (default: the "
                             "folder names)")
    parser.add_argument("--out", default=None,
                        help="where the command writes its results; the plot, as FILE.png (an "
                             ".svg is written beside it); default RUN_DIR/results.png for one "
                             "run, needed for several")


def run(args: argparse.Namespace) -> int:
    """``cosmos3-gym report``: print the table(s) and redraw the plot; 1 if it cannot draw."""
    dirs = [Path(d) for d in args.runs]
    labels = _labels(dirs, args.labels)
    if args.out is not None:
        stem = Path(args.out)
        stem = stem.with_suffix("") if stem.suffix in (".png", ".svg") else stem
    elif len(dirs) == 1:
        stem = dirs[0] / "results"
    else:
        raise ValueError(
            f"comparing {len(dirs)} runs needs --out FILE.png (where to write the plot); "
            "found none"
        )
    from cosmos3_gym.eval.arms import format_arms_table, is_arms_folder, load_arms

    arms = [d for d in dirs if is_arms_folder(d)]
    if arms:
        if len(dirs) > 1:
            raise ValueError(f"{arms[0]} holds several arms of one run (its own comparison); "
                             "report it alone")
        results = load_arms(dirs[0])
        print(format_arms_table(results))
        paths = draw_arms(results, stem, labels[0])
        if not paths:
            return 1
        print("plot: " + ", ".join(str(p) for p in paths))
        return 0
    runs = [(label, load_run(d)) for label, d in zip(labels, dirs, strict=True)]
    if len(runs) == 1:
        print(results_io.format_table(runs[0][1]))
    else:
        print(format_comparison(runs))
    try:
        paths = plot_results(runs, stem)
    except PlottingUnavailable as err:
        print(f"cosmos3-gym report: no plot drawn: {err}", file=sys.stderr)
        return 1
    print("plot: " + ", ".join(str(p) for p in paths))
    return 0


def _labels(dirs: Sequence[Path], text: str | None) -> list[str]:
    if text is None:
        names = [d.resolve().name for d in dirs]
        return names if len(set(names)) == len(names) else [str(d) for d in dirs]
    labels = [t.strip() for t in text.split(",")]
    if len(labels) != len(dirs) or not all(labels):
        raise ValueError(
            f"--labels: expected {len(dirs)} non-empty names (one per run); found {labels}"
        )
    return labels
