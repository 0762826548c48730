"""``SamplerConfig``: how every chunk is denoised, one object from the command line to the call.

The command line builds one (its ``sampler`` group), the :class:`~cosmos3_gym.policy.VectorPolicy`
holds it, its :class:`~cosmos3_gym.policy.ChunkPlanner` turns it into the pipeline call's
arguments (:meth:`SamplerConfig.call_kwargs`), and runs record it: no layer declares these
settings again. ``None`` keeps the checkpoint's own value (its recipe, ``action_policy.json`` or
scheduler config; :mod:`cosmos3_gym.checkpoint`).

Two separate things are called random here, and they have separate names: the **sampler**
(``flow_unipc``, deterministic given its noise; ``flow_sde`` / ``flow_cps``, stochastic action
steps with a log-probability, for RL) and the **noise rule** (``per_chunk``: fresh starting
noise for every chunk, drawn from its seed; ``fixed``: every chunk from the same seed, so a chunk
is a function of image and prompt, as the official server runs).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from cosmos3_gym.settings import sde_steps_value, setting

DETERMINISTIC_SAMPLER = "flow_unipc"
SAMPLERS = (DETERMINISTIC_SAMPLER, "flow_sde", "flow_cps")


def unscorable(head: Any, *, state_rows: bool, guidance_interval: Any,
               guidance_scale: float, committed_actions: bool = False) -> list[str]:
    """What in a chunk's sampling a stochastic sampler cannot score yet (the log-probability
    recomputation, ``sde.chunk_log_prob``, guides every step, knows no state rows nor committed
    action rows, and its steps are defined on the official FlowUniPC), each in words; empty: a
    stochastic sampler may run. ``head`` is the checkpoint's
    :class:`~cosmos3_gym.checkpoint.PolicyConfig`. The pipeline asks it of every stochastic call;
    ``rl grpo`` asks it of the head before anything loads."""
    found = []
    if state_rows:
        found.append(f"state rows (history_length {head.history_length})")
    if committed_actions:
        found.append("committed action rows (real-time chunking)")
    if guidance_interval is not None and float(guidance_scale) != 1.0:
        found.append(f"a guidance interval {tuple(guidance_interval)}")
    if head.scheduler_config is not None:
        found.append("a diffusers scheduler (this checkpoint's scheduler_config; the stochastic "
                     "steps are defined on the official FlowUniPC)")
    return found
NOISE_RULES = ("per_chunk", "fixed")


def _interval(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(t) for t in text.split(","))
    except ValueError:
        raise ValueError(f"expected two timesteps LO,HI; found {text!r}") from None
    return lo, hi


@dataclass(frozen=True)
class SamplerConfig:
    """Every setting of the denoising sampler and of the chunks' noise, with its default.

    >>> SamplerConfig(num_inference_steps=4).call_kwargs(executed_actions=None)
    {'num_inference_steps': 4, 'guidance_scale': None, 'flow_shift': None}
    >>> list(SamplerConfig(sampler="flow_sde").call_kwargs(executed_actions=2))[3:]
    ['sampler', 'noise_level', 'sde_steps', 'executed_actions']
    """

    num_inference_steps: int | None = setting(
        None, "denoising steps per chunk (default: the checkpoint's)", group="sampler",
        flag="denoising-steps")
    guidance_scale: float | None = setting(
        None, "classifier-free guidance scale, 1 = off (default: the checkpoint's)",
        group="sampler")
    guidance_interval: tuple[float, float] | None = setting(
        None, "model timesteps LO,HI between which guidance is applied, e.g. 960,1001 for the "
        "first step only (default: the checkpoint's: every step)", group="sampler",
        parse=_interval, metavar="LO,HI")
    flow_shift: float | None = setting(
        None, "the flow-matching sigma schedule's shift (default: the checkpoint's)",
        group="sampler")
    sampler: str = setting(
        DETERMINISTIC_SAMPLER, "the sampler: flow_unipc (deterministic given its noise), or "
        "flow_sde / flow_cps (Gaussian action steps whose log-probability every chunk records, "
        "for RL)", group="sampler", choices=SAMPLERS)
    noise_level: float = setting(
        0.5, "the stochastic steps' noise level (flow_sde, flow_cps)", group="sampler")
    sde_steps: str | tuple[int, ...] = setting(
        "random", "which denoising steps are stochastic (flow_sde, flow_cps): random (one per "
        "chunk, from its seed), random-but-last (the same, never the last step, whose Gaussian "
        "is the narrowest), all, or step indices such as 2,3", group="sampler",
        parse=sde_steps_value)
    noise: str | None = setting(
        None, "the noise rule: per_chunk (fresh starting noise for every chunk, from its seed) "
        "or fixed (every chunk from the run's seed, as the official server runs); none: "
        "per_chunk, or the protocol's", group="sampler", choices=NOISE_RULES)

    def __post_init__(self) -> None:
        steps = self.num_inference_steps
        if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int)
                                  or steps < 1):
            raise ValueError(f"num_inference_steps must be None or an int >= 1; found {steps!r}")
        for name in ("guidance_scale", "flow_shift"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not value > 0):
                raise ValueError(f"{name} must be None or a number > 0; found {value!r}")
        if self.sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}; found {self.sampler!r}")
        if self.noise not in (None, *NOISE_RULES):
            raise ValueError(f"noise must be None or one of {NOISE_RULES}; found {self.noise!r}")
        if self.guidance_interval is not None:
            from cosmos3_gym.checkpoint import check_guidance_interval

            object.__setattr__(self, "guidance_interval",
                               check_guidance_interval(self.guidance_interval))
        if not isinstance(self.sde_steps, str):
            object.__setattr__(self, "sde_steps", tuple(int(s) for s in self.sde_steps))
        if self.stochastic:
            from cosmos3_gym.pipeline.sde import stochastic_sampling

            stochastic_sampling(self.sampler, self.noise_level, self.sde_steps, None)

    @property
    def fresh_noise(self) -> bool:
        """Whether every chunk draws fresh starting noise (the ``per_chunk`` rule, the default)."""
        return self.noise != "fixed"

    @property
    def stochastic(self) -> bool:
        """Whether the sampler takes stochastic action steps (and records log-probabilities)."""
        return self.sampler != DETERMINISTIC_SAMPLER

    def with_changes(self, **changes: Any) -> SamplerConfig:
        """A copy with ``changes`` (checked like any other)."""
        return replace(self, **changes)

    def call_kwargs(self, executed_actions: int | None) -> dict[str, Any]:
        """The pipeline call's sampling arguments. A guidance interval and the stochastic
        sampler's settings are passed only where set, so any callable with the pipeline's
        basic signature plans as before; ``executed_actions`` is how many actions of each
        chunk run (its log-probability covers those)."""
        out: dict[str, Any] = {"num_inference_steps": self.num_inference_steps,
                               "guidance_scale": self.guidance_scale,
                               "flow_shift": self.flow_shift}
        if self.guidance_interval is not None:
            out["guidance_interval"] = self.guidance_interval
        if self.stochastic:
            out.update(sampler=self.sampler, noise_level=self.noise_level,
                       sde_steps=self.sde_steps, executed_actions=executed_actions)
        return out
