"""Robustness runs as arms: --repeats measures the noise floor (repeat 0 is the run itself,
later repeats draw other noise on the same episodes, fixed noise agrees with itself), and
--perturbations maps LIBERO-PRO's dimensions onto the package's suites. The mechanism is the
same on every env, so the fast tests use the built-in env; tests/test_eval_robustness_libero.py
runs LIBERO."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosmos3_gym.envs.libero_pro import DIMENSIONS, dimensions, perturbed_suite
from cosmos3_gym.eval.arms import agreement, arm_folder, format_arms_table, run_arms
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.eval.run import resolve
from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.runner import episode_seed_rule
from cosmos3_gym.seeding import repeat_seed

KEPT = ("task", "task_index", "trial", "seed", "init_state_id", "obs_sha256", "steps", "success",
        "chunks", "return")


def config(**changes) -> EvalConfig:
    return EvalConfig(**{"trials": 2, "num_envs": 2, "seed": 3, "image_size": 32,
                         "tasks": ["red", "blue"], "max_episode_steps": 8,
                         "sampling": SamplerConfig(num_inference_steps=2), "progress": False,
                         **changes})


def episodes(folder: Path) -> dict[tuple[int, int], dict]:
    return {(r["task_index"], r["trial"]): {k: r[k] for k in KEPT}
            for r in read_episode_records(folder)}


@pytest.fixture(scope="module")
def repeated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("repeats") / "run"
    return out, evaluate(config(repeats=2), out, summary=False)


def test_repeat_zero_is_the_run_without_repeats_and_repeat_one_draws_other_noise(
        repeated: tuple[Path, dict], tmp_path: Path) -> None:
    out, results = repeated
    assert set(results["arms"]) == {"repeat-0", "repeat-1"} and results["control"] == "repeat-0"
    alone = tmp_path / "alone"
    evaluate(config(), alone, summary=False)
    assert episodes(arm_folder(out, "repeat-0")) == episodes(alone)  # byte for byte
    first, second = episodes(arm_folder(out, "repeat-0")), episodes(arm_folder(out, "repeat-1"))
    assert first.keys() == second.keys() and len(first) == 4
    for key in first:  # the same episode: its env seed and start
        assert first[key]["seed"] == second[key]["seed"]
    # ... and another noise draw: the actions, so the observations that follow, differ.
    assert any(first[k]["obs_sha256"] != second[k]["obs_sha256"] for k in first)
    floor = results["noise_floor"]
    same = sum(first[k]["success"] == second[k]["success"] for k in first)
    assert floor["pairs"] == 4 and floor["agreeing"] == same and floor["agreement"] == same / 4
    assert set(floor["per_task"]) == {"0", "1"}
    always = sum(first[k]["success"] and second[k]["success"] for k in first)
    never = sum(not (first[k]["success"] or second[k]["success"]) for k in first)
    assert (floor["always"], floor["never"]) == (always, never)
    text = format_arms_table(json.loads((out / "results.json").read_text()))
    assert "test-retest agreement" in text and f"{same} of 4 (task, trial) pairs" in text
    assert (f"{always} pairs succeeded in all 2 repeats, {never} in none; {4 - never} of 4 "
            in text)
    assert (out / "results.png").is_file() and (out / "results.svg").is_file()


def test_fixed_noise_repeats_are_the_same_episodes_and_agree_completely(tmp_path: Path) -> None:
    results = evaluate(config(repeats=2, sampling=SamplerConfig(num_inference_steps=2,
                                                                noise="fixed")),
                       tmp_path / "fixed", summary=False)
    assert results["noise_floor"]["agreement"] == 1.0
    assert results["noise_floor"]["pairs"] == 4
    assert (episodes(arm_folder(tmp_path / "fixed", "repeat-0"))
            == episodes(arm_folder(tmp_path / "fixed", "repeat-1")))


def test_report_reads_an_arms_folder_from_its_logs(repeated: tuple[Path, dict], capsys) -> None:
    from cosmos3_gym.eval.cli import main

    out, results = repeated
    assert main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "repeat-0 (control)" in printed and "noise floor: test-retest agreement" in printed
    svg = (out / "results.svg").read_text()
    assert 'id="bar-arm-0"' in svg and 'id="diff-arm-1"' in svg


def test_an_arm_that_cannot_run_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from cosmos3_gym.eval.arms import Arm

    run = resolve(config(), tmp_path / "run", kind="evaluation")
    with pytest.raises(ValueError, match="does not apply to --env color_reach"):
        run_arms(run, [Arm("control", {}), Arm("other", {"suite": "libero_10"})],
                 control="control")
    assert not (tmp_path / "run").exists()


def test_agreement_counts_pairs_that_agree_in_every_repeat_and_the_per_task_spread() -> None:
    def rec(task: int, trial: int, success: bool | None) -> dict:
        return {"task": f"t{task}", "task_index": task, "trial": trial, "success": success}

    outcomes = {"r0": [(0, 0, True), (0, 1, True), (1, 0, False), (1, 1, False)],
                "r1": [(0, 0, True), (0, 1, False), (1, 0, False), (1, 1, False)],
                "r2": [(0, 0, True), (0, 1, True), (1, 0, False), (1, 1, None)]}
    keyed = {name: {(t, k): rec(t, k, s) for t, k, s in rows} for name, rows in outcomes.items()}
    floor = agreement(keyed)
    # (1, 1) has no outcome in r2: it does not count; (0, 1) disagrees.
    assert floor["pairs"] == 3 and floor["agreeing"] == 2
    assert floor["per_task"]["0"]["rates"] == [1.0, 0.5, 1.0]
    assert floor["per_task"]["0"]["spread"] == 0.5 and floor["per_task"]["1"]["spread"] == 0.0


def test_repeat_seeds_leave_repeat_zero_alone_and_fixed_noise_fixed() -> None:
    from cosmos3_gym.envs import ColorReachEval

    eps = ColorReachEval(["red"]).episodes(trials=2, global_seed=5)
    rules = [episode_seed_rule(5, eps.__getitem__), episode_seed_rule(5, eps.__getitem__, repeat=0),
             episode_seed_rule(5, eps.__getitem__, repeat=1)]
    plain, zero, one = ([rule.seed_of(0, 1, c) for c in range(3)] for rule in rules)
    assert plain == zero and not set(one) & set(plain)
    assert one == [repeat_seed(s, 1) for s in plain]
    fixed = episode_seed_rule(5, eps.__getitem__, fresh=False, repeat=3)
    assert fixed.seed_of(0, 1, 2) == 5


def test_robustness_settings_are_checked_before_anything_runs() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        config(repeats=1)
    with pytest.raises(ValueError, match="needs --env libero; found --env color_reach"):
        config(perturbations=("language",))
    with pytest.raises(ValueError, match="one at a time"):
        EvalConfig(env="libero", suite="libero_10", perturbations=("language",), repeats=2)
    with pytest.raises(ValueError, match="unknown dimension 'colour'"):
        EvalConfig(env="libero", suite="libero_10", perturbations=("colour",)).resolved()
    with pytest.raises(ValueError, match="no suite of it runs on libero_object"):
        EvalConfig(env="libero", suite="libero_object",
                   perturbations=("distractor",)).resolved()
    with pytest.raises(ValueError, match="ships neither its BDDL nor its init-state files"):
        EvalConfig(env="libero", suite="libero_10", perturbations=("environment",)).resolved()
    with pytest.raises(ValueError, match="one LIBERO-PRO perturbs"):
        EvalConfig(env="libero", suite="libero_90", perturbations=("language",)).resolved()
    resolved = EvalConfig(env="libero", suite="libero_4", perturbations=("all",)).resolved()
    assert resolved.perturbations == ("language", "task", "object", "position")


def test_every_dimension_names_a_suite_the_package_registers() -> None:
    """The table against the installed package: each offered (suite, dimension) is a suite it
    registers, and every suffix is distinct."""
    pytest.importorskip("libero.libero")
    from libero.libero import benchmark

    registered = benchmark.get_benchmark_dict()
    assert len({d.suffix for d in DIMENSIONS}) == len(DIMENSIONS)
    for d in DIMENSIONS:
        for suite in d.suites:
            assert perturbed_suite(suite, d.name) in registered
    assert dimensions(["all"], ["libero_10"]) == ("language", "task", "object", "position",
                                                  "distractor")
