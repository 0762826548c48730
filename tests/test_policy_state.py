"""The robot state through the adapters, the planner, its records and VectorPolicy."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from cosmos3_gym import Cosmos3ActionPipeline, VectorPolicy
from cosmos3_gym.pipeline import SamplerConfig
from cosmos3_gym.policy import (
    ChunkPlanner,
    DroidAdapter,
    GenericAdapter,
    LiberoAdapter,
    SeedRule,
    pipeline_state_rows,
)
from cosmos3_gym.tiny import write_tiny_checkpoint

STEPS = 2
PROMPTS = ["pick up the red bowl", "open the top drawer and put the bowl inside", "go"]


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    root = write_tiny_checkpoint(tmp_path_factory.mktemp("state_policy"), seed=4,
                                 policy_overrides={"history_length": 1})
    return Cosmos3ActionPipeline.from_pretrained(root)


def _obs(n: int = 3, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (n, 64, 96, 3), dtype=np.uint8),
            "state": rng.uniform(-0.3, 0.6, (n, 10)).astype(np.float32)}


ADAPTER = GenericAdapter(image_key="image", state_key="state")


def test_the_planner_reads_the_state_through_the_adapter_and_records_it(pipe) -> None:
    assert pipeline_state_rows(pipe) == 1
    obs = _obs()
    planner = ChunkPlanner(pipe, ADAPTER, SeedRule.fixed(3),
                           sampling=SamplerConfig(num_inference_steps=STEPS))
    record = planner.plan(obs, np.arange(3), PROMPTS, [0, 0, 0], [0, 0, 0])
    np.testing.assert_array_equal(record.state, obs["state"][:, None, :])
    direct = pipe(obs["image"], PROMPTS, state=obs["state"][:, None, :], seed=3,
                  num_inference_steps=STEPS, progress=False)
    np.testing.assert_array_equal(record.raw_actions, direct.actions)
    assert record.raw_actions.shape == (3, pipe.action_horizon, pipe.action_dim)


def test_vector_policy_replans_a_subset_with_its_own_states(pipe) -> None:
    """B=1 equality and batch invariance with the state rows: an env's chunk does not depend
    on which other envs replan with it."""
    obs = _obs(seed=1)
    policy = VectorPolicy(pipe, adapter=ADAPTER, seed=2, noise="fixed",
                          num_inference_steps=STEPS)
    together = policy(obs, PROMPTS)
    for i in range(3):
        single = VectorPolicy(pipe, adapter=ADAPTER, seed=2, noise="fixed",
                              num_inference_steps=STEPS)
        alone = single({k: v[i : i + 1] for k, v in obs.items()}, PROMPTS[i])
        np.testing.assert_allclose(together[i], alone[0], rtol=1e-5, atol=1e-5)
    moved = {k: v.copy() for k, v in obs.items()}
    moved["state"][1] += 0.5
    changed = policy(moved, PROMPTS)
    assert np.abs(changed[1] - together[1]).max() > 1e-3  # env 1's state matters
    np.testing.assert_allclose(changed[[0, 2]], together[[0, 2]], rtol=1e-5, atol=1e-5)
    assert policy.last_chunk_record.state.shape == (3, 1, 10)


def test_a_chunk_record_with_state_replays_exactly(pipe) -> None:
    obs = _obs(seed=2)
    policy = VectorPolicy(pipe, adapter=ADAPTER, seed=5, num_inference_steps=STEPS)
    first = policy(obs, PROMPTS)
    record = policy.last_chunk_record
    replay = policy(obs, PROMPTS, action_noise=record.action_noise, seeds=record.seeds)
    np.testing.assert_allclose(replay, first, rtol=1e-6, atol=1e-6)


def test_a_state_head_with_an_adapter_that_reads_none_is_refused(pipe) -> None:
    policy = VectorPolicy(pipe, adapter=GenericAdapter(image_key="image"), seed=0,
                          num_inference_steps=STEPS)
    with pytest.raises(ValueError, match=r"conditioned on the robot state \(1 row per env\).*"
                                         r"GenericAdapter\(state_key"):
        policy(_obs(), PROMPTS)
    assert policy.num_envs is None and policy.last_chunk_record is None  # nothing changed


def test_droid_adapter_is_the_official_servers_construction() -> None:
    rng = np.random.default_rng(3)
    wrist = rng.integers(0, 256, (2, 360, 640, 3), dtype=np.uint8)
    ext1 = rng.integers(0, 256, (2, 180, 320, 3), dtype=np.uint8)
    ext2 = rng.integers(0, 256, (2, 360, 640, 3), dtype=np.uint8)
    obs = {DroidAdapter.WRIST: wrist, DroidAdapter.EXTERIOR_1: ext1,
           DroidAdapter.EXTERIOR_2: ext2,
           DroidAdapter.JOINTS: rng.normal(size=(2, 7)).astype(np.float32),
           DroidAdapter.GRIPPER: np.array([0.25, 1.0], np.float32)}
    adapter = DroidAdapter()
    image = adapter.images(obs)
    assert image.shape == (2, 540, 640, 3)
    np.testing.assert_array_equal(image[:, :360], wrist)  # wrist on top, untouched
    np.testing.assert_array_equal(image[:, 360:, :320], ext1)  # already half size
    # The server's resize: bilinear, no corner alignment, truncated to uint8.
    expected = F.interpolate(torch.from_numpy(ext2).permute(0, 3, 1, 2).float(), size=(180, 320),
                             mode="bilinear", align_corners=False)
    np.testing.assert_array_equal(image[:, 360:, 320:],
                                  expected.permute(0, 2, 3, 1).numpy().astype(np.uint8))
    state = adapter.state(obs)
    assert state.shape == (2, 1, 8)
    np.testing.assert_array_equal(state[:, 0, :7], obs[DroidAdapter.JOINTS])
    np.testing.assert_array_equal(state[:, 0, 7], [0.75, 0.0])  # 1 - gripper
    raw = rng.uniform(0, 1, (2, 32, 8)).astype(np.float32)
    env = adapter.actions(raw)
    np.testing.assert_array_equal(env[..., :7], raw[..., :7])
    np.testing.assert_array_equal(env[..., 7], 1.0 - raw[..., 7])
    with pytest.raises(ValueError, match="lacks"):
        adapter.state({DroidAdapter.JOINTS: obs[DroidAdapter.JOINTS]})


def test_libero_and_generic_adapters_read_their_state() -> None:
    state = np.arange(16, dtype=np.float64).reshape(2, 8)
    libero = LiberoAdapter().state({"state": state})
    assert libero.dtype == np.float32 and libero.shape == (2, 1, 8)
    history = np.zeros((2, 3, 5), np.float32)
    assert GenericAdapter(state_key="obs/state").state({"obs": {"state": history}}).shape == (
        2, 3, 5)
    with pytest.raises(ValueError, match="state_key 'agent_pos' not in the observation"):
        GenericAdapter(state_key="agent_pos").state({"pixels": np.zeros((2, 4, 4, 3))})
    assert GenericAdapter().state({"state": state}) is None  # no key: no state
    with pytest.raises(ValueError, match="libero adapter: expected the state under 'state'"):
        LiberoAdapter().state({"agentview_image": np.zeros((2, 8, 8, 3), np.uint8)})
