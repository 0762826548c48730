"""FlowUniPCScheduler against diffusers' UniPC and the official sigma formula."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import UniPCMultistepScheduler

from cosmos3_gym.pipeline.scheduler import FlowUniPCScheduler, flow_unipc_sigmas

# diffusers' UniPC coefficients are float32 torch scalars, ours float64 Python floats; the runs
# below differ by ~1e-6 at |x| ~ 3. A wrong coefficient or order shows up as ~1e-2 or worse.
PARITY_ATOL = 1e-5


def _diffusers_unipc(num_steps: int, shift: float) -> UniPCMultistepScheduler:
    """diffusers' UniPC configured as the official FlowUniPC, fed the official unshifted grid.

    diffusers applies ``flow_shift`` to custom sigmas itself, so we pass the *unshifted*
    ``linspace(float32(0.999), 0, N+1)[:-1]``. Its "sigmas[0] ≈ 1 → subtract 1e-6" guard does not
    fire (σ_0 ≈ 0.9999), and with ``set_begin_index(0)`` it starts at step 0 like ours, so the
    first step and the lower-order warm-up/final steps match the official algorithm exactly.
    """
    ref = UniPCMultistepScheduler(
        prediction_type="flow_prediction",
        use_flow_sigmas=True,
        flow_shift=shift,
        solver_order=2,
        solver_type="bh2",
        predict_x0=True,
        lower_order_final=True,
        final_sigmas_type="zero",
    )
    unshifted = np.linspace(float(np.float32(0.999)), 0.0, num_steps + 1)[:-1].copy()
    ref.set_timesteps(sigmas=unshifted)
    ref.set_begin_index(0)
    return ref


def _velocity(x: torch.Tensor, sigma: float, x0: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
    """A synthetic, state-dependent velocity field (so the history terms matter)."""
    return (eps - x0) + 0.3 * torch.sin(3.0 * x) * sigma


@pytest.mark.parametrize(("num_steps", "shift"), [(1, 5.0), (2, 3.0), (4, 5.0), (30, 10.0)])
def test_matches_diffusers_unipc_with_the_same_sigmas(num_steps: int, shift: float) -> None:
    ours = FlowUniPCScheduler(num_steps, shift)
    ref = _diffusers_unipc(num_steps, shift)
    assert torch.equal(ours.sigmas, ref.sigmas)
    assert torch.equal(ours.timesteps, ref.timesteps)

    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(2, 4, 3, 5, generator=g)
    eps = torch.randn(2, 4, 3, 5, generator=g)
    x, x_ref = eps.clone(), eps.clone()
    for i in range(num_steps):
        sigma = ours.sigma(i)
        x = ours.step(_velocity(x, sigma, x0, eps), i, x)
        x_ref = ref.step(_velocity(x_ref, sigma, x0, eps), ref.timesteps[i], x_ref).prev_sample
        torch.testing.assert_close(x, x_ref, atol=PARITY_ATOL, rtol=0)


def test_official_sigma_formula_values() -> None:
    sigmas, timesteps = flow_unipc_sigmas(30, 10.0)
    assert timesteps[:4].tolist() == [999, 996, 992, 988]
    assert timesteps[-4:].tolist() == [605, 526, 416, 256]
    assert timesteps.dtype == np.int64
    assert sigmas.dtype == np.float32 and sigmas.shape == (31,) and sigmas[-1] == 0.0
    # Written out: σ = linspace(0.999, 0, N+1)[:-1], shifted, truncated to int64(σ·1000).
    base = np.linspace(0.999, 0.0, 31)[:-1]
    expected = 10.0 * base / (1.0 + 9.0 * base)
    np.testing.assert_allclose(sigmas[:-1], expected, rtol=1e-6)
    sigmas5, _ = flow_unipc_sigmas(30, 5.0)
    assert sigmas5[-2] == pytest.approx(0.147, abs=5e-4)
    assert sigmas[-2] == pytest.approx(0.256, abs=5e-4)


def test_scheduler_exposes_official_timesteps_and_sigmas() -> None:
    sched = FlowUniPCScheduler(30, 5.0)
    assert sched.timesteps.dtype == torch.int64 and sched.timesteps.shape == (30,)
    assert sched.sigmas.dtype == torch.float32 and sched.sigmas.shape == (31,)
    assert ((sched.timesteps >= 0) & (sched.timesteps < 1000)).all()
    assert sched.sigma(0) == pytest.approx(5 * 0.999 / (1 + 4 * 0.999), rel=1e-6)


def test_exact_velocity_field_recovers_x0() -> None:
    # With the true straight-line velocity v = ε − x0, every x0 estimate is exact and the final
    # first-order step lands on x0.
    g = torch.Generator().manual_seed(1)
    x0, eps = torch.randn(3, 7, generator=g), torch.randn(3, 7, generator=g)
    sched = FlowUniPCScheduler(5, 5.0)
    x = (1.0 - sched.sigma(0)) * x0 + sched.sigma(0) * eps  # on the path at σ_0 (≈ 0.9998, not 1)
    for i in range(5):
        x = sched.step(eps - x0, i, x)
    torch.testing.assert_close(x, x0, atol=1e-5, rtol=0)


def test_batched_items_match_single_items() -> None:
    g = torch.Generator().manual_seed(2)
    x0, eps = torch.randn(4, 6, 5, generator=g), torch.randn(4, 6, 5, generator=g)
    batched = FlowUniPCScheduler(6, 10.0)
    x = eps.clone()
    for i in range(6):
        x = batched.step(_velocity(x, batched.sigma(i), x0, eps), i, x)
    for b in range(4):
        single = FlowUniPCScheduler(6, 10.0)
        xb = eps[b : b + 1].clone()
        for i in range(6):
            xb = single.step(_velocity(xb, single.sigma(i), x0[b : b + 1], eps[b : b + 1]), i, xb)
        assert torch.equal(xb, x[b : b + 1])


def test_tuple_step_equals_one_flattened_tensor() -> None:
    # The official code steps one flattened [vision | action] tensor; we step a tuple.
    g = torch.Generator().manual_seed(3)
    vision_x0, vision_eps = torch.randn(2, 4, 2, 3, 3, generator=g), torch.randn(2, 4, 2, 3, 3)
    action_x0, action_eps = torch.randn(2, 8, 6, generator=g), torch.randn(2, 8, 6, generator=g)
    split = FlowUniPCScheduler(5, 5.0)
    joint = FlowUniPCScheduler(5, 5.0)
    v, a = vision_eps.clone(), action_eps.clone()
    flat = torch.cat([vision_eps.flatten(1), action_eps.flatten(1)], dim=1)
    flat_x0 = torch.cat([vision_x0.flatten(1), action_x0.flatten(1)], dim=1)
    flat_eps = flat.clone()
    for i in range(5):
        s = split.sigma(i)
        v, a = split.step(
            (_velocity(v, s, vision_x0, vision_eps), _velocity(a, s, action_x0, action_eps)),
            i,
            (v, a),
        )
        flat = joint.step(_velocity(flat, s, flat_x0, flat_eps), i, flat)
    assert torch.equal(torch.cat([v.flatten(1), a.flatten(1)], dim=1), flat)


def test_step_does_not_modify_inputs_and_reset_restarts() -> None:
    sched = FlowUniPCScheduler(3, 5.0)
    x = torch.randn(2, 3)
    v = torch.randn(2, 3)
    x_copy, v_copy = x.clone(), v.clone()
    first = sched.step(v, 0, x)
    assert torch.equal(x, x_copy) and torch.equal(v, v_copy)
    sched.reset()
    assert torch.equal(sched.step(v, 0, x), first)


def test_out_of_order_step_is_rejected() -> None:
    sched = FlowUniPCScheduler(3, 5.0)
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="step_index: expected 0 .* got 1"):
        sched.step(x, 1, x)
    sched.step(x, 0, x)
    with pytest.raises(ValueError, match="step_index: expected 1 .* got 0"):
        sched.step(x, 0, x)


def test_shape_and_count_mismatches_are_rejected() -> None:
    sched = FlowUniPCScheduler(3, 5.0)
    with pytest.raises(ValueError, match=r"velocity shape \(2, 3\) != sample shape \(2, 4\)"):
        sched.step(torch.zeros(2, 3), 0, torch.zeros(2, 4))
    sched.step((torch.zeros(2), torch.zeros(3)), 0, (torch.zeros(2), torch.zeros(3)))
    with pytest.raises(ValueError, match=r"expected 2 tensor\(s\) per step .* got 1"):
        sched.step(torch.zeros(2), 1, torch.zeros(2))
    with pytest.raises(ValueError, match="one velocity per sample tensor, got 1 velocities for 2"):
        sched.step((torch.zeros(2),), 1, (torch.zeros(2), torch.zeros(3)))


@pytest.mark.parametrize(("steps", "shift"), [(0, 5.0), (3, 0.0), (3, float("nan"))])
def test_bad_schedule_arguments_are_rejected(steps: int, shift: float) -> None:
    with pytest.raises(ValueError, match="expected"):
        FlowUniPCScheduler(steps, shift)
