"""The policy in envs nobody here wrote: the box action map, prompts given from outside, torch
observations, and heads of any width."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gymnasium.spaces import Box
from gymnasium.vector import AutoresetMode

from cosmos3_gym import VectorPolicy
from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.envs import make_color_reach_vector_env, make_gym_vector_env
from cosmos3_gym.pipeline import Cosmos3ActionPipeline
from cosmos3_gym.pipeline.admission import admit_images
from cosmos3_gym.pipeline.output import ActionOutput
from cosmos3_gym.policy import GenericAdapter
from cosmos3_gym.policy.adapters import BoxActionAdapter, check_action_fit, with_action_map
from cosmos3_gym.tiny import tiny_action_stats, write_tiny_checkpoint


def test_the_box_map_is_affine_per_dimension_onto_the_bounds() -> None:
    space = Box(np.array([0.0, -2.0, 10.0]), np.array([512.0, 2.0, 11.0]), dtype=np.float32)
    adapter = with_action_map(GenericAdapter(), "box", space)
    raw = np.random.default_rng(0).uniform(-1.5, 1.5, (2, 4, 3)).astype(np.float32)
    # The reference: np.interp per dimension, which holds at the bounds beyond [-1, 1]: the map
    # clips onto the box (and the records say how much: tests/test_success_sources.py).
    expected = np.stack([
        np.interp(raw[..., d], [-1, 1], [space.low[d], space.high[d]]) for d in range(3)
    ], axis=-1)
    assert (np.abs(raw) > 1).any()  # some actions were outside, so the clip is exercised
    np.testing.assert_allclose(adapter.actions(raw), expected, rtol=1e-6, atol=1e-4)
    assert with_action_map(GenericAdapter(), None, space).name == "generic"


def test_the_box_map_refuses_what_it_cannot_map() -> None:
    with pytest.raises(ValueError, match=r"every bound must be finite .*unbounded dims \[1\]"):
        BoxActionAdapter(Box(np.array([0.0, -np.inf]), np.array([1.0, np.inf])))
    with pytest.raises(ValueError, match="expected a 1-D Box"):
        BoxActionAdapter(Box(0, 1, (2, 2)))
    with pytest.raises(ValueError, match="unknown action map 'clip'"):
        with_action_map(GenericAdapter(), "clip", Box(0, 1, (2,)))
    adapter = BoxActionAdapter(Box(0.0, 512.0, (2,), np.float32))
    with pytest.raises(ValueError, match="the 'box' adapter cannot take .* found 10-D"):
        check_action_fit(adapter, 10, "libero", adapter.action_space, fix="Fix: ...")


def _stand_in(width: int):
    def pipeline(images, prompts, *, seed=None, action_noise=None, **sampler):
        n = len(prompts)
        assert images.shape[0] == n
        actions = np.zeros((n, 4, width), np.float32)
        return ActionOutput(actions, actions, np.zeros((n, 4, 64), np.float32), list(seed))

    return pipeline


def test_attach_with_prompts_serves_envs_that_name_no_task_and_sees_every_episode_end() -> None:
    envs = make_gym_vector_env("CartPole-v1", 2, prompt=["a", "b"], max_episode_steps=3,
                               autoreset_mode=AutoresetMode.NEXT_STEP)
    policy = VectorPolicy(_stand_in(1), n_action_steps=2)
    feed = policy.attach(envs, prompts=["balance", "keep it up"])
    assert feed.tasks == ["balance", "keep it up"]
    obs, _ = feed.reset(seed=0)
    episodes, tasks = [], set()
    for _ in range(8):
        actions = policy.select_action(obs).astype(np.int64)[:, 0]
        if policy.last_chunk_record is not None:
            tasks.update(zip(policy.last_chunk_record.env_indices.tolist(),
                             policy.last_chunk_record.tasks, strict=True))
        obs, *_ = feed.step(actions)
        episodes.append(policy.episode_index.tolist())
    # 3 steps an episode, then NEXT_STEP's reset step, which begins the next episode.
    assert episodes == [[0, 0]] * 3 + [[1, 1]] * 4 + [[2, 2]]
    assert tasks == {(0, "balance"), (1, "keep it up")}  # never the envs' own prompts
    with pytest.raises(ValueError, match="expected 2 prompts, one per env of the 2 attached envs"):
        VectorPolicy(_stand_in(1)).attach(envs, prompts=["x", "y", "z"])
    envs.close()


@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Cosmos3ActionPipeline:
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    return Cosmos3ActionPipeline.from_pretrained("tiny")


def test_torch_observations_give_the_actions_of_the_same_numpy_ones(pipeline) -> None:
    envs = make_color_reach_vector_env(2, image_size=64)
    obs, _ = envs.reset(seed=3)
    prompts = list(envs.call("task_description"))
    reference = VectorPolicy(pipeline, seed=5)(obs, prompts)
    tensor = torch.from_numpy(obs.copy())
    assert np.array_equal(VectorPolicy(pipeline, seed=5)(tensor, prompts), reference)
    # A dict observation of tensors, one env's slice taken on the tensor's device.
    chunked = VectorPolicy(pipeline, seed=5, n_action_steps=2)
    chunked.select_action({"rgb": tensor, "state": torch.zeros(2, 3)}, prompts)
    chunked.reset(np.array([False, True]))
    chunked.select_action({"rgb": tensor, "state": torch.zeros(2, 3)}, prompts)
    assert chunked.last_chunk_record.env_indices.tolist() == [1]
    envs.close()


def test_admission_keeps_tensors_on_their_device_and_checks_them_as_arrays() -> None:
    images = torch.arange(2 * 4 * 5 * 4, dtype=torch.int64).reshape(2, 4, 5, 4).to(torch.uint8)
    admitted = admit_images(images)
    assert all(isinstance(i, torch.Tensor) and i.shape == (4, 5, 3) for i in admitted)
    assert torch.equal(admitted[1], images[1, :, :, :3]) and admitted[1].is_contiguous()
    admitted[1].zero_()
    assert images[1].any()  # a copy: the caller's tensor is never written
    grey = admit_images(torch.full((3, 3), 7, dtype=torch.uint8))
    assert grey[0].shape == (3, 3, 3) and int(grey[0].sum()) == 7 * 27
    with pytest.raises(ValueError, match=r"image 0: expected uint8, got torch.float32"):
        admit_images(torch.zeros(1, 4, 4, 3))
    with pytest.raises(ValueError, match="expected 1, 3 or 4 channels, got 2"):
        admit_images(torch.zeros(1, 4, 4, 2, dtype=torch.uint8))


def test_a_tiny_checkpoint_of_any_width_loads_and_runs(tmp_path) -> None:
    folder = write_tiny_checkpoint(tmp_path / "ckpt14", policy_overrides={"raw_action_dim": 14})
    pipe = Cosmos3ActionPipeline.from_pretrained(folder)
    assert pipe.policy.stats == tiny_action_stats(14)
    out = pipe(np.zeros((1, 64, 64, 3), np.uint8), "insert the peg", progress=False)
    assert out.actions.shape == (1, 4, 14) and np.isfinite(out.actions).all()


def test_statistics_of_another_width_are_refused_when_the_head_is_described() -> None:
    with pytest.raises(ValueError, match="raw_action_dim is 14 but the statistics are 10-D"):
        PolicyConfig(raw_action_dim=14, stats=tiny_action_stats(10))
    assert PolicyConfig(raw_action_dim=14, normalization="none", stats=None).raw_action_dim == 14
