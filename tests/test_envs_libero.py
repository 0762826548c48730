"""LIBERO as Gymnasium envs: a real two-suite vector env, chunk stepping on it, and helpers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.envs import ChunkedActionWrapper, LiberoEpisode, make_libero_vector_env
from cosmos3_gym.envs.libero import _init_state_schedules, _quat_xyzw_to_axis_angle

# Tests marked `libero` are skipped without the extra, and fail instead where
# COSMOS3_GYM_REQUIRE_LIBERO=1 (CI) says it must be there: see conftest.py.
os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")


def _run_a_libero_test_without_libero(tmp_path: Path, require: str | None):
    """Run a one-test suite under this suite's conftest, with `libero` shadowed by an empty
    package (so `import libero.libero` fails as it does with a broken install)."""
    shadow = tmp_path / "shadow"
    (shadow / "libero").mkdir(parents=True)
    (shadow / "libero" / "__init__.py").write_text("")
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "conftest.py").write_text((Path(__file__).parent / "conftest.py").read_text())
    (suite / "pytest.ini").write_text("[pytest]\nmarkers =\n    libero: needs LIBERO\n")
    (suite / "test_needs_libero.py").write_text(
        "import pytest\n\n\n@pytest.mark.libero\ndef test_uses_libero():\n    pass\n")
    env = {k: v for k, v in os.environ.items() if k != "COSMOS3_GYM_REQUIRE_LIBERO"}
    env["PYTHONPATH"] = os.pathsep.join([str(shadow), env.get("PYTHONPATH", "")])
    if require is not None:
        env["COSMOS3_GYM_REQUIRE_LIBERO"] = require
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", str(suite)],
        cwd=suite, env=env, capture_output=True, text=True)


def test_libero_tests_skip_without_the_extra_and_fail_where_it_is_required(tmp_path) -> None:
    optional = _run_a_libero_test_without_libero(tmp_path / "optional", require=None)
    assert optional.returncode == 0, optional.stdout
    assert "1 skipped" in optional.stdout and "needs the libero extra" in optional.stdout
    required = _run_a_libero_test_without_libero(tmp_path / "required", require="1")
    assert required.returncode == 1, required.stdout  # the run fails: CI goes red
    assert "1 error" in required.stdout and "skipped" not in required.stdout
    assert "COSMOS3_GYM_REQUIRE_LIBERO is set but LIBERO cannot be imported" in required.stdout


def test_envs_sharing_a_task_split_its_init_states() -> None:
    tasks = [("libero_goal", 1), ("libero_10", 0), ("libero_goal", 1)]
    assert _init_state_schedules(tasks, [3, 4, 5, 6, 7]) == [[3, 5, 7], [3, 4, 5, 6, 7], [4, 6]]


@pytest.mark.libero
def test_state_rotation_matches_robosuite_axis_angle() -> None:
    from robosuite.utils.transform_utils import quat2axisangle

    rng = np.random.default_rng(0)
    quats = rng.normal(size=(20, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    for quat in [*quats, np.array([0.0, 0.0, 0.0, 1.0])]:
        np.testing.assert_allclose(_quat_xyzw_to_axis_angle(quat), quat2axisangle(quat), atol=1e-6)


@pytest.mark.libero
@pytest.mark.slow
def test_two_suite_vector_env_steps_and_chunk_steps() -> None:
    from libero.libero import benchmark

    tasks = [("libero_spatial", 0), ("libero_object", 1)]
    envs = make_libero_vector_env(
        tasks, 2, image_size=64, max_episode_steps=3, hard_reset=False, init_state_ids=[4, 7]
    )
    try:
        obs, infos = envs.reset()
        for key in ("agentview_image", "wrist_image"):
            assert obs[key].shape == (2, 64, 64, 3) and obs[key].dtype == np.uint8
            assert obs[key].std() > 1.0, f"{key} looks blank"
        assert obs["state"].shape == (2, 8) and obs["state"].dtype == np.float32
        assert np.isfinite(obs["state"]).all()
        assert not infos["is_success"].any()

        suites = benchmark.get_benchmark_dict()
        expected = [suites[s]().get_task(t).language for s, t in tasks]
        prompts = envs.call("task_description")
        assert list(prompts) == expected and prompts[0] != prompts[1]
        assert envs.get_attr("episode") == (
            LiberoEpisode("libero_spatial", 0, 4, 0),
            LiberoEpisode("libero_object", 1, 4, 0),
        )

        # Two plain steps, then a chunk that can only run one more step before truncation.
        for _ in range(2):
            obs, rewards, terminated, truncated, infos = envs.step(np.zeros((2, 7)))
            assert not infos["is_success"].any() and not (terminated | truncated).any()
        chunked = ChunkedActionWrapper(envs)
        obs, rewards, terminated, truncated, infos = chunked.step(np.zeros((2, 4, 7)))
        assert infos["steps_executed"].tolist() == [1, 1]
        assert truncated.all() and not terminated.any() and rewards.tolist() == [0.0, 0.0]

        # NEXT_STEP: the following call resets both envs onto their next init state.
        obs, rewards, terminated, truncated, infos = chunked.step(np.zeros((2, 4, 7)))
        assert infos["steps_executed"].tolist() == [0, 0]
        assert obs["agentview_image"].shape == (2, 64, 64, 3)
        assert chunked.get_attr("episode") == (
            LiberoEpisode("libero_spatial", 0, 7, 1),
            LiberoEpisode("libero_object", 1, 7, 1),
        )
        frames = chunked.call("render")
        np.testing.assert_array_equal(np.stack(frames), obs["agentview_image"])
    finally:
        envs.close()


@pytest.mark.libero
@pytest.mark.slow
def test_camera_free_env_switches_task_on_reset() -> None:
    from cosmos3_gym.envs import LiberoEnv

    env = LiberoEnv("libero_goal", 0, render_images=False, hard_reset=False)
    try:
        obs, _ = env.reset()
        assert set(obs) == {"state"} and env.max_episode_steps == 300
        assert env.render() is None
        first = env.task_description
        obs, _ = env.reset(options={"task": ("libero_10", 2), "init_state_id": 5})
        assert env.episode == LiberoEpisode("libero_10", 2, 5, 1)
        assert env.task_description != first and env.max_episode_steps == 520
        _, reward, terminated, truncated, info = env.step(np.zeros(7))
        assert obs["state"].shape == (8,) and info["is_success"] is False and reward == 0.0
        with pytest.raises(ValueError, match="also needs 'init_state_id'"):
            env.reset(options={"task": ("libero_10", 2)})
        with pytest.raises(ValueError, match=r"init states 0\.\.49, got 50"):
            env.reset(options={"init_state_id": 50})
    finally:
        env.close()
