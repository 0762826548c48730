"""``cosmos3-gym bench``: the action stack measured in isolation (no env, no server).

What it measures, all in one process and one run so ratios are side by side:

- latency and actions/s per batch size, batched versus the same items as serial B=1 calls
  (``speedup_vs_serial``: batched actions/s over serial actions/s, the headline);
- the text (UND) K/V cache on versus off (``text_cache_speedup``);
- prompts of mixed token lengths versus equal lengths in one batch;
- each hot-path optimisation switched off alone (fused projections, K/V buffers, folded query
  groups, the single-frame VAE encoder, the prompt cache across calls), and the RoPE and
  RMSNorm kernels against their textbook forms at Cosmos3-Nano shapes;
- per-stage seconds (admission ... decode) and peak memory: CUDA max-allocated on GPU, process
  peak RSS on CPU.

Every comparison alternates its two sides (serial pass, batched call, serial pass, ...;
switch off, as shipped, ...) for ``repeats`` pairs after ``warmup`` untimed pairs, and reports
the median of each side and the median of the per-pair ratios, so that a shared machine's
drift moves both sides of a ratio together.

A busy machine can still make a ratio meaningless, so every comparison is checked before it is
shown (:func:`~cosmos3_gym.bench.paired.why_unstable`): its per-pair ratios must agree within
``MAX_PAIR_SPREAD``, and at B=1, where batched and serial are the same call, the two sides must
agree within ``SAME_CALL_TOLERANCE``. A comparison that fails is listed under ``unstable`` in
the JSON (with its per-pair ratios, ``stable`` false) and its ratio is replaced by ``unstable``
in the table, with the reason below it.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cosmos3_gym.bench.paired import Stages, paired, peak_memory_mb, stage_seconds, why_unstable
from cosmos3_gym.jsonio import write_text_atomic
from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.settings import (
    ModelSettings,
    RuntimeSettings,
    check_settings,
    int_list,
    positive_int,
    setting,
    threads_setting,
)
from cosmos3_gym.source import ModelSource, read_model_source

if TYPE_CHECKING:  # torch and the model stack load when the benchmark runs, not with the CLI
    import torch

    from cosmos3_gym import Cosmos3ActionPipeline

PROMPTS = [
    "put the black bowl on the plate",
    "open the top drawer of the cabinet and put the bowl inside it",
    "turn on the stove",
    "pick up the alphabet soup and place it in the basket next to the cream cheese box",
]
EQUAL_PROMPT = PROMPTS[0]
# The benchmark's name for each optimisation -> the InferenceOptions field that switches it.
SWITCHES = {
    "text_cache": "text_cache",
    "kv_buffers": "kv_buffers",
    "fused_projections": "fuse_projections",
    "folded_query_groups": "fold_query_groups",
    "frame_encoder": "frame_encoder",
    "prompt_cache": "prompt_cache",
}


def kernel_microbench(device: str = "cpu", batch: int = 8, repeats: int = 10) -> dict[str, Any]:
    """RoPE and RMSNorm at Cosmos3-Nano GEN shapes (32 heads x 128, 266 tokens): the textbook
    form (``rotate_half`` + ``torch.cat``; RMSNorm as five ops) against ours, with a check that
    both give the same bits."""
    import torch

    from cosmos3_gym.model.rope import apply_rope
    from cosmos3_gym.model.transformer import RMSNorm

    dev = torch.device(device)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(batch, 32, 266, 128, generator=gen).to(dev)
    angles = torch.randn(batch, 1, 266, 64, generator=gen).to(dev)
    cos, sin = angles.cos(), angles.sin()
    cos_full, sin_full = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    norm = RMSNorm(128, 1e-6).to(dev)

    def rotate_half() -> torch.Tensor:
        return x * cos_full + torch.cat([-x[..., 64:], x[..., :64]], -1) * sin_full

    def rms_five_ops() -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * norm.weight

    def ms(fn: Callable[[], Any]) -> float:
        fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        for _ in range(repeats):
            fn()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return (time.perf_counter() - start) / repeats * 1e3

    with torch.no_grad():
        rope_ref, rope_ms = ms(rotate_half), ms(lambda: apply_rope(x, cos, sin))
        norm_ref, norm_ms = ms(rms_five_ops), ms(lambda: norm(x))
        return {
            "shape": [batch, 32, 266, 128],
            "rope_rotate_half_ms": rope_ref, "rope_no_cat_ms": rope_ms,
            "rope_speedup": rope_ref / rope_ms,
            "rope_bit_identical": bool(torch.equal(rotate_half(), apply_rope(x, cos, sin))),
            "rmsnorm_five_ops_ms": norm_ref, "rmsnorm_fused_ms": norm_ms,
            "rmsnorm_speedup": norm_ref / norm_ms,
            "rmsnorm_bit_identical": bool(torch.equal(rms_five_ops(), norm(x))),
        }


def run_benchmark(
    source: ModelSource,
    *,
    device: str = "cpu",
    precision_name: str = "auto",
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32),
    image_size: tuple[int, int] = (256, 512),
    sampling: SamplerConfig | None = None,
    warmup: int = 1,
    repeats: int = 5,
    compare_batch: int = 8,
    overlap_env: str | None = None,
    overlap_envs: int = 4,
    overlap_trials: int = 2,
) -> dict[str, Any]:
    """Run the benchmark and return its JSON-ready result (see the module docstring).

    ``source`` is the checkpoint, read once (:func:`~cosmos3_gym.source.read_model_source`:
    its folder and the head it runs with); every call samples as ``sampling`` says (default: the
    checkpoint's settings)."""
    import torch

    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.devices import resolve_device, resolve_precision
    from cosmos3_gym.pipeline.options import TRANSFORMER_OPTIONS, InferenceOptions

    dev = resolve_device(device)
    precision, fp8 = resolve_precision(precision_name, dev)
    sampling = sampling or SamplerConfig()
    pipe = source.load(device=dev, dtype=precision, options=InferenceOptions(fp8=fp8))
    horizon = pipe.action_horizon
    rng = np.random.default_rng(0)
    max_b = max(*batch_sizes, compare_batch)
    images = rng.integers(0, 256, size=(max_b, *image_size, 3), dtype=np.uint8)
    mixed = [PROMPTS[i % len(PROMPTS)] for i in range(max_b)]

    def call(p: Cosmos3ActionPipeline, items: range, prompts: list[str]) -> Stages:
        out = p(images[items.start : items.stop], prompts[items.start : items.stop],
                seed=list(items), progress=False, **sampling.call_kwargs(None))
        return stage_seconds(out.timings)

    def serial(b: int) -> Stages:
        """The b items as b separate B=1 calls; stage seconds summed over the calls."""
        total: Stages = {}
        for i in range(b):
            for k, v in call(pipe, range(i, i + 1), mixed).items():
                total[k] = total.get(k, 0.0) + v
        return total

    per_batch: dict[str, Any] = {}
    unstable: dict[str, str] = {}  # comparison -> why its ratio is not shown

    def check(name: str, m: dict[str, Any], same_call: bool = False) -> bool:
        reason = why_unstable(m, same_call)
        if reason is not None:
            unstable[name] = reason
        return reason is None

    for b in batch_sizes:
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        m = paired(lambda b=b: serial(b), lambda b=b: call(pipe, range(b), mixed),
                    warmup, repeats)
        per_batch[str(b)] = {
            "stable": check(f"B={b} vs serial", m, same_call=b == 1),
            "pair_ratios": m["pair_ratios"],
            "latency_s": m["b_s"],
            "actions_per_s": b * horizon / m["b_s"],
            "serial_latency_s": m["a_s"],
            "serial_actions_per_s": b * horizon / m["a_s"],
            # Batched actions/s over serial actions/s: the median of paired ratios.
            "speedup_vs_serial": m["ratio"],
            "stages_s": m["b_stages_s"],
            "serial_stages_s": m["a_stages_s"],
            # The model's share alone: the denoising loop, batched vs b serial loops.
            "denoise_speedup_vs_serial": m["denoise_ratio"],
            "peak_memory_mb": peak_memory_mb(dev),
        }

    b = compare_batch

    def switched_off(option: str) -> Cosmos3ActionPipeline:
        """The pipeline as shipped but for ``option``: a stage option shares its transformer,
        VAE and tokenizer; a transformer option needs a transformer loaded with it."""
        options, _ = pipe.options.flip(option)  # off, with what needs it (graphs, kernels)
        if option in TRANSFORMER_OPTIONS:
            return Cosmos3ActionPipeline.from_pretrained(  # the folder read once, above
                source.folder, device=dev, dtype=precision, policy=pipe.policy, options=options)
        return Cosmos3ActionPipeline(
            pipe.transformer, pipe.vae, pipe.tokenizer, pipe.policy, options=options,
            contract=pipe.contract, checkpoint=pipe.checkpoint
        )

    # Each optimisation switched off alone, paired with the pipeline as shipped: slowdown
    # factors, i.e. each one's speedup as shipped (whole call and denoising stage). One variant
    # at a time, so at most two transformers are in memory.
    optimisations = {}
    for name, option in SWITCHES.items():
        variant = switched_off(option)
        m = paired(lambda v=variant: call(v, range(b), mixed),
                    lambda: call(pipe, range(b), mixed), warmup, repeats)
        optimisations[name] = {"total": m["ratio"], "denoise": m["denoise_ratio"],
                               "stable": check(name, m), "pair_ratios": m["pair_ratios"]}
        del variant
    m = paired(lambda: call(pipe, range(b), mixed),
                lambda: call(pipe, range(b), [EQUAL_PROMPT] * max_b), warmup, repeats)
    mixed_vs_equal = m["ratio"]
    check("mixed/equal prompt lengths", m)
    env_overlap = None
    if overlap_env is not None:
        from cosmos3_gym.bench.overlap import measure_overlap

        env_overlap = measure_overlap(
            pipe, env=overlap_env, num_envs=overlap_envs, trials=overlap_trials,
            sampling=sampling,
        )
    return {
        "checkpoint": source.checkpoint,
        "domain": pipe.policy.domain_name,
        "device": str(dev),
        "dtype": str(precision).removeprefix("torch."),
        "options": asdict(pipe.options),
        "host": platform.node(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "image_size": list(image_size),
        "action_horizon": horizon,
        "num_inference_steps": sampling.num_inference_steps or pipe.policy.num_inference_steps,
        "sampling": asdict(sampling),
        "warmup": warmup,
        "repeats": repeats,
        "statistic": "median",
        "stable": not unstable,
        "unstable": unstable,
        "batched": per_batch,
        "speedup_vs_serial": {k: v["speedup_vs_serial"] for k, v in per_batch.items()},
        "compare_batch": b,
        "text_cache_speedup": optimisations["text_cache"]["total"],
        "optimisations": optimisations,
        "mixed_vs_equal_prompt_latency": mixed_vs_equal,
        "kernels": kernel_microbench(str(dev), batch=b),
        "env_overlap": env_overlap,
    }


def format_table(result: dict[str, Any]) -> str:
    """A short plain-text table of a benchmark result."""
    lines = [
        f"cosmos3-gym bench: {result['checkpoint']} on {result['device']}, "
        f"H={result['action_horizon']}, steps={result['num_inference_steps']}, "
        f"medians of {result['repeats']} paired runs (warmup {result['warmup']})",
        f"{'B':>4} {'serial s':>9} {'latency s':>10} {'actions/s':>10} {'vs serial':>10} "
        f"{'denoise s':>10} {'encode s':>9} {'peak MB':>8} {'denoise vs serial':>8}",
    ]
    unstable = result["unstable"]

    def ratio(name: str, value: float, width: int = 0, unit: str = "x") -> str:
        return f"{'unstable' if name in unstable else f'{value:.2f}{unit}':>{width}}"

    for b, row in result["batched"].items():
        name = f"B={b} vs serial"
        lines.append(
            f"{b:>4} {row['serial_latency_s']:>9.3f} {row['latency_s']:>10.3f} "
            f"{row['actions_per_s']:>10.1f} "
            f"{ratio(name, result['speedup_vs_serial'][b], 10)} "
            f"{row['stages_s']['denoise']:>10.3f} "
            f"{row['stages_s']['encode']:>9.3f} {row['peak_memory_mb']:>8.0f} "
            f"{ratio(name, row['denoise_speedup_vs_serial'], 9)}"
        )
    b = result["compare_batch"]
    opts = result["optimisations"]
    lines.append(f"at B={b}, each optimisation's speedup as shipped (whole call / denoise stage): "
                 + ", ".join(f"{name} {ratio(name, r['total'])} / {ratio(name, r['denoise'])}"
                             for name, r in opts.items()))
    mixed = result["mixed_vs_equal_prompt_latency"]
    lines.append(f"mixed/equal prompt lengths: latency ratio "
                 f"{ratio('mixed/equal prompt lengths', mixed, unit='')}")
    k = result["kernels"]
    lines.append(
        f"kernels at Nano shapes {k['shape']}: RoPE without cat {k['rope_speedup']:.2f}x "
        f"(bit-identical: {k['rope_bit_identical']}), one-op RMSNorm {k['rmsnorm_speedup']:.2f}x "
        f"(bit-identical: {k['rmsnorm_bit_identical']})"
    )
    overlap = result.get("env_overlap")
    if overlap:
        lines.append(
            f"env overlap ({overlap['env']}, {overlap['num_envs']} envs in 2 groups): "
            f"{overlap['sequential_steps_per_s']:.1f} -> {overlap['overlapped_steps_per_s']:.1f} "
            f"env steps/s ({overlap['overlap_speedup']:.2f}x; the same episodes: "
            f"{overlap['identical_episodes']})"
        )
    if unstable:
        lines.append(
            f"UNSTABLE timing: {len(unstable)} comparison(s) not shown, the machine was too busy "
            "for their ratios to mean anything: "
            + "; ".join(f"{name}: {why}" for name, why in unstable.items())
            + ". Rerun on an idle machine or with --threads 1 (the JSON keeps every pair's ratio)."
        )
    return "\n".join(lines)


@dataclass
class BenchConfig(ModelSettings, RuntimeSettings):
    """Every knob of ``cosmos3-gym bench`` (its options are generated from these fields)."""

    out: str = setting("bench.json", "where the command writes its results; a JSON file (and "
                       "a plot beside it)", group="bench")
    batch_sizes: tuple[int, ...] = setting(
        (1, 2, 4, 8, 16, 32), "batch sizes to time, comma-separated", group="bench",
        parse=int_list)
    input_size: str = setting("256x512", "the synthetic observations' size HxW in pixels",
                              group="bench", metavar="HxW")
    warmup: int = setting(1, "untimed pairs before each comparison", group="bench", parse=int)
    repeats: int = setting(
        5, "how many times each measurement runs; here the timed pairs of each comparison",
        group="bench", parse=positive_int)
    compare_batch: int = setting(8, "batch size of the on/off comparisons", group="bench",
                                 parse=positive_int)
    overlap_env: str | None = setting(
        None, "also measure env steps/s with and without overlap in this env family",
        group="bench", metavar="ENV")
    overlap_num_envs: int = setting(4, "env slots of the overlap measurement (two groups)",
                                    group="bench", parse=positive_int)
    overlap_trials: int = setting(2, "trials per task of the overlap measurement",
                                  group="bench", parse=positive_int)
    threads: int | None = threads_setting()
    sampling: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)

    def __post_init__(self) -> None:
        check_settings(self)
        self.check_model_source()
        try:
            height, width = (int(x) for x in self.input_size.lower().split("x"))
        except ValueError:
            raise ValueError(f"--input-size: expected HxW such as 256x512; found "
                             f"{self.input_size!r}") from None
        self.image_hw = (height, width)


def run_bench_command(config: BenchConfig) -> dict[str, Any]:
    """``cosmos3-gym bench``: run, write the JSON and the plot, print the table."""
    config.resolve_runtime()
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    source = read_model_source(dataclasses.replace(config, **config.model_defaults()))
    result = run_benchmark(
        source, device=config.device, precision_name=config.precision,
        batch_sizes=tuple(config.batch_sizes), image_size=config.image_hw,
        sampling=config.sampling, warmup=config.warmup, repeats=config.repeats,
        compare_batch=config.compare_batch, overlap_env=config.overlap_env,
        overlap_envs=config.overlap_num_envs, overlap_trials=config.overlap_trials,
    )
    out = Path(config.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(out, json.dumps(result, indent=2))
    print(format_table(result))
    from cosmos3_gym.bench.plots import plot_bench
    from cosmos3_gym.plotting import PlottingUnavailable

    try:
        print("plot: " + ", ".join(str(p) for p in plot_bench(result, out.with_suffix(""))))
    except PlottingUnavailable as err:
        print(f"note: no bench plot: {err}", file=sys.stderr)
    return result
