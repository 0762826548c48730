"""Arms of one evaluation in one folder: each arm is the evaluation a run of its settings alone
would make, episodes pair across arms, and the paired difference has an honest interval."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.eval.arms import Arm, arm_folder, format_arms_table, run_arms
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.eval.run import resolve
from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.runner.folder import RunMismatch
from cosmos3_gym.stats import paired_difference

FIELDS = ("task", "trial", "seed", "obs_sha256", "steps", "success")


def config(**changes) -> EvalConfig:
    return EvalConfig(**{"trials": 2, "num_envs": 2, "seed": 3, "image_size": 32,
                         "max_episode_steps": 8, "sampling": SamplerConfig(num_inference_steps=2),
                         "progress": False, **changes})


def table(folder: Path) -> list[tuple]:
    return [tuple(r[k] for k in FIELDS) for r in read_episode_records(folder)]


ARMS = [Arm("control", {}), Arm("shuffled", {"shuffle_prompts": True})]


def test_each_arm_is_the_evaluation_its_settings_make_alone_and_pairs_with_the_control(
        tmp_path: Path) -> None:
    results = run_arms(resolve(config(), tmp_path / "arms", kind="evaluation"), ARMS,
                       control="control")
    assert results["complete"] and set(results["arms"]) == {"control", "shuffled"}
    alone = tmp_path / "alone"
    evaluate(config(shuffle_prompts=True), alone, summary=False)
    assert table(arm_folder(tmp_path / "arms", "shuffled")) == table(alone)
    paired = results["paired"]["shuffled"]
    assert paired["pairs"] == 8 == results["arms"]["control"]["episodes"]
    control = {(r["task_index"], r["trial"]): r["success"]
               for r in read_episode_records(arm_folder(tmp_path / "arms", "control"))}
    shuffled = {(r["task_index"], r["trial"]): r["success"]
                for r in read_episode_records(arm_folder(tmp_path / "arms", "shuffled"))}
    assert paired["difference"] == pytest.approx(
        np.mean(list(shuffled.values())) - np.mean(list(control.values())))
    expected = paired_difference([(shuffled[k], control[k]) for k in sorted(control)])
    assert paired["interval"] == pytest.approx(expected["interval"])
    assert set(paired["per_task"]) == {"0", "1", "2", "3"}
    on_disk = json.loads((tmp_path / "arms" / "results.json").read_text())
    assert on_disk["paired"]["shuffled"]["pairs"] == 8
    text = format_arms_table(on_disk)
    assert "control (control)" in text and "shuffled" in text and "paired 95% interval" in text


def test_a_finished_arms_run_resumes_to_its_results_and_refuses_other_arms(
        tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "arms"
    first = run_arms(resolve(config(), out, kind="evaluation"), ARMS, control="control")
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def not_loaded(*args, **kwargs):
        raise AssertionError("a finished arms run loads nothing")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", not_loaded)
    again = run_arms(resolve(config(), out, kind="evaluation"), ARMS, control="control")
    assert again["paired"] == first["paired"]
    other = [Arm("control", {}), Arm("noisier", {"seed": 4})]
    with pytest.raises(RunMismatch, match="arms"):
        run_arms(resolve(config(), out, kind="evaluation"), other, control="control")


def test_arm_names_are_folder_names() -> None:
    for bad in ("", "../x", "a/b", ".hidden"):
        with pytest.raises(ValueError, match="folder name"):
            Arm(bad, {})


def test_the_paired_interval_covers_the_true_difference_as_often_as_it_says() -> None:
    """Newcombe's interval against simulation: for known paired success probabilities, 95% of
    intervals should hold the true difference (within Monte Carlo error of 600 draws)."""
    rng = np.random.default_rng(0)
    for both, arm_only, control_only, n in ((0.45, 0.25, 0.05, 30), (0.1, 0.2, 0.3, 60)):
        probs = [both, arm_only, control_only, 1 - both - arm_only - control_only]
        truth = arm_only - control_only
        covered = 0
        for _ in range(600):
            k = rng.multinomial(n, probs)
            pairs = ([(True, True)] * k[0] + [(True, False)] * k[1] + [(False, True)] * k[2]
                     + [(False, False)] * k[3])
            low, high = paired_difference(pairs)["interval"]
            covered += low <= truth <= high
        assert 0.92 <= covered / 600 <= 0.99, (probs, covered / 600)
