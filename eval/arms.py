"""Several arms of one evaluation in one run folder: a control and the arms compared with it.

An arm is the run's evaluation with some settings changed (another latency, a perturbed suite
of the same benchmark, another noise draw of the same episodes). Every arm runs the same
episodes: the same tasks (by index), trials, init states and env seeds, so an arm's outcome on an
episode pairs with the control's on the same episode, and their difference is measured on the
pairs (:func:`~cosmos3_gym.stats.paired_difference`), not on two independent samples.

The folder holds ``config.json`` (the run's identity, with the arms and which is the control),
one evaluation folder per arm under ``arms/NAME/`` (each a complete evaluation: its own
identity, episode records and ``results.json``; it resumes as any evaluation does),
``results.json``: every arm's success rate with its interval, and every other arm's paired
difference to the control, overall and per task (with each arm's latency block where the arms
ran under real-time execution), and ``results.png`` / ``.svg``: each arm's rate and interval and
its paired difference to the control, the control first, the others in the arms' order
(:func:`~cosmos3_gym.eval.report.plot_arms`). The model is loaded once for all arms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmos3_gym.eval import results as results_io
from cosmos3_gym.eval.run import Run
from cosmos3_gym.jsonio import read_json_object, write_json_atomic
from cosmos3_gym.stats import paired_difference, wilson_interval

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
             env_changes: Sequence[str] = ("suite",),
             noise_floor: bool = False) -> dict[str, Any] | None:
    """Evaluate every arm of ``run`` (a resolved evaluation) into its folder, then write the
    combined ``results.json`` (and its plot); rank 0 returns it. ``control`` names the arm the
    others are compared with. An arm's settings are the run's with its changes
    (``settings.for_arm``); an arm whose changes touch ``env_changes`` gets its own env family,
    built with the others before anything is written (an arm that cannot run, its latency
    included, is refused before the first episode); the others run in the run's.
    ``noise_floor``: the arms are repeats of the same episodes, and results.json adds their
    test-retest agreement (:func:`agreement`).
    """
    from cosmos3_gym.eval.evaluate import Evaluator
    from cosmos3_gym.eval.latency import realtime_for

    names = [arm.name for arm in arms]
    if len(set(names)) != len(names) or control not in names:
        raise ValueError(f"arms must have distinct names and include the control {control!r}; "
                         f"found {names}")
    plan = []
    for arm in arms:
        settings = run.settings.for_arm(arm.changes).resolved()
        env = settings.make_env() if set(arm.changes) & set(env_changes) else None
        if env is not None:
            env.single_action_space()  # builds no simulator; a missing task file fails here
        realtime_for(settings, env or run.env, run.model)  # its latency (a replay's episodes)
        plan.append((arm, settings, env))
    changes = {arm.name: _plain(arm.changes) for arm in arms}
    identity = {**run.identity(weights=run.model.fingerprint()), "arms": changes,
                "control": control, "noise_floor": noise_floor}
    pipeline = run.model.pipeline
    per_arm: dict[str, dict[str, Any]] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    with run.folder() as folder:
        recorded = any((arm_folder(run.out, n) / "config.json").exists() for n in names)
        folder.bind("config.json", identity, bound=recorded,
                    extra={"session": dataclasses.asdict(run.settings)},
                    what="a different evaluation")
        for arm, settings, env in plan:
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
        from cosmos3_gym.eval.report import draw_arms

        combined = combine(per_arm, records, control=control, changes=changes,
                           noise_floor=noise_floor)
        write_json_atomic(run.out / "results.json", combined)
        draw_arms(combined, run.out / "results", label=run.out.name)
        return combined


def is_arms_folder(out: Path) -> bool:
    """Whether ``out`` holds an arms run (its identity names arms)."""
    config = Path(out) / "config.json"
    if not config.is_file():
        return False
    return "arms" in (read_json_object(config, what="run identity").get("identity") or {})


def load_arms(out: Path) -> dict[str, Any]:
    """An arms run's results document recomputed from its arms' episode logs (the source of
    truth), so a run that was interrupted, or is still going, is shown as it is: what
    ``cosmos3-gym report`` shows of an arms folder. Arms not started yet are left out."""
    from cosmos3_gym.eval.report import load_run

    identity = read_json_object(Path(out) / "config.json", what="run identity")["identity"]
    per_arm: dict[str, dict[str, Any]] = {}
    records: dict[str, list[dict[str, Any]]] = {}
    for name in identity["arms"]:
        folder = arm_folder(out, name)
        if (folder / "config.json").is_file():
            per_arm[name] = load_run(folder)
            records[name] = results_io.read_episode_records(folder)
    combined = combine(per_arm, records, control=identity["control"], changes=identity["arms"],
                       noise_floor=bool(identity.get("noise_floor")))
    if len(per_arm) < len(identity["arms"]):
        combined["complete"] = False
    return combined


def _pending(run: Run, arm: Arm, settings: Any, env: Any) -> bool:
    """Whether the arm has episodes left to run (its model must then be loaded)."""
    folder = arm_folder(run.out, arm.name)
    done = len(results_io.read_episode_records(folder)) if folder.is_dir() else 0
    family = env if env is not None else run.env
    return done < len(family.episodes(settings.trials, settings.seed))


def _plain(changes: dict[str, Any]) -> dict[str, Any]:
    return {k: dataclasses.asdict(v) if dataclasses.is_dataclass(v) else v
            for k, v in changes.items()}


def combine(per_arm: dict[str, dict[str, Any]], records: dict[str, list[dict[str, Any]]], *,
            control: str, changes: dict[str, dict[str, Any]],
            noise_floor: bool = False) -> dict[str, Any]:
    """The arms' ``results.json``: each arm's rate and interval, each task's rate in every arm
    (``per_task``, by task index), each other arm's paired difference to ``control`` (overall
    and per task; episodes pair by task index and trial), and with ``noise_floor`` the arms'
    test-retest agreement (:func:`agreement`).

    >>> rec = lambda t, k, s: {"task": f"t{t}", "task_index": t, "trial": k, "success": s}
    >>> control = [rec(0, k, True) for k in range(4)]
    >>> worse = [rec(0, k, k < 2) for k in range(4)]
    >>> out = combine({"control": {"success_rate": 1.0, "episodes": 4, "complete": True},
    ...                "worse": {"success_rate": 0.5, "episodes": 4, "complete": True}},
    ...               {"control": control, "worse": worse}, control="control",
    ...               changes={"control": {}, "worse": {"latency": "4steps"}})
    >>> out["paired"]["worse"]["difference"], out["paired"]["worse"]["pairs"]
    (-0.5, 4)
    >>> out["per_task"]["0"]["arms"]["worse"]["successes"]
    2
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
                                                 "interval", "complete", "per_task",
                                                 "latency")}}
            for name, result in per_arm.items()}
    combined = {"schema": SCHEMA, "control": control, "arms": arms, "paired": paired,
                "per_task": _per_task(keyed, control),
                "complete": all(a.get("complete") for a in per_arm.values()),
                "episodes": sum(a.get("episodes") or 0 for a in per_arm.values())}
    if noise_floor:
        combined["noise_floor"] = agreement(keyed)
    return combined


def _per_task(keyed: dict[str, dict[tuple[int, int], dict[str, Any]]],
              control: str) -> dict[str, Any]:
    """Each task's success in every arm, by task index; named by the control's task name (a
    perturbed suite names its tasks after itself)."""
    out: dict[str, Any] = {}
    names = [control, *(n for n in keyed if n != control)]
    for task in sorted({k[0] for by_key in keyed.values() for k in by_key}):
        label = next((r["task"] for n in names for k, r in sorted(keyed.get(n, {}).items())
                      if k[0] == task), str(task))
        rates = {}
        for name in names:
            outcomes = [r["success"] for k, r in keyed.get(name, {}).items()
                        if k[0] == task and r.get("success") is not None]
            wins = sum(bool(x) for x in outcomes)
            rates[name] = {"successes": wins, "episodes": len(outcomes),
                           "success_rate": wins / len(outcomes) if outcomes else None}
        out[str(task)] = {"task": label, "arms": rates}
    return out


def agreement(keyed: dict[str, dict[tuple[int, int], dict[str, Any]]]) -> dict[str, Any]:
    """Test-retest agreement of arms that repeat the same episodes (``--repeats``): the
    fraction of (task, trial) pairs whose outcome is the same in every arm, with its Wilson
    interval, and per task every arm's success rate and their spread (highest minus lowest).
    ``always`` and ``never`` count the pairs that succeeded in every arm and in none; the pairs
    that succeeded at least once (``pairs - never``) are the ones where a success reward can
    tell a better episode from a worse one (RL's reach, docs/rl.md). Only pairs every arm has
    finished, with an outcome, count.

    >>> rec = lambda t, k, s: {"task": f"t{t}", "task_index": t, "trial": k, "success": s}
    >>> floor = agreement({"repeat-0": {(0, k): rec(0, k, k == 0) for k in range(3)},
    ...                    "repeat-1": {(0, k): rec(0, k, k < 2) for k in range(3)}})
    >>> floor["agreement"], floor["pairs"], floor["per_task"]["0"]["spread"]
    (0.6666666666666666, 3, 0.3333333333333333)
    >>> floor["always"], floor["never"]
    (1, 1)
    """
    names = list(keyed)
    common = sorted(set.intersection(*(set(by_key) for by_key in keyed.values()))
                    if keyed else set())
    outcomes = {k: [keyed[n][k].get("success") for n in names] for k in common}
    outcomes = {k: v for k, v in outcomes.items() if None not in v}
    agreeing = sum(1 for v in outcomes.values() if len(set(v)) == 1)
    per_task: dict[str, Any] = {}
    for task in sorted({k[0] for k in outcomes}):
        rows = [v for k, v in outcomes.items() if k[0] == task]
        rates = [sum(bool(row[i]) for row in rows) / len(rows) for i in range(len(names))]
        per_task[str(task)] = {
            "task": keyed[names[0]][next(k for k in outcomes if k[0] == task)]["task"],
            "rates": rates, "spread": max(rates) - min(rates), "pairs": len(rows),
            "agreement": sum(1 for row in rows if len(set(row)) == 1) / len(rows)}
    n = len(outcomes)
    rates = [sum(bool(v[i]) for v in outcomes.values()) / n if n else None
             for i in range(len(names))]
    return {"repeats": names, "pairs": n, "agreeing": agreeing,
            "agreement": agreeing / n if n else None,
            "always": sum(1 for v in outcomes.values() if all(v)),
            "never": sum(1 for v in outcomes.values() if not any(v)),
            "interval": list(wilson_interval(agreeing, n)) if n else [None, None],
            "rates": rates,
            "spread": max(rates) - min(rates) if n else None,
            "per_task": per_task}


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _signed(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f}"


def _columns(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in (header, tuple("-" * w for w in widths), *rows)]


def format_arms_table(results: dict[str, Any]) -> str:
    """The arms' summary: each arm's success and interval, and its paired difference to the
    control with the difference's interval; then per task, each arm's success and its
    difference to the control; then, for repeats, the noise floor."""
    control = results["control"]
    header = ("arm", "success", "n", "95% interval", "vs " + control, "paired 95% interval",
              "pairs")
    rows = []
    for name, arm in results["arms"].items():
        lo, hi = arm.get("interval") or (None, None)
        diff = results["paired"].get(name)
        rows.append((
            name + (" (control)" if name == control else ""), _pct(arm.get("success_rate")),
            str(arm.get("episodes")), f"[{_pct(lo)}, {_pct(hi)}]",
            "" if diff is None else _signed(diff["difference"]),
            "" if diff is None else f"[{_signed(diff['interval'][0])}, "
                                    f"{_signed(diff['interval'][1])}]",
            "" if diff is None else str(diff["pairs"])))
    lines = _columns(header, rows)
    lines.append("differences in points (arm - control) on the same episodes (task, trial, init "
                 "state, seed); Newcombe's paired interval")
    per_task = results.get("per_task") or {}
    if len(per_task) > 1 or len(results["arms"]) > 1:
        names = list(results["arms"])
        task_rows = []
        for index, entry in per_task.items():
            cells = [entry["task"]]
            for name in names:
                arm = entry["arms"].get(name) or {}
                cell = ("-" if not arm.get("episodes") else
                        f"{arm['successes']}/{arm['episodes']}")
                diff = (results["paired"].get(name) or {}).get("per_task", {}).get(index)
                if diff is not None and diff.get("difference") is not None:
                    cell += f" ({_signed(diff['difference'])})"
                cells.append(cell)
            task_rows.append(cells)
        lines += ["", "per task: successes/episodes in each arm, (difference to "
                      f"{control} in points)"]
        lines += _columns(("task", *names), task_rows)
    floor = results.get("noise_floor")
    if floor is not None:
        lines += ["", format_noise_floor(floor)]
    return "\n".join(lines)


def format_noise_floor(floor: dict[str, Any]) -> str:
    """The summary's noise-floor lines: test-retest agreement over the repeats, with its
    interval, and the widest per-task spread of success between repeats."""
    k = len(floor["repeats"])
    if not floor["pairs"]:
        return f"noise floor: no (task, trial) finished in all {k} repeats yet"
    lo, hi = floor["interval"]
    lines = [f"noise floor: test-retest agreement {_pct(floor['agreement'])} "
             f"({floor['agreeing']} of {floor['pairs']} (task, trial) pairs have the same "
             f"outcome in all {k} repeats; 95% interval [{_pct(lo)}, {_pct(hi)}]); success "
             f"per repeat {', '.join(_pct(r) for r in floor['rates'])}, spread "
             f"{100 * floor['spread']:.1f} points"]
    if "never" in floor:  # results written before these counts: the line above alone
        once = floor["pairs"] - floor["never"]
        lines.append(f"decided by the episode: {floor['always']} pairs succeeded in all {k} "
                     f"repeats, {floor['never']} in none; {once} of {floor['pairs']} "
                     f"({_pct(once / floor['pairs'])}) succeeded at least once: what RL on a "
                     "success reward can lift these episodes to, without gains on the ones "
                     "never solved (docs/rl.md)")
    if floor["per_task"]:
        task, widest = max(floor["per_task"].items(), key=lambda item: item[1]["spread"])
        lines.append(f"per-task spread of success between repeats: up to "
                     f"{100 * widest['spread']:.1f} points ({widest['task']}: "
                     f"{', '.join(_pct(r) for r in widest['rates'])}); a difference smaller "
                     "than the spread is within the noise of the policy's own sampling")
    return "\n".join(lines)
