"""Robustness runs on real LIBERO, offline: every LIBERO-PRO dimension runs beside its control on
the control's episodes (the same task, trial, init state id and env seed), the perturbed prompt
where the dimension changes it, and fixed noise repeats the same episodes exactly. One task, a
few policy steps: these check the plumbing, not a success rate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cosmos3_gym.envs.libero_pro import dimensions, perturbed_suite
from cosmos3_gym.eval.arms import arm_folder
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.tiny import write_tiny_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.libero]
SHORT = ["--image-size", "64", "--max-episode-steps", "3", "--denoising-steps", "1",
         "--num-envs", "1", "--no-progress"]
PAIRED = ("task_index", "trial", "init_state_id", "seed")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("libero.libero")
    return write_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny")  # LIBERO-like head


def test_every_dimension_runs_beside_its_control_on_the_same_episodes(
        checkpoint: Path, tmp_path: Path, capsys) -> None:
    from cosmos3_gym.eval.cli import main

    out = tmp_path / "pro"
    command = ["eval", "--checkpoint", str(checkpoint), "--env", "libero", "--suite", "libero_10",
               "--tasks", "0", "--trials", "2", "--perturbations", "all", *SHORT,
               "--out", str(out)]
    assert main(command) == 0
    printed = capsys.readouterr().out
    names = dimensions(["all"], ["libero_10"])
    assert names == ("language", "task", "object", "position", "distractor")
    control = read_episode_records(arm_folder(out, "control"))
    assert len(control) == 2
    keys = sorted(tuple(r[k] for k in PAIRED) for r in control)
    prompts = {}
    for name in names:
        records = read_episode_records(arm_folder(out, name))
        assert sorted(tuple(r[k] for k in PAIRED) for r in records) == keys, name
        assert {r["suite"] for r in records} == {perturbed_suite("libero_10", name)}
        prompts[name] = {r["prompt"] for r in records}
    standard = {r["prompt"] for r in control}
    assert standard == {"put both the alphabet soup and the tomato sauce in the basket"}
    for name in ("object", "position", "distractor"):  # the scene changes, not the words
        assert prompts[name] == standard, name
    for name in ("language", "task"):  # the words the suite's BDDL states
        assert len(prompts[name]) == 1 and prompts[name] != standard, name
    results = json.loads((out / "results.json").read_text())
    assert set(results["paired"]) == set(names)
    assert all(results["paired"][n]["pairs"] == 2 for n in names)
    assert "control (control)" in printed and "distractor" in printed

    # Resume: nothing runs again, and report recomputes the same table from the logs.
    before = {n: read_episode_records(arm_folder(out, n)) for n in ("control", *names)}
    assert main(command) == 0
    assert {n: read_episode_records(arm_folder(out, n)) for n in before} == before
    capsys.readouterr()
    assert main(["report", str(out)]) == 0
    assert "paired 95% interval" in capsys.readouterr().out


def test_fixed_noise_repeats_of_a_libero_run_agree_completely(
        checkpoint: Path, tmp_path: Path) -> None:
    from cosmos3_gym.eval.cli import main

    out = tmp_path / "floor"
    assert main(["eval", "--checkpoint", str(checkpoint), "--env", "libero", "--suite",
                 "libero_spatial", "--tasks", "0", "--trials", "2", "--repeats", "2", "--noise",
                 "fixed", *SHORT, "--out", str(out)]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["noise_floor"]["agreement"] == 1.0 and results["noise_floor"]["pairs"] == 2
    first, second = (read_episode_records(arm_folder(out, f"repeat-{r}")) for r in (0, 1))
    assert ({(r["trial"], r["obs_sha256"]) for r in first}
            == {(r["trial"], r["obs_sha256"]) for r in second})
