"""bench/grpo_seeds.py's arithmetic: the docs' GRPO table and acceptance columns come from it."""

from __future__ import annotations

import pytest

from cosmos3_gym.bench import grpo_seeds


def _curve(*held: tuple[int, float]) -> list[dict]:
    return [{"iteration": i, "held_out_success": h} for i, h in held]


def test_a_run_holds_only_with_the_gain_and_near_its_best() -> None:
    rising = grpo_seeds.seed_row(_curve((0, 0.555), (15, 0.70), (30, 0.79)), 20, 10)
    assert rising["gain"] == pytest.approx(23.5) and rising["holds"]
    fallen = grpo_seeds.seed_row(_curve((0, 0.555), (15, 0.845), (30, 0.76)), 20, 10)
    assert fallen["best"] == pytest.approx(84.5) and fallen["best_iteration"] == 15
    assert fallen["below_best"] == pytest.approx(8.5) and fallen["holds"]
    dropped = grpo_seeds.seed_row(_curve((0, 0.555), (15, 0.90), (30, 0.78)), 20, 10)
    assert not dropped["holds"]  # +22.5, but 12 below its best
    short = grpo_seeds.seed_row(_curve((0, 0.555), (15, 0.74)), 20, 10)
    assert not short["holds"]  # within its best, but +18.5


def test_a_kept_run_is_judged_on_its_test_episodes() -> None:
    """--keep best: the final is the kept weights on the test episodes against the start on
    the same episodes; the best is the held-out measurement that chose them."""
    curve = _curve((0, 0.555), (15, 0.845), (30, 0.60))
    curve[0]["test_success"] = 0.53
    row = grpo_seeds.seed_row(curve, 20, 10, {"iteration": 15, "test_success": 0.78})
    assert row["start"] == pytest.approx(53.0) and row["final"] == pytest.approx(78.0)
    assert row["final_iteration"] == 15 and row["best"] == pytest.approx(84.5)
    assert row["gain"] == pytest.approx(25.0) and row["holds"]
    low = grpo_seeds.seed_row(curve, 20, 10, {"iteration": 15, "test_success": 0.72})
    assert not low["holds"]  # +19 on the test episodes, 12.5 below the best that chose it


def test_the_band_is_over_the_iterations_every_run_measured() -> None:
    band = grpo_seeds.band([_curve((0, 0.5), (15, 0.6), (30, 0.7)), _curve((0, 0.5), (30, 0.9))])
    assert band["iteration"] == [0, 30]
    assert band["mean"] == pytest.approx([0.5, 0.8]) and band["low"] == [0.5, 0.7]
    assert band["high"] == [0.5, 0.9]
