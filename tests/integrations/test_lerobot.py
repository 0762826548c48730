"""LeRobot's own evaluator (``lerobot.scripts.lerobot_eval``) drives Cosmos3 through the
integration: the shipped tiny checkpoint on ColorReach, and LIBERO for a few steps.

Needs LeRobot (0.6 or 0.4.4) beside the project, which takes a venv of its own (.ci/lerobot builds
one of each and runs this file in both); skipped where LeRobot is not importable, unless
COSMOS3_GYM_REQUIRE_LEROBOT=1 turns that into an error (.ci/lerobot sets it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

if os.environ.get("COSMOS3_GYM_REQUIRE_LEROBOT") == "1":
    import lerobot  # noqa: F401  (an ImportError here fails the run)
else:
    pytest.importorskip(
        "lerobot", reason="LeRobot is not installed here; .ci/lerobot runs this file in its venv"
    )

from lerobot.configs.policies import PreTrainedConfig
from lerobot.envs.utils import preprocess_observation
from lerobot.policies.factory import make_pre_post_processors
from lerobot.policies.pretrained import PreTrainedPolicy
from lerobot.processor import ComplementaryDataProcessorStep, PolicyProcessorPipeline
from lerobot.scripts.lerobot_eval import eval_policy, rollout

from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy
from cosmos3_gym.envs import ColorReachEnv, make_color_reach_vector_env
from cosmos3_gym.integrations.lerobot import make_lerobot_env, make_lerobot_policy, uint8_frames
from cosmos3_gym.integrations.lerobot_plugin import Cosmos3GymConfig
from cosmos3_gym.policy import LiberoAdapter

NUM_ENVS = 10
EPISODES = 20
START_SEED = 70_000  # disjoint from the tiny checkpoint's training seeds (0..1399)


class RecordingPipeline:
    """The real pipeline, with a record of what each call received (images, prompts)."""

    def __init__(self, pipe: Cosmos3ActionPipeline) -> None:
        self.pipe = pipe
        self.action_horizon = pipe.action_horizon
        self.calls: list[tuple[np.ndarray, list[str]]] = []

    def __call__(self, images: np.ndarray, prompts: list[str], **kwargs: Any) -> Any:
        self.calls.append((np.array(images), list(prompts)))
        return self.pipe(images, prompts, **kwargs)


class RotateTasks(ComplementaryDataProcessorStep):
    """A LeRobot env processor that hands env i the task of env (i + 1) % B."""

    def complementary_data(self, complementary_data: dict[str, Any]) -> dict[str, Any]:
        tasks = list(complementary_data["task"])
        return {**complementary_data, "task": tasks[1:] + tasks[:1]}

    def transform_features(self, features: Any) -> Any:
        return features


@pytest.fixture(scope="module")
def tiny_pipe() -> Cosmos3ActionPipeline:
    return Cosmos3ActionPipeline.from_pretrained("tiny")


def evaluate_color_reach(
    pipe: Any, env_preprocessor: PolicyProcessorPipeline, **eval_kwargs: Any
) -> dict:
    policy = make_lerobot_policy(VectorPolicy(pipe, adapter="generic", seed=0))
    env = make_lerobot_env(make_color_reach_vector_env(NUM_ENVS), policy)
    preprocessor, postprocessor = make_pre_post_processors(policy.config)
    try:
        return eval_policy(
            env, policy, env_preprocessor, PolicyProcessorPipeline(), preprocessor,
            postprocessor, n_episodes=EPISODES, start_seed=START_SEED, **eval_kwargs,
        )
    finally:
        env.close()


def test_lerobot_knows_the_cosmos3_gym_policy_type(tiny_pipe: Cosmos3ActionPipeline) -> None:
    policy = make_lerobot_policy(VectorPolicy(tiny_pipe, adapter="generic", seed=3))
    assert isinstance(policy, PreTrainedPolicy)
    assert policy.config.type == "cosmos3_gym"
    assert PreTrainedConfig.get_choice_class("cosmos3_gym") is Cosmos3GymConfig
    # The config describes the VectorPolicy it was made from.
    assert (policy.config.checkpoint, policy.config.adapter, policy.config.seed) == (
        None, "generic", 3)
    preprocessor, postprocessor = make_pre_post_processors(policy.config)
    assert (preprocessor.name, postprocessor.name) == ("cosmos3_gym_preprocessor",
                                                       "cosmos3_gym_postprocessor")
    assert preprocessor.steps == [] and postprocessor.steps == []


def test_the_policy_answers_lerobot_batches_with_torch_actions(
    tiny_pipe: Cosmos3ActionPipeline,
) -> None:
    vector_policy = VectorPolicy(tiny_pipe, adapter="generic", seed=0)
    policy = make_lerobot_policy(vector_policy)
    env = make_lerobot_env(make_color_reach_vector_env(2), policy)
    obs, _ = env.reset(seed=[3, 4])
    batch = {**preprocess_observation(obs), "task": list(env.call("task_description"))}
    env.close()
    chunk = policy.predict_action_chunk(batch)
    assert chunk.dtype == torch.float32 and chunk.shape == (2, 4, 2)  # [B, H, D]
    # LeRobot's `noise` argument is the initial action noise the pipeline starts from.
    noise = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(0))
    first = policy.predict_action_chunk(batch, noise=noise)
    used = vector_policy.last_chunk_record.action_noise[..., :2]  # the checkpoint's 2 action dims
    np.testing.assert_array_equal(used, noise[..., :2].numpy())
    torch.testing.assert_close(policy.predict_action_chunk(batch, noise=noise), first)
    action = policy.select_action(batch)
    assert action.dtype == torch.float32 and action.shape == (2, 2)  # [B, D]
    assert vector_policy.queue_lengths.tolist() == [3, 3]


def test_images_reach_the_policy_as_the_env_rendered_them() -> None:
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (3, 48, 64, 3), dtype=np.uint8)
    single = preprocess_observation({"pixels": frames})
    np.testing.assert_array_equal(uint8_frames(single["observation.image"]), frames)
    other = rng.integers(0, 256, (3, 48, 64, 3), dtype=np.uint8)
    cameras = preprocess_observation({"pixels": {"image": frames, "image2": other}})
    np.testing.assert_array_equal(uint8_frames(cameras["observation.images.image"]), frames)
    np.testing.assert_array_equal(uint8_frames(cameras["observation.images.image2"]), other)


def test_eval_policy_solves_color_reach_with_each_envs_own_prompt(
    tiny_pipe: Cosmos3ActionPipeline, tmp_path: Path
) -> None:
    recorder = RecordingPipeline(tiny_pipe)
    info = evaluate_color_reach(
        recorder, PolicyProcessorPipeline(), max_episodes_rendered=2, videos_dir=tmp_path
    )
    successes = [episode["success"] for episode in info["per_episode"]]
    print(f"LeRobot eval_policy, right prompts: {sum(successes)}/{len(successes)}")
    assert len(successes) == EPISODES
    assert info["aggregated"]["pc_success"] >= 80.0
    # LeRobot rendered the sub-envs into its episode videos.
    videos = [Path(path) for path in info["video_paths"]]
    assert len(videos) == 2 and all(video.stat().st_size > 0 for video in videos)

    # The first call planned every env from its reset frame, with its own prompt.
    images, prompts = recorder.calls[0]
    for i in range(NUM_ENVS):
        env = ColorReachEnv()
        frame, _ = env.reset(seed=START_SEED + i)
        np.testing.assert_array_equal(images[i], frame)
        assert prompts[i] == env.task_description


def test_eval_policy_falls_to_chance_when_prompts_are_rotated_across_envs(
    tiny_pipe: Cosmos3ActionPipeline,
) -> None:
    info = evaluate_color_reach(tiny_pipe, PolicyProcessorPipeline(steps=[RotateTasks()]))
    successes = [episode["success"] for episode in info["per_episode"]]
    print(f"LeRobot eval_policy, rotated prompts: {sum(successes)}/{len(successes)}")
    # Env i's prompt names env i+1's colour, its own only by chance (4 colours: about 1 in 4).
    assert info["aggregated"]["pc_success"] <= 50.0


def test_an_env_that_finishes_early_replans_from_its_new_episode(
    tiny_pipe: Cosmos3ActionPipeline,
) -> None:
    vector_policy = VectorPolicy(tiny_pipe, adapter="generic", seed=0)
    policy = make_lerobot_policy(vector_policy)
    env = make_lerobot_env(make_color_reach_vector_env(4), policy)
    preprocessor, postprocessor = make_pre_post_processors(policy.config)
    snapshots: list[dict[str, Any]] = []

    def snapshot(env: Any) -> None:  # LeRobot calls it after the reset and after every step
        snapshots.append({
            "tasks": list(env.call("task_description")),
            "queue_lengths": vector_policy.queue_lengths,
            "record": vector_policy.last_chunk_record,
        })

    data = rollout(env, policy, PolicyProcessorPipeline(), PolicyProcessorPipeline(),
                   preprocessor, postprocessor, seeds=[11, 12, 13, 14], render_callback=snapshot)
    env.close()
    done = data["done"].numpy()
    first_done = done.argmax(axis=1)
    early = [i for i in range(4) if first_done[i] + 1 < done.shape[1]]
    assert early, "no env finished before the others; pick other seeds"
    for i in early:
        d = int(first_done[i])
        after_done, next_step = snapshots[d + 1], snapshots[d + 2]
        # The done step emptied env i's queue...
        assert after_done["queue_lengths"][i] == 0
        # ...so the next step planned env i afresh: the first chunk of its second episode
        # (index 1), with the new episode's prompt.
        record = next_step["record"]
        row = list(record.env_indices).index(i)
        assert record.episode_indices[row] == 1 and record.chunk_indices[row] == 0
        assert record.tasks[row] == after_done["tasks"][i]


@pytest.mark.libero
@pytest.mark.slow
def test_libero_runs_through_lerobots_camera_and_state_conventions(tmp_path: Path) -> None:
    pytest.importorskip("libero.libero")
    os.environ.setdefault("MUJOCO_GL", "egl")
    from cosmos3_gym.envs import libero_task_description, make_libero_vector_env
    from cosmos3_gym.tiny import write_tiny_checkpoint

    # A random tiny checkpoint with a LIBERO-shaped head (10 raw dims): this checks plumbing,
    # not skill.
    recorder = RecordingPipeline(Cosmos3ActionPipeline.from_pretrained(
        write_tiny_checkpoint(tmp_path / "ckpt")))
    policy = make_lerobot_policy(VectorPolicy(recorder, adapter="libero", seed=0))
    tasks = [("libero_spatial", 0), ("libero_spatial", 3)]
    env = make_lerobot_env(
        make_libero_vector_env(tasks, 2, async_=False, image_size=128, max_episode_steps=4),
        policy,
    )
    preprocessor, postprocessor = make_pre_post_processors(policy.config)
    data = rollout(env, policy, PolicyProcessorPipeline(), PolicyProcessorPipeline(),
                   preprocessor, postprocessor, seeds=[0, 1], return_observations=True)
    env.close()

    observations = data["observation"]
    assert sorted(observations) == [
        "observation.images.image", "observation.images.image2", "observation.state"]
    assert observations["observation.state"].shape[-1] == 8
    assert data["action"].shape == (2, 4, 7)
    assert torch.isfinite(data["action"]).all()
    # What the model saw first = the LIBERO adapter applied to what LeRobot passed at the reset:
    # image -> agentview (left), image2 -> wrist (right), each rotated once.
    images, prompts = recorder.calls[0]
    expected = LiberoAdapter().images({
        "agentview_image": uint8_frames(observations["observation.images.image"][:, 0]),
        "wrist_image": uint8_frames(observations["observation.images.image2"][:, 0]),
    })
    np.testing.assert_array_equal(images, expected)
    assert prompts == [LiberoAdapter().prompt(libero_task_description(*t)) for t in tasks]
