"""The env table: the command line, rollouts and the benchmark build envs from one entry each."""

from __future__ import annotations

import pytest

from cosmos3_gym.eval import tasks
from cosmos3_gym.eval.cli import build_parser
from cosmos3_gym.eval.tasks import EVAL_ENVS, ColorReachEval, make_eval_env


def test_the_cli_offers_exactly_the_registered_envs() -> None:
    parser = build_parser()
    for name in EVAL_ENVS:
        assert parser.parse_args(["eval", "--out", "x", "--env", name]).env == name
    with pytest.raises(SystemExit):
        parser.parse_args(["eval", "--out", "x", "--env", "mujoco"])
    assert tasks.ENV_NAMES == tuple(EVAL_ENVS) == ("color_reach", "libero")


def test_a_new_env_is_one_table_entry(monkeypatch) -> None:
    class TwoColours(ColorReachEval):
        adapter = "libero"

    monkeypatch.setitem(EVAL_ENVS, "two_colours", TwoColours)
    env = make_eval_env("two_colours", tasks=["red", "blue"], image_size=32)
    assert type(env) is TwoColours and env.tasks == ["red", "blue"]
    assert env.image_size == 32 and env.max_episode_steps == 40 and env.adapter == "libero"


def test_unknown_envs_and_misplaced_suites_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown env 'mujoco'; expected one of \['color_reach'"):
        make_eval_env("mujoco")
    with pytest.raises(ValueError, match="does not apply to --env color_reach"):
        make_eval_env("color_reach", suite="libero_10")
    with pytest.raises(ValueError, match="--env libero needs --suite"):
        make_eval_env("libero")
