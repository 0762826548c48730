"""State-conditioned heads: the robot state as clean leading action rows.

diffusers' pipeline (0.42.1) has no state input in policy mode, so the reference is the official
DROID server's construction as written (cosmos-framework ``action_policy_server_robolab.py``
``_build_sample`` / ``infer`` with ``use_state=True``, ``history_length=h``, and
``transforms.build_sequence_plan_from_mode``): the action sequence is ``h`` state rows then the
H actions, the first ``h`` rows are conditioning (clean, no time embedding, zero velocity), the
seeded noise covers all ``h + H`` rows before the state replaces the first ``h``, the action
stream's temporal positions start at pixel frame ``1 - h`` (``action_start_frame_offset``), and
the first ``h`` rows are cut from the output.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_vae_tokens

import cosmos3_gym.model.transformer as transformer_module
from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.pipeline.normalization import ActionStats, normalize_actions
from cosmos3_gym.tiny import write_tiny_checkpoint

PROMPTS = ["pick up the red bowl", "open the top drawer and put the bowl inside", "go"]
STEPS = 3


def _official_action_rows(seed: int, state_rows: np.ndarray, horizon: int, raw: int):
    """The server's initial action sequence: the seeded [h + H, 64] draw (padding zeroed), its
    first h rows replaced by the (normalised, padded) state."""
    h = state_rows.shape[0]
    draw = np.random.RandomState(seed).standard_normal((h + horizon, 64)).astype(np.float32)
    draw[:, raw:] = 0.0
    draw[:h, :raw] = state_rows
    return draw


@pytest.fixture(scope="module", params=[1, 2], ids=["h1", "h2"])
def pipe(request, tmp_path_factory):
    root = write_tiny_checkpoint(tmp_path_factory.mktemp("state"), seed=2,
                                 policy_overrides={"history_length": request.param})
    return Cosmos3ActionPipeline.from_pretrained(root)


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(2).integers(0, 256, size=(3, 64, 128, 3), dtype=np.uint8)


def _state(pipe, seed: int = 0, count: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.uniform(-0.4, 0.6, size=(count, pipe.history_length, pipe.action_dim)).astype(
        np.float32)


def _run(pipe, images, state, prompts=PROMPTS, seeds=(7, 8, 9), **kwargs):
    return pipe(images, prompts, state=state, seed=list(seeds), num_inference_steps=STEPS,
                progress=False, **kwargs)


def _capture_first_step(pipe, monkeypatch) -> dict:
    """The first GEN forward's action inputs and the GEN positions the layout was built from."""
    seen: dict = {}
    positions = transformer_module.gen_position_ids
    forward = pipe.transformer.forward_gen

    def recording_positions(*args, **kwargs):
        out = positions(*args, **kwargs)
        seen.setdefault("positions", out)
        return out

    def recording_forward(text, layout, vision, vision_noisy, actions, action_noisy, *args,
                          **kwargs):
        if "actions" not in seen:
            seen.update(actions=actions.clone(), action_noisy=action_noisy.clone(),
                        grid=layout.grid, text_lengths=text.lengths.clone())
        return forward(text, layout, vision, vision_noisy, actions, action_noisy, *args,
                       **kwargs)

    monkeypatch.setattr(transformer_module, "gen_position_ids", recording_positions)
    monkeypatch.setattr(pipe.transformer, "forward_gen", recording_forward)
    return seen


def test_token_layout_is_the_official_servers(pipe, images, monkeypatch) -> None:
    h, horizon, raw = pipe.history_length, pipe.action_horizon, pipe.action_dim
    state = _state(pipe)
    seen = _capture_first_step(pipe, monkeypatch)
    out = _run(pipe, images[:1], state[:1], PROMPTS[:1], seeds=[7])

    # Conditioning: the first h rows clean, the H actions noisy (condition_frame_indexes_action).
    expected_noisy = np.array([[False] * h + [True] * horizon])
    np.testing.assert_array_equal(seen["action_noisy"].cpu().numpy(), expected_noisy)
    # Values: the server's sequence, the state normalised with the head's statistics.
    stats = ActionStats.from_dict(pipe.policy.stats)
    normalised = normalize_actions(state[0], stats, pipe.policy.normalization)
    official = _official_action_rows(7, normalised, horizon, raw)
    np.testing.assert_allclose(seen["actions"][0].cpu().numpy(), official, rtol=0, atol=1e-6)
    # Positions: the action stream (h + H tokens) starts at pixel frame 1 - h.
    t, hp, wp = seen["grid"]
    offset = float(seen["text_lengths"][0]) + pipe.transformer.config.\
        unified_3d_mrope_temporal_modality_margin
    reference, _ = get_3d_mrope_ids_vae_tokens(
        h + horizon, 1, 1, offset, fps=pipe.policy.fps, base_fps=24.0,
        temporal_compression_factor=1, base_temporal_compression_factor=4,
        start_frame_offset=1 - h,
    )
    ours = seen["positions"][:, 0, t * hp * wp:]
    np.testing.assert_allclose(ours.cpu().numpy(), reference.float().numpy(), rtol=0, atol=1e-3)
    # Output: the state rows are cut; the noise returned is the H predicted rows'.
    assert out.actions.shape == (1, horizon, raw)
    np.testing.assert_array_equal(out.action_noise[0], official[h:])


def test_the_state_conditions_the_actions(pipe, images) -> None:
    state = _state(pipe)
    a = _run(pipe, images, state)
    b = _run(pipe, images, state + 0.5)
    assert np.abs(a.actions - b.actions).max() > 1e-3
    np.testing.assert_array_equal(_run(pipe, images, state).actions, a.actions)


def test_batched_state_rows_equal_each_item_alone(pipe, images) -> None:
    state = _state(pipe, seed=3)
    batched = _run(pipe, images, state)
    for i in range(3):
        alone = _run(pipe, images[i : i + 1], state[i : i + 1], PROMPTS[i : i + 1],
                     seeds=[7 + i])
        assert alone.actions.shape == (1, pipe.action_horizon, pipe.action_dim)
        np.testing.assert_allclose(batched.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)
    permuted = _run(pipe, images[::-1], state[::-1], PROMPTS[::-1], seeds=(9, 8, 7))
    np.testing.assert_allclose(permuted.actions[::-1], batched.actions, rtol=1e-5, atol=1e-5)


def test_a_recorded_chunk_replays_from_its_noise_and_seed(pipe, images) -> None:
    state = _state(pipe, seed=4)
    out = _run(pipe, images, state)
    replay = _run(pipe, images, state, action_noise=out.action_noise)
    np.testing.assert_allclose(replay.actions, out.actions, rtol=1e-6, atol=1e-6)


def test_state_rows_with_guidance_reach_both_halves(pipe, images) -> None:
    state = _state(pipe, seed=5)
    guided = _run(pipe, images, state, guidance_scale=3.0)
    for i in range(3):
        alone = _run(pipe, images[i : i + 1], state[i : i + 1], PROMPTS[i : i + 1],
                     seeds=[7 + i], guidance_scale=3.0)
        np.testing.assert_allclose(guided.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)


def test_without_statistics_the_state_is_taken_as_given(pipe, images, monkeypatch) -> None:
    bare = Cosmos3ActionPipeline(pipe.transformer, pipe.vae, pipe.tokenizer,
                                 dataclasses.replace(pipe.policy, stats=None))
    state = _state(pipe, seed=6, count=1)
    seen = _capture_first_step(bare, monkeypatch)
    _run(bare, images[:1], state, PROMPTS[:1], seeds=[7])
    h, raw = pipe.history_length, pipe.action_dim
    np.testing.assert_array_equal(seen["actions"][0, :h, :raw].cpu().numpy(), state[0])
    assert torch.all(seen["actions"][0, :h, raw:] == 0)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda h: None, r"conditioned on the robot state.*state=\[3, {h}, 10\]"),
        (lambda h: np.zeros((3, 10), np.float32), r"expected finite float \[3, {h}, 10\]"),
        (lambda h: np.zeros((2, h, 10), np.float32), r"found float32 \[2, {h}, 10\]"),
        (lambda h: np.zeros((3, h, 9), np.float32), r"found float32 \[3, {h}, 9\]"),
        (lambda h: np.full((3, h, 10), np.nan, np.float32),
         r"state: expected finite numbers; found NaN in items \[0, 1, 2\]"),
        (lambda h: np.stack([np.zeros((h, 10)), np.full((h, 10), np.inf),
                             np.zeros((h, 10))]).astype(np.float32),
         r"state: expected finite numbers; found infinity in items \[1\]"),
        (lambda h: np.zeros((3, h, 10), np.int64), "found int64"),
    ],
)
def test_bad_state_is_refused(pipe, images, make, message) -> None:
    h = pipe.history_length
    with pytest.raises(ValueError, match=message.format(h=h)):
        _run(pipe, images, make(h))


def test_a_head_without_state_refuses_one(images, tmp_path) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(write_tiny_checkpoint(tmp_path, seed=2))
    assert pipe.history_length == 0
    with pytest.raises(ValueError, match="takes no state"):
        pipe(images, PROMPTS, state=np.zeros((3, 1, 10), np.float32), progress=False)


def test_stochastic_samplers_refuse_state_rows(pipe, images) -> None:
    with pytest.raises(ValueError, match="does not take state rows"):
        _run(pipe, images, _state(pipe), sampler="flow_sde")


def test_history_length_is_checked() -> None:
    with pytest.raises(ValueError, match=r"history_length: expected an integer from 0 to at "
                                         r"most 64 \(state rows\); found -1"):
        PolicyConfig(history_length=-1)
