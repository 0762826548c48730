"""Meta-World through our vector env and adapter: the scripted experts solve tasks through it
(success, autoreset and the action mapping right), the camera is upright, the gripper closes at
+1, layouts replay, and the tiny checkpoint acts in it. No trained weights."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from cosmos3_gym.envs import (
    METAWORLD_TASK_DESCRIPTIONS,
    METAWORLD_TASKS,
    MetaWorldEnv,
    MetaWorldExpert,
    make_metaworld_vector_env,
)
from cosmos3_gym.policy import MetaWorldAdapter

pytestmark = pytest.mark.metaworld

EXPERT_TASKS = ["reach-v3", "push-v3", "pick-place-v3"]


def test_adapter_gripper_follows_the_data_convention_and_inverts() -> None:
    """Raw gripper 1 = open (the Cosmos3 data's convention) -> Meta-World effort -1 (opens);
    raw 0 -> +1 (closes). A swapped sign fails here and in the expert test below."""
    adapter = MetaWorldAdapter()
    raw = np.array([[[0.1, -0.2, 0.3, 1.0], [0.0, 0.0, 0.0, 0.0]]], np.float32)
    assert adapter.actions(raw)[0, :, 3].tolist() == [-1.0, 1.0]
    env_actions = np.array([[0.5, -1.0, 0.25, 1.0], [0.0, 0.0, 0.0, -0.5]], np.float32)
    back = adapter.actions(adapter.raw_actions(env_actions)[None])[0]
    np.testing.assert_allclose(back, env_actions, atol=1e-6)
    ten = np.concatenate([raw[..., :3], np.zeros((1, 2, 6), np.float32), raw[..., 3:]], -1)
    np.testing.assert_array_equal(adapter.actions(ten), adapter.actions(raw))
    with pytest.raises(ValueError, match=r"\[B, H, 4\]"):
        adapter.actions(np.zeros((1, 1, 7), np.float32))


def test_every_task_has_an_instruction_and_an_expert() -> None:
    assert len(METAWORLD_TASKS) == 50
    assert all(METAWORLD_TASK_DESCRIPTIONS[t].strip() for t in METAWORLD_TASKS)
    for task in METAWORLD_TASKS:
        MetaWorldExpert(task)


@pytest.mark.slow
def test_experts_solve_tasks_through_the_vector_env_and_the_adapter() -> None:
    """Each expert acts on the 39-D state; its action goes through the adapter's inverse and
    the adapter, then the vector env. Every env must succeed (terminated, is_success), and the
    step after it must be the autoreset into the env's next layout."""
    adapter = MetaWorldAdapter()
    envs = make_metaworld_vector_env(EXPERT_TASKS, 3, image_size=64, max_episode_steps=150,
                                     autoreset_mode=AutoresetMode.NEXT_STEP)
    experts = [MetaWorldExpert(t) for t in EXPERT_TASKS]
    try:
        obs, _ = envs.reset(seed=0)
        first_layouts = envs.get_attr("layout_id")
        ended_at: dict[int, int] = {}
        restarted: set[int] = set()
        for step in range(160):
            raw_obs = envs.get_attr("raw_observation")
            expert_actions = np.stack([e.act(o) for e, o in zip(experts, raw_obs, strict=True)])
            actions = adapter.actions(adapter.raw_actions(expert_actions)[:, None])[:, 0]
            obs, _, terminated, truncated, infos = envs.step(actions)
            for i in range(3):
                if i in ended_at and i not in restarted and step == ended_at[i] + 1:
                    restarted.add(i)  # NEXT_STEP: this step was the reset
                    assert envs.get_attr("layout_id")[i] != first_layouts[i]
                if (terminated[i] or truncated[i]) and i not in ended_at:
                    assert terminated[i] and infos["is_success"][i], (
                        f"{EXPERT_TASKS[i]}: the expert's episode ended without success")
                    ended_at[i] = step
            if len(restarted) == 3:
                break
        assert sorted(ended_at) == [0, 1, 2], f"unsolved: {set(range(3)) - set(ended_at)}"
        assert restarted == {0, 1, 2}
        assert obs["image"].shape == (3, 64, 64, 3) and obs["state"].shape == (3, 4)
    finally:
        envs.close()


def _hand_blob_rows(frames: list[np.ndarray]) -> list[float]:
    """Mean image row of the hand in each of three frames, from which pixels change between
    them: where the hand is in frame k, it differs from both other frames."""
    diff = [np.abs(frames[a].astype(int) - frames[b].astype(int)).sum(-1) > 30
            for a, b in ((0, 1), (1, 2), (0, 2))]
    masks = [diff[0] & diff[2], diff[0] & diff[1], diff[1] & diff[2]]
    assert all(m.sum() >= 5 for m in masks), [int(m.sum()) for m in masks]
    return [float(np.nonzero(m)[0].mean()) for m in masks]


def test_camera_is_upright_and_effort_plus_one_closes() -> None:
    """The hand moves up in the world (+z), so it must move up in the image (smaller rows):
    a missing or extra 180-degree turn reverses that. Then effort +1 closes the fingers."""
    env = MetaWorldEnv("reach-v3", image_size=96)
    try:
        obs, _ = env.reset(options={"layout_id": 0})
        frames, heights = [obs["image"]], [float(obs["state"][2])]
        for _ in range(2):
            for _ in range(12):
                obs, *_ = env.step(np.array([0.0, 0.0, 1.0, -1.0], np.float32))
            frames.append(obs["image"])
            heights.append(float(obs["state"][2]))
        assert heights[0] < heights[1] < heights[2]
        rows = _hand_blob_rows(frames)
        assert rows[0] > rows[1] > rows[2], f"the hand went up but its rows went {rows}"
        np.testing.assert_array_equal(env.render(), obs["image"])

        opening = float(obs["state"][3])
        for _ in range(10):
            obs, *_ = env.step(np.array([0.0, 0.0, 0.0, 1.0], np.float32))
        assert float(obs["state"][3]) < opening - 0.2, "effort +1 must close the gripper"
    finally:
        env.close()


def test_same_layout_replays_and_layouts_differ() -> None:
    env = MetaWorldEnv("push-v3", image_size=64)
    try:
        a, _ = env.reset(options={"layout_id": 4})
        b, _ = env.reset(seed=123, options={"layout_id": 4})
        c, _ = env.reset(options={"layout_id": 5})
        np.testing.assert_array_equal(a["image"], b["image"])
        assert not np.array_equal(a["image"], c["image"])
        env.reset(options={"task": "reach-v3", "layout_id": 0})
        assert env.task_description == METAWORLD_TASK_DESCRIPTIONS["reach-v3"]
        with pytest.raises(ValueError, match="layout_id"):
            env.reset(options={"task": "push-v3"})
    finally:
        env.close()


def test_each_env_renders_its_own_scene_beside_others_and_after_one_closes() -> None:
    """Envs of one process (a SyncVectorEnv over several tasks; GRPO's training envs beside its
    held-out evaluation's): each renders its own task's scene, whatever env was built or
    closed since. Without its GL context made current per frame, a frame came out of the last
    built env's context (another task's scene) or, after that env closed, black."""
    first = MetaWorldEnv("button-press-topdown-v3", image_size=64, shadows=False)
    other = MetaWorldEnv("drawer-close-v3", image_size=64, shadows=False)
    try:
        alone = first.reset(options={"layout_id": 0})[0]["image"]
        other_alone = other.reset(options={"layout_id": 0})[0]["image"]
        beside = first.reset(options={"layout_id": 0})[0]["image"]
        np.testing.assert_array_equal(beside, alone)
        np.testing.assert_array_equal(other.reset(options={"layout_id": 0})[0]["image"],
                                      other_alone)
        other.close()
        after = first.reset(options={"layout_id": 0})[0]["image"]
        np.testing.assert_array_equal(after, alone)
        assert alone.mean() > 20.0  # a scene, not a black frame
    finally:
        first.close()
        other.close()


@pytest.mark.slow
def test_tiny_checkpoint_runs_chunks_in_metaworld(tmp_path) -> None:
    from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy
    from cosmos3_gym.envs import ChunkedActionWrapper
    from cosmos3_gym.tiny import write_tiny_checkpoint

    head = {"domain_name": "metaworld", "domain_id": 31, "raw_action_dim": 4,
            "normalization": "none", "stats": None, "view_point": "ego_view"}
    pipe = Cosmos3ActionPipeline.from_pretrained(
        write_tiny_checkpoint(tmp_path / "tiny", policy_overrides=head))
    policy = VectorPolicy(pipe, adapter="metaworld", seed=0, num_inference_steps=2)
    envs = ChunkedActionWrapper(make_metaworld_vector_env(["reach-v3", "push-v3"], 2,
                                                          image_size=64))
    try:
        obs, _ = envs.reset(seed=0)
        assert list(envs.get_attr("task_description")) == [
            METAWORLD_TASK_DESCRIPTIONS["reach-v3"], METAWORLD_TASK_DESCRIPTIONS["push-v3"]]
        for _ in range(2):
            chunk = policy.predict_action_chunk(obs, list(envs.get_attr("task_description")))
            assert chunk.shape == (2, 4, 4) and chunk.dtype == np.float32
            assert np.all(np.abs(chunk[..., 3]) <= 1.0)
            obs, _, _, _, infos = envs.step(chunk)
            assert list(infos["steps_executed"]) == [4, 4]
    finally:
        envs.close()


def family_envs_get(env_kwargs: dict) -> tuple:
    """The one switch in ``env_kwargs`` as every env of ``--env metaworld``'s family holds it
    (the family takes it from --env-kwargs and hands it to the envs it makes)."""
    from cosmos3_gym.envs import make_eval_env

    (name,) = env_kwargs
    vector = make_eval_env("metaworld", tasks=["reach-v3"], image_size=32,
                           env_kwargs=env_kwargs).make(1, False)
    try:
        return vector.get_attr(name)
    finally:
        vector.close()


def test_without_shadows_the_scene_is_the_same_in_other_frames_and_bad_values_are_refused(
) -> None:
    """``shadows=False`` (software GL renders about 5x faster) turns off the lights' shadow maps
    only: the same state, other but close frames; the family takes it from --env-kwargs and
    hands it to every env it makes. Anything but a bool is refused."""
    from cosmos3_gym.envs import make_eval_env

    frames, states, envs = {}, {}, []
    for shadows in (True, False):
        env = MetaWorldEnv("reach-v3", image_size=64, shadows=shadows)
        envs.append(env)
        obs, _ = env.reset(options={"layout_id": 2})
        frames[shadows], states[shadows] = obs["image"], obs["state"]
        assert bool(env._sim.model.light_castshadow.any()) == shadows
    try:
        np.testing.assert_array_equal(states[True], states[False])
        assert not np.array_equal(frames[True], frames[False])
        assert np.abs(frames[True].astype(int) - frames[False]).mean() < 30
    finally:
        for env in envs:
            env.close()
    assert family_envs_get({"shadows": False}) == (False,)
    with pytest.raises(ValueError, match="shadows must be true or false; found 'no'"):
        MetaWorldEnv("reach-v3", shadows="no")
    with pytest.raises(ValueError, match="takes \\['shadows', 'terminate_on_success'\\] only"):
        make_eval_env("metaworld", env_kwargs={"light": 0})


def test_without_termination_an_episode_runs_to_its_limit_and_keeps_its_success() -> None:
    """``terminate_on_success=False``: the same actions give the same episode up to the step the
    goal is reached (where the default env terminates); the episode then goes on to its step
    limit, ``is_success`` stays true (the episode's success is the same) while Meta-World's own
    ``success`` is this step's, and the shaped reward goes on, so the return grades it. The
    family hands the switch to every env; anything but a bool is refused."""
    from cosmos3_gym.envs import make_eval_env

    limit = 80
    ending, going = (MetaWorldEnv("reach-v3", image_size=32, shadows=False,
                                  max_episode_steps=limit, terminate_on_success=terminate)
                     for terminate in (True, False))
    expert = MetaWorldExpert("reach-v3")
    try:
        for env in (ending, going):
            env.reset(options={"layout_id": 0})
        reached, after = None, []
        for t in range(limit):
            action = expert.act(going.raw_observation)
            _, reward, terminated, truncated, info = going.step(action)
            if reached is None:
                _, reward_e, terminated_e, _, info_e = ending.step(action)
                assert (reward, info["is_success"]) == (reward_e, info_e["is_success"])
                assert terminated_e == info_e["is_success"]
                reached = t if terminated_e else None
            else:
                after.append((reward, info["is_success"], bool(info["success"])))
            assert not terminated
            assert truncated == (t == limit - 1)
        assert reached is not None and len(after) == limit - 1 - reached > 10
        assert all(is_success for _, is_success, _ in after)
        assert sum(reward for reward, _, _ in after) > 5 * len(after)
    finally:
        ending.close()
        going.close()
    assert family_envs_get({"terminate_on_success": False}) == (False,)
    with pytest.raises(ValueError, match="terminate_on_success must be true or false; found 0"):
        make_eval_env("metaworld", env_kwargs={"terminate_on_success": 0})
