"""A run's latency settings resolved: the real-time execution its policy runs under.

:func:`realtime_for` turns the settings' ``--latency``, ``--replan-at``, ``--rtc`` and
``--control-hz`` (:class:`~cosmos3_gym.settings.LatencySettings`), the env family's control rate
and hold, and the model's chunk length into the policy's
:class:`~cosmos3_gym.policy.realtime.RealTime`, refusing what cannot run before anything loads
(:func:`~cosmos3_gym.eval.run.resolve` calls it once per run, and once per arm). A comma list of
latencies is a sweep: :func:`latency_arms` makes one arm per value
(:mod:`cosmos3_gym.eval.arms`).

A ``measured`` run records each chunk's delay in its episode records (``chunk_timing``);
``--latency replay:DIR`` reads them back (:func:`recorded_delays`): every episode of the new run
takes, chunk by chunk, the delays its namesake (same task and trial) took in DIR. The episodes
are then the same wherever their chunks are: a chunk depends on its own observation, prompt
and seed, whatever the batch it was planned in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cosmos3_gym.policy.realtime import (
    SYNCHRONOUS,
    DelayRule,
    HoldRule,
    Latency,
    RealTime,
)


def latency_arms(settings: Any) -> tuple[list[Any], str] | None:
    """One arm per value of a latency sweep (``--latency 0,100ms,200ms``) and the control's
    name (``0`` where it is among them, else the first); None for a single latency."""
    from cosmos3_gym.eval.arms import Arm

    values = settings.latencies()
    if len(values) < 2:
        return None
    arms = [Arm(lat.text, {"latency": lat.text}) for lat in values]
    control = next((lat.text for lat in values if lat.kind == "none"), values[0].text)
    return arms, control


def realtime_for(settings: Any, env: Any, model: Any) -> RealTime | None:
    """The policy's real-time execution under ``settings`` (None: synchronous, or a sweep,
    whose arms each resolve their own); every value of a sweep is checked here all the same."""
    values = settings.latencies() if hasattr(settings, "latencies") else []
    found = [_realtime(settings, env, model, lat) for lat in values]
    return found[0] if len(found) == 1 else None


def describe(realtime: RealTime | None) -> str:
    """The latency model in one line (results.json's ``latency.model``)."""
    return SYNCHRONOUS if realtime is None else realtime.describe()


def _realtime(settings: Any, env: Any, model: Any, latency: Latency) -> RealTime | None:
    if latency.kind == "none":
        return None
    hz = settings.control_hz or env.control_hz
    label = getattr(settings, "env", None) or "the env"
    if latency.needs_control_rate and hz is None:
        raise ValueError(f"--latency {latency.text} is counted in time, so it needs the env's "
                         f"control rate; --env {label} declares none: give --control-hz HZ "
                         "(its steps per second), or the latency in steps (3steps)")
    recorded = recorded_delays(Path(latency.source), env, settings) \
        if latency.kind == "replay" else None
    delay = DelayRule(latency, hz, recorded)
    if settings.rtc:
        check_rtc(settings, model, delay)
    return RealTime(delay, replan_at=settings.replan_at, rtc=settings.rtc,
                    hold=HoldRule(env.hold))


def check_rtc(settings: Any, model: Any, delay: DelayRule) -> None:
    """Refuse ``--rtc`` where the head cannot take the committed rows: a pipeline that takes
    none, a stochastic sampler (its log-probability knows no clean action rows), or a delay as
    long as a chunk (nothing would be left to predict)."""
    from cosmos3_gym.policy.planner import takes_committed_actions

    lat = delay.latency.text
    if model.pipeline is not None and not takes_committed_actions(model.pipeline):
        raise ValueError(f"--rtc: {model.label} takes no committed action rows (real-time "
                         "chunking needs Cosmos3ActionPipeline's committed_actions); drop --rtc")
    sampling = getattr(settings, "sampling", None)
    if sampling is not None and sampling.stochastic:
        raise ValueError(f"--rtc: {model.label}'s head cannot take committed action rows under "
                         f"--sampler {sampling.sampler} (the log-probability of a stochastic "
                         "chunk is defined without clean action rows); use flow_unipc, or drop "
                         "--rtc")
    horizon = model.action_horizon
    if horizon is None:
        return
    steps = delay.latency.delay_steps(delay.control_hz)
    if delay.recorded:  # a replay: its longest recorded delay
        steps = max((max(v) for v in delay.recorded.values() if v), default=None)
    if steps is not None and steps >= horizon:
        raise ValueError(f"--latency {lat} with --rtc: a delay of {steps} steps is as long as "
                         f"a chunk or longer ({model.label} plans H={horizon} actions), so "
                         "every row would be committed and none predicted; expected a delay "
                         f"under {horizon} steps")


def recorded_delays(folder: Path, env: Any, settings: Any) -> dict[int, list[int]]:
    """The delays an evaluation in ``folder`` recorded, by this run's episode index (its
    canonical order): each episode's ``chunk_timing`` delays in chunk order. Every episode of
    this run must be there."""
    from cosmos3_gym.eval.results import read_episode_records

    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"--latency replay:{folder}: no evaluation there (no "
                                "config.json); expected the folder of an evaluation that ran "
                                "with --latency measured")
    records = read_episode_records(folder)
    timed = {(r["task"], int(r["trial"])): r["chunk_timing"] for r in records
             if r.get("chunk_timing")}
    if not timed:
        raise ValueError(f"--latency replay:{folder}: its {len(records)} episode records hold "
                         "no chunk delays (chunk_timing); expected an evaluation that ran with "
                         "a --latency")
    episodes = env.episodes(settings.trials, settings.seed)
    missing = [e.key for e in episodes if e.key not in timed]
    if missing:
        shown = ", ".join(f"{t} trial {k}" for t, k in missing[:3])
        more = ", ..." if len(missing) > 3 else ""
        raise ValueError(f"--latency replay:{folder}: {len(missing)} of this run's "
                         f"{len(episodes)} episodes were not recorded there ({shown}{more}); "
                         "expected the same tasks, trials and seed")
    return {k: [int(c["delay"]) for c in sorted(timed[e.key], key=lambda c: c["chunk"])]
            for k, e in enumerate(episodes)}
