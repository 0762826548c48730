"""``--env gym:ID`` with an env that cannot serve the run: one ``error:`` line (exit status 2)
before the model loads, for every failure a foreign env shows at its build or first reset: an
action space the adapters cannot map, a ``render()`` that gives no image, constructor keywords
it does not take or lacks, a package it needs that is not installed, no prompt for an env that
names no task."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from cosmos3_gym.envs.names import make_eval_env
from cosmos3_gym.eval.cli import main
from cosmos3_gym.pipeline import Cosmos3ActionPipeline


class StateEnv(gym.Env):
    """A 2-D point env with a state observation: its image must come from ``render()``."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}
    observation_space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = spaces.Box(-1.0, 1.0, (2,), np.float32)

    def __init__(self, render_mode: str | None = None, frame: Any = "good") -> None:
        self.render_mode, self.frame = render_mode, frame

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action: Any) -> Any:
        return np.zeros(2, np.float32), 0.0, False, False, {}

    def render(self) -> Any:
        frames = {"good": np.zeros((16, 16, 3), np.uint8), "none": None,
                  "float": np.zeros((16, 16, 3), np.float32),
                  "flat": np.zeros((16, 16), np.uint8)}
        if self.frame == "missing package":
            raise gym.error.DependencyNotInstalled(
                'pygame is not installed, run `pip install "gymnasium[classic-control]"`')
        return frames[self.frame]


class DiscreteEnv(gym.Env):
    """An env with images in its observation and a Discrete action space."""

    observation_space = spaces.Box(0, 255, (16, 16, 3), np.uint8)
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> Any:
        return np.zeros((16, 16, 3), np.uint8), {}

    def step(self, action: Any) -> Any:
        return np.zeros((16, 16, 3), np.uint8), 0.0, False, False, {}


class SizedEnv(StateEnv):
    """An env whose constructor needs a keyword."""

    def __init__(self, size: int, render_mode: str | None = None) -> None:
        super().__init__(render_mode)
        self.size = size


for name, entry in (("State", StateEnv), ("Discrete", DiscreteEnv), ("Sized", SizedEnv)):
    if f"cosmos3test/{name}-v0" not in gym.registry:
        gym.register(f"cosmos3test/{name}-v0", entry_point=entry, max_episode_steps=4)
if "cosmos3test/NotInstalled-v0" not in gym.registry:  # its package is missing
    gym.register("cosmos3test/NotInstalled-v0", entry_point="no_such_benchmark.envs:Env",
                 max_episode_steps=4)


@pytest.fixture
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model must not load: the env's faults are found before."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the model loaded before the env was checked")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", refuse)


def error_line(capsys: pytest.CaptureFixture, command: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(command)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


CASES = {
    "discrete": (["--env", "gym:cosmos3test/Discrete-v0", "--prompt", "go"],
                 "--env gym:cosmos3test/Discrete-v0's action space is Discrete(3); the policy's "
                 "actions are real vectors, which its adapters map onto a Box action space only"),
    "render none": (["--env", "gym:cosmos3test/State-v0", "--prompt", "go", "--env-kwargs",
                     '{"frame": "none"}'],
                    "cosmos3test/State-v0's render() returned None (render_mode 'rgb_array'); "
                    "expected a uint8 [H, W, C] frame (C 1, 3 or 4)"),
    "render float": (["--env", "gym:cosmos3test/State-v0", "--prompt", "go", "--env-kwargs",
                      '{"frame": "float"}'],
                     "render() returned a float32 array of shape [16, 16, 3]"),
    "render flat": (["--env", "gym:cosmos3test/State-v0", "--prompt", "go", "--env-kwargs",
                     '{"frame": "flat"}'],
                    "render() returned a uint8 array of shape [16, 16]"),
    "unknown keyword": (["--env", "gym:cosmos3test/State-v0", "--prompt", "go", "--env-kwargs",
                         '{"frames": "none"}'],
                        "--env-kwargs: gym:cosmos3test/State-v0's constructor (StateEnv) takes "
                        "no keyword 'frames'; it takes: render_mode, frame"),
    "missing keyword": (["--env", "gym:cosmos3test/Sized-v0", "--prompt", "go"],
                        "gym:cosmos3test/Sized-v0's constructor (SizedEnv) needs 'size'; give it "
                        "with --env-kwargs '{\"size\": \"...\"}'"),
    "package at render": (["--env", "gym:cosmos3test/State-v0", "--prompt", "go",
                           "--env-kwargs", '{"frame": "missing package"}'],
                          "gym:cosmos3test/State-v0 needs a package that is not installed "
                          "(pygame is not installed, run `pip install \"gymnasium[classic-"
                          "control]\"`)"),
    "package at import": (["--env", "gym:cosmos3test/NotInstalled-v0", "--prompt", "go"],
                          "gym:cosmos3test/NotInstalled-v0 needs a package that is not installed "
                          "(No module named 'no_such_benchmark')"),
    "no prompt": (["--env", "gym:cosmos3test/State-v0"],
                  "cosmos3test/State-v0 names no task (no task_description attribute); give the "
                  "instruction with prompt=... (command line: --prompt TEXT)"),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_a_gym_env_that_cannot_serve_the_run_is_one_line_before_the_model_loads(
    checkpoint: Path, tmp_path: Path, capsys, no_model, case: str, command: str
) -> None:
    options, message = CASES[case]
    out = tmp_path / "run"
    line = error_line(capsys, [command, "--checkpoint", str(checkpoint), *options,
                               "--no-progress", "--out", str(out)])
    assert line.startswith(f"cosmos3-gym {command}: error: ") and message in line, line
    # Nothing recorded (rollout takes the folder's lock before it builds the env).
    assert not out.exists() or [p.name for p in out.iterdir()] == [".lock.rank0"]


def test_the_same_envs_built_right_run(checkpoint: Path, tmp_path: Path) -> None:
    """The stand-ins themselves are fine where given what they need: the errors above are
    theirs to blame, not the harness's."""
    # Neither reports a success signal: --success none says so (rates are not counted).
    for options in (["--env", "gym:cosmos3test/State-v0", "--success", "none"],
                    ["--env", "gym:cosmos3test/Sized-v0", "--env-kwargs", '{"size": 3}',
                     "--success", "none"]):
        assert main(["eval", "--checkpoint", str(checkpoint), *options, "--prompt", "go",
                     "--trials", "1", "--no-progress", "--out", str(tmp_path / options[1][-8:])
                     ]) == 0


def test_the_checks_hold_in_python_too() -> None:
    env = make_eval_env("gym:Pendulum-v1", prompt="swing up", env_kwargs={"gravityy": 3.0})
    with pytest.raises(ValueError, match=r"PendulumEnv\) takes no keyword 'gravityy'; it takes: "
                                         r"render_mode, g"):
        env.single_action_space()
