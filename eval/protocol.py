"""Evaluation protocols: how episodes are run, checked before a run and recorded in results.json.

``default`` (this project's): ``--trials`` per task (10 unless given), trial ``t`` from LIBERO
init state ``t % 50``, the step budget ``--step-budget`` names (the official client's by
default), whole chunks unless ``--n-action-steps`` says otherwise, and **fresh noise for every
chunk**, seeded by ``(--seed, task, trial, chunk)``: each episode is a different draw from the
policy, which is what a success rate estimates.

``official`` (``--protocol official``): the rules of cosmos-framework's LIBERO evaluation, the
client (``closed_loop_eval.py``) and server (``action_policy_server_libero.py``) behind NVIDIA's
published Cosmos3 LIBERO numbers: 50 trials per task, trial ``t`` from init state ``t``, the
client's budget with its 10 settle steps counted inside it, whole 16-action chunks (open loop),
**every request from seed 0** (the server seeds each request with its fixed seed, so the same
image and prompt always give the same chunk), and the checkpoint's own sampler settings (for the
LIBERO recipe: 30 FlowUniPC steps, guidance 1, shift 5). Options that would change these rules
are refused; a run made smaller (fewer trials or tasks, a shorter budget, another image size or
seed) is allowed and listed under ``deviations`` in results.json and in the summary.
"""

from __future__ import annotations

from typing import Any

PROTOCOLS = ("default", "official")
OFFICIAL_TRIALS = 50
OFFICIAL_IMAGE_SIZE = 256
OFFICIAL_SEED = 0
DEFAULT_TRIALS = 10


def default_trials(protocol: str | None) -> int:
    """Trials per task when ``--trials`` is not given."""
    return OFFICIAL_TRIALS if protocol == "official" else DEFAULT_TRIALS


def check(config: Any) -> None:
    """Refuse options that contradict ``config.protocol`` (an ``EvalConfig``), one error each."""
    if config.protocol not in (None, *PROTOCOLS):
        raise ValueError(f"protocol must be one of {PROTOCOLS}; found {config.protocol!r}")
    if config.protocol != "official":
        return
    conflicts = []
    if config.env != "libero":
        conflicts.append(f"--env {config.env} (the official protocol is LIBERO's: --env libero)")
    if config.step_budget not in (None, "cosmos3"):
        conflicts.append(f"--step-budget {config.step_budget} (official: cosmos3, the client's)")
    if config.n_action_steps is not None:
        conflicts.append(f"--n-action-steps {config.n_action_steps} (official: whole chunks)")
    sampling = config.sampling
    for name, flag in (("num_inference_steps", "--denoising-steps"),
                       ("guidance_scale", "--guidance-scale"),
                       ("guidance_interval", "--guidance-interval"),
                       ("flow_shift", "--flow-shift")):
        if getattr(sampling, name) is not None:
            conflicts.append(f"{flag} {getattr(sampling, name)} (official: the checkpoint's "
                             "sampler settings)")
    if sampling.sampler != "flow_unipc":
        conflicts.append(f"--sampler {sampling.sampler} (official: flow_unipc)")
    if sampling.noise == "per_chunk":
        conflicts.append("--noise per_chunk (official: fixed, every chunk from seed 0)")
    if config.shuffle_prompts:
        conflicts.append("--shuffle-prompts (a diagnostic, not a protocol run)")
    if conflicts:
        raise ValueError("--protocol official fixes what these options change; drop "
                         + "; ".join(conflicts))


def deviations(config: Any) -> list[str]:
    """What makes an ``official`` run smaller than the protocol's, for the record."""
    if config.protocol != "official":
        return []
    found = []
    if config.trials != OFFICIAL_TRIALS:
        found.append(f"trials {config.trials} per task (official: {OFFICIAL_TRIALS})")
    if config.tasks is not None:
        found.append(f"tasks {','.join(config.tasks)} only (official: every task)")
    if config.max_episode_steps is not None:
        found.append(f"max_episode_steps {config.max_episode_steps} (official: the client's "
                     "per-suite budget)")
    if config.image_size not in (None, OFFICIAL_IMAGE_SIZE):
        found.append(f"image_size {config.image_size} (official: {OFFICIAL_IMAGE_SIZE})")
    if config.seed != OFFICIAL_SEED:
        found.append(f"seed {config.seed} (official: {OFFICIAL_SEED})")
    if getattr(config, "latency", "0") != "0":
        found.append(f"latency {config.latency} (official: synchronous, the env waits for every "
                     "chunk)")
    return found


def record(config: Any, init_state_rule: str | None, policy: Any) -> dict[str, Any]:
    """The ``protocol`` block of results.json: the rules the episodes were run by.

    ``policy`` is the checkpoint's :class:`~cosmos3_gym.checkpoint.PolicyConfig` (its sampler
    settings), or ``None`` where they are not known (a pipeline without one).
    """
    name = config.protocol or "default"
    sampling = config.sampling
    sampler = None
    if policy is not None:
        heads = getattr(policy, "sampler", None)  # each setting's value and its source
        sampler, sources = {}, {}
        for field in ("num_inference_steps", "guidance_scale", "guidance_interval", "flow_shift"):
            given = getattr(sampling, field)
            sampler[field] = given if given is not None else getattr(policy, field, None)
            sources[field] = ("this run's option" if given is not None else
                              (heads or {}).get(field, {}).get("source", "the checkpoint"))
        # The recipe in force: the one the checkpoint's settings came from (``domain="libero"``
        # is the LIBERO recipe without --recipe), or the one asked for.
        named = {s.removeprefix("recipe ") for s in sources.values() if s.startswith("recipe ")}
        recipe = named.pop() if len(named) == 1 else config.recipe
        sampler.update(sampler_name=sampling.sampler, recipe=recipe, sources=sources)
        scheduler = getattr(policy, "scheduler", None)  # the official FlowUniPC, or diffusers'
        if isinstance(scheduler, dict):
            sampler["scheduler"] = scheduler
    fixed = sampling.noise == "fixed"
    return {
        "name": name,
        "trials_per_task": config.trials,
        "init_state": init_state_rule,
        "actions_per_chunk": config.n_action_steps or "whole chunk",
        "noise": (f"every chunk from seed {config.seed}" if fixed else
                  f"fresh per (task, trial, chunk), derived from seed {config.seed}"),
        "sampler": sampler,
        "deviations": deviations(config),
    }


def describe(protocol: dict[str, Any]) -> list[str]:
    """The summary's lines for a results.json ``protocol`` block."""
    trials = protocol["trials_per_task"]
    parts = [f"{trials} trial{'' if trials == 1 else 's'} per task"]
    if protocol.get("init_state"):
        parts.append(f"init state {protocol['init_state']}")
    chunk = protocol["actions_per_chunk"]
    parts.append("whole chunks" if chunk == "whole chunk" else f"{chunk} actions per chunk")
    parts.append(f"noise {protocol['noise']}")
    sampler = protocol.get("sampler")
    if sampler:
        guidance = f"guidance {sampler['guidance_scale']:g}"
        if sampler.get("guidance_interval") and sampler["guidance_scale"] != 1:
            lo, hi = sampler["guidance_interval"]
            guidance += f" on timesteps ({lo:g}, {hi:g})"
        name = sampler.get("sampler_name", "flow_unipc")
        recipe = f", recipe {sampler['recipe']}" if sampler.get("recipe") else ""
        scheduler = ""
        if (sampler.get("scheduler") or {}).get("name") == "diffusers_unipc":
            scheduler = " on diffusers' UniPC (the checkpoint's scheduler_config)"
        parts.append(f"sampler {name} {sampler['num_inference_steps']} steps, {guidance}, "
                     f"shift {sampler['flow_shift']:g}{scheduler}{recipe}")
    lines = [f"protocol {protocol['name']}: " + ", ".join(parts)]
    if protocol.get("deviations"):
        lines.append("deviations from the official protocol: " + "; ".join(protocol["deviations"]))
    return lines
