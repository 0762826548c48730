"""cosmos3_gym.envs stands alone: no torch, no model stack, runnable docstring examples."""

from __future__ import annotations

import subprocess
import sys

import gymnasium as gym

import cosmos3_gym.envs


def test_importing_envs_pulls_in_neither_torch_nor_the_model_stack_nor_a_simulator() -> None:
    code = (
        "import sys, cosmos3_gym.envs; "
        "bad = [m for m in ('torch', 'cosmos3_gym.model', 'cosmos3_gym.pipeline', "
        "'cosmos3_gym.policy', 'libero', 'robosuite', 'mujoco', 'metaworld', 'triton') "
        "if m in sys.modules]; "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, f"imported: {result.stdout.strip()} {result.stderr[-500:]}"


def test_color_reach_is_registered() -> None:
    env = gym.make(cosmos3_gym.envs.COLOR_REACH_ID)
    assert isinstance(env.unwrapped, cosmos3_gym.envs.ColorReachEnv)
    env.close()
