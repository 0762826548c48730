"""The FP8 accuracy gates: what quantising the GEN tower's GEMMs costs, before anyone relies on it.

``python -m cosmos3_gym.bench.fp8_gate`` measures three things and prints them (``--out`` keeps
the JSON):

1. ``sqnr``: per layer, the signal-to-quantisation-noise ratio of each quantised GEMM's output
   (Q/K/V, attention output, gate/up, down) against the same GEMM in the model's dtype on the
   same input, accumulated over every step of a pipeline call (the stream itself runs
   unquantised, so each number is that GEMM's own error).
2. ``actions``: the same weights, noise and inputs in float32, in bf16 and in bf16 with FP8; the
   gate passes when FP8's mean |action - fp32 action| is at most twice bf16's own.
3. ``closed_loop`` (the shipped tiny checkpoint only): ColorReach episodes in float32, bf16 and
   bf16 with FP8 (on a CPU torch emulates the FP8 products), paired: the same episodes (env
   seeds and noise seeds) in each arm. Success rates with Wilson intervals, and an exact McNemar
   test of FP8 against each other arm on the discordant pairs.

Sizes: ``--preset tiny`` (default) loads the shipped tiny checkpoint on the CPU; ``--preset
nano --device cuda`` runs gates 1-2 on a random-weight Cosmos3-Nano (its LIBERO-size input).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from cosmos3_gym.jsonio import write_text_atomic
from cosmos3_gym.model.fp8 import fp8_linear, quantize_rows
from cosmos3_gym.model.kernels import TorchGenOps
from cosmos3_gym.stats import mcnemar_p, wilson_interval

GEMMS = ("qkv", "out", "gate_up", "down")
ACTION_RATIO_LIMIT = 2.0


class SqnrOps(TorchGenOps):
    """Eager ops that run every GEN GEMM in the model's dtype and, beside it, the FP8 GEMM on
    the same input, keeping the signal and noise energy per (layer, GEMM)."""

    name = "sqnr"

    def __init__(self, num_layers: int) -> None:
        super().__init__()
        self.num_layers = num_layers
        self.calls = 0  # Q/K/V calls so far: the layer index is calls % num_layers
        self.energy = np.zeros((num_layers, len(GEMMS), 2))  # signal, noise

    def _record(self, gemm: str, exact: torch.Tensor, quantised: torch.Tensor) -> None:
        layer = (self.calls - 1) % self.num_layers
        exact = exact.double()
        self.energy[layer, GEMMS.index(gemm)] += (
            float(exact.pow(2).sum()), float((exact - quantised.double()).pow(2).sum()))

    def qkv(self, attn, h, cos, sin, text_kv, kv_buffers):
        self.calls += 1
        exact = F.linear(h, *attn.gen_qkv)
        self._record("qkv", exact, fp8_linear(quantize_rows(h), attn.fp8_qkv, h.dtype))
        return super().qkv(attn, h, cos, sin, text_kv, kv_buffers)

    def out(self, attn, attended):
        exact = attn.to_add_out(attended)
        self._record("out", exact, fp8_linear(quantize_rows(attended), attn.fp8_out,
                                              attended.dtype))
        return exact

    def mlp(self, mlp, h):
        inner = F.linear(h, mlp.gate_up) if mlp.hidden_act == "silu" else mlp.up_proj(h)
        self._record("gate_up", inner, fp8_linear(quantize_rows(h), mlp.fp8_in, h.dtype))
        if mlp.hidden_act == "relu2":
            act = torch.relu(inner).square()
        else:
            gate, up = inner.chunk(2, dim=-1)
            act = F.silu(gate) * up
        down = mlp.down_proj(act)
        self._record("down", down, fp8_linear(quantize_rows(act), mlp.fp8_down, act.dtype))
        return down

    def table(self) -> dict[str, list[float]]:
        """GEMM -> SQNR in dB per layer."""
        db = 10 * np.log10(self.energy[..., 0] / np.maximum(self.energy[..., 1], 1e-300))
        return {g: [round(float(v), 2) for v in db[:, i]] for i, g in enumerate(GEMMS)}


def _pipeline(preset: str, device: str, dtype: torch.dtype, **options: Any):
    """The gate's pipeline: the tiny checkpoint, or a random-weight preset with the
    synthetic benchmark's LIBERO action head; eager steps (the gates compare arithmetic)."""
    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.pipeline import InferenceOptions

    opts = InferenceOptions(cuda_graphs=False, triton_kernels=device.startswith("cuda"),
                            **options)
    if preset == "tiny":
        return Cosmos3ActionPipeline.from_pretrained("tiny", device=device, dtype=dtype,
                                                     options=opts)
    from cosmos3_gym.synthetic import synthetic_pipeline

    return synthetic_pipeline(preset, device=device, dtype=dtype, options=opts)


def _inputs(preset: str, batch: int) -> tuple[np.ndarray, list[str]]:
    side = (64, 64) if preset == "tiny" else (256, 512)
    images = np.random.default_rng(0).integers(0, 256, (batch, *side, 3), dtype=np.uint8)
    colours = ["red", "green", "blue", "yellow"]
    return images, [f"reach the {colours[i % 4]} square" for i in range(batch)]


def layer_sqnr(preset: str, device: str, batch: int, steps: int | None) -> dict[str, Any]:
    """Gate 1: per-layer SQNR of each quantised GEMM over one bf16 pipeline call."""
    pipe = _pipeline(preset, device, torch.bfloat16)
    pipe.transformer.quantize_gen_fp8()
    ops = SqnrOps(len(pipe.transformer.layers))
    pipe.denoise.ops = ops
    images, prompts = _inputs(preset, batch)
    pipe(images, prompts, seed=list(range(batch)), num_inference_steps=steps, progress=False)
    table = ops.table()
    return {"per_layer_db": table,
            "min_db": {g: min(v) for g, v in table.items()},
            "median_db": {g: float(np.median(v)) for g, v in table.items()}}


def action_deviation(preset: str, device: str, batch: int, steps: int | None,
                     fp8_bf16_steps: int) -> dict[str, Any]:
    """Gate 2: FP8's action deviation from float32 against bf16's, same weights/noise/inputs."""
    images, prompts = _inputs(preset, batch)
    call = dict(seed=list(range(batch)), num_inference_steps=steps, progress=False)
    fp32 = _pipeline(preset, device, torch.float32)
    reference = fp32(images, prompts, **call).normalized_actions
    del fp32
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    bf16 = _pipeline(preset, device, torch.bfloat16)
    plain = bf16(images, prompts, **call).normalized_actions
    from cosmos3_gym import Cosmos3ActionPipeline

    fp8_pipe = Cosmos3ActionPipeline(
        bf16.transformer, bf16.vae, bf16.tokenizer, bf16.policy,
        options=replace(bf16.options, fp8=True, fp8_bf16_steps=fp8_bf16_steps, fp8_min_tokens=0))
    quantised = fp8_pipe(images, prompts, **call).normalized_actions
    dev = {name: {"max": float(np.abs(a - reference).max()),
                  "mean": float(np.abs(a - reference).mean())}
           for name, a in (("bf16", plain), ("fp8", quantised))}
    ratio = dev["fp8"]["mean"] / max(dev["bf16"]["mean"], 1e-12)
    return {"vs_fp32": dev, "mean_ratio": ratio, "limit": ACTION_RATIO_LIMIT,
            "passed": ratio <= ACTION_RATIO_LIMIT, "disabled": fp8_pipe.disabled_options,
            "fp8_bf16_steps": fp8_bf16_steps}


def closed_loop(trials: int, num_envs: int, seed: int, steps: int | None, fp8_bf16_steps: int,
                ) -> dict[str, Any]:
    """Gate 3: paired ColorReach episodes of the tiny checkpoint in float32, bf16 and FP8: the
    same episodes (env seeds, noise seeds) in each arm, run on the episode runner."""
    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.envs import ColorReachEval
    from cosmos3_gym.pipeline import InferenceOptions, SamplerConfig
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.runner import (
        EndedEpisodes,
        EpisodeList,
        EpisodeRunner,
        RunnerOptions,
        episode_seed_rule,
        episode_specs,
    )

    arms = {"fp32": (torch.float32, InferenceOptions()),
            "bf16": (torch.bfloat16, InferenceOptions()),
            "fp8": (torch.bfloat16, InferenceOptions(fp8=True, fp8_bf16_steps=fp8_bf16_steps,
                                                     fp8_min_tokens=0))}
    eval_env = ColorReachEval()
    episodes = eval_env.episodes(trials, seed)
    outcomes: dict[str, dict[tuple[str, int], bool]] = {}
    result: dict[str, Any] = {"episodes": len(episodes), "arms": {},
                              "fp8_bf16_steps": fp8_bf16_steps}

    for name, (dtype, options) in arms.items():
        pipe = Cosmos3ActionPipeline.from_pretrained("tiny", device="cpu", dtype=dtype,
                                                     options=options)
        policy = VectorPolicy(pipe, sampling=SamplerConfig(num_inference_steps=steps),
                              seed_rule=episode_seed_rule(seed, episodes.__getitem__))
        start = time.perf_counter()
        ended = EndedEpisodes()
        EpisodeRunner(policy, lambda n: eval_env.make(n, False),
                      EpisodeList(episode_specs(eval_env, episodes)),
                      RunnerOptions(num_envs=num_envs), ended).run()
        outcomes[name] = {r.spec.tag.key: bool(r.success) for r in ended.results.values()}
        wins = sum(outcomes[name].values())
        low, high = wilson_interval(wins, len(outcomes[name]))
        result["arms"][name] = {"successes": wins, "episodes": len(outcomes[name]),
                                "rate": wins / len(outcomes[name]), "wilson95": [low, high],
                                "seconds": round(time.perf_counter() - start, 1),
                                "disabled": pipe.disabled_options}
    keys = sorted(outcomes["fp8"])
    if any(sorted(o) != keys for o in outcomes.values()):
        raise RuntimeError("the arms ran different episodes; they cannot be paired")
    for other in ("bf16", "fp32"):
        b = sum(outcomes[other][k] and not outcomes["fp8"][k] for k in keys)
        c = sum(outcomes["fp8"][k] and not outcomes[other][k] for k in keys)
        result[f"fp8_vs_{other}"] = {"only_" + other: b, "only_fp8": c,
                                     "mcnemar_p": mcnemar_p(b, c)}
    return result


def format_gates(result: dict[str, Any]) -> str:
    lines = [f"FP8 accuracy gates ({result['preset']} on {result['device']})"]
    if result.get("sqnr"):
        s = result["sqnr"]
        lines.append("per-layer SQNR of the FP8 GEMMs vs bf16, dB (min / median over layers): "
                     + ", ".join(f"{g} {s['min_db'][g]:.1f} / {s['median_db'][g]:.1f}"
                                 for g in GEMMS))
    if result.get("actions"):
        a = result["actions"]
        d = a["vs_fp32"]
        lines.append(f"actions vs fp32 (mean / max |diff|): bf16 {d['bf16']['mean']:.4g} / "
                     f"{d['bf16']['max']:.4g}, fp8 {d['fp8']['mean']:.4g} / "
                     f"{d['fp8']['max']:.4g}; fp8/bf16 = {a['mean_ratio']:.2f} (limit "
                     f"{a['limit']:.0f}): {'PASS' if a['passed'] else 'FAIL'}")
    if result.get("closed_loop"):
        c = result["closed_loop"]
        arms = ", ".join(f"{k} {v['successes']}/{v['episodes']} [{v['wilson95'][0]:.1%}, "
                         f"{v['wilson95'][1]:.1%}]" for k, v in c["arms"].items())
        lines.append(f"closed loop, {c['episodes']} paired ColorReach episodes: {arms}")
        for other in ("bf16", "fp32"):
            m = c[f"fp8_vs_{other}"]
            lines.append(f"  fp8 vs {other}: discordant {m['only_' + other]} ({other} only) / "
                         f"{m['only_fp8']} (fp8 only), McNemar exact p = {m['mcnemar_p']:.3g}")
    return "\n".join(lines)


def run_gates(preset: str = "tiny", device: str = "cpu", batch: int = 4, steps: int | None = None,
              fp8_bf16_steps: int = 0, trials: int = 0, num_envs: int = 20, seed: int = 0,
              out: Path | None = None) -> dict[str, Any]:
    """Every gate that applies to ``preset`` (closed loop: tiny only, when ``trials`` > 0),
    written to ``out`` after each one (a run cut short keeps what it measured)."""
    result: dict[str, Any] = {"preset": preset, "device": device, "batch": batch,
                              "steps": steps, "torch": torch.__version__}

    def save() -> None:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out, json.dumps(result, indent=2))

    result["sqnr"] = layer_sqnr(preset, device, batch, steps)
    save()
    result["actions"] = action_deviation(preset, device, batch, steps, fp8_bf16_steps)
    save()
    if trials and preset == "tiny":
        result["closed_loop"] = closed_loop(trials, num_envs, seed, steps, fp8_bf16_steps)
        save()
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m cosmos3_gym.bench.fp8_gate",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", help="tiny (the shipped checkpoint, default), "
                   "or a random-weight shape: nano, super, edge")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=4, help="items per call (gates 1-2)")
    p.add_argument("--denoising-steps", dest="steps", type=int, default=None,
                   help="denoising steps per chunk (default: the checkpoint's)")
    p.add_argument("--fp8-bf16-steps", type=int, default=0,
                   help="steps kept in bf16 at each end for the FP8 arms (default 0: every "
                        "step in FP8, the strictest; the pipeline's default is 3)")
    p.add_argument("--trials", type=int, default=0,
                   help="closed loop: trials per ColorReach colour (4 colours; 25 gives 100 "
                        "paired episodes); 0 skips it")
    p.add_argument("--num-envs", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the JSON here")
    args = p.parse_args(argv)
    result = run_gates(args.preset, args.device, args.batch, args.steps, args.fp8_bf16_steps,
                       args.trials, args.num_envs, args.seed,
                       Path(args.out) if args.out else None)
    print(format_gates(result))
    return result


if __name__ == "__main__":
    main()
