"""One GRPO iteration at a published model shape with random weights: seconds and peak memory.

``python -m cosmos3_gym.bench.grpo_step --preset nano --out grpo_nano.json`` builds the
generator of ``preset`` with random weights on the device (``--synthetic``), sets it up to train
as ``--train`` says (LoRA by default, with gradient checkpointing), and runs one iteration of
``cosmos3-gym rl grpo``'s own parts on ColorReach at LIBERO's input (two 256x256 views side by
side, 16-action chunks): ``groups x group_size`` episodes collected with Flow-SDE, then the
update over every chunk. Random weights succeed by chance only, so the episodes' outcomes are
set to alternate within each group (half succeed): every chunk then carries an advantage and
the update does the work a real iteration does. What it writes: the collection's and the
update's seconds, the chunks and steps, the peak memory of each phase beside
:mod:`~cosmos3_gym.train.memory`'s estimate, and the setting.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from cosmos3_gym.jsonio import write_text_atomic


def run(preset: str, *, device: str, train: str, groups: int, group_size: int, steps: int,
        minibatch: int, microbatch: int, checkpointing: bool, episode_steps: int,
        lora_rank: int, out: Path) -> dict[str, Any]:
    from cosmos3_gym.devices import resolve_device
    from cosmos3_gym.pipeline.sampling import SamplerConfig
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.runner import GroupEpisodes, collect_on_policy, group_seed_rule
    from cosmos3_gym.source import load_policy, read_model_source
    from cosmos3_gym.train import grpo
    from cosmos3_gym.train.data_parallel import DataParallel
    from cosmos3_gym.train.memory import run_estimate

    dev = resolve_device(device)
    cfg = grpo.GRPOConfig(synthetic=preset, device=str(dev), train=train, groups=groups,
                          group_size=group_size, num_inference_steps=steps,
                          n_action_steps=16, minibatch=minibatch, microbatch=microbatch,
                          epochs=1, gradient_checkpointing=checkpointing, lora_rank=lora_rank,
                          max_episode_steps=episode_steps, out=str(out.parent))
    result: dict[str, Any] = {"preset": preset, "device": str(dev), "train": train,
                              "groups": groups, "group_size": group_size, "steps": steps,
                              "minibatch": minibatch, "microbatch": microbatch,
                              "gradient_checkpointing": checkpointing, "lora_rank": lora_rank,
                              "episode_steps": episode_steps}

    def save() -> None:
        write_text_atomic(out, json.dumps(result, indent=2))

    def peak() -> float | None:
        if dev.type != "cuda":
            return None
        torch.cuda.synchronize(dev)
        return round(torch.cuda.max_memory_allocated(dev) / 2**30, 2)

    start = time.perf_counter()
    device_, dtype, _ = cfg.resolve_runtime()
    cfg = cfg.resolved()
    eval_env = cfg.make_env()
    pipe, adapter = load_policy(read_model_source(cfg, eval_env), eval_env, device=device_,
                                dtype=dtype, trainable=True, action_map=cfg.action_map)
    learner = grpo.Learner(pipe, cfg)
    result["build_s"] = round(time.perf_counter() - start, 1)
    result["trained_parameters"] = learner.trainable.count
    result["parameters"] = sum(p.numel() for p in learner.model.parameters())
    envs = eval_env.make(groups * group_size, False)
    estimate = run_estimate(learner, cfg, eval_env, envs, adapter, device_, groups * group_size,
                            grpo.most_chunks(cfg, episode_steps))
    result["estimate_gib"] = {k: round(v / 2**30, 2) for k, v in vars(estimate).items()}
    result["estimate_gib"]["total"] = round(estimate.total / 2**30, 2)
    result["loaded_gib"] = peak()
    save()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    sampling = SamplerConfig(sampler="flow_sde", noise_level=0.5, num_inference_steps=steps,
                             noise="per_chunk")
    policy = VectorPolicy(pipe, adapter=adapter, n_action_steps=16, sampling=sampling,
                          seed_rule=group_seed_rule(0))
    t0 = time.perf_counter()
    batch = collect_on_policy(policy, envs, episode_steps, eval_env=eval_env,
                              schedule=GroupEpisodes(eval_env, 0, range(groups), group_size))
    envs.close()
    result["collect_s"] = round(time.perf_counter() - t0, 2)
    result["collect_peak_gib"] = peak()
    result["chunks"] = len(batch["chunk_env"])
    # Random weights: outcomes alternate within each group, so every chunk has an advantage.
    members = torch.arange(len(batch["episode_id"])) % group_size
    batch["episode_success"] = members % 2 == 0
    batch["episode_finished"][:] = True
    signal = grpo.batch_signal(batch, group_size, cfg.reward, cfg.advantages,
                               aggregate=cfg.aggregate, return_weight=cfg.return_weight,
                               negatives=cfg.negatives, loss_norm=cfg.loss_norm)
    result["chunks_with_signal"] = len(signal.rows)
    save()
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    t1 = time.perf_counter()
    sums = grpo.update(learner, batch, signal, 1, cfg, DataParallel(0, 1))
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    result["update_s"] = round(time.perf_counter() - t1, 2)
    result["update_peak_gib"] = peak()
    result["update_steps"] = int(sums["steps"])
    result["iteration_s"] = round(result["collect_s"] + result["update_s"], 2)
    result["complete"] = True
    save()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="nano")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--train", default="lora")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--denoising-steps", type=int, default=10)
    parser.add_argument("--minibatch", type=int, default=64)
    parser.add_argument("--microbatch", type=int, default=8)
    parser.add_argument("--episode-steps", type=int, default=48,
                        help="ColorReach's episode budget (48: three 16-action chunks)")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--no-gradient-checkpointing", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = run(args.preset, device=args.device, train=args.train, groups=args.groups,
                 group_size=args.group_size, steps=args.denoising_steps,
                 minibatch=args.minibatch, microbatch=args.microbatch,
                 checkpointing=not args.no_gradient_checkpointing,
                 episode_steps=args.episode_steps, lora_rank=args.lora_rank, out=args.out)
    print(json.dumps({k: result.get(k) for k in ("preset", "iteration_s", "collect_s",
                                                  "update_s", "update_peak_gib")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
