"""What a GRPO run shows and writes as it goes: one point of ``curve.json`` per iteration, the
progress bar's fields, the held-out lines, ``curve.png``, and at the end the summary and the
``cosmos3-gym eval`` command that measures the result."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import Any

import torch

from cosmos3_gym.train.config import CURVE_FILE, GRPOConfig


def curve_point(it: int, signal: dict[str, float], sums: dict[str, float], collect_s: float,
                update_s: float, device: Any, lr: float) -> dict[str, Any]:
    """One iteration's point: its episodes (``signal``, summed over the ranks) and its update
    (``sums``)."""
    episodes = signal["episodes"]
    scored = sums["scored"]
    steps = sums["steps"]
    point: dict[str, Any] = {
        "iteration": it,
        "train_success": signal["successes"] / episodes if episodes else math.nan,
        "train_return": signal["return_sum"] / episodes if episodes else math.nan,
        "groups": int(signal["groups"]), "silent_groups": int(signal["silent_groups"]),
        "chunks_with_signal": int(signal["chunks_with_signal"]),
        "update_steps": int(round(steps)),
        "loss": sums["loss"] / steps if steps else 0.0,
        "grad_norm": sums["grad_norm"] / steps if steps else 0.0,
        "clip_frac": sums["clipped"] / scored if scored else 0.0,
        "approx_kl": sums["approx_kl"] / scored if scored else 0.0,
        "lr": lr, "collect_s": round(collect_s, 2), "update_s": round(update_s, 2),
    }
    if sums["kl_stop"]:
        point["kl_stop"] = True
    if sums["kl_ref"]:
        point["kl_ref"] = sums["kl_ref"] / scored
    if device.type == "cuda":
        point["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return point


def postfix(point: dict[str, Any]) -> dict[str, str]:
    """The progress bar's fields for an iteration."""
    shown = {"success": f"{point['train_success']:.0%}", "return":
             f"{point['train_return']:.2f}", "kl": f"{point['approx_kl']:.2g}",
             "s/it": f"{point['collect_s'] + point['update_s']:.1f}"}
    if "held_out_success" in point:
        shown["held_out"] = f"{point['held_out_success']:.0%}"
    return shown


def report_held_out(point: dict[str, Any]) -> None:
    if "held_out_success" not in point:
        return
    low, high = point["held_out_interval"]
    print(f"iteration {point['iteration']}: held-out success {point['held_out_success']:.1%} "
          f"({point['held_out_successes']}/{point['held_out_episodes']}, Wilson 95% "
          f"[{low:.1%}, {high:.1%}])", flush=True)
    if "rolled_back_to" in point:
        print(f"iteration {point['iteration']}: more than --rollback below the best; training "
              f"goes on from iteration {point['rolled_back_to']}'s weights", flush=True)


def summary(cfg: GRPOConfig, curve: list[dict[str, Any]], wall: float,
            kept: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's summary (``curve.json`` beside the curve): its settings, the first and the
    last held-out measurement and their intervals, the best one, and the session's time; under
    ``--keep best`` also ``kept`` (the iteration whose weights are the result, its held-out
    success, and its success on the test episodes) and ``test_before`` (the start's); under
    ``--rollback`` ``rolled_back`` (the measurements that put the kept weights back)."""
    from dataclasses import asdict

    measured = [p for p in curve if "held_out_success" in p]
    before, after = measured[0], measured[-1]
    best = max(measured, key=lambda p: (p["held_out_success"], -p["iteration"]))
    done = {"config": asdict(cfg), "before": before.get("held_out_success"),
            "after": after.get("held_out_success"),
            "before_interval": before.get("held_out_interval"),
            "after_interval": after.get("held_out_interval"),
            "best": best["held_out_success"], "best_iteration": best["iteration"],
            "iterations_run": curve[-1]["iteration"], "wall_s": round(wall, 1),
            "torch": torch.__version__}
    if cfg.rollback is not None:  # the measurements that put the kept weights back
        done["rolled_back"] = [p["iteration"] for p in curve if "rolled_back_to" in p]
    if kept is not None:
        done["kept"] = kept
        done["test_before"] = curve[0].get("test_success")
        done["test_before_interval"] = curve[0].get("test_interval")
    return done


def print_summary(cfg: GRPOConfig, done: dict[str, Any]) -> None:
    print(f"held-out success after {done['iterations_run']} iterations: {done['after']:.1%}; "
          f"before {done['before']:.1%}; best {done['best']:.1%} (iteration "
          f"{done['best_iteration']}); {done['wall_s'] / 60:.1f} min (this session)",
          flush=True)
    kept = done.get("kept")
    if kept is not None:
        print(f"kept: the weights of iteration {kept['iteration']} (held-out "
              f"{kept['held_out_success']:.1%}); on {kept['test_episodes']} test episodes "
              f"(--test-seed {cfg.test_seed}) {kept['test_success']:.1%}, the start "
              f"{done['test_before']:.1%}", flush=True)
    if cfg.synthetic is None:
        print(f"the fine-tuned checkpoint: {done['checkpoint']}; evaluate it with\n  "
              f"{done['eval_command']}", flush=True)
    else:
        print(f"--synthetic {cfg.synthetic}: random weights, so no checkpoint is written",
              flush=True)


def eval_command(cfg: GRPOConfig, checkpoint: Path) -> str:
    """The ``cosmos3-gym eval`` command that measures the fine-tuned checkpoint on the run's
    held-out episodes (under ``--keep best``: its test episodes, the result's own measurement;
    more trials: raise ``--trials``)."""
    args = ["cosmos3-gym", "eval", "--checkpoint", str(checkpoint), "--env", cfg.env]
    for name, flag in (("suite", "--suite"), ("tasks", "--tasks"),
                       ("image_size", "--image-size"),
                       ("max_episode_steps", "--max-episode-steps"),
                       ("step_budget", "--step-budget"), ("import_modules", "--import"),
                       ("success_key", "--success-key"), ("action_map", "--action-map")):
        value = getattr(cfg, name)
        if value is not None:
            args += [flag, ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
    for name, flag in (("prompt", "--prompt"), ("env_kwargs", "--env-kwargs")):
        value = getattr(cfg, name)
        if value is not None:
            args += [flag, value if isinstance(value, str) else json.dumps(value)]
    if cfg.num_inference_steps is not None:
        args += ["--denoising-steps", str(cfg.num_inference_steps)]
    seed = cfg.test_seed if cfg.keep == "best" else cfg.eval_seed
    args += ["--trials", str(cfg.eval_trials), "--seed", str(seed), "--n-action-steps",
             str(cfg.n_action_steps), "--num-envs", str(cfg.num_envs), "--out",
             str(Path(cfg.out) / "eval")]
    return " ".join(shlex.quote(a) for a in args)


def write_curve(out: Path, cfg: GRPOConfig, curve: list[dict[str, Any]],
                done: dict[str, Any] | None = None) -> None:
    """``curve.json`` (the points, and the summary once there is one) and ``curve.png``."""
    from cosmos3_gym.jsonio import write_json_atomic

    write_json_atomic(out / CURVE_FILE, {"curve": curve, **(done or {})})
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
        ax.plot(*zip(*train, strict=True), color="0.7", lw=1,
                label=f"training episodes ({cfg.sampler})")
    if held:
        iters, rates = zip(*held, strict=True)
        intervals = [p["held_out_interval"] for p in curve if "held_out_success" in p]
        ax.fill_between(iters, [lo for lo, _ in intervals], [hi for _, hi in intervals],
                        color="C0", alpha=0.15, lw=0)
        ax.plot(iters, rates, "o-", color="C0",
                label=f"held-out ({cfg.eval_trials} per task, deterministic; Wilson 95%)")
    ax.set_xlabel("GRPO iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    model = f"--synthetic {cfg.synthetic}" if cfg.synthetic else cfg.checkpoint
    ax.set_title(f"GRPO on {cfg.env}, {model} ({cfg.train})")
    save_figure(fig, out / "curve")
