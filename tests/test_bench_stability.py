"""cosmos3-gym bench does not print ratios a busy machine made up: timings are injected through
the bench's one timer, so every outcome here is fixed, whatever the machine's load."""

from __future__ import annotations

import json

import pytest

from cosmos3_gym.bench import paired
from cosmos3_gym.eval.cli import main
from cosmos3_gym.tiny import write_tiny_checkpoint


def scripted_timer(monkeypatch: pytest.MonkeyPatch, seconds_a: list[float], seconds_b: float):
    """Replace the bench's timer: it still runs each side, but side a of the k-th timed pair
    reports ``seconds_a[k % len(seconds_a)]`` and side b ``seconds_b`` (whole call and denoise
    stage alike). ``paired`` times a, b, a, b, ..."""
    calls = []

    def timed(fn):
        stages = dict(fn())
        pair, side = divmod(len(calls), 2)
        calls.append(side)
        seconds = seconds_a[pair % len(seconds_a)] if side == 0 else seconds_b
        stages["denoise"] = seconds
        return seconds, stages

    monkeypatch.setattr(paired, "timed", timed)
    return calls


def test_pairs_that_disagree_are_unstable(monkeypatch) -> None:
    scripted_timer(monkeypatch, [1.0, 3.0, 1.1], 1.0)
    m = paired.paired(lambda: {}, lambda: {}, warmup=0, repeats=3)
    assert m["pair_ratios"] == [1.0, 3.0, 1.1] and m["ratio"] == 1.1
    assert paired.why_unstable(m) == "its paired ratios range from 1.00x to 3.00x"

    scripted_timer(monkeypatch, [2.0, 2.1, 1.9], 1.0)  # a steady 2x: a real difference
    assert paired.why_unstable(paired.paired(lambda: {}, lambda: {}, 0, 3)) is None


def test_same_call_sides_must_agree(monkeypatch) -> None:
    scripted_timer(monkeypatch, [1.05], 1.0)
    assert paired.why_unstable(paired.paired(lambda: {}, lambda: {}, 0, 2), same_call=True) is None
    scripted_timer(monkeypatch, [3.36], 1.0)  # the "vs serial 3.36x" at B=1
    m = paired.paired(lambda: {}, lambda: {}, 0, 2)
    assert paired.why_unstable(m) is None  # steady, so only the same-call rule can tell
    assert paired.why_unstable(m, same_call=True) == (
        "both sides are the same call, yet the paired ratio is 3.36x")


def test_bench_flags_an_impossible_b1_ratio_in_table_and_json(tmp_path, monkeypatch, capsys):
    checkpoint = write_tiny_checkpoint(tmp_path / "tiny")
    calls = scripted_timer(monkeypatch, [3.0], 1.0)  # side a always 3x slower, steadily
    out = tmp_path / "bench.json"
    assert main([
        "bench", "--checkpoint", str(checkpoint), "--out", str(out), "--batch-sizes", "1,2",
        "--input-size", "64x64", "--denoising-steps", "1", "--warmup", "0",
        "--repeats", "1", "--compare-batch", "2",
    ]) == 0
    assert len(calls) >= 2 * 8  # two batch sizes, five switches, mixed/equal prompts
    result = json.loads(out.read_text())
    # At B=1 batched and serial are the same call: a 3x ratio is the machine, not the code.
    assert result["stable"] is False
    assert list(result["unstable"]) == ["B=1 vs serial"]
    assert "same call" in result["unstable"]["B=1 vs serial"]
    assert result["batched"]["1"]["stable"] is False and result["batched"]["2"]["stable"] is True
    assert result["batched"]["1"]["pair_ratios"] == [3.0]
    table = capsys.readouterr().out.splitlines()
    row_1 = next(line for line in table if line.split()[:1] == ["1"])
    row_2 = next(line for line in table if line.split()[:1] == ["2"])
    assert "unstable" in row_1 and "3.00x" not in row_1
    assert "3.00x" in row_2 and "unstable" not in row_2
    warning = [line for line in table if line.startswith("UNSTABLE timing:")]
    assert len(warning) == 1 and "1 comparison(s) not shown" in warning[0]
    assert "B=1 vs serial: both sides are the same call" in warning[0]
    svg = out.with_suffix(".svg").read_text()  # the plot hides the made-up ratio as well
    assert ">unstable<" in svg and svg.count(">3.0x<") == 1  # B=2 only
