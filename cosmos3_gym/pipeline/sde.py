"""Stochastic action steps for RL: Flow-SDE and Flow-CPS inside FlowUniPC, with log-probabilities.

A few denoising steps of the action tokens become Gaussian transitions (πRL's / RLinf's
``flow_sde``, Flow-GRPO; RLinf's ``flow_cps``), so every chunk has a log-probability;
:class:`StochasticRecord` keeps what scoring it needs, and :func:`chunk_log_prob` recomputes it
with gradients under new weights. The deterministic sampler is untouched.

Design (the step derived in the sampler's conventions): docs/rl.md, "Design: the stochastic step".
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import torch

from cosmos3_gym.pipeline.sampling import DETERMINISTIC_SAMPLER, SAMPLERS
from cosmos3_gym.pipeline.scheduler import FlowUniPCScheduler
from cosmos3_gym.settings import SDE_STEP_NAMES

_STEP_TAG, _NOISE_TAG = 11, 12  # keep the step choice and the noise draws of a seed apart
_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass(frozen=True)
class StochasticSampling:
    """How a call samples its action tokens stochastically.

    >>> StochasticSampling().sde_steps, StochasticSampling("flow_cps", 0.3, (2, 3)).sde_steps
    ('random', (2, 3))
    """

    # "flow_sde" (πRL / Flow-GRPO) or "flow_cps" (coefficients-preserving); docs/rl.md.
    sampler: str = "flow_sde"
    # a: flow_sde's g = a·√(σ/(1−σ)); flow_cps's angle π·a/2. RLinf's default.
    noise_level: float = 0.5
    # "random": one step per chunk drawn from its seed; "random-but-last": the same, never the
    # last step (the narrowest Gaussian; RLinf's ignore_last); "all"; or the step indices.
    sde_steps: str | tuple[int, ...] = "random"
    # Actions of the chunk the env executes (their rows count in the log-probability);
    # None: all H.
    executed_actions: int | None = None

    def __post_init__(self) -> None:
        if self.sampler not in SAMPLERS[1:]:
            raise ValueError(
                f"sampler: expected one of {list(SAMPLERS[1:])} for stochastic steps; "
                f"found {self.sampler!r}"
            )
        a = self.noise_level
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a <= 0:
            raise ValueError(f"noise_level: expected a finite number > 0; found {a!r}")
        if self.sampler == "flow_cps" and a >= 1:
            raise ValueError(f"noise_level: flow_cps takes 0 < a < 1 (angle π·a/2); found {a}")
        steps = self.sde_steps
        if isinstance(steps, str):
            if steps not in SDE_STEP_NAMES:
                raise ValueError(
                    f"sde_steps: expected one of {', '.join(SDE_STEP_NAMES)} or step indices; "
                    f"found {steps!r}"
                )
        else:
            steps = tuple(steps)
            if not steps or any(isinstance(s, bool) or not isinstance(s, (int, np.integer))
                                or s < 0 for s in steps) or len(set(steps)) != len(steps):
                raise ValueError(
                    f"sde_steps: expected distinct step indices >= 0; found {self.sde_steps!r}"
                )
            object.__setattr__(self, "sde_steps", tuple(sorted(int(s) for s in steps)))
        k = self.executed_actions
        if k is not None and (isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1):
            raise ValueError(f"executed_actions: expected an int >= 1 or None; found {k!r}")

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if isinstance(self.sde_steps, tuple):
            d["sde_steps"] = list(self.sde_steps)
        return d

    def steps_for(self, seed: int, num_steps: int) -> tuple[int, ...]:
        """The stochastic step indices of an item with ``seed`` under ``num_steps`` steps."""
        # The last step is left out by flow_cps (its σ' = 0 has no noise) and by random-but-last.
        but_last = self.sde_steps == "random-but-last"
        last = num_steps - 1 if self.sampler == "flow_cps" or but_last else num_steps
        if last < 1:
            what = f"{self.sampler} with random-but-last" if but_last else self.sampler
            raise ValueError(
                f"{what} needs at least {num_steps - last + 1} denoising steps; found {num_steps}"
            )
        if self.sde_steps in ("random", "random-but-last"):
            rng = np.random.default_rng([int(seed), _STEP_TAG])
            return (int(rng.integers(last)),)
        if self.sde_steps == "all":
            return tuple(range(last))
        bad = [s for s in self.sde_steps if s >= last]
        if bad:
            raise ValueError(
                f"sde_steps {list(self.sde_steps)}: {self.sampler} with {num_steps} denoising "
                f"steps takes indices 0..{last - 1}; found {bad}"
            )
        return self.sde_steps


def stochastic_sampling(
    sampler: str, noise_level: float, sde_steps: str | Sequence[int],
    executed_actions: int | None,
) -> StochasticSampling | None:
    """A pipeline call's sampler arguments as :class:`StochasticSampling` (None: FlowUniPC)."""
    if sampler == DETERMINISTIC_SAMPLER:
        return None
    if sampler not in SAMPLERS:
        raise ValueError(f"sampler: expected one of {list(SAMPLERS)}; found {sampler!r}")
    steps = sde_steps if isinstance(sde_steps, str) else tuple(sde_steps)
    return StochasticSampling(sampler, noise_level, steps, executed_actions)


def step_coefficients(
    settings: StochasticSampling, sigmas: Sequence[float], i: int
) -> tuple[float, float, float]:
    """``(c_x0, c_eps, std)`` of stochastic step ``i``: ``mean = c_x0·x0̂ + c_eps·ε̂``.

    >>> s = [0.999, 0.5, 0.0]
    >>> [round(c, 4) for c in step_coefficients(StochasticSampling(noise_level=0.5), s, 1)]
    [1.0, -0.125, 0.3536]
    """
    sigma, nxt = float(sigmas[i]), float(sigmas[i + 1])
    delta = sigma - nxt
    a = float(settings.noise_level)
    if settings.sampler == "flow_sde":
        one_minus = 1.0 - (float(sigmas[1]) if i == 0 else sigma)
        g2 = a * a * sigma / one_minus
        return 1.0 - nxt, nxt - g2 * delta / (2.0 * sigma), math.sqrt(g2 * delta)
    theta = 0.5 * math.pi * a
    return 1.0 - nxt, nxt * math.cos(theta), nxt * math.sin(theta)


def transition_mean(
    x: torch.Tensor, v: torch.Tensor, sigma: float, c_x0: float, c_eps: float
) -> torch.Tensor:
    """The Gaussian step's mean from the state ``x`` at ``sigma`` and the velocity ``v``."""
    x0 = x - sigma * v
    eps = x + (1.0 - sigma) * v
    return c_x0 * x0 + c_eps * eps


def gaussian_log_prob(
    sample: torch.Tensor, mean: torch.Tensor, std: torch.Tensor | float, mask: torch.Tensor
) -> torch.Tensor:
    """fp32 ``Σ log N(sample; mean, std²)`` over ``mask`` per leading row: ``[b, ...] -> [b]``."""
    std = torch.as_tensor(std, dtype=torch.float32, device=sample.device)
    z = (sample.float() - mean.float()) / std
    per = -0.5 * z * z - torch.log(std) - _LOG_SQRT_2PI
    return (per * mask.to(per.dtype)).flatten(1).sum(1)


def step_noise(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """``z`` of an item's stochastic steps ``[K, H, 64]``, from its seed alone (host fp32)."""
    rng = np.random.default_rng([int(seed), _NOISE_TAG])
    return torch.from_numpy(rng.standard_normal(shape).astype(np.float32))


def weights_digest(model: torch.nn.Module, *, cached: bool = True) -> str:
    """SHA-256 (first 16 hex digits) over the model's parameters and buffers, by name, dtype,
    shape and bytes; cached until a tensor changes (``_version`` counters), so sampling pays it
    once per weight update (reading every weight once: seconds for a multi-GB checkpoint).
    ``cached=False`` reads every weight again: a change made through ``tensor.data`` does not
    move the version counters, so what must not miss any change (a run folder's identity, once
    per evaluation) computes it afresh."""
    tensors = [*model.named_parameters(), *model.named_buffers()]
    key = tuple((name, t.data_ptr(), t._version) for name, t in tensors)
    previous = getattr(model, "_cosmos3_weights_digest", None)
    if cached and previous is not None and previous[0] == key:
        return previous[1]
    h = hashlib.sha256()
    for name, t in sorted(tensors, key=lambda item: item[0]):
        data = t.detach().contiguous().cpu()
        h.update(f"{name}:{data.dtype}:{tuple(data.shape)}".encode())
        h.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    digest = h.hexdigest()[:16]
    object.__setattr__(model, "_cosmos3_weights_digest", (key, digest))
    return digest


class StochasticActionSampler:
    """Stands in for the denoise stage's ``FlowUniPCScheduler``: the video tokens take every
    FlowUniPC step; each item's action tokens take FlowUniPC steps except at its stochastic
    steps, where they take the Gaussian step and a fresh FlowUniPC run starts after it.

    ``step((v_vision, v_action), i, (vision, actions))`` like the scheduler's; :meth:`record`
    returns the per-item arrays of :class:`StochasticRecord` (``sde_*`` keys, rows = items).
    """

    def __init__(
        self, scheduler: FlowUniPCScheduler, settings: StochasticSampling, seeds: Sequence[int],
        *, horizon: int, action_dim: int, raw_action_dim: int,
        noise_seeds: Sequence[int] | None = None,
    ) -> None:
        if noise_seeds is not None and len(noise_seeds) != len(seeds):
            raise ValueError(f"noise_seeds: expected one per item ({len(seeds)}); found "
                             f"{len(noise_seeds)}")
        self.scheduler = scheduler  # the vision tokens' run
        self.settings = settings
        n = scheduler.num_inference_steps
        self.timesteps = scheduler.timesteps
        self._sigmas = [scheduler.sigma(i) for i in range(n)] + [0.0]
        # An item's seed picks its stochastic steps; its noise seed (the seed itself unless
        # given apart) draws their Gaussian samples, the only noise the log-probability scores.
        self.steps = [settings.steps_for(s, n) for s in seeds]  # per item
        count = len(self.steps[0])
        draws = seeds if noise_seeds is None else noise_seeds
        self.noise = [step_noise(s, (count, horizon, action_dim)) for s in draws]
        self.raw = raw_action_dim
        self.executed = horizon if settings.executed_actions is None else min(
            settings.executed_actions, horizon)
        self.mask = torch.zeros(horizon, action_dim, dtype=torch.bool)
        self.mask[: self.executed, :raw_action_dim] = True
        self._runs = [FlowUniPCScheduler(n, scheduler.shift) for _ in seeds]  # per item
        size = len(seeds)
        self._vision: list[list[torch.Tensor]] = [[] for _ in range(size)]
        self._before: list[list[torch.Tensor]] = [[] for _ in range(size)]
        self._after: list[list[torch.Tensor]] = [[] for _ in range(size)]
        self._log_prob = torch.zeros(size, dtype=torch.float32)

    def step(
        self, velocity: tuple[torch.Tensor, torch.Tensor], step_index: int,
        sample: tuple[torch.Tensor, torch.Tensor],
    ) -> tuple[torch.Tensor, torch.Tensor]:
        (v_vision, v_action), (vision, actions) = velocity, sample
        i = step_index
        vision_next = self.scheduler.step(v_vision, i, vision)
        rows = []
        n = self.scheduler.num_inference_steps
        for r, steps in enumerate(self.steps):
            x, v = actions[r : r + 1], v_action[r : r + 1]
            if i not in steps:
                rows.append(self._runs[r].step(v, i, x))
                continue
            c_x0, c_eps, std = step_coefficients(self.settings, self._sigmas, i)
            mean = transition_mean(x, v, self._sigmas[i], c_x0, c_eps)
            z = self.noise[r][steps.index(i)].to(x.device)[None].clone()
            z[..., self.raw :] = 0.0
            x_next = mean + std * z
            x_next[..., self.raw :] = 0.0
            self._log_prob[r] += gaussian_log_prob(
                x_next, mean, std, self.mask.to(x.device)[None]
            ).cpu()[0]
            self._vision[r].append(vision[r].float().cpu().clone())
            self._before[r].append(x[0].float().cpu().clone())
            self._after[r].append(x_next[0].float().cpu().clone())
            if i + 1 < n:
                self._runs[r] = FlowUniPCScheduler(n, self.scheduler.shift, first_step=i + 1)
            rows.append(x_next)
        return vision_next, torch.cat(rows)

    def record(self, image_hw: Sequence[tuple[int, int]]) -> dict[str, np.ndarray]:
        """Per-item arrays (``sde_*``), rows in the micro-batch's order."""
        steps = np.asarray(self.steps, dtype=np.int64)  # [b, K]
        sig = np.asarray(self._sigmas, dtype=np.float32)
        b = steps.shape[0]
        return {
            "sde_steps": steps,
            "sde_sigmas": np.stack([sig[steps], sig[steps + 1]], axis=-1),  # [b, K, 2]
            "sde_timesteps": self.timesteps.numpy()[steps].astype(np.float32),  # [b, K]
            "sde_vision": np.stack([torch.stack(v).numpy() for v in self._vision]),
            "sde_actions_before": np.stack([torch.stack(v).numpy() for v in self._before]),
            "sde_actions_after": np.stack([torch.stack(v).numpy() for v in self._after]),
            "sde_log_prob": self._log_prob.numpy().copy(),
            "sde_action_mask": np.repeat(self.mask.numpy()[None], b, axis=0),  # [b, H, 64]
            "sde_image_hw": np.asarray(image_hw, dtype=np.int64).reshape(b, 2),
        }


@dataclass
class StochasticRecord:
    """What the stochastic steps of B chunks were, row ``k`` = item ``k`` (``K`` stochastic
    steps per chunk, the same K for every row).

    Attributes:
        steps: int64 ``[B, K]`` step indices; sigmas: float32 ``[B, K, 2]`` (σ, σ') of each;
            timesteps: float32 ``[B, K]``, the model timestep fed at each.
        vision: float32 ``[B, K, 48, T, h, w]``, the video latent fed to the model at each step.
        actions_before / actions_after: float32 ``[B, K, H, 64]``, the action latent into and
            out of each stochastic step.
        log_prob: float32 ``[B]``, Σ over steps, executed actions and real channels.
        action_mask: bool ``[B, H, 64]``, the entries that count (executed rows x real dims).
        image_hw: int64 ``[B, 2]``, the input image size (fixes the caption's canvas).
        settings: the :class:`StochasticSampling` as a dict, plus ``num_inference_steps``,
            ``flow_shift`` and ``guidance_scale``.
        weights: :func:`weights_digest` of the transformer that sampled the chunks.
    """

    steps: np.ndarray
    sigmas: np.ndarray
    timesteps: np.ndarray
    vision: np.ndarray
    actions_before: np.ndarray
    actions_after: np.ndarray
    log_prob: np.ndarray
    action_mask: np.ndarray
    image_hw: np.ndarray
    settings: dict[str, Any]
    weights: str

    ARRAYS = ("steps", "sigmas", "timesteps", "vision", "actions_before", "actions_after",
              "log_prob", "action_mask", "image_hw")

    def __len__(self) -> int:
        return int(self.steps.shape[0])

    def take(self, rows: Sequence[int] | np.ndarray) -> StochasticRecord:
        """The record of ``rows`` only."""
        rows = np.asarray(rows, dtype=np.int64)
        return StochasticRecord(**{k: getattr(self, k)[rows] for k in self.ARRAYS},
                                settings=dict(self.settings), weights=self.weights)

    @classmethod
    def concat(cls, records: Sequence[StochasticRecord]) -> StochasticRecord:
        """Rows of several records, in order (same settings; the first record's weights)."""
        first = records[0]
        return cls(**{k: np.concatenate([getattr(r, k) for r in records]) for k in cls.ARRAYS},
                   settings=dict(first.settings), weights=first.weights)


def chunk_log_prob(
    pipe: Any, record: StochasticRecord, prompts: Sequence[str], *,
    model: torch.nn.Module | None = None, per_step: bool = False,
) -> torch.Tensor:
    """Recompute ``record``'s log-probabilities under ``model``'s current weights: fp32 ``[B]``,
    with gradients where ``model`` has them (call it outside ``torch.inference_mode``);
    ``per_step=True``: fp32 ``[B, K]``, each stochastic step's own (they sum to the chunk's).

    ``pipe`` is the :class:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline` whose prompt stage and
    policy head sampled the chunks (the captions are rebuilt from ``prompts`` exactly as it
    built them); ``model`` defaults to ``pipe.transformer``. Training needs a model with unfused
    projections (``InferenceOptions(fuse_projections=False)`` or a loaded copy): fused weights
    are plain tensors that autograd does not reach. One eager GEN forward per stochastic step,
    text K/V from ``model.encode_text`` (no K/V buffers), the mean and std by the same functions
    the sampler used; equal to ``record.log_prob`` while the weights are unchanged.
    """
    from cosmos3_gym.pipeline.preprocess import plan_canvas
    from cosmos3_gym.pipeline.stages import MicroBatch, SamplingParams

    model = pipe.transformer if model is None else model
    policy = pipe.policy
    prompts = list(prompts)
    b = len(record)
    if len(prompts) != b:
        raise ValueError(f"expected one prompt per record row ({b}); found {len(prompts)}")
    settings = StochasticSampling(**{k: (tuple(v) if k == "sde_steps" and isinstance(v, list)
                                         else v)
                                     for k, v in record.settings.items()
                                     if k in StochasticSampling.__dataclass_fields__})
    guidance = float(record.settings.get("guidance_scale", 1.0))
    cfg = guidance != 1.0
    params = SamplingParams(
        num_inference_steps=int(record.settings["num_inference_steps"]), guidance_scale=guidance,
        flow_shift=float(record.settings["flow_shift"]), progress=False,
    )
    device, dtype = model.device, model.dtype
    out = torch.zeros(b, record.steps.shape[1], dtype=torch.float32, device=device)
    # Rows of one canvas share a caption format: one text pass and one forward per step each.
    canvases: dict[tuple[int, int], list[int]] = {}
    for r, (h, w) in enumerate(record.image_hw.tolist()):
        canvases.setdefault((h, w), []).append(r)
    for (h, w), rows in canvases.items():
        plan = plan_canvas(h, w, policy.resolution_tier)
        mb = MicroBatch(indices=list(range(len(rows))), images=[],
                        prompts=[prompts[r] for r in rows], seeds=[], plan=plan)
        ids, mask = pipe.prompt.tokenize(mb, params)
        text = model.encode_text(ids.to(device), mask.to(device))
        part = []
        for k in range(record.steps.shape[1]):
            vision = torch.from_numpy(record.vision[rows, k]).to(device)
            before = torch.from_numpy(record.actions_before[rows, k]).to(device)
            after = torch.from_numpy(record.actions_after[rows, k]).to(device)
            n, t = len(rows), vision.shape[2]
            layout = model.gen_layout(
                text, latent_shape=tuple(vision.shape[2:]), num_actions=before.shape[1],
                fps=policy.fps, action_fps=policy.action_fps, preallocate_kv=False,
            )
            vision_noisy = (torch.arange(t, device=device) > 0)[None].expand(n, t)
            action_noisy = torch.ones(n, before.shape[1], dtype=torch.bool, device=device)
            domain_ids = torch.full((n,), policy.domain_id, dtype=torch.long, device=device)
            timesteps = torch.from_numpy(record.timesteps[rows, k]).to(device)
            model_vision, model_actions = vision.to(dtype), before.to(dtype)
            if cfg:
                model_vision, model_actions = model_vision.repeat(2, 1, 1, 1, 1), \
                    model_actions.repeat(2, 1, 1)
                vision_noisy, action_noisy = vision_noisy.repeat(2, 1), action_noisy.repeat(2, 1)
                domain_ids, timesteps = domain_ids.repeat(2), timesteps.repeat(2)
            _, v_action = model.forward_gen(
                text, layout, model_vision, vision_noisy, model_actions, action_noisy,
                domain_ids, timesteps,
            )
            v_action = v_action.float()
            if cfg:
                v_action = v_action[n:] + guidance * (v_action[:n] - v_action[n:])
            v_action = torch.cat(
                [v_action[..., : policy.raw_action_dim],
                 torch.zeros_like(v_action[..., policy.raw_action_dim :])], dim=-1)
            sigma_rows = record.sigmas[rows, k]
            step_rows = record.steps[rows, k]
            means, stds = [], []
            for j in range(n):
                sigmas = np.zeros(params.num_inference_steps + 1, np.float64)
                sigmas[step_rows[j]] = sigma_rows[j, 0]
                sigmas[step_rows[j] + 1] = sigma_rows[j, 1]
                if step_rows[j] == 0:  # flow_sde's step 0 reads σ_1, which is σ'
                    sigmas[1] = sigma_rows[j, 1]
                c_x0, c_eps, std = step_coefficients(settings, sigmas, int(step_rows[j]))
                means.append(transition_mean(before[j : j + 1], v_action[j : j + 1],
                                             float(sigma_rows[j, 0]), c_x0, c_eps))
                stds.append(std)
            mean = torch.cat(means)
            mask = torch.from_numpy(record.action_mask[rows]).to(device)
            std = torch.tensor(stds, dtype=torch.float32, device=device).view(n, 1, 1)
            part.append(gaussian_log_prob(after, mean, std, mask))
        out = out.index_put((torch.tensor(rows, device=device),), torch.stack(part, dim=1))
    return out if per_step else out.sum(dim=1)
