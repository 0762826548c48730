"""The env table: the command line, rollouts and the benchmark build envs from one entry each."""

from __future__ import annotations

import pytest

from cosmos3_gym.envs import EVAL_ENVS, ColorReachEval, make_eval_env, names
from cosmos3_gym.eval.cli import build_parser


def test_the_cli_offers_exactly_the_registered_envs() -> None:
    parser = build_parser()
    for name in EVAL_ENVS:
        assert parser.parse_args(["eval", "--out", "x", "--env", name]).env == name
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--out", "x", "--env", "mujoco"])
    assert names.ENV_NAMES == tuple(EVAL_ENVS) == ("color_reach", "libero", "metaworld")


def test_a_new_env_is_one_table_entry(monkeypatch) -> None:
    class TwoColours(ColorReachEval):
        adapter = "libero"

    monkeypatch.setitem(EVAL_ENVS, "two_colours", TwoColours)
    env = make_eval_env("two_colours", tasks=["red", "blue"], image_size=32)
    assert type(env) is TwoColours and env.tasks == ["red", "blue"]
    assert env.image_size == 32 and env.max_episode_steps == 40 and env.adapter == "libero"


def test_unknown_envs_and_misplaced_suites_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown env 'mujoco'; expected one of color_reach, "
                       r"libero, metaworld, a benchmark preset \(pusht, aloha"):
        make_eval_env("mujoco")
    with pytest.raises(ValueError, match="does not apply to --env color_reach"):
        make_eval_env("color_reach", suite="libero_10")
    with pytest.raises(ValueError, match="--env libero needs --suite"):
        make_eval_env("libero")


def test_metaworld_tasks_are_names_and_trials_pick_layouts() -> None:
    env = make_eval_env("metaworld", tasks=["reach-v3", "push-v3"], image_size=64)
    assert env.adapter == "metaworld" and env.max_episode_steps == 500
    episodes = env.episodes(trials=2, global_seed=0)
    assert [(e.task, e.trial, e.init_state_id) for e in episodes] == [
        ("reach-v3", 0, 0), ("reach-v3", 1, 1), ("push-v3", 0, 0), ("push-v3", 1, 1)]
    assert env.reset_options(episodes[1]) == {"task": "reach-v3", "layout_id": 1}
    assert env.task_prompt(1) == "push the puck to the goal"
    assert env.single_action_space().shape == (4,)
    assert make_eval_env("metaworld").tasks[:2] == ["reach-v3", "push-v3"]  # MT10's
    with pytest.raises(ValueError, match="unknown Meta-World tasks"):
        make_eval_env("metaworld", tasks=["reach"])
    with pytest.raises(ValueError, match="does not apply to --env metaworld"):
        make_eval_env("metaworld", suite="libero_10")
    with pytest.raises(ValueError, match="applies to --env libero only"):
        make_eval_env("metaworld", step_budget="openpi")


def test_the_step_budget_option_is_libero_only_and_excludes_an_explicit_length() -> None:
    parser = build_parser()
    for command in (["eval"], ["rollout", "--env-steps", "1"]):
        args = [*command, "--out", "x", "--step-budget", "openpi"]
        assert parser.parse_args(args).step_budget == "openpi"
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--out", "x", "--step-budget", "openvla"])
    with pytest.raises(ValueError, match="--step-budget 'openpi' chooses between LIBERO clients"):
        make_eval_env("color_reach", step_budget="openpi")
    assert make_eval_env("color_reach", max_episode_steps=9).episode_budget() == {
        "step_budget": None, "settle_steps": 0, "max_episode_steps": {"color_reach": 9}}


@pytest.mark.libero
def test_the_libero_step_budget_reaches_the_envs_and_is_described() -> None:
    budgets = {}
    for step_budget, max_steps in ((None, None), ("openpi", None), (None, 5)):
        env = make_eval_env("libero", suite="libero_10", tasks=["3"], step_budget=step_budget,
                            max_episode_steps=max_steps)
        envs = env.make(1, False)  # constructors only: no simulator is built before a reset
        described = env.episode_budget()
        assert envs.get_attr("step_budget") == (described["step_budget"],)
        assert envs.get_attr("max_episode_steps") == (described["max_episode_steps"]["libero_10"],)
        assert envs.get_attr("settle_steps") == (described["settle_steps"],) == (10,)
        envs.close()
        budgets[described["step_budget"]] = described["max_episode_steps"]["libero_10"]
    assert budgets == {"cosmos3": 510, "openpi": 520, "custom": 5}
    with pytest.raises(ValueError, match="--step-budget 'openpi' and --max-episode-steps 5 both"):
        make_eval_env("libero", suite="libero_10", step_budget="openpi", max_episode_steps=5)
