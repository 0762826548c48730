"""Several arms of one evaluation in one run folder: a control and the arms compared with it.

An arm is the run's evaluation with some settings changed (another latency, a perturbed suite
of the same benchmark, another noise draw of the same episodes). Every arm runs the same
episodes: the same tasks (by index), trials, init states and env seeds, so an arm's outcome on an
episode pairs with the control's on the same episode, and their difference is measured on the
pairs (:func:`~cosmos3_gym.stats.paired_difference`), not on two independent samples.

The folder holds ``config.json`` (the run's identity, with the arms and which is the control),
one evaluation folder per arm under ``arms/NAME/`` (each a complete evaluation: its own
identity, episode records and ``results.json``; it resumes as any evaluation does), and
``results.json``: every arm's success rate with its interval, and every other arm's paired
difference to the control, overall and per task. The model is loaded once for all arms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmos3_gym.eval import results as results_io
from cosmos3_gym.eval.run import Run
from cosmos3_gym.jsonio import write_json_atomic
from cosmos3_gym.stats import paired_difference

ARMS = "arms"
SCHEMA = "arms/1"


@dataclass(frozen=True)
class Arm:
    """One arm: its name (a folder name: letters, digits, ``-``, ``_``, ``.``) and the
    evaluation settings it changes (``EvalConfig`` fields)."""

    name: str
    changes: dict[str, Any]

    def __post_init__(self) -> None:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
        if not self.name or not set(self.name) <= allowed or self.name.startswith("."):
            raise ValueError(f"an arm's name is a folder name of letters, digits, '-', '_' and "
                             f"'.'; found {self.name!r}")


def arm_folder(out: Path, name: str) -> Path:
    return Path(out) / ARMS / name


def run_arms(run: Run, arms: Sequence[Arm], *, control: str,
             env_changes: Sequence[str] = ("suite",)) -> dict[str, Any] | None:
    """Evaluate every arm of ``run`` (a resolved evaluation) into its folder, then write the
    combined ``results.json``; rank 0 returns it. ``control`` names the arm the others are
    compared with. An arm whose changes touch ``env_changes`` gets its own env family (built
    from its settings); the others run in the run's."""
    from cosmos3_gym.eval.evaluate import Evaluator

    names = [arm.name for arm in arms]
    if len(set(names)) != len(names) or control not in names:
        raise ValueError(f"arms must have distinct names and include the control {control!r}; "
                         f"found {names}")
    identity = {**run.identity(weights=run.model.fingerprint()),
                "arms": {arm.name: _plain(arm.changes) for arm in arms}, "control": control}
    pipeline = run.model.pipeline
    per_arm: dict[str, dict[str, Any]] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    with run.folder() as folder:
        recorded = any((arm_folder(run.out, n) / "config.json").exists() for n in names)
        folder.bind("config.json", identity, bound=recorded,
                    extra={"session": dataclasses.asdict(run.settings)},
                    what="a different evaluation")
        for arm in arms:
            settings = dataclasses.replace(run.settings, **arm.changes)
            env = settings.resolved().make_env() if set(arm.changes) & set(env_changes) else None
            if pipeline is None and _pending(run, arm, settings, env):
                pipeline = run.load()
            arm_run = run.derive("evaluation", settings, arm_folder(run.out, arm.name),
                                 pipeline=pipeline, env=env)
            result = Evaluator(arm_run).run()
            if result is not None:
                per_arm[arm.name] = result
                records[arm.name] = results_io.read_episode_records(arm_run.out)
        if not run.rank.is_main:
            return None
        combined = combine(per_arm, records, control=control,
                           changes={arm.name: _plain(arm.changes) for arm in arms})
        write_json_atomic(run.out / "results.json", combined)
        return combined


def _pending(run: Run, arm: Arm, settings: Any, env: Any) -> bool:
    """Whether the arm has episodes left to run (its model must then be loaded)."""
    folder = arm_folder(run.out, arm.name)
    done = len(results_io.read_episode_records(folder)) if folder.is_dir() else 0
    resolved = settings.resolved()
    family = env if env is not None else run.env
    return done < len(family.episodes(resolved.trials, resolved.seed))


def _plain(changes: dict[str, Any]) -> dict[str, Any]:
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            for k, v in changes.items()}


def combine(per_arm: dict[str, dict[str, Any]], records: dict[str, list[dict[str, Any]]], *,
            control: str, changes: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The arms' ``results.json``: each arm's rate and interval, and each other arm's paired
    difference to ``control`` (overall and per task; episodes pair by task index and trial).

    >>> rec = lambda t, k, s: {"task": f"t{t}", "task_index": t, "trial": k, "success": s}
    >>> control = [rec(0, k, True) for k in range(4)]
    >>> worse = [rec(0, k, k < 2) for k in range(4)]
    >>> out = combine({"control": {"success_rate": 1.0, "episodes": 4, "complete": True},
    ...                "worse": {"success_rate": 0.5, "episodes": 4, "complete": True}},
    ...               {"control": control, "worse": worse}, control="control",
    ...               changes={"control": {}, "worse": {"latency": "4steps"}})
    >>> out["paired"]["worse"]["difference"], out["paired"]["worse"]["pairs"]
    (-0.5, 4)
    """
    keyed = {name: {(int(r["task_index"]), int(r["trial"])): r for r in rs}
             for name, rs in records.items()}
    base = keyed.get(control, {})
    paired: dict[str, Any] = {}
    for name, by_key in keyed.items():
        if name == control:
            continue
        common = sorted(set(by_key) & set(base))
        outcomes = [(by_key[k], base[k]) for k in common
                    if by_key[k].get("success") is not None
                    and base[k].get("success") is not None]
        overall = paired_difference([(bool(a["success"]), bool(c["success"]))
                                     for a, c in outcomes])
        per_task: dict[str, Any] = {}
        for task in sorted({k[0] for k in common}):
            pairs = [(bool(a["success"]), bool(c["success"])) for a, c in outcomes
                     if int(a["task_index"]) == task]
            per_task[str(task)] = {"task": base[(task, min(t for i, t in common if i == task))]
                                   ["task"], **paired_difference(pairs)}
        paired[name] = {**overall, "per_task": per_task}
    arms = {name: {"changes": changes.get(name, {}),
                   **{k: result.get(k) for k in ("success_rate", "successes", "episodes",
                                                 "interval", "complete", "per_task")}}
            for name, result in per_arm.items()}
    return {"schema": SCHEMA, "control": control, "arms": arms, "paired": paired,
            "complete": all(a.get("complete") for a in per_arm.values()),
            "episodes": sum(a.get("episodes") or 0 for a in per_arm.values())}


def format_arms_table(results: dict[str, Any]) -> str:
    """The arms' table: each arm's success and interval, and its paired difference to the
    control with the difference's interval."""

    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    def signed(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:+.1f}"

    control = results["control"]
    header = ("arm", "success", "n", "95% interval", "vs " + control, "paired 95% interval",
              "pairs")
    rows = []
    for name, arm in results["arms"].items():
        lo, hi = arm.get("interval") or (None, None)
        diff = results["paired"].get(name)
        rows.append((
            name + (" (control)" if name == control else ""), pct(arm.get("success_rate")),
            str(arm.get("episodes")), f"[{pct(lo)}, {pct(hi)}]",
            "" if diff is None else signed(diff["difference"]),
            "" if diff is None else f"[{signed(diff['interval'][0])}, "
                                    f"{signed(diff['interval'][1])}]",
            "" if diff is None else str(diff["pairs"])))
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
             for r in (header, tuple("-" * w for w in widths), *rows)]
    lines.append("differences in points (arm - control) on the same episodes (task, trial, init "
                 "state, seed); Newcombe's paired interval")
    return "\n".join(lines)
