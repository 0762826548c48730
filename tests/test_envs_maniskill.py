"""ManiSkill3 (its own vector env, torch observations) with make_gym_vector_env and attach().

Needs ManiSkill3 and a Vulkan driver newer than Debian 12's: .ci/run unpacks Mesa 25's with
.ci/vulkan and runs this module with the variables it prints (tests/conftest.py skips it, with
that reason, where there is none).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cosmos3_gym import VectorPolicy
from cosmos3_gym.envs import make_gym_vector_env
from cosmos3_gym.pipeline.output import ActionOutput

pytestmark = pytest.mark.maniskill


def test_pick_cube_runs_with_make_gym_vector_env_and_attach() -> None:
    envs = make_gym_vector_env("PickCube-v1", 1, prompt="pick up the red cube",
                               import_modules=["mani_skill.envs"], obs_mode="rgb",
                               sim_backend="physx_cpu")
    seen = []

    def pipeline(images, prompts, *, seed=None, action_noise=None, **sampler):
        seen.append((images, list(prompts)))
        n = len(prompts)
        actions = np.zeros((n, 4, 8), np.float32)
        return ActionOutput(actions, actions, np.zeros((n, 4, 64), np.float32), list(seed))

    policy = VectorPolicy(pipeline, n_action_steps=2)
    feed = policy.attach(envs)  # the prompt through call(), which the base env lacks
    obs, _ = feed.reset(seed=0)
    camera = obs["sensor_data"]["base_camera"]["rgb"]
    assert isinstance(camera, torch.Tensor) and camera.dtype == torch.uint8
    for _ in range(3):
        obs, _, terminated, truncated, info = feed.step(policy.select_action(obs))
    images, prompts = seen[0]
    assert isinstance(images, torch.Tensor) and images.shape == (1, 128, 128, 3)  # no host copy
    assert prompts == ["pick up the red cube"] and len(seen) == 2
    assert "success" in info
    # ManiSkill's own vector env, as a user makes it: its prompts given to attach().
    inner = envs.env
    assert type(inner).__name__ == "ManiSkillVectorEnv"
    feed = VectorPolicy(pipeline).attach(inner, prompts="pick up the cube")
    assert feed.tasks == ["pick up the cube"]
    obs, _ = feed.reset(seed=1)
    feed.step(feed.policy.select_action(obs))
    assert seen[-1][1] == ["pick up the cube"]
    envs.close()
