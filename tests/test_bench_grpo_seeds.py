"""bench/grpo_seeds.py's arithmetic: the docs' GRPO table and acceptance columns come from it."""

from __future__ import annotations

import json

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


def test_the_requested_iterations_are_the_last_flag_or_the_settings_default() -> None:
    asked = grpo_seeds.requested_iterations({
        "plain": ["--threads", "1"], "two": ["--iterations", "60", "--iterations=240"],
        "other": ["--iterations=60", "--iterations", "30"], "short": ["--iter", "45"]})
    # GRPOConfig's default; the last flag, as argparse reads it; an abbreviation rl grpo takes
    assert asked == {"plain": 120, "two": 240, "other": 30, "short": 45}
    with pytest.raises(SystemExit):  # a typo'd flag: refused before any run
        grpo_seeds.requested_iterations({"typo": ["--iteratoins", "60"]})


def _finished_run(folder, iterations: int) -> None:
    folder.mkdir(parents=True)
    held = _curve((0, 0.5), (iterations, 0.7))
    (folder / "curve.json").write_text(json.dumps(
        {"curve": held, "config": {"iterations": iterations, "seed": 0}, "after": 0.7,
         "wall_s": 60.0}))


def test_a_finished_run_counts_only_at_the_iterations_asked_for(tmp_path) -> None:
    """A finished run of fewer iterations is resumed (not silently reported as the longer
    run); one of more is refused, naming both counts; an unfinished one is run."""
    folder = tmp_path / "default" / "seed-0"
    _finished_run(folder, 120)
    assert grpo_seeds.finished(folder, 120)["config"]["iterations"] == 120
    assert grpo_seeds.finished(folder, 240) is None
    with pytest.raises(SystemExit, match="holds a run of 120 iterations; this command asks for 60"):
        grpo_seeds.finished(folder, 60)
    data = json.loads((folder / "curve.json").read_text())
    del data["after"]  # killed before its summary
    (folder / "curve.json").write_text(json.dumps(data))
    assert grpo_seeds.finished(folder, 120) is None


def test_a_longer_variant_reruns_the_seeds_a_shorter_command_finished(tmp_path, monkeypatch
                                                                      ) -> None:
    """--iterations 240 over a folder of 120-iteration runs runs every seed again (rl grpo
    resumes them); the same command with 120 runs nothing and reports them."""
    for seed in (0, 1):
        _finished_run(tmp_path / "default" / f"seed-{seed}", 120)
    ran: list[int] = []
    monkeypatch.setattr(grpo_seeds, "run_seed", lambda args, extra, seed, folder: ran.append(seed))
    monkeypatch.setattr(grpo_seeds, "plot", lambda summary, stem: None)
    grpo_seeds.main(["--out", str(tmp_path), "--seeds", "0,1", "--", "--threads", "1"])
    assert ran == []
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["variants"]["default"]["missing"] == []
    grpo_seeds.main(["--out", str(tmp_path), "--seeds", "0,1", "--", "--iterations", "240"])
    assert ran == [0, 1]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["variants"] == {}  # nothing of 240 iterations finished: no row to show


def test_group_signal_counts_the_silent_groups_of_each_noise_setting(tmp_path) -> None:
    """bench/group_signal.py on the shipped tiny policy: the same start states under each
    setting, a silent group is one whose episodes all agree, and a variant that changes more
    than the sampling is refused."""
    from cosmos3_gym.bench import group_signal

    grpo = ["--env-kwargs", '{"max_speed": 0.28}', "--max-episode-steps", "6",
            "--denoising-steps", "3", "--n-action-steps", "2", "--group-size", "3",
            "--num-envs", "6", "--noise-level", "2.0"]
    out = tmp_path / "signal.json"
    assert group_signal.main(["--groups", "2", "--out", str(out), "--variant",
                              "shared=--group-noise shared", "--", *grpo]) == 0
    found = json.loads(out.read_text())["settings"]
    assert list(found) == [group_signal.START_NOISE_ALONE, "default", "shared"]
    for row in found.values():
        rates = row["group_success"]
        assert len(rates) == 2 and all(r in (0, 1 / 3, 2 / 3, 1) for r in rates)
        assert row["silent"] == sum(r in (0, 1) for r in rates) / 2
        assert row["within_group_variance"] == pytest.approx(
            sum(r * (1 - r) for r in rates) / 2, abs=1e-4)
    with pytest.raises(SystemExit):
        group_signal.main(["--groups", "2", "--out", str(out), "--variant",
                           "other=--group-size 4", "--", *grpo])
    assert group_signal.summarize([[True, True], [True, False]])["silent"] == 0.5
