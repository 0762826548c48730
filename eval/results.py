"""Evaluation results on disk: the per-episode JSONL logs, Wilson intervals, results.json.

The JSONL logs (``episodes*.jsonl``, one line per finished episode, appended and fsynced) are
the source of truth; ``results.json`` is their summary (:func:`summarize`), kept up to date one
episode at a time from the lines appended since its last update (:class:`ResultsTally`, the same
document in constant time per episode) and replaced atomically. A partial last line left by a
crash is skipped by readers and cut off by the next writer.

The folder's files and every key: docs/evaluation.md, "What the run folder holds".
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from cosmos3_gym.jsonio import read_jsonl
from cosmos3_gym.stats import wilson_interval, wilson_interval_of_rate

EpisodeRecord = dict[str, Any]

SCHEMA_VERSION = 1


def suite_average(per_suite: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """The unweighted mean of the suites' success rates (how the published LIBERO averages are
    formed), with a 95% interval; ``None`` for fewer than two suites with episodes.

    The interval is Wilson's at the mean, over the effective count ``K^2 / sum(1/n_k)`` of K
    suites with ``n_k`` episodes each: with equal counts (a finished run) that is every episode,
    and the mean is the pooled rate, so both agree with the ``all`` row.

    >>> avg = suite_average({"a": {"successes": 9, "episodes": 10},
    ...                      "b": {"successes": 7, "episodes": 10}})
    >>> avg["success_rate"], avg["episodes"], [round(x, 4) for x in avg["interval"]]
    (0.8, 20, [0.584, 0.9193])
    """
    rates = {k: e["successes"] / e["episodes"] for k, e in per_suite.items()
             if e["episodes"] and e["successes"] is not None}
    if len(rates) < 2:
        return None
    mean = sum(rates.values()) / len(rates)
    effective = len(rates) ** 2 / sum(1 / per_suite[k]["episodes"] for k in rates)
    return {
        "success_rate": mean,
        "suites": list(rates),
        "episodes": sum(per_suite[k]["episodes"] for k in rates),
        "effective_episodes": effective,
        "interval": list(wilson_interval_of_rate(mean, effective)),
    }


def episode_log_name(rank: int, world_size: int) -> str:
    """``episodes.jsonl`` for a single process, ``episodes.rank{r}.jsonl`` under torchrun."""
    return "episodes.jsonl" if world_size == 1 else f"episodes.rank{rank}.jsonl"


def incident_log_name(rank: int, world_size: int) -> str:
    """``incidents.jsonl`` for a single process, ``incidents.rank{r}.jsonl`` under torchrun."""
    return "incidents.jsonl" if world_size == 1 else f"incidents.rank{rank}.jsonl"


def read_episode_records(out_dir: Path) -> list[EpisodeRecord]:
    """Every finished episode in ``out_dir``'s logs, one per ``(task, trial)``, sorted.

    Should two logs hold the same episode (two runs racing on one folder), the first line read
    wins; both lines came from the same deterministic episode.
    """
    seen: dict[tuple[str, int], EpisodeRecord] = {}
    for path in sorted(out_dir.glob("episodes*.jsonl")):
        for record in read_jsonl(path):
            seen.setdefault((record["task"], int(record["trial"])), record)
    return sorted(seen.values(), key=lambda r: (r["task_index"], r["trial"]))


def resumed_line(out_dir: str | Path, recorded: int, total: int) -> str:
    r"""What an evaluation says when it goes on in a folder that holds some of its episodes
    already (a rerun of an interrupted command), before it runs the others.

    >>> print(*resumed_line("runs/x", 6, 20).split("; "), sep=";\n")
    runs/x: resuming: 6 of its 20 episodes were recorded before and are not run again;
    running the other 14
    """
    return (f"{out_dir}: resuming: {recorded} of its {total} episodes were recorded before and "
            f"are not run again; running the other {total - recorded}")


def read_incidents(out_dir: Path) -> list[dict[str, Any]]:
    """Every recorded incident in ``out_dir``, in time order."""
    incidents = [i for p in sorted(out_dir.glob("incidents*.jsonl")) for i in read_jsonl(p)]
    return sorted(incidents, key=lambda i: i.get("time", 0.0))


class ExactSum:
    """A float sum kept exactly as values arrive (Shewchuk's partials, as :func:`math.fsum`
    keeps them): its value is the correctly rounded sum whatever the order of the values, so
    a total kept one episode at a time equals the one summed over the sorted log.

    >>> total = ExactSum()
    >>> for x in (0.1, 1e16, 0.2, -1e16, 0.3):
    ...     total.add(x)
    >>> total.value(), sum((0.1, 1e16, 0.2, -1e16, 0.3))
    (0.6, 0.3)
    """

    def __init__(self) -> None:
        self.partials: list[float] = []  # non-overlapping, increasing in magnitude
        self.special = 0.0  # the infinities and NaNs, summed as floats sum them

    def add(self, x: float) -> None:
        if not math.isfinite(x):
            self.special += x
            return
        i = 0
        for y in self.partials:
            if abs(x) < abs(y):
                x, y = y, x
            hi = x + y
            lo = y - (hi - x)
            if lo:
                self.partials[i] = lo
                i += 1
            x = hi
        self.partials[i:] = [x]

    def value(self) -> float:
        return self.special if self.special else math.fsum(self.partials)


def exact_sum(values: Iterable[float]) -> float:
    """The correctly rounded sum of ``values`` (:class:`ExactSum`)."""
    total = ExactSum()
    for x in values:
        total.add(x)
    return total.value()


def _rate_entry(episodes: int, successes: int, unknown: int, returns: tuple[float, int],
                lengths: tuple[float, int]) -> dict[str, Any]:
    """A group's entry from its counts and the total and count of its returns and of its
    lengths; ``unknown`` episodes have no outcome."""
    measures = {
        "mean_return": returns[0] / returns[1] if returns[1] else None,
        "mean_length": lengths[0] / lengths[1] if lengths[1] else None,
    }
    if unknown:
        return {"success_rate": None, "successes": None, "episodes": episodes,
                "interval": [None, None], **measures}
    lo, hi = wilson_interval(successes, episodes)
    return {
        "success_rate": successes / episodes if episodes else None,
        "successes": successes,
        "episodes": episodes,
        "interval": [lo, hi],
        **measures,
    }


def _rate(records: Sequence[EpisodeRecord]) -> dict[str, Any]:
    """A group's success rate with its interval, and its episodes' mean return and length.

    Episodes without an outcome (``success`` null: a run whose success rule is ``none``) give
    no rate: ``success_rate``, ``successes`` and ``interval`` are then null, never a 0%.
    """
    returns = [r["return"] for r in records if r.get("return") is not None]
    lengths = [r["steps"] for r in records if r.get("steps") is not None]
    return _rate_entry(len(records), sum(bool(r["success"]) for r in records),
                       sum(r["success"] is None for r in records),
                       (exact_sum(returns), len(returns)), (exact_sum(lengths), len(lengths)))


def summarize(
    records: Sequence[EpisodeRecord],
    *,
    config: dict[str, Any],
    task_names: Sequence[str],
    expected_episodes: int,
    incidents: Sequence[dict[str, Any]] = (),
    throughput: dict[str, Any] | None = None,
    episode_budget: dict[str, Any] | None = None,
    protocol: dict[str, Any] | None = None,
    success_source: dict[str, Any] | None = None,
    latency_model: str | None = None,
) -> dict[str, Any]:
    """The results.json document of ``records`` (:func:`read_episode_records`: one per episode,
    sorted). :class:`ResultsTally` keeps the same document one episode at a time.

    Keys: ``schema_version``; ``complete`` (every expected episode finished);
    ``episodes`` / ``episodes_expected`` / ``successes`` / ``success_rate`` / ``interval``
    (Wilson 95%, ``[low, high]``), ``mean_return`` / ``mean_length`` (the episodes' sum of
    rewards and steps) over the whole run; ``success_source`` (where success came from:
    :meth:`~cosmos3_gym.envs.success.SuccessRule.record`; null for a run before it was
    recorded); ``per_task`` and ``per_suite``: name ->
    ``{success_rate, successes, episodes, interval, mean_return, mean_length}`` (tasks in the
    run's order; the rates null where the success rule is ``none``);
    ``invalid_action_episodes`` (episodes failed on an action that was not sent: non-finite,
    or out of range under ``out_of_range="fail"``);
    ``out_of_range_episodes`` (episodes with at least one action outside the action space);
    ``clipped_episodes`` (episodes with an action the box map clipped into the bounds);
    ``restarted_episodes``; ``incidents`` (list); ``throughput`` (or null); ``imagined``
    (:func:`imagined_summary`, or null without imagined videos);
    ``episode_budget`` (the env's step-budget convention: ``step_budget``, ``settle_steps``,
    ``max_episode_steps`` per suite; or null); ``latency`` (:func:`latency_summary` with
    ``latency_model``, the latency model in one line, and what its delays did; null without
    ``latency_model``: a run before it was recorded); ``config``.
    """
    by_task = {name: [r for r in records if r["task"] == name] for name in task_names}
    suites: dict[str, list[EpisodeRecord]] = {}
    for r in records:
        suites.setdefault(r["suite"], []).append(r)
    flagged = {name: sum(flag(r) for r in records) for name, flag in FLAGGED.items()}
    return _document(
        _rate(records), {name: _rate(rs) for name, rs in by_task.items()},
        {name: _rate(rs) for name, rs in suites.items()}, flagged, imagined_summary(records),
        config=config, expected_episodes=expected_episodes, incidents=incidents,
        throughput=throughput, episode_budget=episode_budget, protocol=protocol,
        success_source=success_source,
        latency=None if latency_model is None else latency_summary(records, latency_model))


# The episodes results.json counts by what happened in them, and how a record says it.
FLAGGED: dict[str, Callable[[EpisodeRecord], bool]] = {
    "invalid_action_episodes": lambda r: r["invalid_action"] is not None,
    "out_of_range_episodes": lambda r: r["out_of_range_steps"] > 0,
    "clipped_episodes": lambda r: r.get("clipped_steps", 0) > 0,
    "restarted_episodes": lambda r: r["restarts"] > 0,
}


def _document(overall: dict[str, Any], per_task: dict[str, Any], per_suite: dict[str, Any],
              flagged: dict[str, int], imagined: dict[str, Any] | None, *,
              config: dict[str, Any], expected_episodes: int,
              incidents: Sequence[dict[str, Any]], throughput: dict[str, Any] | None,
              episode_budget: dict[str, Any] | None, protocol: dict[str, Any] | None,
              success_source: dict[str, Any] | None,
              latency: dict[str, Any] | None) -> dict[str, Any]:
    """The results.json document from its parts (:func:`summarize` has its keys)."""
    return {
        "schema_version": SCHEMA_VERSION,
        "complete": overall["episodes"] == expected_episodes,
        "episodes_expected": expected_episodes,
        "success_source": success_source,
        **overall,
        "per_task": per_task,
        "per_suite": per_suite,
        "suite_average": suite_average(per_suite),
        **flagged,
        "incidents": list(incidents),
        "throughput": throughput,
        "imagined": imagined,
        "episode_budget": episode_budget,
        "protocol": protocol,
        "latency": latency,
        "config": config,
    }


def latency_summary(records: Sequence[EpisodeRecord], model: str) -> dict[str, Any]:
    """results.json's ``latency``: the model in one line (``model``), and over the episodes'
    chunks (their ``chunk_timing``, under real-time execution) the delays applied and the
    calls' wall times, the actions dropped, the chunks RTC conditioned, and the stalls
    (:class:`ResultsTally` keeps the same one episode at a time).

    >>> rec = {"stalls": 2, "chunk_timing": [
    ...     {"delay": 3, "latency_s": 0.2, "dropped": 0, "committed": 0},
    ...     {"delay": 3, "latency_s": 0.4, "dropped": 3, "committed": 3}]}
    >>> out = latency_summary([rec, {"stalls": 0, "chunk_timing": []}], "a model")
    >>> out["stalls"], out["stalled_episodes"], out["delay_steps"], out["rtc_chunks"]
    (2, 1, {'mean': 3.0, 'max': 3}, 1)
    """
    tally = _LatencyTally()
    for record in records:
        tally.add(record)
    return tally.summary(model)


class _LatencyTally:
    """:func:`latency_summary`'s totals kept one record at a time (the wall times' sum exact,
    so the mean is the same in any order)."""

    def __init__(self) -> None:
        self.stalls = self.stalled_episodes = self.chunks = 0
        self.delays = self.dropped = self.rtc_chunks = 0
        self.max_delay = 0
        self.walls = ExactSum()
        self.max_wall = 0.0

    def add(self, record: EpisodeRecord) -> None:
        stalls = int(record.get("stalls") or 0)
        self.stalls += stalls
        self.stalled_episodes += stalls > 0
        for c in record.get("chunk_timing") or []:
            delay, wall = int(c["delay"]), float(c["latency_s"])
            self.max_delay = delay if not self.chunks else max(self.max_delay, delay)
            self.max_wall = wall if not self.chunks else max(self.max_wall, wall)
            self.chunks += 1
            self.delays += delay
            self.walls.add(wall)
            self.dropped += int(c["dropped"])
            self.rtc_chunks += int(c["committed"]) > 0

    def summary(self, model: str) -> dict[str, Any]:
        out: dict[str, Any] = {"model": model, "stalls": self.stalls,
                               "stalled_episodes": self.stalled_episodes, "chunks": self.chunks}
        if self.chunks:
            out.update(delay_steps={"mean": self.delays / self.chunks, "max": self.max_delay},
                       latency_s={"mean": self.walls.value() / self.chunks,
                                  "max": self.max_wall},
                       dropped_actions=self.dropped, rtc_chunks=self.rtc_chunks)
        return out


def format_latency(latency: dict[str, Any], episodes: int) -> list[str]:
    """The summary's lines on the latency model and what its delays did."""
    lines = [f"latency: {latency['model']}"]
    if latency.get("chunks"):
        d, wall = latency["delay_steps"], latency["latency_s"]
        rtc = f"; {latency['rtc_chunks']} started from committed actions (RTC)" \
            if latency["rtc_chunks"] else ""
        lines.append(f"  {latency['chunks']} chunks: delay {d['mean']:.2f} steps on average "
                     f"(max {d['max']}), calls {1000 * wall['mean']:.0f} ms on average; "
                     f"{latency['dropped_actions']} actions dropped{rtc}; "
                     f"{latency['stalls']} stalled steps in {latency['stalled_episodes']} of "
                     f"{episodes} episodes")
    return lines


def imagined_summary(records: Sequence[EpisodeRecord]) -> dict[str, Any] | None:
    """The imagined videos' predicted frames against the env's, over every episode that has
    them (``imagined`` in its record): PSNR in dB (peak 255) of the mean squared error over all
    compared frames, per comparison of :func:`cosmos3_gym.eval.videos.imagined_errors`."""
    parts = [r["imagined"] for r in records if r.get("imagined")]
    if not parts:
        return None

    def pooled(blocks: list[dict[str, Any]]) -> tuple[int, dict[str, float]]:
        return sum(b["frames"] for b in blocks), {
            name: exact_sum(b["mse"][name] * b["frames"] for b in blocks if b["frames"])
            for name in blocks[0]["mse"]}

    return _imagined_entry(
        len(parts), {p["shift"] for p in parts}, sum(p["chunks"] for p in parts),
        exact_sum(p["reconstruction_mse"] * p["chunks"] for p in parts),
        {kind: pooled([p[kind] for p in parts] if kind else parts) for kind in IMAGINED})


# The comparisons of an imagined record: its own (the predicted frame against the env's frame
# at its step), then against the env's frame ``shift`` steps earlier and later.
IMAGINED = ("", "earlier", "later")


def _imagined_entry(episodes: int, shifts: set[int], chunks: int, reconstruction: float,
                    pooled: dict[str, tuple[int, dict[str, float]]]) -> dict[str, Any]:
    """``results.json``'s ``imagined`` from its totals: ``pooled`` holds, per comparison of
    :data:`IMAGINED`, the frames compared and each measure's total of ``mse * frames``."""
    if len(shifts) != 1:
        raise ValueError(f"imagined records compare frames at different shifts: "
                         f"{sorted(shifts)}")

    def psnr(frames: int, totals: dict[str, float]) -> dict[str, Any]:
        return {"frames": frames, "psnr_db": {name: _psnr(total / frames) if frames else None
                                              for name, total in totals.items()}}

    summary = {"episodes": episodes, "shift": next(iter(shifts)), **psnr(*pooled[""]),
               "chunks": chunks, "reconstruction_psnr_db": _psnr(reconstruction / chunks)}
    for kind in IMAGINED[1:]:
        summary[kind] = psnr(*pooled[kind])
    return summary


class _Group:
    """One row of results.json (a task, a suite, the run) kept one episode at a time."""

    def __init__(self) -> None:
        self.episodes = self.successes = self.unknown = 0
        self.returns, self.lengths = ExactSum(), ExactSum()
        self.counted_returns = self.counted_lengths = 0

    def add(self, record: EpisodeRecord) -> None:
        self.episodes += 1
        self.successes += bool(record["success"])
        self.unknown += record["success"] is None
        if record.get("return") is not None:
            self.returns.add(record["return"])
            self.counted_returns += 1
        if record.get("steps") is not None:
            self.lengths.add(record["steps"])
            self.counted_lengths += 1

    def entry(self) -> dict[str, Any]:
        return _rate_entry(self.episodes, self.successes, self.unknown,
                           (self.returns.value(), self.counted_returns),
                           (self.lengths.value(), self.counted_lengths))


class ResultsTally:
    """The results.json document kept one episode at a time: each record is taken in constant
    time, and :meth:`results` gives what :func:`summarize` gives over
    :func:`read_episode_records` of the same records, whatever order they came in.

    It takes records one by one (:meth:`add`) or follows a run folder's logs (:meth:`follow`:
    the complete lines appended since its last read, from every process's log; a log that was
    replaced or cut is read again from the start). Of two records of one episode the first
    taken counts (:func:`read_episode_records` keeps the first by file name: the same record
    where two runs raced on one folder, since an episode is deterministic).

    >>> tally = ResultsTally(["red"], expected_episodes=2)
    >>> tally.add({"task": "red", "task_index": 0, "suite": "s", "trial": 0, "success": True,
    ...            "return": 1.0, "steps": 5, "invalid_action": None, "out_of_range_steps": 0,
    ...            "restarts": 0})
    True
    >>> doc = tally.results(config={})
    >>> doc["episodes"], doc["success_rate"], doc["complete"]
    (1, 1.0, False)
    """

    def __init__(self, task_names: Sequence[str], expected_episodes: int) -> None:
        self.task_names = list(task_names)
        self.expected_episodes = expected_episodes
        self._clear()

    def _clear(self) -> None:
        self.seen: set[tuple[str, int]] = set()
        self.run = _Group()
        self.tasks = {name: _Group() for name in self.task_names}
        self.suites: dict[str, _Group] = {}
        self.suite_first: dict[str, tuple[Any, Any]] = {}  # its first episode's sort key
        self.flagged = dict.fromkeys(FLAGGED, 0)
        self.imagined: _ImaginedTally | None = None
        self.latency = _LatencyTally()
        self.read_to: dict[Path, tuple[int, int, int]] = {}  # log -> (inode, offset, lines)

    def add(self, record: EpisodeRecord) -> bool:
        """Count ``record``; False (and nothing counted) for an episode already counted."""
        key = (record["task"], int(record["trial"]))
        if key in self.seen:
            return False
        self.seen.add(key)
        order = (record["task_index"], record["trial"])
        self.run.add(record)
        if record["task"] in self.tasks:
            self.tasks[record["task"]].add(record)
        suite = record["suite"]
        self.suites.setdefault(suite, _Group()).add(record)
        if suite not in self.suite_first or order < self.suite_first[suite]:
            self.suite_first[suite] = order
        for name, flag in FLAGGED.items():
            self.flagged[name] += flag(record)
        self.latency.add(record)
        if record.get("imagined"):
            self.imagined = self.imagined or _ImaginedTally()
            self.imagined.add(record["imagined"], order)
        return True

    def follow(self, out_dir: Path) -> None:
        """Take the records appended to ``out_dir``'s episode logs since the last call; a
        partial last line (an append under way, or cut by a crash) waits for its end."""
        for path in sorted(Path(out_dir).glob("episodes*.jsonl")):
            with path.open("rb") as f:
                stat = os.fstat(f.fileno())
                inode, offset, lines = self.read_to.get(path, (stat.st_ino, 0, 0))
                if inode != stat.st_ino or stat.st_size < offset:  # replaced or cut
                    self._clear()
                    return self.follow(out_dir)
                f.seek(offset)
                data = f.read(stat.st_size - offset)
            complete = data[:data.rfind(b"\n") + 1].split(b"\n")[:-1]
            for number, line in enumerate(complete, start=lines + 1):
                if line.strip():
                    self.add(_record(line, path, number))
            self.read_to[path] = (inode, offset + sum(len(line) + 1 for line in complete),
                                  lines + len(complete))
        return None

    def results(self, *, config: dict[str, Any], incidents: Sequence[dict[str, Any]] = (),
                throughput: dict[str, Any] | None = None,
                episode_budget: dict[str, Any] | None = None,
                protocol: dict[str, Any] | None = None,
                success_source: dict[str, Any] | None = None,
                latency_model: str | None = None) -> dict[str, Any]:
        """The results.json document (:func:`summarize`'s keys and values)."""
        suites = sorted(self.suites, key=self.suite_first.__getitem__)
        return _document(
            self.run.entry(), {name: g.entry() for name, g in self.tasks.items()},
            {name: self.suites[name].entry() for name in suites}, dict(self.flagged),
            self.imagined.summary() if self.imagined else None,
            config=config, expected_episodes=self.expected_episodes, incidents=incidents,
            throughput=throughput, episode_budget=episode_budget, protocol=protocol,
            success_source=success_source,
            latency=None if latency_model is None else self.latency.summary(latency_model))


def _record(line: bytes, path: Path, number: int) -> EpisodeRecord:
    try:
        return json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise ValueError(f"{path}:{number} is not valid JSON; expected one record per "
                         "line") from None


class _ImaginedTally:
    """:func:`imagined_summary`'s totals kept one record at a time."""

    def __init__(self) -> None:
        self.episodes = self.chunks = 0
        self.shifts: set[int] = set()
        self.reconstruction = ExactSum()
        self.frames = dict.fromkeys(IMAGINED, 0)
        self.totals: dict[str, dict[str, ExactSum]] = {kind: {} for kind in IMAGINED}
        self.first: tuple[Any, dict[str, list[str]]] | None = None  # the first record's names

    def add(self, part: dict[str, Any], order: tuple[Any, Any]) -> None:
        self.episodes += 1
        self.shifts.add(part["shift"])
        self.chunks += part["chunks"]
        self.reconstruction.add(part["reconstruction_mse"] * part["chunks"])
        for kind in IMAGINED:
            block = part[kind] if kind else part
            self.frames[kind] += block["frames"]
            if block["frames"]:
                for name, mse in block["mse"].items():
                    self.totals[kind].setdefault(name, ExactSum()).add(mse * block["frames"])
        if self.first is None or order < self.first[0]:
            self.first = (order, {kind: list((part[kind] if kind else part)["mse"])
                                  for kind in IMAGINED})

    def summary(self) -> dict[str, Any]:
        assert self.first is not None  # made by its first add
        pooled = {kind: (self.frames[kind], {
            name: self.totals[kind][name].value() if name in self.totals[kind] else 0.0
            for name in self.first[1][kind]}) for kind in IMAGINED}
        return _imagined_entry(self.episodes, self.shifts, self.chunks,
                               self.reconstruction.value(), pooled)


def _psnr(mse: float) -> float:
    return math.inf if mse <= 0 else 10.0 * math.log10(255.0**2 / mse)


def format_imagined(summary: dict[str, Any]) -> list[str]:
    """Three lines on the imagined frames (:func:`imagined_summary`)."""
    db, shift = summary["psnr_db"], summary["shift"]
    earlier, later = summary["earlier"], summary["later"]

    def off(block: dict[str, Any]) -> str:
        return "-" if not block["frames"] else (
            f"{block['psnr_db']['shifted']:.1f} dB (the predicted frame against its own step's "
            f"env frame there: {block['psnr_db']['predicted']:.1f})"
        )

    return [
        f"imagined frames: the model's frame 0 against the observation it decodes: PSNR "
        f"{summary['reconstruction_psnr_db']:.1f} dB over {summary['chunks']} chunks",
        f"imagined frames: {summary['frames']} predicted frames over {summary['episodes']} "
        f"episodes against the env's frame at their step: PSNR {db['predicted']:.1f} dB; the "
        f"observed frame copied {db['copy_observed']:.1f} dB, the model's reconstruction of it "
        f"copied {db['copy_reconstruction']:.1f} dB",
        f"imagined frames against the env's frame {shift} steps earlier: {off(earlier)}; "
        f"{shift} steps later: {off(later)}",
    ]


def format_table(results: dict[str, Any]) -> str:
    """A short plain-text table: one row per task, one per suite, then the throughput and any
    episodes with out-of-range or invalid actions, and incidents."""
    rows = [("task", "success", "n", "95% interval")]

    def row(name: str, entry: dict[str, Any]) -> tuple[str, str, str, str]:
        rate = entry["success_rate"]
        lo, hi = entry["interval"]
        shown = "-" if rate is None else f"{rate:.1%}"
        interval = "-" if lo is None else f"[{lo:.1%}, {hi:.1%}]"
        return name, shown, str(entry["episodes"]), interval

    rows += [row(name, e) for name, e in results["per_task"].items()]
    rows += [row(f"suite {name}", e) for name, e in results["per_suite"].items()]
    average = results.get("suite_average")
    if average:
        rows.append(row(f"average of {len(average['suites'])} suites", average))
    rows.append(row("all", results))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += format_outcomes(results)
    budget = results.get("episode_budget")
    if budget:
        name = f" {budget['step_budget']}" if budget["step_budget"] else ""
        steps = ", ".join(f"{suite} {n}" for suite, n in budget["max_episode_steps"].items())
        settle = f" after {budget['settle_steps']} settle steps" if budget["settle_steps"] else ""
        lines.append(f"step budget{name}: {steps} policy steps per episode{settle}")
    simulation = (results.get("config") or {}).get("simulation")
    if simulation:
        lines.append(f"simulation: {simulation['sim_backend']} on "
                     + ("ManiSkill3's own vector env" if simulation["vector_env"] == "maniskill"
                        else "one env per sub-env"))
    protocol = results.get("protocol")
    if protocol:
        from cosmos3_gym.eval.protocol import describe

        lines += describe(protocol)
    if results.get("latency"):
        lines += format_latency(results["latency"], results["episodes"])
    t = results.get("throughput")
    if t:
        lines.append(
            f"throughput: {t['episodes_per_s']:.3f} episodes/s, {t['steps_per_s']:.1f} steps/s, "
            f"{t['chunks_per_s']:.2f} chunks/s over {t['wall_s']:.1f} s"
        )
        lines += format_runtime(t)
    if results.get("imagined"):
        lines += format_imagined(results["imagined"])
    n = results["episodes"]
    if results["out_of_range_episodes"]:
        lines.append(f"out-of-range actions: {results['out_of_range_episodes']} of {n} episodes "
                     "sent an action outside the action space (see out_of_range_steps in "
                     "episodes.jsonl)")
    if results.get("clipped_episodes"):
        lines.append(f"clipped actions: {results['clipped_episodes']} of {n} episodes had actions "
                     "outside the env's bounds that the box map clipped onto them (see "
                     "clipped_steps and max_clip in episodes.jsonl)")
    if results["invalid_action_episodes"]:
        lines.append(f"invalid actions: {results['invalid_action_episodes']} of {n} episodes "
                     "failed on an invalid action (see invalid_action in episodes.jsonl)")
    if results["incidents"]:
        lines += format_incidents(results["incidents"])
    return "\n".join(lines)


def format_outcomes(results: dict[str, Any]) -> list[str]:
    """The summary's lines on what the rates count (the success source) and the episodes'
    returns and lengths, per task where a run has no rate."""
    source = results.get("success_source")
    lines = [f"success: {source['description']}" if source else
             "success: its source was not recorded (a run from before success sources)"]
    if results.get("mean_return") is not None:
        lines.append(f"return: mean {results['mean_return']:.4g} over {results['episodes']} "
                     f"episodes, mean length {results['mean_length']:.1f} steps")
    if results.get("success_rate") is None and results.get("episodes"):
        lines += [f"  {name}: mean return {e['mean_return']:.4g}, mean length "
                  f"{e['mean_length']:.1f} steps" for name, e in results["per_task"].items()
                  if e.get("mean_return") is not None]
    return lines


def format_incidents(incidents: Sequence[dict[str, Any]], most: int = 5) -> list[str]:
    """The env faults of a run, each kind once: how often, at which env slot and episode, and
    what the env did (the detail names the observation key or call that failed).

    >>> fault = {"kind": "crash", "detail": "observation['pixels'] has shape [8, 16, 3]",
    ...          "env_slots_at_fault": [0], "episodes": [
    ...              {"env_slot": 0, "at_fault": True, "task": "red", "trial": 0},
    ...              {"env_slot": 1, "at_fault": False, "task": "red", "trial": 1}]}
    >>> for line in format_incidents([fault, fault]):
    ...     print(line)
    incidents: 2 env faults (incidents.jsonl has each):
      2x crash of env slot 0, episode red trial 0: observation['pixels'] has shape [8, 16, 3]
    """
    groups: dict[tuple[Any, ...], int] = {}
    for incident in incidents:
        key = (incident.get("kind"), incident.get("detail"), _culprits(incident))
        groups[key] = groups.get(key, 0) + 1
    n = len(incidents)
    lines = [f"incidents: {n} env fault{'' if n == 1 else 's'} (incidents.jsonl has each):"]
    for (kind, detail, culprits), count in list(groups.items())[:most]:
        lines.append(f"  {count}x {kind} of {culprits}: {detail}")
    if len(groups) > most:
        lines.append(f"  ... and {len(groups) - most} other kinds")
    return lines


def _culprits(incident: dict[str, Any]) -> str:
    """Which env slots and episodes an incident was pinned on, in words."""
    slots = incident.get("env_slots_at_fault")
    episodes = [e for e in incident.get("episodes", []) if e.get("at_fault")]
    named = ", ".join(f"episode {e.get('task')} trial {e.get('trial')}" for e in episodes)
    if slots is None:
        return "an env slot not known" + (f" (in flight: {named})" if named else "")
    where = f"env slot{'' if len(slots) == 1 else 's'} {', '.join(map(str, slots))}"
    return f"{where}, {named}" if named else f"{where} (no episode running)"


def merge_throughput(parts: Iterable[dict[str, Any]]) -> dict[str, Any] | None:
    """Sum the counts of several processes' sessions; rates over the slowest process's wall.

    The time split (``pipeline_s``: pipeline calls, ``env_s``: env builds, resets and steps,
    ``other_s``: the rest of the loop) is summed over processes, and ``loop_overhead`` is what
    everything around the pipeline adds to its call time: ``(wall - pipeline) / pipeline``.
    ``devices`` / ``dtypes`` / ``gpus`` list what the processes ran on; ``options`` are the
    first process's (a launch shares its settings), ``disabled_options`` any process's.
    """
    parts = list(parts)
    if not parts:
        return None
    wall = max(p["wall_s"] for p in parts)
    totals = {k: sum(p[k] for p in parts) for k in ("episodes", "env_steps", "chunks")}
    rate = (lambda n: n / wall) if wall > 0 else (lambda n: 0.0)
    merged = {
        **totals,
        "wall_s": wall,
        "processes": len(parts),
        "episodes_per_s": rate(totals["episodes"]),
        "episodes_per_hour": 3600 * rate(totals["episodes"]),
        "steps_per_s": rate(totals["env_steps"]),
        "chunks_per_s": rate(totals["chunks"]),
    }
    if all("pipeline_s" in p for p in parts):  # sessions before the split have none
        walls = sum(p["wall_s"] for p in parts)
        pipeline = sum(p["pipeline_s"] for p in parts)
        env = sum(p["env_s"] for p in parts)
        merged.update(
            pipeline_s=pipeline, env_s=env, other_s=max(walls - pipeline - env, 0.0),
            loop_overhead=(walls - pipeline) / pipeline if pipeline > 0 else None,
        )
    for key, out in (("device", "devices"), ("dtype", "dtypes"), ("gpu", "gpus")):
        merged[out] = sorted({p[key] for p in parts if p.get(key)})
    merged["synthetic"] = parts[0].get("synthetic")
    merged["overlap"] = parts[0].get("overlap")
    merged["options"] = parts[0].get("options")
    merged["disabled_options"] = {k: v for p in parts
                                  for k, v in (p.get("disabled_options") or {}).items()}
    return merged


def format_runtime(t: dict[str, Any]) -> list[str]:
    """The summary's lines on where the model ran and where the time went (throughput keys of
    :func:`merge_throughput`; lines whose keys an older run lacks are left out)."""
    lines = []
    if t.get("synthetic"):
        lines.append(f"model: synthetic {t['synthetic']} (random weights): success rates are "
                     "meaningless, the timings are the real model's")
    if t.get("devices"):
        gpus = f" ({', '.join(t['gpus'])})" if t.get("gpus") else ""
        on = [k for k in ("cuda_graphs", "triton_kernels", "prompt_cache")
              if (t.get("options") or {}).get(k)]
        lines.append(f"ran on {', '.join(t['devices'])}{gpus} in {', '.join(t['dtypes'])}"
                     + (f" with {', '.join(on)}" if on else ""))
    for name, error in (t.get("disabled_options") or {}).items():
        lines.append(f"switched off on this device: {name} ({error})")
    if t.get("pipeline_s") is not None:
        lines.append(format_time(t))
    return lines


def format_time(t: dict[str, Any]) -> str:
    """Where a run's time went, summed over processes: the model (pipeline calls), the env
    (builds, resets, steps: simulation and rendering) and the loop's own bookkeeping (the rest
    of the wall time), with the loop's share of the three. Under ``--overlap`` the model's and
    the env's times overlap, and the loop's is what their sum leaves of the wall time, if any.

    >>> print(format_time({"pipeline_s": 1.2, "env_s": 40.3, "other_s": 0.4,
    ...                    "episodes_per_hour": 85.7}))
    time: model 1.2 s, env 40.3 s, loop 0.4 s (1.0% of the run); 86 episodes/hour
    """
    total = t["pipeline_s"] + t["env_s"] + t["other_s"]
    share = f" ({100 * t['other_s'] / total:.1f}% of the run)" if total > 0 else ""
    return (f"time: model {t['pipeline_s']:.1f} s, env {t['env_s']:.1f} s, loop "
            f"{t['other_s']:.1f} s{share}; {t['episodes_per_hour']:.0f} episodes/hour")
