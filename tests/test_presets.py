"""Benchmarks by name: every preset end to end (the synthetic tiny model, the smallest run), the
registry's names and selections, several variants in one run, and the versions CI runs."""

from __future__ import annotations

import importlib.metadata
import json
import os
from pathlib import Path

import pytest

from cosmos3_gym.envs.gym_eval import GymEval
from cosmos3_gym.envs.metaworld import MetaWorldEval
from cosmos3_gym.envs.names import check_env_name, make_eval_env
from cosmos3_gym.envs.presets import PRESETS, presets_markdown, split_preset_name
from cosmos3_gym.envs.robotics import robosuite_unavailable
from cosmos3_gym.eval.cli import main

ROOT = Path(__file__).resolve().parent.parent

# The smallest end-to-end run of each preset: its first default variant, one episode of two
# steps; the marker says what the preset needs.
SMOKE = {
    "pusht": pytest.mark.gym, "aloha": pytest.mark.gym, "fetch": pytest.mark.gym,
    "panda": pytest.mark.gym, "metaworld": pytest.mark.metaworld,
    "maniskill": pytest.mark.maniskill,
    # robosuite runs in a venv of its own (.ci/robosuite), which sets
    # COSMOS3_GYM_REQUIRE_ROBOSUITE=1: there it must run; elsewhere it runs where it can.
    "robosuite": pytest.mark.skipif(
        os.environ.get("COSMOS3_GYM_REQUIRE_ROBOSUITE", "") in ("", "0")
        and robosuite_unavailable() is not None, reason=f"{robosuite_unavailable()}"),
}


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def test_every_preset_has_a_smoke_run_and_names_its_versions() -> None:
    assert set(SMOKE) == set(PRESETS)
    for preset in PRESETS.values():
        assert preset.versions and preset.not_covered and preset.success_why
        assert preset.select(None), preset.name


@pytest.mark.parametrize("name", [pytest.param(n, marks=m) for n, m in SMOKE.items()])
def test_each_preset_runs_end_to_end(name: str, tmp_path: Path) -> None:
    preset = PRESETS[name]
    first = (list(preset.default) or [v.task for v in preset.variants])[0]
    out = tmp_path / name
    assert main(["eval", "--env", f"{name}:{first}", "--synthetic", "tiny", "--trials", "1",
                 "--num-envs", "1", "--max-episode-steps", "2", "--no-progress",
                 "--out", str(out)]) == 0
    (record,) = _records(out)
    assert record["task"] == first and record["steps"] <= 2 and record["success"] is not None
    assert isinstance(record["return"], float)
    results = json.loads((out / "results.json").read_text())
    assert results["success_source"]["rule"] == ("info.is_success" if preset.family ==
                                                 "metaworld" else preset.success)


@pytest.mark.gym
def test_several_variants_run_in_one_folder_with_their_own_rates(tmp_path: Path) -> None:
    out = tmp_path / "panda"
    argv = ["eval", "--env", "panda:reach,push", "--synthetic", "tiny", "--trials", "2",
            "--num-envs", "2", "--max-episode-steps", "2", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    records = _records(out)
    assert sorted((r["task"], r["trial"]) for r in records) == [
        ("push", 0), ("push", 1), ("reach", 0), ("reach", 1)]
    assert {r["task"]: r["reset_options"]["variant"] for r in records} == {
        "reach": "reach", "push": "push"}
    assert {r["task"]: r["reset_options"]["task_description"] for r in records} == {
        "reach": PRESETS["panda"].variant("reach").prompt,
        "push": PRESETS["panda"].variant("push").prompt}
    results = json.loads((out / "results.json").read_text())
    assert list(results["per_task"]) == ["reach", "push"]
    assert all(e["episodes"] == 2 for e in results["per_task"].values())
    assert main(argv) == 0  # the same command again: complete, nothing runs
    assert len(_records(out)) == 4


@pytest.mark.gym
def test_variants_whose_spaces_differ_are_refused_before_the_model_loads(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--env", "panda:reach,stack", "--synthetic", "tiny",
              "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "variant 'stack'" in err and "must share" in err


def test_names_selections_and_overrides_resolve_in_one_place() -> None:
    assert check_env_name("aloha:insertion") == "aloha:insertion"
    assert check_env_name("gym:CartPole-v1") == "gym:CartPole-v1"
    with pytest.raises(ValueError, match="unknown env 'alohaa'"):
        check_env_name("alohaa")
    preset, selector = split_preset_name("metaworld:mt10")
    assert [v.task for v in preset.select(selector)] == list(preset.sets["mt10"])
    assert [v.task for v in PRESETS["aloha"].select(None, ["transfer_cube"])] == ["transfer_cube"]
    with pytest.raises(ValueError, match="has no variant 'peg'"):
        PRESETS["aloha"].select("peg")
    with pytest.raises(ValueError, match=r"--tasks x: --env aloha runs"):
        PRESETS["aloha"].select(None, ["x"])
    opened = PRESETS["maniskill"].select("PegInsertionSide-v1")
    assert opened[0].env_id == "PegInsertionSide-v1" and opened[0].prompt is None


def test_a_mistyped_env_name_is_answered_with_the_closest_known_one(tmp_path, capsys) -> None:
    """Families, presets and their variants and sets: the one known name closest to a typo,
    before anything runs (the command line parses --env with check_env_name)."""
    for typo, meant in (("colour_reach", "color_reach"), ("pushtt", "pusht"),
                        ("libro", "libero"), ("alohaa:insertion", "aloha:insertion")):
        with pytest.raises(ValueError, match=rf"^unknown env '{typo}' \(did you mean {meant}\?\); "
                                             "expected one of color_reach, libero, metaworld"):
            check_env_name(typo)
    for typo, meant in (("aloha:insertoin", "aloha:insertion"),
                        ("metaworld:mt1O", "metaworld:mt10"), ("panda:reach,stak", "panda:stack")):
        with pytest.raises(ValueError, match=rf"has no variant '\w+' \(did you mean {meant}\?\)"):
            check_env_name(typo)
    with pytest.raises(ValueError, match=r"^unknown env 'mujoco'; expected one of"):  # none close
        check_env_name("mujoco")
    assert check_env_name("maniskill:PegInsertionSide-v1") == "maniskill:PegInsertionSide-v1"
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--env", "pushtt", "--synthetic", "tiny", "--out", str(tmp_path / "out")])
    last = capsys.readouterr().err.splitlines()[-1]
    assert exit_info.value.code == 2 and "unknown env 'pushtt' (did you mean pusht?)" in last
    assert not (tmp_path / "out").exists()


@pytest.mark.gym
def test_a_preset_env_carries_its_conventions_and_the_command_line_overrides_them() -> None:
    pusht = make_eval_env("pusht")
    assert isinstance(pusht, GymEval) and pusht.action_map == "box"
    assert pusht.adapter_options["image_key"] == "pixels"
    assert pusht.success_rule.declared_by.startswith("preset pusht")
    custom = make_eval_env("pusht", prompt="push it", success="terminated", flip="none")
    assert custom.prompts == {"pusht": "push it"} and custom.success_rule.text == "terminated"
    assert custom.success_rule.declared_by == "--success" and custom.flip is None
    with pytest.raises(ValueError, match="--image-size does not apply"):
        make_eval_env("pusht", image_size=64)
    metaworld = make_eval_env("metaworld:ml10-test", max_episode_steps=5)
    assert isinstance(metaworld, MetaWorldEval) and len(metaworld.tasks) == 5
    with pytest.raises(ValueError, match="built-in Meta-World family"):
        make_eval_env("metaworld:mt10", prompt="x")


def test_inspect_prints_a_preset_as_data(capsys) -> None:
    assert main(["inspect", "--env", "aloha:transfer_cube"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [v["task"] for v in shown["selected"]] == ["transfer_cube"]
    assert shown["preset"]["versions"] == dict(PRESETS["aloha"].versions)
    assert shown["preset"]["action_dim"] == {"insertion": 14, "transfer_cube": 14}
    with pytest.raises(SystemExit):
        main(["inspect", "--env", "gym:CartPole-v1"])


@pytest.mark.slow
def test_each_variant_s_action_width_is_the_env_s(capsys) -> None:
    """The widths the table and ``inspect --env`` show are the envs' own action Boxes, checked
    on every variant whose simulator runs here (34 s on CI's machine: each env is made; a
    simulator this machine lacks is printed, and checked where it runs)."""
    unchecked, checked = [], 0
    for preset in PRESETS.values():
        assert preset.action_dim, f"{preset.name} declares no action width"
        variants = preset.variants if preset.family != "metaworld" else preset.variants[:1]
        if preset.name == "robosuite":
            from cosmos3_gym.envs.robotics import robosuite_unavailable

            if robosuite_unavailable() is not None:  # it builds, with other controllers
                unchecked.append(f"robosuite ({robosuite_unavailable()}; checked in "
                                 "tests/test_robosuite.py under .ci/robosuite)")
                continue
        for v in variants:
            try:
                space = make_eval_env(f"{preset.name}:{v.task}",
                                      prompt=None if v.prompt else "x").single_action_space()
            except Exception as err:  # a simulator this machine lacks: reported below
                unchecked.append(f"{preset.name}:{v.task} ({type(err).__name__})")
                continue
            assert space.shape == (preset.action_dim_of(v.task),), (preset.name, v.task, space)
            checked += 1
    main(["inspect", "--env", "panda"])
    shown = json.loads(capsys.readouterr().out)["preset"]["action_dim"]
    assert shown == {"reach": 3, "push": 3, "slide": 3, "pick_and_place": 4, "stack": 4,
                     "flip": 4}
    assert checked, "no preset's env could be made here"
    print(f"checked {checked} variants; not runnable here: {unchecked}")


def test_the_docs_table_is_generated_from_the_registry() -> None:
    page = (ROOT / "docs" / "presets.md").read_text(encoding="utf-8")
    assert presets_markdown() in page, "docs/presets.md is stale: run scripts/presets_table.py"


def _installed(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def test_the_versions_the_table_names_are_the_ones_installed() -> None:
    """CI installs every extra from scratch: what it ran is what the table says (a package not
    installed here is skipped, and reported)."""
    wrong, missing = [], []
    for preset in PRESETS.values():
        if preset.name == "robosuite" and robosuite_unavailable():
            continue  # its own venv's versions: tests/test_robosuite.py checks them there
        for package, version in preset.versions.items():
            found = _installed(package)
            if found is None:
                missing.append(f"{preset.name}: {package}")
            elif found != version:
                wrong.append(f"{preset.name}: {package} {found}, the table says {version}")
    assert wrong == []
    if missing:
        pytest.skip(f"not installed here: {missing}")


@pytest.mark.metaworld
def test_the_meta_world_sets_are_meta_world_s_own() -> None:
    from metaworld import env_dict  # the class lists metaworld.ML10 / ML45 draw from

    from cosmos3_gym.envs import presets

    assert presets.METAWORLD_ML10_TRAIN == tuple(env_dict.ML10_V3["train"])
    assert presets.METAWORLD_ML10_TEST == tuple(env_dict.ML10_V3["test"])
    assert set(presets.METAWORLD_ML45_TRAIN) == set(env_dict.ML45_V3["train"])
    assert presets.METAWORLD_ML45_TEST == tuple(env_dict.ML45_V3["test"])
