"""How often a GRPO group's episodes disagree, and what made them differ: the same start states
under each noise setting, before any update.

``python -m cosmos3_gym.bench.group_signal --groups 48 --out runs/group_signal.json -- ARGS``
builds the policy and the env family of ``cosmos3-gym rl grpo ARGS`` (the checkpoint, the env,
the sampler settings, ``--group-size``, ``--seed``) and collects groups ``0 .. --groups - 1``
of the run (the start states its first iterations meet) once per setting:

- ``start-noise-alone``: the deterministic sampler (``flow_unipc``), each episode its own start
  noise and nothing else random: how much of a group's spread the unscored noise makes;
- ``default``: the command's own sampler and ``--group-noise``;
- ``--variant NAME="FLAGS"``: the command with those flags appended (repeat it), e.g.
  ``shared="--group-noise shared"``.

Per setting it writes the training success, the share of silent groups (all succeeded or all
failed: no advantage, nothing learned), and the mean within-group variance ``p(1 - p)`` of the
groups' success rates ``p`` (a group of independent episodes at success ``q`` would average
``q(1 - q)(G - 1)/G``). A silent group under ``--group-noise shared`` is one the scored noise
could not move; under ``episode`` a disagreeing group may owe its spread to unscored noise.
"""

from __future__ import annotations

import argparse
import json
import shlex
import time
from pathlib import Path
from typing import Any

from cosmos3_gym.bench.grpo_seeds import grpo_settings
from cosmos3_gym.jsonio import write_text_atomic

START_NOISE_ALONE = "start-noise-alone"


def group_outcomes(pipe: Any, adapter: Any, env: Any, envs: Any, cfg: Any, groups: int,
                   deterministic: bool = False) -> list[list[bool]]:
    """Each group's episode successes under ``cfg``'s sampler and group noise (the
    deterministic sampler with ``deterministic``), groups collected as many at a time as
    ``envs`` has slots for."""
    from cosmos3_gym.pipeline.sampling import DETERMINISTIC_SAMPLER
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.runner import GroupEpisodes, collect_on_policy, group_seed_rule
    from cosmos3_gym.train.grpo import episode_steps, training_noise

    sampling, rule = training_noise(cfg)  # what rl grpo's training episodes draw
    if deterministic:  # the start noise alone: each episode its own, nothing scored
        sampling = sampling.with_changes(sampler=DETERMINISTIC_SAMPLER)
        rule = group_seed_rule(cfg.seed)
    per_call = envs.num_envs // cfg.group_size
    outcomes: list[list[bool]] = []
    for first in range(0, groups, per_call):
        ids = list(range(first, min(first + per_call, groups)))
        policy = VectorPolicy(pipe, adapter=adapter, n_action_steps=cfg.n_action_steps,
                              sampling=sampling, seed_rule=rule)
        batch = collect_on_policy(policy, envs, episode_steps(env), eval_env=env,
                                  schedule=GroupEpisodes(env, cfg.seed, ids, cfg.group_size))
        success = batch["episode_success"].tolist()
        order = batch["episode_id"].tolist()
        by_id = dict(zip(order, success, strict=True))
        for g in ids:
            outcomes.append([bool(by_id[g * cfg.group_size + m]) for m in range(cfg.group_size)])
    return outcomes


def summarize(outcomes: list[list[bool]]) -> dict[str, Any]:
    rates = [sum(g) / len(g) for g in outcomes]
    n = len(rates)
    return {"groups": n, "success": round(sum(rates) / n, 4),
            "silent": round(sum(p in (0.0, 1.0) for p in rates) / n, 4),
            "within_group_variance": round(sum(p * (1 - p) for p in rates) / n, 4),
            "group_success": rates}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m cosmos3_gym.bench.group_signal", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=48, help="groups per setting (default 48)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=FLAGS",
                        help="another setting: the rl grpo flags after -- with FLAGS appended")
    parser.add_argument("--out", type=Path, required=True, help="the JSON written at the end")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then rl grpo's flags")
    args = parser.parse_args(argv)
    if args.groups < 1:
        parser.error(f"--groups: expected at least 1; found {args.groups}")
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    variants: dict[str, list[str]] = {"default": []}
    for text in args.variant:
        name, sep, flags = text.partition("=")
        if not sep or not name or name in variants or name == START_NOISE_ALONE:
            parser.error(f"--variant: expected a new NAME=FLAGS; found {text!r}")
        variants[name] = shlex.split(flags)
    configs = {name: grpo_settings([*rest, *flags]) for name, flags in variants.items()}
    base = configs["default"]
    for name, cfg in configs.items():  # one policy, one env: the variants change sampling alone
        differs = [k for k in ("checkpoint", "synthetic", "env", "env_kwargs", "group_size",
                               "seed", "n_action_steps", "max_episode_steps")
                   if getattr(cfg, k, None) != getattr(base, k, None)]
        if differs:
            parser.error(f"--variant {name}: changes {', '.join(differs)}; a variant may change "
                         "the sampler and the group noise only")

    import torch

    if base.threads is not None:
        torch.set_num_threads(base.threads)
    run = base.preflight()
    pipe, adapter, env = run.load(trainable=False), run.adapter, run.env
    envs = env.make(max(base.group_size, base.num_envs // base.group_size * base.group_size),
                    False)
    result: dict[str, Any] = {"command": rest, "variants": dict(variants), "settings": {}}
    try:
        rows = [(START_NOISE_ALONE, base, True)] + [(n, c, False) for n, c in configs.items()]
        for name, cfg, deterministic in rows:
            t0 = time.perf_counter()
            found = summarize(group_outcomes(pipe, adapter, env, envs, cfg, args.groups,
                                             deterministic))
            found["seconds"] = round(time.perf_counter() - t0, 1)
            result["settings"][name] = found
            print(f"{name:>20}: success {found['success']:.3f}, silent groups "
                  f"{found['silent']:.2f}, within-group variance "
                  f"{found['within_group_variance']:.3f} ({found['groups']} groups, "
                  f"{found['seconds']:.0f} s)", flush=True)
    finally:
        envs.close()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(args.out, json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
