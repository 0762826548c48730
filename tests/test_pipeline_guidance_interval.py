"""Classifier-free guidance on chosen steps only (cosmos-framework's guidance_interval)."""

from __future__ import annotations

import numpy as np
import pytest

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.pipeline.scheduler import flow_unipc_sigmas
from cosmos3_gym.pipeline.stages import SamplingParams
from cosmos3_gym.tiny import write_tiny_checkpoint

PROMPTS = ["pick up the red bowl", "open the top drawer and put the bowl inside", "go"]
STEPS = 4
SHIFT = 5.0


@pytest.fixture(scope="module")
def pipe(tmp_path_factory):
    return Cosmos3ActionPipeline.from_pretrained(
        write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=1)
    )


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(1).integers(0, 256, size=(3, 64, 128, 3), dtype=np.uint8)


def _run(pipe, images, **kwargs):
    call = {"seed": [4, 5, 6], "num_inference_steps": STEPS, "flow_shift": SHIFT,
            "progress": False, **kwargs}
    return pipe(images, PROMPTS, **call)


def _forward_rows(pipe, monkeypatch) -> list[tuple[int, list[int]]]:
    """Record, per GEN forward, its row count and the prompt lengths of its text rows."""
    calls: list[tuple[int, list[int]]] = []
    forward = pipe.transformer.forward_gen

    def recording(text, layout, vision, *args, **kwargs):
        calls.append((vision.shape[0], text.lengths.tolist()))
        return forward(text, layout, vision, *args, **kwargs)

    monkeypatch.setattr(pipe.transformer, "forward_gen", recording)
    return calls


def test_steps_are_chosen_by_their_timestep_strictly_inside_the_interval() -> None:
    _, timesteps = flow_unipc_sigmas(STEPS, SHIFT)
    assert timesteps.tolist() == [999, 937, 833, 624]

    def guided(interval, guidance=3.0):
        return SamplingParams(STEPS, guidance, SHIFT, False,
                              guidance_interval=interval).guided_steps()

    # The Edge-Policy-DROID launch interval guides the first step only: NVIDIA's [2, 1, 1, 1].
    assert guided((960, 1001)) == (True, False, False, False)
    assert guided((999, 1001)) == (False,) * 4  # t_lo < t: 999 itself is outside
    assert guided((998, 1000)) == (True, False, False, False)
    assert guided((600, 900)) == (False, False, True, True)
    assert guided(None) == (True,) * 4
    assert guided((960, 1001), guidance=1.0) == (False,) * 4  # no guidance, no interval


def test_an_interval_covering_every_step_equals_guidance_on_every_step(pipe, images) -> None:
    everywhere = _run(pipe, images, guidance_scale=3.0)
    covering = _run(pipe, images, guidance_scale=3.0, guidance_interval=(-1.0, 1001.0))
    np.testing.assert_array_equal(covering.actions, everywhere.actions)


def test_an_interval_covering_no_step_equals_guidance_one(pipe, images, monkeypatch) -> None:
    unguided = _run(pipe, images, guidance_scale=1.0)
    rows = _forward_rows(pipe, monkeypatch)
    outside = _run(pipe, images, guidance_scale=3.0, guidance_interval=(1001.0, 2000.0))
    np.testing.assert_array_equal(outside.actions, unguided.actions)
    assert [r for r, _ in rows] == [3] * STEPS  # and the negative prompts were never run


def test_guided_steps_batch_the_unconditional_rows_and_the_others_run_alone(
    pipe, images, monkeypatch
) -> None:
    everywhere = _run(pipe, images, guidance_scale=3.0)
    unguided = _run(pipe, images, guidance_scale=1.0)
    rows = _forward_rows(pipe, monkeypatch)
    first = _run(pipe, images, guidance_scale=3.0, guidance_interval=(960.0, 1001.0))
    assert [r for r, _ in rows] == [6, 3, 3, 3]
    cond_lengths = rows[1][1]
    assert rows[0][1][:3] == cond_lengths  # the conditional half of the guided batch
    assert all(length < min(cond_lengths) for length in rows[0][1][3:])  # "" negative prompts
    assert all(lengths == cond_lengths for _, lengths in rows[1:])
    for other in (everywhere, unguided):
        assert np.abs(first.actions - other.actions).max() > 1e-4


def test_a_guided_interval_batch_equals_its_items_alone(pipe, images) -> None:
    batched = _run(pipe, images, guidance_scale=3.0, guidance_interval=(900.0, 1001.0))
    for i in range(3):
        alone = pipe(images[i : i + 1], PROMPTS[i], seed=[4 + i], num_inference_steps=STEPS,
                     flow_shift=SHIFT, guidance_scale=3.0, guidance_interval=(900.0, 1001.0),
                     progress=False)
        np.testing.assert_allclose(batched.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("interval", [(900.0, 100.0), (1.0,), "first", (0.0, float("nan"))])
def test_a_malformed_interval_is_refused(pipe, images, interval) -> None:
    with pytest.raises(ValueError, match="guidance_interval"):
        _run(pipe, images, guidance_scale=3.0, guidance_interval=interval)


def test_a_stochastic_sampler_refuses_an_interval_it_could_not_score(pipe, images) -> None:
    with pytest.raises(ValueError, match="does not take a guidance interval"):
        _run(pipe, images, guidance_scale=3.0, guidance_interval=(960.0, 1001.0),
             sampler="flow_sde")
