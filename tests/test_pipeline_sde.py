"""Stochastic action steps (pipeline/sde.py): the Gaussian step, its log-probability recorded at
sampling time and recomputed under the weights, and the deterministic sampler left as it was."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3_gym.model import Cosmos3Transformer
from cosmos3_gym.pipeline import Cosmos3ActionPipeline, chunk_log_prob
from cosmos3_gym.pipeline.scheduler import FlowUniPCScheduler
from cosmos3_gym.pipeline.sde import StochasticActionSampler, StochasticSampling


@pytest.fixture(scope="module")
def pipe(checkpoint: Path) -> Cosmos3ActionPipeline:
    return Cosmos3ActionPipeline.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def trainable(checkpoint: Path) -> Cosmos3Transformer:
    """The same weights, unfused and with gradients: what a learner scores chunks with."""
    return Cosmos3Transformer.from_pretrained(checkpoint / "transformer").requires_grad_(True)


def _inputs(n: int, seed: int = 0) -> tuple[np.ndarray, list[str]]:
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 255, (n, 128, 128, 3), dtype=np.uint8)
    colors = ["red", "green", "blue", "yellow"]
    return images, [f"reach the {colors[k % 4]} target" for k in range(n)]


def test_default_sampler_is_flow_unipc_byte_for_byte(pipe) -> None:
    images, prompts = _inputs(3)
    default = pipe(images, prompts, seed=[1, 2, 3], progress=False)
    explicit = pipe(images, prompts, seed=[1, 2, 3], progress=False, sampler="flow_unipc",
                    noise_level=0.9, sde_steps="all", executed_actions=1)
    assert default.actions.tobytes() == explicit.actions.tobytes()
    assert default.stochastic is None and explicit.stochastic is None
    sde = pipe(images, prompts, seed=[1, 2, 3], progress=False, sampler="flow_sde")
    assert not np.array_equal(sde.actions, default.actions)


def test_scheduler_restarted_at_a_step_runs_from_there_as_from_step_zero() -> None:
    full = FlowUniPCScheduler(6, 3.0)
    late = FlowUniPCScheduler(6, 3.0, first_step=2)
    assert late._predictors[2].c_d == 0.0 and late._correctors[2] is None  # first order, fresh
    assert late._predictors[4] == full._predictors[4]  # two steps in: the usual coefficients
    x = torch.randn(2, 3)
    for i in range(2, 6):  # a model whose x0 estimate is 0 lands on 0
        x = late.step(x / late.sigma(i), i, x)
    assert float(x.abs().max()) < 1e-5
    with pytest.raises(ValueError, match="expected 2"):
        FlowUniPCScheduler(6, 3.0, first_step=2).step(x, 0, x)


@pytest.mark.parametrize("sampler", ["flow_sde", "flow_cps"])
def test_stochastic_step_samples_are_distributed_as_its_log_prob_says(sampler: str) -> None:
    """10,000 draws: the standardised residuals of the Gaussian step around the mean and std
    derived independently here have mean 0 and variance 1 within 4-sigma intervals, and the
    recorded log-probability is the Gaussian density of exactly those residuals."""
    b, horizon, width, raw, steps, shift = 1250, 4, 8, 2, 4, 2.0
    settings = StochasticSampling(sampler, 0.7, (1,))
    sched = FlowUniPCScheduler(steps, shift)
    sampler_ = StochasticActionSampler(sched, settings, list(range(b)), horizon=horizon,
                                       action_dim=width, raw_action_dim=raw)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, horizon, width, generator=gen)
    x[..., raw:] = 0.0
    vision = torch.randn(b, 3, 2, 2, 2, generator=gen)
    x_in = None
    for i in range(steps):
        v = torch.tanh(x) + 0.3  # any velocity will do
        v[..., raw:] = 0.0
        if i == 1:
            x_in, v_in = x.clone(), v.clone()
        _, x = sampler_.step((torch.zeros_like(vision), v), i, (vision, x))
        if i == 1:
            x_out = x.clone()
    s, s_next = sched.sigma(1), sched.sigma(2)
    x0, eps = x_in - s * v_in, x_in + (1 - s) * v_in
    if sampler == "flow_sde":
        g2 = 0.49 * s / (1 - s)
        mean = (1 - s_next) * x0 + (s_next - g2 * (s - s_next) / (2 * s)) * eps
        std = math.sqrt(g2 * (s - s_next))
    else:
        mean = (1 - s_next) * x0 + s_next * math.cos(0.35 * math.pi) * eps
        std = s_next * math.sin(0.35 * math.pi)
    z = ((x_out - mean) / std)[..., :raw].double().flatten()
    n = z.numel()
    assert n == 10_000
    assert abs(float(z.mean())) < 4 / math.sqrt(n)
    assert abs(float(z.var()) - 1.0) < 4 * math.sqrt(2 / n)
    assert float(x_out[..., raw:].abs().max()) == 0.0  # padding channels carry no noise
    record = sampler_.record([(128, 128)] * b)
    expected = (-0.5 * z.view(b, -1) ** 2 - math.log(std) - 0.5 * math.log(2 * math.pi)).sum(1)
    np.testing.assert_allclose(record["sde_log_prob"], expected.numpy(), rtol=1e-5, atol=1e-4)
    np.testing.assert_array_equal(record["sde_actions_before"][:, 0], x_in.numpy())
    np.testing.assert_array_equal(record["sde_actions_after"][:, 0], x_out.numpy())


@pytest.mark.parametrize(("sampler", "sde_steps", "guidance"), [
    ("flow_sde", "random", 1.0), ("flow_sde", "all", 1.0), ("flow_cps", (2, 3), 1.0),
    ("flow_sde", "random", 2.0), ("flow_sde", "random-but-last", 1.0),
])
def test_recomputed_log_probs_equal_the_recorded_ones(pipe, trainable, sampler, sde_steps,
                                                      guidance) -> None:
    images, prompts = _inputs(6)
    out = pipe(images, prompts, seed=list(range(10, 16)), progress=False, sampler=sampler,
               sde_steps=sde_steps, guidance_scale=guidance, executed_actions=3)
    record = out.stochastic
    log_prob = chunk_log_prob(pipe, record, prompts, model=trainable)
    assert log_prob.dtype == torch.float32 and log_prob.requires_grad
    np.testing.assert_allclose(log_prob.detach().numpy(), record.log_prob, rtol=0, atol=1e-5)
    # Another batch (two rows alone) scores them the same.
    rows = [4, 1]
    part = chunk_log_prob(pipe, record.take(rows), [prompts[r] for r in rows], model=trainable)
    np.testing.assert_allclose(part.detach().numpy(), record.log_prob[rows], rtol=0, atol=1e-5)
    log_prob.sum().backward()
    grads = [p.grad for p in trainable.parameters() if p.grad is not None]
    assert grads and any(float(g.abs().sum()) > 0 for g in grads)
    trainable.zero_grad(set_to_none=True)
    # Per step (--ratio step): one column per stochastic step, each the score of a record that
    # kept that step alone; together the chunk's.
    steps = chunk_log_prob(pipe, record, prompts, model=trainable, per_step=True).detach()
    assert steps.shape == record.steps.shape
    np.testing.assert_allclose(steps.sum(1).numpy(), record.log_prob, rtol=0, atol=1e-5)
    for k in range(record.steps.shape[1]):
        alone = dataclasses.replace(record, **{
            name: getattr(record, name)[:, k : k + 1] for name in (
                "steps", "sigmas", "timesteps", "vision", "actions_before", "actions_after")})
        np.testing.assert_allclose(
            steps[:, k].numpy(), chunk_log_prob(pipe, alone, prompts).detach().numpy(),
            rtol=0, atol=1e-5)


def test_log_prob_counts_the_executed_actions_and_real_dims_only(pipe, trainable) -> None:
    images, prompts = _inputs(2)
    out = pipe(images, prompts, seed=[3, 4], progress=False, sampler="flow_sde",
               executed_actions=2)
    record = out.stochastic
    raw = pipe.policy.raw_action_dim
    assert record.action_mask[:, :2, :raw].all() and not record.action_mask[:, 2:].any()
    assert not record.action_mask[:, :, raw:].any()
    moved = record.take([0, 1])
    moved.actions_after[:, :, 2:, :raw] += 5.0  # unexecuted rows: no effect
    with torch.no_grad():
        same = chunk_log_prob(pipe, moved, prompts, model=trainable)
        moved.actions_after[:, :, 0, 0] += 0.5  # an executed action: lower density
        lower = chunk_log_prob(pipe, moved, prompts, model=trainable)
    np.testing.assert_allclose(same.numpy(), record.log_prob, atol=1e-5)
    assert (lower.numpy() < record.log_prob).all()


def test_random_but_last_draws_every_step_but_the_narrowest() -> None:
    """``random-but-last`` (RLinf's ignore_last) draws one step per chunk from all but the last,
    whose Gaussian is the narrowest; flow_cps's ``random`` never takes that step anyway."""
    seeds = range(400)
    drawn = {name: [StochasticSampling("flow_sde", 0.5, name).steps_for(s, 8) for s in seeds]
             for name in ("random", "random-but-last")}
    assert sorted({k for (k,) in drawn["random"]}) == list(range(8))
    assert sorted({k for (k,) in drawn["random-but-last"]}) == list(range(7))
    for s in seeds:
        assert (StochasticSampling("flow_cps", 0.5, "random-but-last").steps_for(s, 8)
                == StochasticSampling("flow_cps", 0.5, "random").steps_for(s, 8))
    with pytest.raises(ValueError, match="random-but-last needs at least 2 denoising steps"):
        StochasticSampling("flow_sde", 0.5, "random-but-last").steps_for(0, 1)


def test_a_pipeline_call_under_random_but_last_records_no_last_step(pipe) -> None:
    images, prompts = _inputs(16)
    out = pipe(images, prompts, seed=list(range(16)), progress=False, sampler="flow_sde",
               sde_steps="random-but-last")
    steps = out.stochastic.steps
    last = pipe.policy.num_inference_steps - 1
    assert steps.shape == (16, 1) and steps.min() >= 0 and steps.max() < last
    assert out.stochastic.settings["sde_steps"] == "random-but-last"


def test_stochastic_chunks_are_reproducible_from_their_seeds(pipe) -> None:
    images, prompts = _inputs(3)
    a = pipe(images, prompts, seed=[7, 8, 9], progress=False, sampler="flow_sde")
    b = pipe(images[::-1].copy(), prompts[::-1], seed=[9, 8, 7], progress=False,
             sampler="flow_sde")
    np.testing.assert_array_equal(a.actions, b.actions[::-1])
    np.testing.assert_array_equal(a.stochastic.steps, b.stochastic.steps[::-1])
    np.testing.assert_array_equal(a.stochastic.log_prob, b.stochastic.log_prob[::-1])
    assert a.stochastic.weights == b.stochastic.weights
    assert a.stochastic.settings["sampler"] == "flow_sde"
    c = pipe(images, prompts, seed=[17, 18, 19], progress=False, sampler="flow_sde")
    assert not np.array_equal(a.actions, c.actions)


def test_step_noise_seeds_change_the_scored_draws_alone(pipe, trainable) -> None:
    """Items that share a seed and differ in their step-noise seeds share the start noise, the
    stochastic step and the state before it, and differ only in the Gaussian draw; a step-noise
    seed equal to the item's seed is the default; the recorded log-probabilities recompute."""
    images, prompts = _inputs(1)
    images, prompts = np.repeat(images, 3, axis=0), prompts * 3
    out = pipe(images, prompts, seed=[5, 5, 5], step_noise_seed=[5, 40, 41], progress=False,
               sampler="flow_sde")
    default = pipe(images[:1], prompts[:1], seed=[5], progress=False, sampler="flow_sde")
    # (other batch sizes: equal to float rounding)
    np.testing.assert_allclose(out.actions[:1], default.actions, rtol=0, atol=1e-5)
    np.testing.assert_allclose(out.stochastic.log_prob[:1], default.stochastic.log_prob,
                               rtol=0, atol=1e-4)
    sde = out.stochastic
    assert (sde.steps == sde.steps[0]).all()
    np.testing.assert_array_equal(out.action_noise[1:], out.action_noise[[0, 0]])
    np.testing.assert_array_equal(sde.actions_before[1:], sde.actions_before[[0, 0]])
    assert not np.array_equal(sde.actions_after[1], sde.actions_after[0])
    assert not np.array_equal(out.actions[1], out.actions[2])
    again = pipe(images[:1], prompts[:1], seed=[5], step_noise_seed=[41], progress=False,
                 sampler="flow_sde")
    np.testing.assert_allclose(again.actions[0], out.actions[2], rtol=0, atol=1e-5)
    scored = chunk_log_prob(pipe, sde, prompts, model=trainable).detach()
    np.testing.assert_allclose(scored.numpy(), sde.log_prob, rtol=0, atol=1e-5)


def test_step_noise_seeds_are_refused_where_nothing_draws_them(pipe) -> None:
    images, prompts = _inputs(2)
    with pytest.raises(ValueError, match="only a stochastic sampler"):
        pipe(images, prompts, step_noise_seed=[1, 2], progress=False)
    with pytest.raises(ValueError, match=r"step_noise_seed: expected one int or 2 ints"):
        pipe(images, prompts, step_noise_seed=[1], progress=False, sampler="flow_sde")
    with pytest.raises(ValueError, match="one int per item"):
        pipe(images, prompts, step_noise_seed=3, progress=False, sampler="flow_sde")


def test_video_tokens_take_the_deterministic_steps(pipe) -> None:
    """With the last step stochastic, every earlier state is the deterministic run's, so the
    predicted video (the video tokens after the last FlowUniPC step) is unchanged."""
    images, prompts = _inputs(2)
    last = pipe.policy.num_inference_steps - 1
    det = pipe(images, prompts, seed=[1, 2], progress=False, return_video=True)
    sde = pipe(images, prompts, seed=[1, 2], progress=False, return_video=True,
               sampler="flow_sde", sde_steps=(last,))
    for u, v in zip(det.video, sde.video, strict=True):
        np.testing.assert_array_equal(u, v)
    assert not np.array_equal(det.actions, sde.actions)


def test_weights_hash_follows_the_weights(pipe) -> None:
    images, prompts = _inputs(1)
    before = pipe(images, prompts, progress=False, sampler="flow_sde").stochastic.weights
    param = pipe.transformer.action_modality_embed
    with torch.no_grad():
        param.add_(1.0)
        changed = pipe(images, prompts, progress=False, sampler="flow_sde").stochastic.weights
        param.sub_(1.0)
    assert changed != before


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"sampler": "ddim"}, "sampler"),
    ({"sampler": "flow_sde", "noise_level": 0.0}, "noise_level"),
    ({"sampler": "flow_cps", "noise_level": 1.0}, "noise_level"),
    ({"sampler": "flow_sde", "sde_steps": (99,)}, "sde_steps"),
    ({"sampler": "flow_cps", "sde_steps": (7,)}, "sde_steps"),  # its last step has no noise
    ({"sampler": "flow_sde", "sde_steps": "some"}, "sde_steps"),
    ({"sampler": "flow_sde", "sde_steps": "random-but-last", "num_inference_steps": 1},
     "at least 2 denoising steps"),
    ({"sampler": "flow_sde", "executed_actions": 0}, "executed_actions"),
])
def test_bad_sampler_arguments_are_refused(pipe, kwargs, message) -> None:
    images, prompts = _inputs(1)
    with pytest.raises(ValueError, match=message):
        pipe(images, prompts, progress=False, **kwargs)
