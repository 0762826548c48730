"""One evaluation as separate jobs: ``eval --shard I/N`` runs a share of the run's episodes into
its own folder, and ``cosmos3-gym merge`` joins the shards' folders into the folder one run
would have written.

**Which episodes a shard runs.** The run's episodes are ``k = task_index * trials + trial``
(:class:`~cosmos3_gym.envs.EpisodeSet`); an episode is a function of the run's seed and its
``(task, trial)`` whichever process runs it, so a shard records exactly the lines a single run
records for the same episodes. :func:`shard_episodes` deals them out: each task's trials in an
order shuffled from the run's seed, dealt round-robin with one counter over the whole run, so
every shard gets ``floor`` or ``ceil`` of ``trials / N`` of each task and of the run's total,
and no shard gets the same trial numbers of every task (under ``--protocol official`` trial
``t`` starts from LIBERO init state ``t``). vla-eval shards its (task, episode) list the same
way in spirit: a shuffle from a fixed seed (42), then every N-th item of the whole list, so a
task's episodes spread over the shards only on average; dealing each task's trials in turn
makes the spread exact.

**What merge checks** before it writes anything (one error line each, nothing changed): every
folder is a finished evaluation shard (``config.json`` with a ``shard``, every episode of its
share recorded, no other); they are one run (identities equal but for the shard index: the same
checkpoint and weights, env, protocol, seed, trials, sampler, precision); the same ``N``; every
index once. The merged folder holds the single run's identity (``shard`` null),
``episodes.jsonl`` in the run's order, the shards' incidents, timings and videos, then
``results.json`` and the plot: ``cosmos3-gym eval`` with the same settings finds it complete,
and ``report`` reads it like any other. Arms folders (:mod:`~cosmos3_gym.eval.arms`) are not
merged: merge each arm's shards.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosmos3_gym.eval import results as results_io
from cosmos3_gym.jsonio import atomic_write, read_json_object, read_jsonl, write_json_atomic
from cosmos3_gym.runner.folder import RunFolder, identity_differences

# Keeps the shard shuffle's stream apart from every other use of the run's seed.
_SHARD_STREAM = 0x5EED_5A4D


def parse_shard(text: str) -> tuple[int, int]:
    """``(I, N)`` of ``"I/N"`` (a value :func:`~cosmos3_gym.settings.shard_spec` wrote)."""
    index, _, count = text.partition("/")
    return int(index), int(count)


def shard_episodes(num_tasks: int, trials: int, seed: int, index: int, count: int) -> list[int]:
    """The run's episodes (``k = task_index * trials + trial``) that shard ``index`` of
    ``count`` runs, in the run's order (the module notes say how they are dealt).

    >>> shares = [shard_episodes(3, 5, 0, i, 2) for i in range(2)]
    >>> sorted(shares[0] + shares[1]) == list(range(15))  # every episode once
    True
    >>> [[sum(k // 5 == task for k in share) for task in range(3)] for share in shares]
    [[3, 2, 3], [2, 3, 2]]
    """
    rng = np.random.default_rng([int(seed), _SHARD_STREAM])
    dealt, position = [], 0
    for task in range(num_tasks):
        for trial in rng.permutation(trials).tolist():
            if position % count == index:
                dealt.append(task * trials + trial)
            position += 1
    return sorted(dealt)


def check_shard(shard: str | None, num_tasks: int, trials: int) -> None:
    """Refuse a shard count larger than the run's episodes (a shard would run none)."""
    if shard is None:
        return
    count = parse_shard(shard)[1]
    total = num_tasks * trials
    if count > total:
        raise ValueError(f"--shard {shard}: the run has {total} episodes ({num_tasks} "
                         f"task{'s' if num_tasks != 1 else ''}, {trials} "
                         f"trial{'s' if trials != 1 else ''} each); expected at most {total} "
                         "shards")


# ---------------------------------------------------------------------- merge


class MergeRefused(ValueError):
    """The folders given to merge are not the finished shards of one run."""


@dataclass(frozen=True)
class ShardFolder:
    """One shard's folder as merge reads it."""

    path: Path
    identity: dict[str, Any]
    session: dict[str, Any]
    index: int
    count: int
    results: dict[str, Any] | None
    records: list[dict[str, Any]]

    @property
    def name(self) -> str:
        return f"{self.index}/{self.count}"


def read_shard(path: Path) -> ShardFolder:
    """``path`` as an evaluation shard's folder, or :class:`MergeRefused` saying what it is."""
    if not (path / "config.json").is_file():
        raise MergeRefused(f"{path}: no evaluation here (no config.json); merge takes the "
                           "folders of `cosmos3-gym eval --shard I/N` runs")
    RunFolder(path, kind="evaluation").check_free()  # another kind, or still running
    stored = read_json_object(path / "config.json", what="run identity file")
    identity = stored.get("identity", {})
    if "arms" in identity:
        raise MergeRefused(f"{path} holds the arms of an evaluation (arms/); merge joins the "
                           "shards of one evaluation: merge each arm's shard folders")
    shard = identity.get("shard")
    if shard is None:
        raise MergeRefused(f"{path} is an evaluation of the whole run, not a shard (its "
                           "config.json has no shard); merge joins `eval --shard I/N` folders")
    index, count = parse_shard(shard)
    results = None
    if (path / "results.json").is_file():
        results = read_json_object(path / "results.json", what="results file")
    return ShardFolder(path, identity, stored.get("session", {}), index, count, results,
                       results_io.read_episode_records(path))


def check_shards(shards: Sequence[ShardFolder]) -> tuple[list[str], int]:
    """Refuse shards that are not every finished shard of one run, once each (one
    :class:`MergeRefused` line, naming the folders); return the run's task names and trials."""
    first = shards[0]
    seen: dict[Path, Path] = {}
    for shard in shards:
        real = shard.path.resolve()
        if real in seen:
            raise MergeRefused(f"{shard.path} is given twice (as {seen[real]} too)")
        seen[real] = shard.path
    for shard in shards[1:]:
        if shard.count != first.count:
            raise MergeRefused(f"{shard.path} is shard {shard.name} and {first.path} shard "
                               f"{first.name}: shards of one run have the same count N")
        differences = identity_differences({**first.identity, "shard": None},
                                           {**shard.identity, "shard": None})
        if differences:
            shown = {k: {str(first.path): v["stored"], str(shard.path): v["this run"]}
                     for k, v in differences.items()}
            raise MergeRefused(f"{shard.path} is not a shard of the same run as {first.path}; "
                               f"they differ in {shown}")
    by_index: dict[int, ShardFolder] = {}
    for shard in shards:
        if shard.index in by_index:
            raise MergeRefused(f"shard {shard.name} is given twice: {by_index[shard.index].path} "
                               f"and {shard.path}")
        by_index[shard.index] = shard
    missing = [f"{i}/{first.count}" for i in range(first.count) if i not in by_index]
    if missing:
        raise MergeRefused(f"shard{'s' if len(missing) > 1 else ''} {', '.join(missing)} "
                           f"missing: the run is {first.count} shards, each given once")
    trials = int(first.identity["trials"])
    seed = int(first.identity["seed"])
    for shard in shards:
        if shard.results is None:
            raise MergeRefused(f"{shard.path} (shard {shard.name}) is unfinished: no episode "
                               "recorded yet; rerun its command to finish it")
    tasks = list(first.results["per_task"])  # type: ignore[index]
    for shard in shards:
        share = set(shard_episodes(len(tasks), trials, seed, shard.index, shard.count))
        held = {int(r["task_index"]) * trials + int(r["trial"]) for r in shard.records}
        foreign = sorted(held - share)
        if foreign:
            task, trial = divmod(foreign[0], trials)
            raise MergeRefused(f"{shard.path} (shard {shard.name}) holds {len(foreign)} "
                               f"episodes of other shards (first: {tasks[task]!r} trial "
                               f"{trial}): their folders overlap; merge takes each shard's "
                               "own folder")
        if held != share:
            raise MergeRefused(f"{shard.path} (shard {shard.name}) is unfinished: {len(held)} "
                               f"of its {len(share)} episodes recorded; rerun its command to "
                               "finish it")
    return tasks, trials


def merge_shards(paths: Sequence[str | Path], out: str | Path) -> dict[str, Any]:
    """Join the finished shards of one evaluation into ``out``, the folder one run would have
    written (the module notes); returns its ``results.json`` document. Nothing is written
    unless every check passes."""
    from cosmos3_gym.eval.report import ResultsPlot

    if not paths:
        raise MergeRefused("give the shard folders to merge")
    out = Path(out)
    for path in paths:
        if Path(path).resolve() == out.resolve():
            raise MergeRefused(f"--out {out} is one of the shards; merge writes a new folder")
    RunFolder(out, kind="evaluation").check_free()  # another kind's folder: before any shard
    shards = sorted((read_shard(Path(p)) for p in paths), key=lambda s: s.index)
    tasks, trials = check_shards(shards)
    records = sorted((r for s in shards for r in s.records),
                     key=lambda r: (int(r["task_index"]), int(r["trial"])))
    first = shards[0]
    identity = {**first.identity, "shard": None}
    session = {**first.session, "shard": None}
    with RunFolder(out, kind="evaluation") as folder:
        held = results_io.read_episode_records(out)
        if held and _lines(held) != _lines(records):
            raise MergeRefused(f"--out {out} holds {len(held)} episodes that are not these "
                               "shards' merge; give merge a new folder")
        folder.bind("config.json", identity, bound=bool(held), extra={"session": session},
                    what="a different evaluation")
        _copy_side_files(shards, out)
        atomic_write(out / "episodes.jsonl", lambda f: f.write(_lines(records).encode()))
        results = first.results or {}
        throughput = results_io.merge_throughput(
            read_json_object(p, what="throughput file")
            for p in sorted(out.glob("throughput*.json")))
        merged = results_io.summarize(
            records, config={**results["config"], "shard": None}, task_names=tasks,
            expected_episodes=len(tasks) * trials, incidents=results_io.read_incidents(out),
            throughput=throughput, episode_budget=results.get("episode_budget"),
            protocol=results.get("protocol"), success_source=results.get("success_source"),
            latency_model=(results.get("latency") or {}).get("model"))
        write_json_atomic(out / "results.json", merged)
        ResultsPlot(out).update(merged, final=True)
    return merged


def _lines(records: Sequence[dict[str, Any]]) -> str:
    return "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)


def _copy_side_files(shards: Sequence[ShardFolder], out: Path) -> None:
    """Each shard's incidents and timings under a name that keeps the shard
    (``incidents.shard0of2.jsonl``, ``throughput.shard0of2.rank1.json``), and its videos (named
    by task, trial and seed, so they never collide)."""
    for shard in shards:
        tag = f"shard{shard.index}of{shard.count}"
        for pattern in ("incidents*.jsonl", "throughput*.json"):
            for path in sorted(shard.path.glob(pattern)):
                stem, _, rest = path.name.partition(".")
                target = out / f"{stem}.{tag}.{rest}"
                if pattern.endswith(".jsonl"):  # a partial last line is left behind
                    lines = _lines(read_jsonl(path))
                    atomic_write(target, lambda f, text=lines: f.write(text.encode()))
                else:
                    write_json_atomic(target, read_json_object(path, what="throughput file"))
        videos = shard.path / "videos"
        if videos.is_dir():
            (out / "videos").mkdir(exist_ok=True)
            for path in sorted(videos.iterdir()):
                if path.is_file() and not path.name.startswith("."):
                    shutil.copy2(path, out / "videos" / path.name)


def run_merge_command(paths: Sequence[str], out: str) -> int:
    """``cosmos3-gym merge SHARD_DIR... --out DIR``: merge, then print the run's table."""
    results = merge_shards(paths, out)
    print(f"merged {len(paths)} shards into {out}: {results['episodes']} episodes")
    print(results_io.format_table(results))
    return 0
