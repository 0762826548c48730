"""Real-time chunking's committed rows: the actions an env executes while its next chunk is
computed enter the call as clean leading action rows (after any state rows), the way the state
rows do, and come back exactly as given."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.tiny import write_tiny_checkpoint

PROMPTS = ["pick up the red bowl", "open the top drawer and put the bowl inside", "go"]
STEPS = 3


@pytest.fixture(scope="module", params=[0, 1], ids=["no_state", "state_row"])
def pipe(request, tmp_path_factory):
    root = write_tiny_checkpoint(tmp_path_factory.mktemp("rtc"), seed=3,
                                 policy_overrides={"history_length": request.param})
    return Cosmos3ActionPipeline.from_pretrained(root)


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(5).integers(0, 256, size=(3, 64, 128, 3), dtype=np.uint8)


def _state(pipe, count: int = 3):
    if not pipe.history_length:
        return None
    return np.random.default_rng(1).uniform(
        -0.4, 0.6, (count, pipe.history_length, pipe.action_dim)).astype(np.float32)


def _committed(pipe, counts, seed: int = 0) -> list:
    rng = np.random.default_rng(seed)
    return [None if c is None else rng.uniform(-0.5, 0.5, (c, pipe.action_dim)).astype(np.float32)
            for c in counts]


def _run(pipe, images, committed=None, prompts=PROMPTS, seeds=(7, 8, 9), state=None, **kw):
    return pipe(images, prompts, seed=list(seeds), num_inference_steps=STEPS, progress=False,
                committed_actions=committed, state=state, **kw)


def test_committed_rows_are_clean_conditioning_and_come_back_exactly(pipe, images,
                                                                     monkeypatch) -> None:
    s, horizon = pipe.history_length, pipe.action_horizon
    counts = [0, 1, horizon - 1]
    committed = _committed(pipe, counts)
    seen = {}
    forward = pipe.transformer.forward_gen

    def recording(text, layout, vision, vision_noisy, actions, action_noisy, *args, **kwargs):
        seen.setdefault("action_noisy", action_noisy.clone())
        return forward(text, layout, vision, vision_noisy, actions, action_noisy, *args, **kwargs)

    monkeypatch.setattr(pipe.transformer, "forward_gen", recording)
    out = _run(pipe, images, committed, state=_state(pipe))
    expected = np.array([[False] * s + [False] * c + [True] * (horizon - c) for c in counts])
    np.testing.assert_array_equal(seen["action_noisy"].cpu().numpy(), expected)
    for k, c in enumerate(counts):
        np.testing.assert_array_equal(out.actions[k, :c], committed[k])  # bit for bit


def test_no_committed_rows_change_nothing(pipe, images) -> None:
    state = _state(pipe)
    plain = _run(pipe, images, None, state=state)
    empty = _run(pipe, images, [None, np.zeros((0, pipe.action_dim), np.float32), None],
                 state=state)
    np.testing.assert_array_equal(empty.actions, plain.actions)
    np.testing.assert_array_equal(empty.action_noise, plain.action_noise)


def test_the_chunk_follows_its_committed_rows_and_batches_as_alone(pipe, images) -> None:
    state = _state(pipe)
    counts = [2, None, 1]
    committed = _committed(pipe, counts, seed=1)
    batched = _run(pipe, images, committed, state=state)
    other = _run(pipe, images, _committed(pipe, counts, seed=2), state=state)
    assert np.abs(batched.actions[0, 2:] - other.actions[0, 2:]).max() > 1e-4  # they condition
    for i in range(3):
        alone = _run(pipe, images[i:i + 1], [committed[i]], PROMPTS[i:i + 1], seeds=[7 + i],
                     state=None if state is None else state[i:i + 1])
        np.testing.assert_allclose(batched.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)


def test_guided_calls_condition_both_halves(pipe, images) -> None:
    state = _state(pipe)
    committed = _committed(pipe, [1, 3, None], seed=3)
    guided = _run(pipe, images, committed, state=state, guidance_scale=3.0)
    for i in range(3):
        alone = _run(pipe, images[i:i + 1], [committed[i]], PROMPTS[i:i + 1], seeds=[7 + i],
                     state=None if state is None else state[i:i + 1], guidance_scale=3.0)
        np.testing.assert_allclose(guided.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)
    for k, rows in enumerate(committed[:2]):
        np.testing.assert_array_equal(guided.actions[k, :len(rows)], rows)


@pytest.mark.parametrize(("rows", "message"), [
    (lambda h, d: [np.zeros((h, d), np.float32)] * 3, r"C < H=4"),
    (lambda h, d: [np.zeros((1, d + 1), np.float32)] * 3, r"found float32 \[1, 11\]"),
    (lambda h, d: [np.full((1, d), np.nan, np.float32)] * 3, "finite"),
    (lambda h, d: [np.zeros((1, d), np.int64)] * 3, "found int64"),
    (lambda h, d: [None, None], r"one entry per item \(3\); found 2"),
])
def test_bad_committed_rows_are_refused(pipe, images, rows, message) -> None:
    with pytest.raises(ValueError, match=message):
        _run(pipe, images, rows(pipe.action_horizon, pipe.action_dim), state=_state(pipe))


def test_stochastic_samplers_refuse_committed_rows(pipe, images) -> None:
    if pipe.history_length:
        pytest.skip("refused for the state rows already")
    with pytest.raises(ValueError, match="does not take committed action rows"):
        _run(pipe, images, _committed(pipe, [1, 1, 1]), sampler="flow_sde")
