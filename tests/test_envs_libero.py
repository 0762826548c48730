"""LIBERO as Gymnasium envs: reproducible episodes, step budgets, rendering, vector envs.

Simulator tests keep to a few rendered steps at 64 px; each LiberoEnv reset rebuilds the scene
(a few seconds), so the tests that need several resets are marked slow.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from cosmos3_gym.envs import (
    LIBERO_CLIENT_MAX_STEPS,
    LIBERO_ID,
    LIBERO_SETTLE_STEPS,
    ChunkedActionWrapper,
    LiberoEpisode,
    libero_max_episode_steps,
    make_libero_vector_env,
)
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


def test_step_budgets_follow_the_official_client_or_openpi() -> None:
    # cosmos-framework counts its 10 settle steps inside max_steps; openpi adds them on top.
    assert LIBERO_SETTLE_STEPS == 10
    cosmos3 = {suite: libero_max_episode_steps(suite) for suite in LIBERO_CLIENT_MAX_STEPS}
    openpi = {suite: libero_max_episode_steps(suite, "openpi") for suite in LIBERO_CLIENT_MAX_STEPS}
    assert cosmos3 == {
        "libero_spatial": 210, "libero_object": 270, "libero_goal": 290,
        "libero_10": 510, "libero_90": 390,
    }
    assert openpi == {
        "libero_spatial": 220, "libero_object": 280, "libero_goal": 300,
        "libero_10": 520, "libero_90": 400,
    }
    with pytest.raises(ValueError, match=r"one of \['cosmos3', 'openpi'\], got 'lerobot'"):
        libero_max_episode_steps("libero_10", "lerobot")


@pytest.mark.libero
def test_env_reports_its_step_budget_where_tools_look() -> None:
    pytest.importorskip("libero.libero")
    from cosmos3_gym.envs import LiberoEnv

    env = LiberoEnv("libero_10", 0, image_size=64)  # no simulator is built before reset()
    assert env.max_episode_steps == env._max_episode_steps == env.spec.max_episode_steps == 510
    assert env.step_budget == "cosmos3" and env.settle_steps == 10
    openpi = LiberoEnv("libero_10", 0, image_size=64, step_budget="openpi")
    assert openpi.spec.max_episode_steps == 520 and openpi.step_budget == "openpi"
    custom = LiberoEnv("libero_10", 0, image_size=64, max_episode_steps=3)
    assert custom.spec.max_episode_steps == 3 and custom.step_budget == "custom"
    made = gym.make(LIBERO_ID, suite="libero_goal", task_id=1, image_size=64)
    assert made.spec.max_episode_steps == 290 and made.unwrapped.task_id == 1

    envs = make_libero_vector_env(
        [("libero_10", 0), ("libero_spatial", 1)], 2, async_=False, step_budget="openpi"
    )
    assert envs.call("_max_episode_steps") == (520, 220)  # what LeRobot's rollout reads
    assert envs.get_attr("step_budget") == ("openpi", "openpi")
    envs.close()

    with pytest.raises(ValueError, match="render_images=False turns off"):
        LiberoEnv("libero_10", 0, render_images=False)
    with pytest.raises(ValueError, match="step_budget must be one of"):
        LiberoEnv("libero_10", 0, step_budget="openvla")


@pytest.mark.libero
def test_state_rotation_matches_robosuite_axis_angle() -> None:
    from robosuite.utils.transform_utils import quat2axisangle

    rng = np.random.default_rng(0)
    quats = rng.normal(size=(20, 4))
    quats /= np.linalg.norm(quats, axis=1, keepdims=True)
    for quat in [*quats, np.array([0.0, 0.0, 0.0, 1.0])]:
        np.testing.assert_allclose(_quat_xyzw_to_axis_angle(quat), quat2axisangle(quat), atol=1e-6)


@pytest.fixture(scope="module")
def spatial_env():
    """libero_spatial task 0 (its scene has fixtures: a cabinet and a stove), 64 px."""
    pytest.importorskip("libero.libero")
    from cosmos3_gym.envs import LiberoEnv

    env = LiberoEnv("libero_spatial", 0, image_size=64)
    yield env
    env.close()


def _frames(obs: dict[str, np.ndarray], index: int | None = None) -> dict[str, np.ndarray]:
    keys = ("agentview_image", "wrist_image")
    return {k: obs[k] if index is None else obs[k][index] for k in keys}


def _assert_same_frames(a: dict[str, np.ndarray], b: dict[str, np.ndarray], what: str) -> None:
    for key in a:
        assert np.array_equal(a[key], b[key]), (
            f"{what}: {key} differs in {int((a[key] != b[key]).any(-1).sum())} pixels"
        )


@pytest.mark.libero
@pytest.mark.slow
def test_same_seed_and_init_state_give_identical_frames_on_every_reset(spatial_env) -> None:
    caller_rng = np.random.get_state()
    first, _ = spatial_env.reset(seed=7, options={"init_state_id": 3})
    other_seed, _ = spatial_env.reset(seed=8, options={"init_state_id": 3})
    again, _ = spatial_env.reset(seed=7, options={"init_state_id": 3})

    _assert_same_frames(_frames(first), _frames(again), "second reset with seed 7")
    np.testing.assert_array_equal(first["state"], again["state"])
    # The seed reaches the simulator: it places the fixtures, which the init state does not.
    assert not np.array_equal(first["agentview_image"], other_seed["agentview_image"])
    assert spatial_env.episode == LiberoEpisode("libero_spatial", 0, 3, 2, 7)
    after = np.random.get_state()  # the caller's global numpy stream is where it was
    assert np.array_equal(caller_rng[1], after[1]) and caller_rng[2:] == after[2:]


@pytest.mark.libero
@pytest.mark.slow
def test_same_episode_gives_identical_frames_in_other_processes_and_slots(spatial_env) -> None:
    here, _ = spatial_env.reset(seed=7, options={"init_state_id": 3})
    envs = make_libero_vector_env([("libero_spatial", 0)], 2, image_size=64, context="spawn")
    try:
        obs, _ = envs.reset(seed=[7, 7], options={"init_state_id": 3})
    finally:
        envs.close()
    for slot in (0, 1):
        _assert_same_frames(_frames(here), _frames(obs, slot), f"worker process, slot {slot}")


@pytest.mark.libero
@pytest.mark.slow
def test_render_is_the_agentview_observation_upright(spatial_env) -> None:
    spatial_env.reset(seed=0, options={"init_state_id": 0})
    obs, *_ = spatial_env.step(np.zeros(7))
    frame = spatial_env.render()
    assert frame.shape == (64, 64, 3) and frame.dtype == np.uint8
    np.testing.assert_array_equal(frame, np.rot90(obs["agentview_image"], 2))
    assert not np.array_equal(frame, obs["agentview_image"])


@pytest.mark.libero
@pytest.mark.slow
def test_passes_gymnasium_env_checker(spatial_env) -> None:
    from gymnasium.utils.env_checker import check_env

    check_env(spatial_env)  # LiberoEnv("libero_spatial", 0, image_size=64), default checks


@pytest.mark.libero
@pytest.mark.slow
def test_seeded_reset_picks_the_init_state_from_the_seed() -> None:
    pytest.importorskip("libero.libero")
    from cosmos3_gym.envs import LiberoEnv

    env = LiberoEnv(
        "libero_goal", 0, init_state_ids=[4, 7, 9], render_images=False, render_mode=None,
        hard_reset=False,
    )
    try:
        picked = []
        for seed, options in [(5, None), (None, None), (None, {"init_state_id": 1}), (None, None),
                              (5, None)]:
            env.reset(seed=seed, options=options)
            picked.append(env.episode.init_state_id)
        # seed 5 -> init_state_ids[5 % 3]; unseeded resets go on from there; an explicit id
        # does not move the cycle.
        assert picked == [9, 4, 1, 7, 9]
    finally:
        env.close()


@pytest.mark.libero
@pytest.mark.slow
def test_two_suite_vector_env_steps_and_chunk_steps() -> None:
    from libero.libero import benchmark

    tasks = [("libero_spatial", 0), ("libero_object", 1)]
    envs = make_libero_vector_env(
        tasks, 2, image_size=64, max_episode_steps=3, hard_reset=False, init_state_ids=[4, 7],
        wrappers=[gym.wrappers.RecordEpisodeStatistics],
    )
    try:
        obs, infos = envs.reset(seed=[0, 2])  # even seeds: both start at init state 4
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
            LiberoEpisode("libero_spatial", 0, 4, 0, 0),
            LiberoEpisode("libero_object", 1, 4, 0, 2),
        )

        # Two plain steps, then a chunk that can only run one more step before truncation.
        for _ in range(2):
            obs, rewards, terminated, truncated, infos = envs.step(np.zeros((2, 7)))
            assert not infos["is_success"].any() and not (terminated | truncated).any()
        chunked = ChunkedActionWrapper(envs)
        obs, rewards, terminated, truncated, infos = chunked.step(np.zeros((2, 4, 7)))
        assert infos["steps_executed"].tolist() == [1, 1]
        assert truncated.all() and not terminated.any() and rewards.tolist() == [0.0, 0.0]
        assert infos["episode"]["l"].tolist() == [3, 3]  # env steps, counted inside the hold

        # NEXT_STEP: the following call resets both envs onto their next init state.
        obs, rewards, terminated, truncated, infos = chunked.step(np.zeros((2, 4, 7)))
        assert infos["steps_executed"].tolist() == [0, 0]
        assert obs["agentview_image"].shape == (2, 64, 64, 3)
        episodes = chunked.get_attr("episode")
        assert [(e.suite, e.init_state_id, e.episode_index) for e in episodes] == [
            ("libero_spatial", 7, 1), ("libero_object", 7, 1),
        ]
        frames = chunked.call("render")
        np.testing.assert_array_equal(np.stack(frames), obs["agentview_image"][:, ::-1, ::-1])
    finally:
        envs.close()


@pytest.mark.libero
@pytest.mark.slow
def test_camera_free_env_switches_task_on_reset() -> None:
    from cosmos3_gym.envs import LiberoEnv

    env = LiberoEnv("libero_goal", 0, render_images=False, render_mode=None, hard_reset=False)
    try:
        obs, _ = env.reset()
        assert set(obs) == {"state"} and env.max_episode_steps == 290
        assert env.render() is None
        first = env.task_description
        obs, _ = env.reset(seed=11, options={"task": ("libero_10", 2), "init_state_id": 5})
        assert env.episode == LiberoEpisode("libero_10", 2, 5, 1, 11)
        assert env.task_description != first
        assert env.max_episode_steps == env.spec.max_episode_steps == 510
        _, reward, terminated, truncated, info = env.step(np.zeros(7))
        assert obs["state"].shape == (8,) and info["is_success"] is False and reward == 0.0
        with pytest.raises(ValueError, match="also needs 'init_state_id'"):
            env.reset(options={"task": ("libero_10", 2)})
        with pytest.raises(ValueError, match=r"init states 0\.\.49, got 50"):
            env.reset(options={"init_state_id": 50})
    finally:
        env.close()


def test_task_order_filter_passes_other_output(capsys) -> None:
    from cosmos3_gym.envs.libero_suites import _without_task_order_notice

    with _without_task_order_notice():
        print("[info] Applying task order index 0 (permutation: [0, 1]) for benchmark 'x'.")
        print("[info] Using default task order for benchmark 'libero_10_lan' (10 tasks).")
        print("[warning] No tasks found for benchmark: y")
    assert capsys.readouterr().out == "[warning] No tasks found for benchmark: y\n"


_START_A_LIBERO_WORKER = """
from cosmos3_gym.envs import make_libero_vector_env
envs = make_libero_vector_env([("libero_spatial", 0)], 1, async_=True, image_size=32)
obs, info = envs.reset(seed=0)
print("task:", envs.call("task_description")[0])
envs.close()
"""


@pytest.mark.libero
@pytest.mark.slow
def test_starting_libero_workers_prints_no_start_up_notices() -> None:
    """robosuite's macro-file warning (3 lines per worker) and LIBERO's task-order line are
    start-up noise; a fresh process, so robosuite's import really happens here."""
    done = subprocess.run([sys.executable, "-c", _START_A_LIBERO_WORKER],
                          capture_output=True, text=True, timeout=600)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "task: pick up the black bowl" in done.stdout
    assert "macro file" not in output and "setup_macros" not in output
    assert "Applying task order" not in output
