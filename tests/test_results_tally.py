"""results.json kept one episode at a time (ResultsTally) is the document summarize gives over
the sorted, deduplicated log, for any stream of records: many tasks and suites, failures,
errors, episodes without an outcome, out-of-range and clipped actions, restarts, imagined
frames, duplicates, and records in any order, taken one by one or followed from the logs."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from cosmos3_gym.eval.results import (
    ExactSum,
    ResultsTally,
    read_episode_records,
    summarize,
)
from cosmos3_gym.jsonio import append_jsonl

TASKS = [f"suite_{s}/task_{t}" for s in "abc" for t in range(4)]
CONTEXT = {"config": {"env": "x", "trials": 3}, "incidents": [{"kind": "crash", "time": 1.0}],
           "throughput": {"episodes": 7, "wall_s": 2.5}, "episode_budget": None,
           "protocol": {"name": "p"}, "success_source": {"description": "info['is_success']"},
           "latency_model": "3 steps"}


def imagined(rng: random.Random, shift: int) -> dict:
    def block(frames: int) -> dict:
        return {"frames": frames, "mse": {"predicted": rng.uniform(0, 900),
                                          "copy_observed": rng.uniform(0, 900)}}

    return {**block(rng.choice([0, 3, 8])), "shift": shift, "chunks": rng.randint(1, 6),
            "reconstruction_mse": rng.uniform(1, 400),
            "earlier": block(rng.choice([0, 2])), "later": block(rng.choice([0, 5]))}


def record(rng: random.Random, task_index: int, trial: int, *, outcome: bool,
           with_imagined: bool) -> dict:
    task = TASKS[task_index] if task_index < len(TASKS) else f"unlisted/{task_index}"
    r = {
        "task": task, "task_index": task_index, "suite": task.split("/")[0], "trial": trial,
        "seed": rng.randrange(2**31),
        "success": rng.random() < 0.6 if outcome else None,
        "return": rng.choice([None, rng.uniform(-1e3, 1e3), rng.randint(-5, 5), 1e-9]),
        "steps": rng.choice([None, rng.randint(1, 600)]),
        "invalid_action": rng.choice([None, None, "non-finite action"]),
        "error": rng.choice([None, None, "env crashed"]),
        "out_of_range_steps": rng.choice([0, 0, 1, 17]),
        "restarts": rng.choice([0, 0, 0, 2]),
        "imagined": imagined(rng, 4) if with_imagined and rng.random() < 0.5 else None,
    }
    if rng.random() < 0.8:  # older records have no clipping counts
        r["clipped_steps"] = rng.choice([0, 3])
    if rng.random() < 0.7:  # real-time execution: stalls and each chunk's timing
        r["stalls"] = rng.choice([0, 0, 4])
        r["chunk_timing"] = [{"chunk": c, "delay": rng.randint(0, 6),
                              "latency_s": rng.uniform(1e-3, 2.0), "dropped": rng.randint(0, 4),
                              "committed": rng.choice([0, 2])}
                             for c in range(rng.randint(0, 4))]
    return r


def stream(seed: int) -> list[dict]:
    """A run's records in the order a run might finish them, with some episodes twice."""
    rng = random.Random(seed)
    outcome = seed % 4 != 0  # a run with success rule "none" has no outcomes
    some = rng.sample(range(len(TASKS) + 2), rng.randint(1, len(TASKS) + 2))
    records = [record(rng, i, trial, outcome=outcome, with_imagined=seed % 3 == 0)
               for i in some for trial in range(rng.randint(1, 5))]
    if seed % 5 == 1:  # a few outcomes missing amid the others
        for r in rng.sample(records, max(1, len(records) // 6)):
            r["success"] = None
    rng.shuffle(records)
    return records + [dict(r) for r in rng.sample(records, len(records) // 4)]  # repeats


def summarized(records: list[dict], folder: Path | None = None) -> dict:
    """summarize over the records read_episode_records keeps (first of each, sorted)."""
    if folder is None:
        seen: dict = {}
        for r in records:
            seen.setdefault((r["task"], int(r["trial"])), r)
        records = sorted(seen.values(), key=lambda r: (r["task_index"], r["trial"]))
    else:
        records = read_episode_records(folder)
    return summarize(records, task_names=TASKS, expected_episodes=3 * len(TASKS), **CONTEXT)


def as_text(document: dict) -> str:
    return json.dumps(document, indent=2)  # key order counts: results.json is this text


@pytest.mark.parametrize("seed", range(40))
def test_the_tally_of_a_record_stream_is_its_summary(seed: int) -> None:
    records = stream(seed)
    tally = ResultsTally(TASKS, 3 * len(TASKS))
    for n, r in enumerate(records, start=1):
        tally.add(r)
        if n % 7 == 0 or n == len(records):  # the document at points along the run
            assert as_text(tally.results(**CONTEXT)) == as_text(summarized(records[:n]))


def test_the_streams_hold_every_kind_of_episode() -> None:
    """The comparison above sees every key of the document filled in by some stream."""
    documents = [summarized(stream(seed)) for seed in range(40)]
    for key in ("invalid_action_episodes", "out_of_range_episodes", "clipped_episodes",
                "restarted_episodes", "imagined", "suite_average", "mean_return"):
        assert any(d[key] for d in documents), key
    assert any(d["latency"]["chunks"] and d["latency"]["stalls"] for d in documents)
    assert any(d["success_rate"] is None for d in documents)  # no outcomes: no rate
    assert any(e["episodes"] == 0 for d in documents for e in d["per_task"].values())
    assert any(len(d["per_suite"]) > len({t.split("/")[0] for t in TASKS}) for d in documents)


def test_a_different_shift_is_refused_by_both() -> None:
    rng = random.Random(0)
    records = [record(rng, 0, t, outcome=True, with_imagined=False) for t in range(2)]
    records[0]["imagined"], records[1]["imagined"] = imagined(rng, 4), imagined(rng, 6)
    tally = ResultsTally(TASKS, 6)
    for r in records:
        tally.add(r)
    for make in (lambda: tally.results(**CONTEXT), lambda: summarized(records)):
        with pytest.raises(ValueError, match=r"different shifts: \[4, 6\]"):
            make()


def test_the_tally_follows_the_logs_of_every_process(tmp_path: Path) -> None:
    records = stream(3)
    logs = [tmp_path / "episodes.rank0.jsonl", tmp_path / "episodes.rank1.jsonl"]
    tally = ResultsTally(TASKS, 3 * len(TASKS))
    for n, r in enumerate(records):
        append_jsonl(logs[n % 2], r)
        if n % 5 == 0:
            tally.follow(tmp_path)
            assert as_text(tally.results(**CONTEXT)) == as_text(summarized([], tmp_path))
    with logs[0].open("ab") as f:  # an append under way: not a record yet
        f.write(json.dumps(records[0])[:20].encode())
    tally.follow(tmp_path)
    assert as_text(tally.results(**CONTEXT)) == as_text(summarized([], tmp_path))
    # A log replaced by a shorter one (another run's): the tally counts the folder anew.
    kept = read_episode_records(tmp_path)[:5]
    for log in logs:
        log.unlink()
    for r in kept:
        append_jsonl(logs[0], r)
    tally.follow(tmp_path)
    assert tally.results(**CONTEXT)["episodes"] == 5
    assert as_text(tally.results(**CONTEXT)) == as_text(summarized([], tmp_path))


def test_a_corrupt_line_in_a_log_names_the_file_and_line(tmp_path: Path) -> None:
    log = tmp_path / "episodes.jsonl"
    append_jsonl(log, stream(1)[0])
    with log.open("ab") as f:
        f.write(b"{not json\n")
    with pytest.raises(ValueError, match=r"episodes.jsonl:2 is not valid JSON"):
        ResultsTally(TASKS, 1).follow(tmp_path)


def test_an_exact_sum_does_not_depend_on_the_order() -> None:
    rng = random.Random(5)
    values = [rng.uniform(-1, 1) * 10 ** rng.randint(-12, 12) for _ in range(500)]
    sums = set()
    for _ in range(5):
        rng.shuffle(values)
        total = ExactSum()
        for v in values:
            total.add(v)
        sums.add(total.value())
    assert sums == {math.fsum(values)}
