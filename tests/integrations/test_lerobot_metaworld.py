"""Meta-World the LeRobot way, and rollouts as LeRobot datasets, in each LeRobot venv (0.6, 0.4.4).

- LeRobot's own Meta-World env (``lerobot.envs`` with its ``metaworld`` config) drives the same
  policy through :func:`make_lerobot_policy`: images and keys as LeRobot gives them.
- ``cosmos3-gym rollout --format lerobot`` output loads in LeRobot's ``LeRobotDataset`` and
  matches the rollout: actions, state, rewards, done and tasks exactly, frames within the
  video codec's tolerance.

.ci/lerobot runs this file (it installs the ``metaworld`` extra there); skipped elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

if os.environ.get("COSMOS3_GYM_REQUIRE_LEROBOT") == "1":
    import lerobot  # noqa: F401  (an ImportError here fails the run)
    import metaworld  # noqa: F401
else:
    pytest.importorskip(
        "lerobot", reason="LeRobot is not installed here; .ci/lerobot runs this file in its venv"
    )
    pytest.importorskip("metaworld", reason="needs the metaworld extra")

os.environ.setdefault("MUJOCO_GL", "egl")
os.environ.setdefault("PYOPENGL_PLATFORM", "egl")

from lerobot.policies.factory import make_pre_post_processors  # noqa: E402
from lerobot.processor import PolicyProcessorPipeline  # noqa: E402
from lerobot.scripts.lerobot_eval import rollout  # noqa: E402

from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy  # noqa: E402
from cosmos3_gym.integrations.lerobot import make_lerobot_policy, uint8_frames  # noqa: E402
from cosmos3_gym.tiny import write_tiny_checkpoint  # noqa: E402

# A 4-D Meta-World head for the tiny random model (no Meta-World checkpoint exists).
METAWORLD_HEAD = {"domain_name": "metaworld", "domain_id": 31, "raw_action_dim": 4,
                  "normalization": "none", "stats": None, "view_point": "ego_view"}


@pytest.fixture(scope="module")
def metaworld_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_checkpoint(tmp_path_factory.mktemp("mw"), policy_overrides=METAWORLD_HEAD)


class RecordingPipeline:
    def __init__(self, pipe: Cosmos3ActionPipeline) -> None:
        self.pipe, self.action_horizon = pipe, pipe.action_horizon
        self.calls: list[tuple[np.ndarray, list[str]]] = []

    def __call__(self, images, prompts, **kwargs):
        self.calls.append((np.array(images), list(prompts)))
        return self.pipe(images, prompts, **kwargs)


@pytest.mark.slow
def test_lerobot_metaworld_env_drives_the_policy_to_an_episode_end(metaworld_checkpoint) -> None:
    from lerobot.envs.configs import MetaworldEnv as MetaworldConfig
    from lerobot.envs.factory import make_env
    from lerobot.envs.metaworld import TASK_DESCRIPTIONS

    recorder = RecordingPipeline(Cosmos3ActionPipeline.from_pretrained(metaworld_checkpoint))
    policy = make_lerobot_policy(VectorPolicy(recorder, adapter="metaworld", seed=0,
                                              num_inference_steps=2))
    env = make_env(MetaworldConfig(task="reach-v3"), n_envs=2)["reach-v3"][0]
    for sub_env in env.envs:  # a short episode: Meta-World truncates at its max_path_length
        lerobot_env = sub_env.unwrapped
        if lerobot_env._env is None:  # LeRobot 0.6 builds the simulator at the first reset
            lerobot_env._ensure_env()
        lerobot_env._env.max_path_length = 6
    preprocessor, postprocessor = make_pre_post_processors(policy.config)
    try:
        data = rollout(env, policy, PolicyProcessorPipeline(), PolicyProcessorPipeline(),
                       preprocessor, postprocessor, seeds=[0, 1], return_observations=True)
    finally:
        env.close()

    observations = data["observation"]
    assert sorted(observations) == ["observation.image", "observation.state"]
    assert observations["observation.image"].shape[2:] == (3, 480, 480)
    assert observations["observation.state"].shape[-1] == 4
    assert data["action"].shape == (2, 6, 4) and torch.isfinite(data["action"]).all()
    assert data["done"][:, -1].all()  # both episodes ended (truncated at step 6)
    # The model saw LeRobot's (upright, 480 px) frames unchanged, under LeRobot's own prompts.
    images, prompts = recorder.calls[0]
    np.testing.assert_array_equal(images, uint8_frames(observations["observation.image"][:, 0]))
    assert prompts == [TASK_DESCRIPTIONS["reach-v3"]] * 2
    assert len(recorder.calls) == 2  # 6 steps = two 4-action chunks


@pytest.mark.slow
def test_rollout_as_lerobot_dataset_loads_and_matches(metaworld_checkpoint, tmp_path) -> None:
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.integrations.lerobot_dataset import finished_episodes
    from cosmos3_gym.runner import load_rollouts

    out = tmp_path / "rollouts"
    code = main(["rollout", "--checkpoint", str(metaworld_checkpoint), "--env", "metaworld",
                 "--tasks", "reach-v3,push-v3", "--num-envs", "2", "--image-size", "64",
                 "--max-episode-steps", "5", "--env-steps", "13", "--denoising-steps", "2",
                 "--no-progress", "--format", "lerobot", "--out", str(out)])
    assert code == 0
    rollouts = load_rollouts(out)
    episodes = list(finished_episodes(rollouts))
    assert len(episodes) == 4  # per env: steps 0-4, a reset step, 6-10; 11-12 unfinished

    dataset = LeRobotDataset("cosmos3_gym/rollouts", root=out / "lerobot")
    assert dataset.meta.total_episodes == 4 and dataset.fps == 80
    assert len(dataset) == sum(len(e.steps) for e in episodes)
    assert sorted(dataset.meta.tasks.index) == sorted({e.task for e in episodes})
    assert set(dataset.meta.stats) >= {"action", "observation.state", "next.reward"}
    camera = "observation.images.image"
    assert dataset.meta.video_keys == [camera]
    worst, index = 0.0, 0
    for k, episode in enumerate(episodes):
        # LeRobot 0.4.4 decodes frames with torchcodec (it needs a system FFmpeg, absent here)
        # or torchvision's VideoReader (gone from torchvision 0.29): decode its MP4 with PyAV at
        # the timestamps its episode metadata gives.
        video = _decode(dataset.root / dataset.meta.get_video_file_path(k, camera))
        start = dataset.meta.episodes[k][f"videos/{camera}/from_timestamp"]
        for j, t in enumerate(episode.steps):
            row, b = dataset.hf_dataset[index], episode.env
            index += 1
            assert int(row["episode_index"]) == k and int(row["frame_index"]) == j
            task = dataset.meta.tasks.index[int(row["task_index"])]
            assert task == episode.task == rollouts["prompts"][t, b]
            np.testing.assert_array_equal(row["action"].numpy(), rollouts["actions"][t, b])
            np.testing.assert_array_equal(row["observation.state"].numpy(),
                                          rollouts["obs.state"][t, b])
            assert float(row["next.reward"]) == float(rollouts["rewards"][t, b])
            assert bool(row["next.done"]) == (j == len(episode.steps) - 1)
            assert bool(row["next.success"]) == bool(rollouts["terminations"][t, b])
            frame = video[round((start + float(row["timestamp"])) * dataset.fps)]
            worst = max(worst, float(np.abs(frame.astype(float) - rollouts["obs.image"][t, b])
                                     .mean()))
    print(f"LeRobot dataset: {index} frames, worst mean abs frame error {worst:.2f} / 255")
    assert worst < 6.0, f"decoded frames differ from the env's by {worst:.2f} on average"


def _decode(path: Path) -> list[np.ndarray]:
    import av

    with av.open(str(path)) as container:
        return [frame.to_ndarray(format="rgb24") for frame in container.decode(video=0)]


def test_an_episode_is_the_valid_steps_up_to_its_end() -> None:
    from cosmos3_gym.integrations.lerobot_dataset import finished_episodes

    # One env, NEXT_STEP: an episode of 3 steps, the reset step, then an unfinished one.
    rollouts = {
        "terminations": np.array([[False], [False], [True], [False], [False]]),
        "truncations": np.zeros((5, 1), bool),
        "valid": np.array([[True], [True], [True], [False], [True]]),
        "prompts": np.array([["push"]] * 5),
    }
    assert [(e.env, e.steps.tolist(), e.task) for e in finished_episodes(rollouts)] == [
        (0, [0, 1, 2], "push")]
