"""Success only from a declared signal: each finding of issue 43 as a test.

A random policy (the synthetic tiny model) on Gymnasium's InvertedPendulum-v5 used to score 100%
(the pole falls: ``terminated``); a float info key was ``bool()``-ed; robosuite's horizon end
counted as a success; no record held a return. Here each comes from the env itself.
"""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

from cosmos3_gym.envs import ReportSuccess, SuccessRule, parse_success
from cosmos3_gym.envs.success import as_flag
from cosmos3_gym.eval.cli import main


def _records(out) -> list[dict]:
    return [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]


def _results(out) -> dict:
    return json.loads((out / "results.json").read_text())


class _Falls(gym.Env):
    """Terminates at step 2 with reward 1 per step, reporting no success of any kind."""

    observation_space = gym.spaces.Box(0, 255, (8, 8, 3), np.uint8)
    action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros((8, 8, 3), np.uint8), {}

    def step(self, action):
        self.t += 1
        return np.zeros((8, 8, 3), np.uint8), 1.0, self.t >= 2, False, {"dist": -0.3 * self.t}


def test_rules_parse_round_trip_and_refuse_what_they_cannot_read() -> None:
    for text in ("auto", "info.is_success", "info.dist > -0.5", "return >= 950", "terminated",
                 "none", "info.x <= 2.5e-2"):
        assert parse_success(parse_success(text).text).text == parse_success(text).text
    for bad in ("reward_dist", "info.", "return = 3", "info.x > nan", ""):
        with pytest.raises(ValueError, match="--success"):
            parse_success(bad)
    assert as_flag(np.float32(1.0), "is_success") is True  # gymnasium-robotics' float flags
    with pytest.raises(ValueError, match=r"holds -0.31 \(float\), not a flag"):
        as_flag(-0.31, "reward_dist")
    with pytest.raises(ValueError, match=r"holds 2 \(int\), not a flag"):
        as_flag(np.array([2]), "count")


def test_a_termination_is_a_success_only_where_declared() -> None:
    auto = ReportSuccess(_Falls())
    auto.reset(seed=0)
    auto.step(auto.action_space.sample())
    *_, terminated, _, info = auto.step(auto.action_space.sample())
    assert terminated and "is_success" not in info  # no signal: no outcome, never True
    declared = ReportSuccess(_Falls(), "terminated")
    declared.reset(seed=0)
    assert [declared.step(np.zeros(2))[4]["is_success"] for _ in range(2)] == [False, True]


def test_thresholds_read_numbers_and_returns_sum_since_the_reset() -> None:
    env = ReportSuccess(_Falls(), "info.dist > -0.4")
    env.reset(seed=0)
    assert [env.step(np.zeros(2))[4]["is_success"] for _ in range(2)] == [True, False]
    ret = ReportSuccess(_Falls(), "return >= 2")
    for _ in range(2):  # the return starts again at each reset
        ret.reset(seed=0)
        assert [ret.step(np.zeros(2))[4]["is_success"] for _ in range(2)] == [False, True]
    none = ReportSuccess(ReportSuccess(_Falls(), "terminated"), "none")
    none.reset(seed=0)
    assert "is_success" not in none.step(np.zeros(2))[4]  # none removes even an env's own flag
    assert SuccessRule("none").counts is False



@pytest.mark.gym
def test_inverted_pendulum_without_a_signal_is_refused_before_the_model_loads(
        tmp_path, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--env", "gym:InvertedPendulum-v5", "--prompt", "balance the pole",
              "--synthetic", "tiny", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "reports no success signal" in err
    assert "reward_threshold is 950" in err and "--success none" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.gym
def test_grpo_on_success_refuses_an_env_without_a_signal_before_the_model_loads(
        tmp_path, capsys) -> None:
    """``--reward success`` and ``success+return`` need the env's success; ``return`` does
    not (its refusal is for the success rule, not the reward)."""
    for reward in ("success", "success+return"):
        out = tmp_path / reward
        with pytest.raises(SystemExit) as exit_info:
            main(["rl", "grpo", "--env", "gym:InvertedPendulum-v5", "--prompt",
                  "balance the pole", "--synthetic", "tiny", "--reward", reward,
                  "--out", str(out)])
        assert exit_info.value.code == 2 and "reports no success signal" in \
            capsys.readouterr().err
        assert not out.exists()


@pytest.mark.gym
def test_a_random_policy_on_inverted_pendulum_is_not_always_successful(tmp_path) -> None:
    out = tmp_path / "pendulum"
    assert main(["eval", "--env", "gym:InvertedPendulum-v5", "--prompt", "balance the pole",
                 "--synthetic", "tiny", "--action-map", "box", "--success", "return >= 950",
                 "--render-size", "32x32", "--trials", "3", "--num-envs", "3",
                 "--no-progress", "--out", str(out)]) == 0
    records, results = _records(out), _results(out)
    assert results["success_rate"] < 1.0
    # The episodes ended by falling (terminated, short), and their returns say so: v5 pays 1
    # per step the pole stays up and 0 on the step it falls; none reached 950.
    assert all(r["steps"] < 1000 and r["return"] == pytest.approx(r["steps"] - 1)
               for r in records)
    assert all(r["success"] is False for r in records)
    assert results["success_source"]["rule"] == "return >= 950"
    assert results["success_source"]["declared_by"] == "--success"


@pytest.mark.gym
def test_success_none_reports_returns_and_no_rate(tmp_path, capsys) -> None:
    out = tmp_path / "none"
    assert main(["eval", "--env", "gym:InvertedPendulum-v5", "--prompt", "balance the pole",
                 "--synthetic", "tiny", "--success", "none", "--render-size", "32x32",
                 "--trials", "2", "--num-envs", "2", "--no-progress", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    records, results = _records(out), _results(out)
    assert all(r["success"] is None and r["return"] > 0 for r in records)
    assert results["success_rate"] is None and results["interval"] == [None, None]
    assert results["mean_return"] == pytest.approx(np.mean([r["return"] for r in records]))
    assert "success: none (no success signal" in printed and "%" not in printed.split(
        "success:")[0].split("\n", 2)[2]  # the table's rows show no rate


@pytest.mark.gym
def test_a_float_success_key_is_refused_with_what_was_found(tmp_path, capsys) -> None:
    with pytest.raises(SystemExit):
        main(["eval", "--env", "gym:Reacher-v5", "--prompt", "reach", "--synthetic", "tiny",
              "--success-key", "reward_dist", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert "success key 'reward_dist' holds" in err and "(float), not a flag" in err
    assert "--success 'info.reward_dist > X'" in err and not (tmp_path / "out").exists()


def test_an_env_family_that_reports_no_success_is_not_counted(tmp_path) -> None:
    from gymnasium.vector import SyncVectorEnv

    from cosmos3_gym.envs import EvalEnv
    from cosmos3_gym.envs.chunking import make_held_env
    from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
    from cosmos3_gym.pipeline.output import ActionOutput

    class FallsEval(EvalEnv):
        suite = "falls"

        def __init__(self):
            super().__init__(["fall"])

        def reset_options(self, episode):
            return {}

        def task_prompt(self, task_index):
            return "fall"

        def make(self, num_envs, async_, autoreset_mode=gym.vector.AutoresetMode.DISABLED):
            return SyncVectorEnv([lambda: make_held_env(_Prompted)] * num_envs,
                                 autoreset_mode=autoreset_mode)

    def pipeline(images, prompts, *, seed=None, **kwargs):
        actions = np.zeros((len(prompts), 4, 2), np.float32)
        return ActionOutput(actions, actions, np.zeros((len(prompts), 4, 64), np.float32),
                            list(seed))

    with pytest.raises(ValueError, match=r"no info\['is_success'\] at its last step"):
        evaluate(EvalConfig(trials=1, num_envs=1, progress=False), tmp_path / "out",
                 pipeline=pipeline, eval_env=FallsEval(), summary=False)


class _Prompted(_Falls):
    task_description = "fall"


def test_robosuite_s_horizon_end_is_a_truncation_not_a_success(monkeypatch) -> None:
    """Our robosuite env over a stand-in for robosuite.make (robosuite 1.4.0 does not run on
    this MuJoCo): robosuite's own done at the horizon becomes truncated, success stays False."""
    robosuite = pytest.importorskip("robosuite")
    from cosmos3_gym.envs.robotics import RobosuiteEnv

    class FakeSuite:
        action_spec = (-np.ones(7), np.ones(7))

        def __init__(self, horizon):
            self.horizon, self.t = horizon, 0

        def observation_spec(self):
            return {"robot0_proprio-state": np.zeros(9)}

        def _obs(self):
            return {"agentview_image": np.zeros((8, 8, 3), np.uint8),
                    "robot0_eye_in_hand_image": np.zeros((8, 8, 3), np.uint8),
                    "robot0_proprio-state": np.zeros(9)}

        def reset(self):
            self.t = 0
            return self._obs()

        def step(self, action):
            self.t += 1
            return self._obs(), 0.1, self.t >= self.horizon, {}  # robosuite: done at horizon

        def _check_success(self):
            return False

        def close(self):
            pass

    monkeypatch.setattr(robosuite, "make", lambda *a, horizon, **k: FakeSuite(horizon))
    env = RobosuiteEnv("Lift", camera_size=8, horizon=3)
    env.reset(seed=0)
    flags = [env.step(np.zeros(7))[2:5] for _ in range(3)]
    assert [(t, tr, info["is_success"]) for t, tr, info in flags] == [
        (False, False, False), (False, False, False), (False, True, False)]
