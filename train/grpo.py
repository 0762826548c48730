"""``cosmos3-gym rl grpo``: on-policy GRPO fine-tuning of a tiny policy on ColorReach.

The reference loop, end to end on a CPU: the shipped tiny policy in a harder ColorReach (a higher
``max_speed``), groups of episodes from one start state collected with Flow-SDE
(:func:`~cosmos3_gym.runner.collect_on_policy`), group-relative advantages of their success, PPO's
clipped surrogate on :func:`~cosmos3_gym.pipeline.chunk_log_prob`, and held-out success with the
deterministic sampler. What each step does, its learning curve and how to size the groups:
docs/rl.md, "GRPO".
"""

from __future__ import annotations

import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos3_gym.settings import positive_int, setting


@dataclass
class GRPOConfig:
    """Every knob of the GRPO run, with its default and why (``cosmos3-gym rl grpo``'s
    options are generated from these fields)."""

    init: str = setting(
        "tiny", "the checkpoint to fine-tune: a folder or a shipped name; the shipped tiny "
        "policy reaches 100% at ColorReach's own speed and overshoots at --max-speed",
        group="rl")
    out: str = setting("runs/grpo", "where the command writes its results; curve.json, "
                       "curve.png and the fine-tuned checkpoint/", group="rl")
    max_speed: float = setting(
        0.28, "ColorReach's arena units per step at full action (the env's own is 0.08: a "
        "harder setting)", group="rl")
    seed: int = setting(
        0, "the run's root seed; the training episodes, their noise and the minibatch order "
        "derive from it", group="rl", parse=int)
    iterations: int = setting(200, "GRPO iterations (collect, then update)", group="rl",
                              parse=positive_int)
    group_size: int = setting(
        8, "episodes per group, from one start state; GRPO compares them with each other",
        group="rl", parse=positive_int)
    groups: int = setting(2, "groups collected per iteration", group="rl", parse=positive_int)
    noise_level: float = setting(
        0.5, "the stochastic steps' noise level (flow_sde, flow_cps); GRPO samples with flow_sde "
        "(RLinf's default 0.5)", group="rl")
    n_action_steps: int = setting(
        4, "actions executed per chunk before replanning; their log-probability is the chunk's",
        group="rl", parse=positive_int)
    lr: float = setting(1e-4, "the optimiser's learning rate (AdamW); constant", group="rl")
    clip: float = setting(0.2, "PPO's clip on the chunk probability ratio", group="rl")
    epochs: int = setting(2, "passes over each iteration's chunks", group="rl",
                          parse=positive_int)
    minibatch: int = setting(64, "chunks per update step", group="rl", parse=positive_int)
    eval_episodes: int = setting(
        80, "held-out episodes of the success measurement (a multiple of --eval-envs), with the "
        "deterministic sampler", group="rl", parse=positive_int)
    eval_envs: int = setting(16, "env slots of the held-out measurement", group="rl",
                             parse=positive_int)
    eval_seed: int = setting(1_000_000, "the held-out episodes' first seed", group="rl",
                             parse=int)
    eval_every: int = setting(10, "iterations between held-out measurements", group="rl",
                              parse=positive_int)
    time_budget_s: float = setting(
        1200.0, "stop early (after a measurement) once this many seconds have passed; 0: no "
        "limit", group="rl")
    threads: int = setting(
        1, "torch intra-op CPU threads; 1 keeps the result independent of how busy a shared "
        "machine is", group="rl", parse=positive_int)

    def __post_init__(self) -> None:
        for name in ("iterations", "group_size", "groups", "epochs", "minibatch",
                     "eval_episodes", "eval_envs", "eval_every", "n_action_steps", "threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1; found {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"group_size must be >= 2 (GRPO compares a group); found "
                             f"{self.group_size}")
        if self.eval_episodes % self.eval_envs:
            raise ValueError(f"eval_episodes ({self.eval_episodes}) must be a multiple of "
                             f"eval_envs ({self.eval_envs})")


def group_advantages(returns: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``(R − mean_group) / (std_group + 1e-6)`` per episode; 0 in groups of equal returns.

    >>> adv = group_advantages(torch.tensor([1., 0., 1., 1.]), torch.tensor([0, 0, 1, 1]))
    >>> [round(a, 4) for a in adv.tolist()]
    [1.0, -1.0, 0.0, 0.0]
    """
    adv = torch.zeros_like(returns)
    for g in torch.unique(groups):
        members = groups == g
        r = returns[members]
        adv[members] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    return adv


def held_out_success(pipe: Any, cfg: GRPOConfig) -> float:
    from cosmos3_gym.train.success import evaluate_success

    return evaluate_success(pipe, episodes=cfg.eval_episodes, num_envs=cfg.eval_envs,
                            seed=cfg.eval_seed, n_action_steps=cfg.n_action_steps,
                            env_kwargs={"max_speed": cfg.max_speed})["success_rate"]


def run_grpo(cfg: GRPOConfig, progress: bool = True) -> dict[str, Any]:
    """Fine-tune ``cfg.init`` with GRPO; returns (and writes) the learning curve."""
    from gymnasium.vector import AutoresetMode

    from cosmos3_gym.checkpoint import resolve_checkpoint
    from cosmos3_gym.envs import ColorReachEval
    from cosmos3_gym.model.weights import save_transformer
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline, chunk_log_prob
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.progress import progress_bar
    from cosmos3_gym.runner import collect_on_policy, stochastic_record

    check_init(cfg)
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    # trainable: unfused projections, so the sampling transformer is the trained one (fused
    # weights are plain tensors autograd does not reach). The single-frame encoder (default)
    # gives the causal VAE encode's latents to ~1e-5 at a third of its time.
    pipe = Cosmos3ActionPipeline.from_pretrained(cfg.init, trainable=True)
    model = pipe.transformer
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    eval_env = ColorReachEval(max_speed=cfg.max_speed)
    num_envs = cfg.groups * cfg.group_size
    envs = eval_env.make(num_envs, False, autoreset_mode=AutoresetMode.DISABLED)
    budget = eval_env.max_episode_steps
    generator = torch.Generator().manual_seed(cfg.seed)

    curve: list[dict[str, Any]] = []
    before = held_out_success(pipe, cfg)
    curve.append({"iteration": 0, "held_out_success": before, "wall_s": 0.0})
    print(f"held-out success before: {before:.1%} ({cfg.eval_episodes} episodes)", flush=True)
    bar = progress_bar(enabled=progress, total=cfg.iterations, desc="grpo", unit="it")
    last_train = None
    try:
        for it in range(1, cfg.iterations + 1):
            policy = VectorPolicy(pipe, n_action_steps=cfg.n_action_steps,
                                  seed=cfg.seed * 100_003 + it, sampler="flow_sde",
                                  noise_level=cfg.noise_level)
            batch = collect_on_policy(policy, envs, budget, eval_env=eval_env,
                                      seed=cfg.seed * 1_000 + it, group_size=cfg.group_size)
            stats = _update(model, pipe, optimizer, batch, cfg, generator, stochastic_record,
                            chunk_log_prob)
            last_train = stats
            point: dict[str, Any] = {"iteration": it, **stats,
                                     "wall_s": round(time.perf_counter() - start, 1)}
            over = cfg.time_budget_s and time.perf_counter() - start > cfg.time_budget_s
            if it % cfg.eval_every == 0 or it == cfg.iterations or over:
                point["held_out_success"] = held_out_success(pipe, cfg)
            curve.append(point)
            bar.set_postfix({"train": f"{stats['train_success']:.0%}",
                             "held_out": f"{point.get('held_out_success', float('nan')):.0%}"},
                            refresh=False)
            bar.update(1)
            _write_curve(out, cfg, curve)
            if over:
                break
    finally:
        bar.close()
        envs.close()
    after = curve[-1]["held_out_success"]
    wall = time.perf_counter() - start
    ckpt = out / "checkpoint"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    shutil.copytree(resolve_checkpoint(cfg.init), ckpt,
                    ignore=shutil.ignore_patterns("transformer", "train_log.json",
                                                  "training.json"))
    save_transformer(model.eval(), ckpt / "transformer")
    summary = {"config": asdict(cfg), "before": before, "after": after,
               "iterations_run": curve[-1]["iteration"], "wall_s": round(wall, 1),
               "load_average": os.getloadavg(), "torch": torch.__version__,
               "last_train": last_train}
    _write_curve(out, cfg, curve, summary)
    print(f"held-out success after {curve[-1]['iteration']} iterations: {after:.1%} "
          f"({cfg.eval_episodes} episodes); before {before:.1%}; {wall / 60:.1f} min; "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)
    return {"curve": curve, **summary}


def _update(model, pipe, optimizer, batch, cfg, generator, stochastic_record, chunk_log_prob):
    """One GRPO update from a collected batch; returns the iteration's statistics."""
    finished = batch["episode_finished"]
    groups, returns = batch["episode_group"], batch["episode_success"].float()
    complete = torch.zeros_like(finished)
    for g in torch.unique(groups):
        members = groups == g
        if finished[members].all() and members.sum() == cfg.group_size:
            complete |= members
    adv_ep = torch.zeros_like(returns)
    if complete.any():
        adv_ep[complete] = group_advantages(returns[complete], groups[complete])
    chunk_ep = batch["chunk_episode"]
    chunks = torch.nonzero(complete[chunk_ep] & (adv_ep[chunk_ep] != 0)).flatten()
    stats = {"train_success": float(returns[complete].mean()) if complete.any() else float("nan"),
             "groups": int(torch.unique(groups[complete]).numel()),
             "chunks_with_signal": int(chunks.numel()), "loss": 0.0, "clip_frac": 0.0}
    if chunks.numel() == 0:
        return stats
    old = batch["chunk_log_prob"][chunks]
    adv = adv_ep[chunk_ep[chunks]]
    prompts = batch["chunk_prompts"]
    losses, clipped = [], []
    for _ in range(cfg.epochs):
        order = torch.randperm(chunks.numel(), generator=generator)
        for s in range(0, chunks.numel(), cfg.minibatch):
            part = order[s : s + cfg.minibatch]
            rows = chunks[part].numpy()
            record = stochastic_record(batch, rows)
            new = chunk_log_prob(pipe, record, [prompts[r] for r in rows], model=model)
            ratio = torch.exp((new - old[part]).clamp(-20.0, 20.0))
            a = adv[part]
            surrogate = torch.minimum(ratio * a, ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * a)
            loss = -surrogate.mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(float(loss.detach()))
            clipped.append(float(((ratio.detach() - 1).abs() > cfg.clip).float().mean()))
    stats.update(loss=float(np.mean(losses)), clip_frac=float(np.mean(clipped)))
    return stats


def _write_curve(out: Path, cfg: GRPOConfig, curve: list[dict[str, Any]],
                 summary: dict[str, Any] | None = None) -> None:
    from cosmos3_gym.jsonio import write_json_atomic

    write_json_atomic(out / "curve.json", {"curve": curve, **(summary or {})})
    try:
        from cosmos3_gym.plotting import PlottingUnavailable, new_figure, save_figure
    except ImportError:
        return
    try:
        fig = new_figure(6.0, 3.6)
    except PlottingUnavailable:
        return
    ax = fig.add_subplot(1, 1, 1)
    held = [(p["iteration"], p["held_out_success"]) for p in curve if "held_out_success" in p]
    train = [(p["iteration"], p["train_success"]) for p in curve
             if not math.isnan(p.get("train_success", math.nan))]
    if train:
        ax.plot(*zip(*train, strict=True), color="0.7", lw=1, label="training episodes (Flow-SDE)")
    label = f"held-out ({cfg.eval_episodes} episodes, deterministic sampler)"
    ax.plot(*zip(*held, strict=True), "o-", color="C0", label=label)
    ax.set_xlabel("GRPO iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title("GRPO on ColorReach, tiny Cosmos3 policy")
    save_figure(fig, out / "curve")


def check_init(cfg: GRPOConfig) -> None:
    """Refuse a starting checkpoint that is not there, saying how to make one."""
    from cosmos3_gym.checkpoint import resolve_checkpoint

    try:
        resolve_checkpoint(cfg.init)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"--init {cfg.init}: no checkpoint there; give a checkpoint folder (one written by "
            f"`cosmos3-gym train --out {cfg.init}`) or a shipped name (tiny)"
        ) from None
