"""FlowUniPC: the multistep sampler Cosmos3 (and Wan) use for flow-matching inference.

The official cosmos-framework sampler (``FlowUniPCMultistepScheduler``, ``solver_order=2``,
``solver_type="bh2"``, ``predict_x0=True``) on the official sigma grid, written for a batched
hot path: every coefficient a Python float computed once, an explicit step index, element-wise
updates (a batch gets what each item gets alone). The model predicts ``v ≈ ε − x0``.

Its differences from the official code (explicit indexing, float64 coefficients): docs/pipeline.md,
"The sampler: FlowUniPC".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

# The official scheduler derives σ_max from its 1000-step training grid (1 − 1/1000) stored as
# float32, so the first inference sigma starts from float32(0.999), not from the literal 0.999.
_NUM_TRAIN_TIMESTEPS = 1000
_SIGMA_MAX = float(np.float32(1.0 - 1.0 / _NUM_TRAIN_TIMESTEPS))


def flow_unipc_sigmas(num_inference_steps: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Return the official ``(sigmas [N+1] float32, timesteps [N] int64)`` for FlowUniPC.

    ``sigmas[-1]`` is 0 (``final_sigmas_type="zero"``). Timesteps are truncated, not rounded,
    because the official ``set_timesteps`` casts ``σ·1000`` with ``dtype=int64``.
    """
    if not isinstance(num_inference_steps, int) or num_inference_steps < 1:
        raise ValueError(f"num_inference_steps: expected an int >= 1, got {num_inference_steps!r}")
    if not (isinstance(shift, (int, float)) and math.isfinite(shift) and shift > 0):
        raise ValueError(f"shift: expected a finite number > 0, got {shift!r}")
    sigmas = np.linspace(_SIGMA_MAX, 0.0, num_inference_steps + 1)[:-1]  # [N] float64
    sigmas = shift * sigmas / (1.0 + (shift - 1.0) * sigmas)
    timesteps = (sigmas * _NUM_TRAIN_TIMESTEPS).astype(np.int64)  # [N], truncation
    sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)  # [N+1]
    return sigmas, timesteps


def _lambda(sigma: float) -> float:
    """Half log-SNR of the flow path ``x_σ = (1−σ)·x0 + σ·ε``: ``log((1−σ)/σ)``."""
    return math.log(1.0 - sigma) - math.log(sigma)


@dataclass(frozen=True)
class _Predictor:
    """``x_next = c_x·x + c_m0·m0 + c_d·(m_prev − m0)`` (UniP-bh2, order 1 or 2)."""

    c_x: float
    c_m0: float
    c_d: float  # 0 for order 1


@dataclass(frozen=True)
class _Corrector:
    """``x_corr = c_x·x_last + c_m0·m0 + c_t·(m_t − m0) + c_d·(m_prev − m0)`` (UniC-bh2)."""

    c_x: float
    c_m0: float
    c_t: float
    c_d: float  # 0 when the corrector runs at order 1


def _bh2_terms(sigma_t: float, sigma_s0: float) -> tuple[float, float, float]:
    """Return ``(h, hh, expm1(hh))`` for a step from ``sigma_s0`` to ``sigma_t`` (predict_x0)."""
    if sigma_t == 0.0:
        # λ_t = +inf, so hh = −inf and expm1(hh) = −1: the step lands on the x0 estimate.
        return math.inf, -math.inf, -1.0
    h = _lambda(sigma_t) - _lambda(sigma_s0)
    hh = -h
    return h, hh, math.expm1(hh)


def _predictor(sigmas: np.ndarray, i: int, order: int) -> _Predictor:
    sigma_s0 = float(sigmas[i])
    sigma_t = float(sigmas[i + 1])
    alpha_t = 1.0 - sigma_t
    h, _, h_phi_1 = _bh2_terms(sigma_t, sigma_s0)
    b_h = h_phi_1  # bh2: B(h) = expm1(hh)
    c_x = sigma_t / sigma_s0
    c_m0 = -alpha_t * h_phi_1
    c_d = 0.0
    if order == 2:
        # Official UniP order 2 uses the fixed ρ = 0.5 on D1 = (m_prev − m0) / r1.
        r1 = (_lambda(float(sigmas[i - 1])) - _lambda(sigma_s0)) / h
        c_d = -alpha_t * b_h * 0.5 / r1
    return _Predictor(c_x=c_x, c_m0=c_m0, c_d=c_d)


def _corrector(sigmas: np.ndarray, i: int, order: int) -> _Corrector:
    """UniC at step ``i`` corrects the sample at ``σ_i`` that the predictor of step ``i−1`` made."""
    sigma_t = float(sigmas[i])
    sigma_s0 = float(sigmas[i - 1])
    alpha_t = 1.0 - sigma_t
    h, hh, h_phi_1 = _bh2_terms(sigma_t, sigma_s0)
    b_h = h_phi_1
    c_x = sigma_t / sigma_s0
    c_m0 = -alpha_t * h_phi_1
    if order == 1:
        rho_t, rho_d = 0.5, 0.0
    else:
        # Solve R·ρ = b with R = [[1, 1], [r1, 1]] and b_k = k!·φ_{k+1}(hh)/B(h), the official
        # order-2 UniC system, in closed form.
        r1 = (_lambda(float(sigmas[i - 2])) - _lambda(sigma_s0)) / h
        h_phi_k = h_phi_1 / hh - 1.0
        b0 = h_phi_k * 1.0 / b_h
        h_phi_k = h_phi_k / hh - 1.0 / 2.0
        b1 = h_phi_k * 2.0 / b_h
        rho_d = (b0 - b1) / (1.0 - r1)
        rho_t = b0 - rho_d
        rho_d = rho_d / r1  # fold D1 = (m_prev − m0) / r1 into the coefficient
    scale = -alpha_t * b_h
    return _Corrector(c_x=c_x, c_m0=c_m0, c_t=scale * rho_t, c_d=scale * rho_d)


class FlowUniPCScheduler:
    """Official Cosmos3 FlowUniPC (order 2, bh2, x0-predicting) with a precomputed schedule.

    One instance serves one denoising run. It keeps the history UniPC needs (the last two x0
    estimates and the last sample) for each tensor it steps; call :meth:`reset` (or make a new
    instance) before the next run.

    Several tensors can share the schedule (e.g. the vision latent ``[B, 48, T, h, w]`` and the
    action latent ``[B, H, 64]``): pass tuples of velocities and samples to :meth:`step`, always
    in the same order and count. That equals stepping each tensor with its own scheduler copy
    (sglang's deep-copy) and stepping one flattened ``[vision | action]`` tensor (the official
    code), because every operation is element-wise with scalar coefficients.

    Example:
        >>> import torch
        >>> sched = FlowUniPCScheduler(num_inference_steps=4, shift=5.0)
        >>> x = torch.randn(2, 3)
        >>> for i in range(sched.num_inference_steps):
        ...     v = x / sched.sigma(i)  # a model whose x0 estimate is 0: x = σ·ε, v = ε − x0
        ...     x = sched.step(v, i, x)
        >>> bool(x.abs().max() < 1e-5)
        True
    """

    def __init__(self, num_inference_steps: int, shift: float, first_step: int = 0) -> None:
        sigmas, timesteps = flow_unipc_sigmas(num_inference_steps, shift)
        n = num_inference_steps
        if isinstance(first_step, bool) or not isinstance(first_step, int) or not (
            0 <= first_step < n
        ):
            raise ValueError(f"first_step: expected an int in 0..{n - 1}, got {first_step!r}")
        self.num_inference_steps = num_inference_steps
        self.shift = float(shift)
        # The step this run starts at, from a sample at sigmas[first_step] with no history (a
        # stochastic step handed the sample over: cosmos3_gym.pipeline.sde). Steps before it
        # are not this run's; 0 is the whole schedule.
        self.first_step = first_step
        self.sigmas = torch.from_numpy(sigmas)  # [N+1] float32, last = 0
        self.timesteps = torch.from_numpy(timesteps)  # [N] int64, what the model is fed
        self._sigmas = [float(s) for s in sigmas]
        k = first_step
        # lower_order_final: the last step is first order; warm-up: step i has ≤ i − k
        # previous x0s.
        self._orders = [min(2, n - i, i - k + 1) if i >= k else 0 for i in range(n)]
        self._predictors = [
            _predictor(sigmas, i, self._orders[i]) if i >= k else None for i in range(n)
        ]
        # The corrector at step i reuses the order of the predictor that produced its sample.
        self._correctors: list[_Corrector | None] = [
            _corrector(sigmas, i, self._orders[i - 1]) if i > k else None for i in range(n)
        ]
        self.reset()

    def reset(self) -> None:
        """Forget the history so the instance can run a new trajectory."""
        self._next_index = self.first_step
        self._num_tensors: int | None = None
        self._x0_history: list[list[torch.Tensor]] = []  # per tensor: [m_{i-2}?, m_{i-1}]
        self._last_samples: list[torch.Tensor] = []

    def sigma(self, step_index: int) -> float:
        """Noise level ``σ`` of the sample that step ``step_index`` receives."""
        return self._sigmas[step_index]

    def step(
        self,
        velocity: torch.Tensor | Sequence[torch.Tensor],
        step_index: int,
        sample: torch.Tensor | Sequence[torch.Tensor],
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Advance ``sample`` from ``σ_i`` to ``σ_{i+1}`` given the model velocity at ``σ_i``.

        Args:
            velocity: model output ``v`` at ``sigmas[step_index]``, same shape as ``sample``
                (any shape), or a tuple of such tensors.
            step_index: ``0 .. num_inference_steps−1``, called in order.
            sample: current state ``x_σ`` (or a tuple, matching ``velocity``).

        Returns:
            The next state, a tensor or a tuple of tensors matching ``sample``. Inputs are not
            modified; the returned tensors are new.
        """
        single = isinstance(sample, torch.Tensor)
        velocities = (velocity,) if isinstance(velocity, torch.Tensor) else tuple(velocity)
        samples = (sample,) if single else tuple(sample)
        self._check_step(velocities, step_index, samples)

        first = step_index == self.first_step
        if first:
            self._num_tensors = len(samples)
        sigma = self._sigmas[step_index]
        predictor = self._predictors[step_index]
        corrector = self._correctors[step_index]
        outputs = []
        for k, (v, x) in enumerate(zip(velocities, samples, strict=True)):
            x0 = torch.add(x, v, alpha=-sigma)  # flow_prediction: x0 = x − σ·v at σ_i
            if first:
                self._x0_history.append([x0])
            else:
                history = self._x0_history[k]
                if corrector is not None:
                    x = self._correct(corrector, self._last_samples[k], history, x0)
                history.append(x0)
                if len(history) > 2:
                    history.pop(0)
            if first:
                self._last_samples.append(x)
            else:
                self._last_samples[k] = x
            outputs.append(self._predict(predictor, x, self._x0_history[k]))
        self._next_index = step_index + 1
        return outputs[0] if single else tuple(outputs)

    @staticmethod
    def _correct(
        c: _Corrector, x_last: torch.Tensor, history: list[torch.Tensor], m_t: torch.Tensor
    ) -> torch.Tensor:
        # The difference terms are expanded so no temporaries are allocated: one output tensor.
        m0 = history[-1]
        out = torch.mul(x_last, c.c_x)
        out.add_(m0, alpha=c.c_m0 - c.c_t - c.c_d)
        out.add_(m_t, alpha=c.c_t)
        if c.c_d != 0.0:
            out.add_(history[-2], alpha=c.c_d)
        return out

    @staticmethod
    def _predict(p: _Predictor, x: torch.Tensor, history: list[torch.Tensor]) -> torch.Tensor:
        m0 = history[-1]
        out = torch.mul(x, p.c_x)
        out.add_(m0, alpha=p.c_m0 - p.c_d)
        if p.c_d != 0.0:
            out.add_(history[-2], alpha=p.c_d)
        return out

    def _check_step(
        self,
        velocities: tuple[torch.Tensor, ...],
        step_index: int,
        samples: tuple[torch.Tensor, ...],
    ) -> None:
        if step_index != self._next_index:
            raise ValueError(
                f"step_index: expected {self._next_index} (steps run in order; call reset() to "
                f"start over), got {step_index}"
            )
        if step_index >= self.num_inference_steps:
            raise ValueError(
                f"step_index: expected < num_inference_steps={self.num_inference_steps}, "
                f"got {step_index}"
            )
        if len(velocities) != len(samples):
            raise ValueError(
                f"expected one velocity per sample tensor, got {len(velocities)} velocities for "
                f"{len(samples)} samples"
            )
        if self._num_tensors is not None and len(samples) != self._num_tensors:
            raise ValueError(
                f"expected {self._num_tensors} tensor(s) per step (as in the first step), "
                f"got {len(samples)}"
            )
        for k, (v, x) in enumerate(zip(velocities, samples, strict=True)):
            if v.shape != x.shape:
                raise ValueError(
                    f"tensor {k}: velocity shape {tuple(v.shape)} != sample shape {tuple(x.shape)}"
                )
            if step_index > self.first_step and x.shape != self._last_samples[k].shape:
                raise ValueError(
                    f"tensor {k}: expected shape {tuple(self._last_samples[k].shape)} "
                    f"(as in step 0), got {tuple(x.shape)}"
                )


class DiffusersFlowScheduler:
    """diffusers' ``UniPCMultistepScheduler`` built from a checkpoint's scheduler config, with
    :class:`FlowUniPCScheduler`'s interface: what a LeRobot Cosmos3 folder samples with.

    LeRobot's Cosmos3 policy builds ``UniPCMultistepScheduler.from_config(scheduler_config)``,
    calls ``set_timesteps(N)``, feeds the model ``scheduler.timesteps`` and steps one flattened
    ``[vision | action]`` state per item; this does the same (``flow_shift``, where given,
    replaces the config's). Its sigma grid is diffusers' (``linspace(1, 1/1000)``, float
    timesteps, ``sigmas[0] - 1e-6``), not the official one, so a LeRobot folder's actions are
    LeRobot's, and differ from what the official FlowUniPC would give.

    Example:
        >>> import torch
        >>> sched = DiffusersFlowScheduler({"use_flow_sigmas": True, "flow_shift": 5.0,
        ...                                 "prediction_type": "flow_prediction"}, 4)
        >>> [round(float(t)) for t in sched.timesteps]
        [999, 937, 833, 625]
    """

    def __init__(self, config: dict, num_inference_steps: int,
                 flow_shift: float | None = None, device: torch.device | str = "cpu") -> None:
        from diffusers import UniPCMultistepScheduler

        if not isinstance(num_inference_steps, int) or num_inference_steps < 1:
            raise ValueError(
                f"num_inference_steps: expected an int >= 1, got {num_inference_steps!r}")
        settings = {k: v for k, v in config.items() if not k.startswith("_")}
        if flow_shift is not None:
            settings["flow_shift"] = float(flow_shift)
        self._scheduler = UniPCMultistepScheduler.from_config(settings)
        self._scheduler.set_timesteps(num_inference_steps, device=device)
        self.num_inference_steps = num_inference_steps
        self.timesteps = self._scheduler.timesteps  # what the model is fed
        self.sigmas = self._scheduler.sigmas
        self._next_index = 0

    def step(
        self, velocity: Sequence[torch.Tensor], step_index: int, sample: Sequence[torch.Tensor],
    ) -> tuple[torch.Tensor, ...]:
        """Advance the tensors of ``sample`` one step, stepped as one flattened ``[b, n]`` state
        (LeRobot's packing; diffusers' step is element-wise, so the split does not matter)."""
        if step_index != self._next_index or step_index >= self.num_inference_steps:
            raise ValueError(f"step_index: expected {self._next_index} (steps run in order), got "
                             f"{step_index}")
        velocities, samples = tuple(velocity), tuple(sample)
        if len(velocities) != len(samples) or any(
                v.shape != x.shape for v, x in zip(velocities, samples, strict=True)):
            raise ValueError("expected one velocity of each sample's shape")
        b = samples[0].shape[0]
        flat_v = torch.cat([v.reshape(b, -1) for v in velocities], dim=1)
        flat_x = torch.cat([x.reshape(b, -1) for x in samples], dim=1)
        t = self.timesteps[step_index]
        out = self._scheduler.step(flat_v, t, flat_x, return_dict=False)[0]
        self._next_index += 1
        parts, start = [], 0
        for x in samples:
            parts.append(out[:, start : start + x[0].numel()].reshape(x.shape))
            start += x[0].numel()
        return tuple(parts)
