"""Stand-ins for the policy tests: a pipeline and a vector env whose outputs can be decoded.

``StandInPipeline`` has ``Cosmos3ActionPipeline.__call__``'s exact signature and writes into each
item's chunk what that item received (its prompt, its image's markers, its noise), and records
every call, so a test can tell which env was planned, from which observation, with which prompt
and seed. ``CountdownEnv`` ends its episodes after a fixed number of steps, stamps (episode,
step, env id) into its image, and keeps every action it executed. The tests in this file check
that the stand-ins honour the pipeline contract the policy relies on.
"""

from __future__ import annotations

import zlib
from functools import partial

import gymnasium as gym
import numpy as np
import pytest

from cosmos3_gym.pipeline.output import ActionOutput

# Columns of a stand-in action.
PROMPT, EPISODE, STEP, ENV, NOISE, MEAN = range(6)


def prompt_code(prompt: str) -> float:
    return float(zlib.crc32(prompt.encode()) % 1000)


class StandInPipeline:
    """Item i's action at chunk step t: [prompt code, episode, step + t, env id, noise, mean].

    The markers are pixel ``[0, 0]`` of the item's image (channels: episode, step, env id), so an
    action says which observation it was planned from and which env step it is meant for.
    """

    def __init__(self, horizon: int = 4, action_dim: int = 6, expose_horizon: bool = True):
        if expose_horizon:
            self.action_horizon = horizon
        self.horizon = horizon
        self.action_dim = action_dim
        self.calls: list[dict] = []

    def __call__(
        self,
        images,
        prompts,
        *,
        seed=None,
        num_inference_steps=None,
        guidance_scale=None,
        flow_shift=None,
        action_noise=None,
        video_noise=None,
        progress=True,
    ) -> ActionOutput:
        images = np.asarray(images)
        if images.dtype != np.uint8 or images.ndim != 4:
            raise ValueError(f"expected uint8 [B, H, W, C]; found {images.dtype} {images.shape}")
        batch = images.shape[0]
        if len(prompts) != batch:
            raise ValueError(f"expected {batch} prompts; found {len(prompts)}")
        seeds = [seed] * batch if seed is None or isinstance(seed, int) else list(seed)
        if action_noise is None:
            noise = np.stack(
                [np.random.default_rng(s).standard_normal((self.horizon, 64)) for s in seeds]
            ).astype(np.float32)
        else:  # the seeds stay: the real pipeline draws the video noise from them
            noise = np.asarray(action_noise, dtype=np.float32)
        actions = np.zeros((batch, self.horizon, self.action_dim), np.float32)
        t = np.arange(self.horizon)
        for i in range(batch):
            marker = images[i, 0, 0].astype(np.float32)
            actions[i, :, PROMPT] = prompt_code(prompts[i])
            actions[i, :, EPISODE] = marker[0]
            actions[i, :, STEP] = marker[1] + t
            actions[i, :, ENV] = marker[2]
            actions[i, :, NOISE] = noise[i, :, 0]
            actions[i, :, MEAN] = images[i].mean()
        self.calls.append(
            {
                "batch": batch,
                "prompts": list(prompts),
                "seeds": list(seeds),
                "markers": images[:, 0, 0].copy(),
                "progress": progress,
                "num_inference_steps": num_inference_steps,
            }
        )
        return ActionOutput(actions, actions / 2, noise, seeds, {"total_s": 0.0})


class CountdownEnv(gym.Env):
    """Episodes of ``length`` steps; image pixel [0, 0] = (episode, step, env id)."""

    metadata = {"render_modes": []}

    def __init__(self, env_id: int, length: int, tasks: tuple[str, ...], truncate: bool = False):
        self.env_id, self.length, self.tasks, self.truncate = env_id, length, tasks, truncate
        self.observation_space = gym.spaces.Box(0, 255, (4, 4, 3), np.uint8)
        self.action_space = gym.spaces.Box(-np.inf, np.inf, (6,), np.float32)
        self.episode, self.t = -1, 0
        self.executed: list[tuple[int, int, np.ndarray]] = []

    @property
    def task_description(self) -> str:
        return self.tasks[self.episode % len(self.tasks)]

    def _obs(self) -> np.ndarray:
        obs = np.full((4, 4, 3), 9, np.uint8)
        obs[0, 0] = (self.episode, self.t, self.env_id)
        return obs

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.episode, self.t = self.episode + 1, 0
        return self._obs(), {}

    def step(self, action):
        self.executed.append((self.episode, self.t, np.array(action)))
        self.t += 1
        done = self.t >= self.length
        return self._obs(), 0.0, done and not self.truncate, done and self.truncate, {}


def task_of(env_id: int, episode: int) -> str:
    return TASKS[env_id][episode % len(TASKS[env_id])]


TASKS = (
    ("pick up the red cube", "stack the blue block"),
    ("open the top drawer",),
    ("push the button", "turn on the stove", "close the microwave"),
)


def countdown_fns(lengths: tuple[int, ...]) -> list:
    """Env factories; env 1 ends by truncation, the others by termination."""
    return [
        partial(CountdownEnv, i, length, TASKS[i], truncate=(i == 1))
        for i, length in enumerate(lengths)
    ]


def test_stand_in_items_do_not_depend_on_their_batch():
    pipe = StandInPipeline()
    images = np.random.default_rng(0).integers(0, 255, (3, 8, 8, 3), dtype=np.uint8)
    prompts = ["a", "b", "c"]
    batched = pipe(images, prompts, seed=[5, 6, 7]).actions
    for i in range(3):
        alone = pipe(images[i : i + 1], [prompts[i]], seed=[5 + i]).actions[0]
        np.testing.assert_array_equal(batched[i], alone)


def test_stand_in_chunk_depends_on_prompt_image_and_seed():
    pipe = StandInPipeline()
    image = np.zeros((1, 8, 8, 3), np.uint8)
    base = pipe(image, ["a"], seed=[0]).actions
    assert not np.array_equal(base, pipe(image, ["b"], seed=[0]).actions)
    assert not np.array_equal(base, pipe(image + 1, ["a"], seed=[0]).actions)
    assert not np.array_equal(base, pipe(image, ["a"], seed=[1]).actions)
    with pytest.raises(ValueError, match="expected 1 prompts"):
        pipe(image, ["a", "b"])


def test_countdown_env_reports_its_episode_in_image_and_task():
    env = CountdownEnv(2, length=2, tasks=TASKS[2])
    obs, _ = env.reset()
    assert tuple(obs[0, 0]) == (0, 0, 2) and env.task_description == "push the button"
    env.step(np.zeros(6))
    obs, _, terminated, truncated, _ = env.step(np.zeros(6))
    assert terminated and not truncated and tuple(obs[0, 0]) == (0, 2, 2)
    env.reset()
    assert env.task_description == "turn on the stove"
