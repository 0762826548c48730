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


def _episodes(out) -> list[dict]:
    import json

    lines = (out / "episodes.jsonl").read_text().splitlines()
    return sorted((json.loads(line) for line in lines), key=lambda r: r["trial"])


@pytest.mark.slow
def test_the_command_line_on_maniskills_vector_env_runs_the_sub_envs_episodes(tmp_path) -> None:
    """``--env maniskill`` on ManiSkill3's own vector env (what a GPU runs; here its CPU
    backend, one env) gives the scheduled seeds and, frame for frame (observation hashes), the
    episodes, returns and outcomes of the CPUGymWrapper sub-envs; the identity records which."""
    import json

    from cosmos3_gym.envs.presets import preset_eval_env
    from cosmos3_gym.eval.cli import main

    runs = {}
    for vector_env in ("maniskill", "sub_envs"):
        out = tmp_path / vector_env
        kwargs = json.dumps({"sim_backend": "physx_cpu", "vector_env": vector_env})
        assert main(["eval", "--env", "maniskill:pick_cube", "--env-kwargs", kwargs,
                     "--synthetic", "tiny", "--trials", "2", "--num-envs", "1",
                     "--max-episode-steps", "3", "--videos", "--video-trials", "1",
                     "--no-progress", "--out", str(out)]) == 0
        assert len(list((out / "videos").glob("*.gif"))) == 1  # frames from the tensors
        identity = json.loads((out / "config.json").read_text())["identity"]
        assert identity["simulation"] == {"sim_backend": "physx_cpu", "vector_env": vector_env}
        runs[vector_env] = _episodes(out)
    scheduled = [e.seed for e in preset_eval_env("maniskill:pick_cube").episodes(2, 0)]
    ours, theirs = runs["maniskill"], runs["sub_envs"]
    assert [r["seed"] for r in ours] == scheduled and len(set(scheduled)) == 2
    assert all(r["steps"] == 3 and r["success"] is False for r in ours)  # truncated, not won
    for key in ("seed", "obs_sha256", "return", "success", "steps"):
        assert [r[key] for r in ours] == [r[key] for r in theirs], key


def test_the_hold_steps_as_maniskill_does_then_keeps_a_finished_env_still() -> None:
    """ManiSkillHold against ManiSkill3's vector env stepped directly: the same observations,
    rewards and success (``info["success"]`` as ``is_success``) to the truncation; then the
    finished env answers its final observation, reward 0, until a masked reset with its seed
    starts the same episode again."""
    import gymnasium as gym
    from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

    from cosmos3_gym.envs.maniskill import ManiSkillHold

    kwargs = dict(obs_mode="rgb", sim_backend="physx_cpu", max_episode_steps=3)
    held = ManiSkillHold("PickCube-v1", 1, prompt="pick up the cube", **kwargs)
    direct = ManiSkillVectorEnv(gym.make("PickCube-v1", num_envs=1, **kwargs), auto_reset=False)
    rgb = lambda obs: obs["sensor_data"]["base_camera"]["rgb"]  # noqa: E731
    try:
        held.set_attr("chunk_hold_armed", True)
        first, _ = held.reset(seed=[5])
        assert torch.equal(rgb(first), rgb(direct.reset(seed=[5])[0]))
        action = np.full((1, 8), 0.3, np.float32)
        for _ in range(3):
            obs, reward, terminated, truncated, info = held.step(action)
            d_obs, d_reward, _, d_truncated, d_info = direct.step(action)
            assert torch.equal(rgb(obs), rgb(d_obs)) and not (terminated | truncated).any()
            assert reward.tolist() == d_reward.numpy().tolist()
            assert info["is_success"].tolist() == d_info["success"].numpy().tolist()
            assert info["episode_truncated"].tolist() == d_truncated.numpy().tolist()
        assert info["episode_truncated"].tolist() == [True]
        final = rgb(obs)
        obs, reward, _, _, info = held.step(action)
        assert torch.equal(rgb(obs), final) and reward.tolist() == [0.0]
        assert info["episode_truncated"].tolist() == [True]  # as it ended
        again, _ = held.reset(seed=[5], options={"reset_mask": np.array([True]),
                                                 "task_description": "push it"})
        assert torch.equal(rgb(again), rgb(first)) and held.call("task_description") == (
            "push it",)
        assert not held.step(action)[4]["episode_truncated"].any()
    finally:
        held.close()
        direct.close()


@pytest.mark.slow
def test_a_rollout_on_maniskills_vector_env_saves_its_nested_torch_observations(tmp_path):
    """``rollout`` shares the runner: ManiSkill3's nested tensor observations are saved by key
    path (``obs.sensor_data/base_camera/rgb``), on the host, one row per step."""
    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.runner.rollouts import load_rollouts

    out = tmp_path / "rollout"
    assert main(["rollout", "--env", "maniskill:pick_cube", "--env-kwargs",
                 '{"sim_backend": "physx_cpu", "vector_env": "maniskill"}', "--synthetic",
                 "tiny", "--num-envs", "1", "--env-steps", "6", "--max-episode-steps", "4",
                 "--no-progress", "--out", str(out)]) == 0
    data = load_rollouts(out)
    rgb = data["obs.sensor_data/base_camera/rgb"]
    assert rgb.dtype == np.uint8 and rgb.shape == (6, 1, 128, 128, 3)
    assert data["last_obs.agent/qpos"].shape[0] == 1 and data["rewards"].shape == (6, 1)
    assert data["truncations"][:, 0].tolist() == [False, False, False, True, False, False]


@pytest.mark.slow
def test_a_resumed_run_cannot_switch_the_sim_backend(tmp_path, monkeypatch, capsys) -> None:
    """The same command on a machine where CUDA appears resolves ``sim_backend: auto`` to the
    GPU: the folder of the CPU run refuses it, naming the simulation."""
    import json

    from cosmos3_gym.eval.cli import main

    out = tmp_path / "run"
    argv = ["eval", "--env", "maniskill:pick_cube", "--synthetic", "tiny", "--trials", "1",
            "--num-envs", "1", "--max-episode-steps", "2", "--device", "cpu", "--no-progress",
            "--out", str(out)]
    assert main(argv) == 0
    assert "simulation: physx_cpu on one env per sub-env" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    assert results["config"]["simulation"] == {"sim_backend": "physx_cpu",
                                               "vector_env": "sub_envs"}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "'simulation'" in err and "physx_cuda" in err


def test_the_backend_is_resolved_and_recorded_and_bad_pairs_are_refused() -> None:
    from cosmos3_gym.envs.maniskill import ManiSkillEval, resolve_sim_backend
    from cosmos3_gym.envs.presets import PRESETS, preset_eval_env

    auto = resolve_sim_backend("auto")
    assert auto == ("physx_cuda" if torch.cuda.is_available() else "physx_cpu")
    env = preset_eval_env("maniskill:pick_cube")
    assert env.simulation == {"sim_backend": auto, "vector_env": (
        "maniskill" if auto == "physx_cuda" else "sub_envs")}
    assert env.identity()["simulation"] == env.simulation
    with pytest.raises(ValueError, match="only ManiSkill3's own vector env"):
        preset_eval_env("maniskill:pick_cube", env_kwargs={"sim_backend": "physx_cuda",
                                                           "vector_env": "sub_envs"})
    with pytest.raises(ValueError, match="vector_env must be one of"):
        preset_eval_env("maniskill", env_kwargs={"vector_env": "ray"})
    own = preset_eval_env("maniskill:pick_cube", env_kwargs={"sim_backend": "physx_cpu",
                                                             "vector_env": "maniskill"})
    with pytest.raises(ValueError, match="--async-envs applies to"):
        own.make(2, True)
    own._open = type("OpenScene", (), {"closed": False})()  # a vector env made, not closed
    with pytest.raises(ValueError, match="without --overlap"):
        own.make(1, False)
    with pytest.raises(ValueError, match="runs one task"):
        ManiSkillEval(PRESETS["maniskill"].variants[:2],
                      env_kwargs={"sim_backend": "physx_cpu", "vector_env": "maniskill"})
