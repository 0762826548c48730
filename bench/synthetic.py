"""``cosmos3-gym bench --synthetic PRESET``: the pipeline at a published model shape, no weights.

Timing depends on shapes, not weight values. This benchmark builds the Cosmos3 generator at a
published configuration (``nano``, ``super``, ``edge``; ``tiny`` for CI on a CPU) with random
weights straight on the device, the Wan2.2 VAE at its real widths, and the shipped tiny
checkpoint's tokenizer, and measures the whole pipeline on LIBERO-size (256x512, tier 256) and
DROID-size (480x832, tier 480) observations:

- per case, batch size and step count: call latency (median), per-stage seconds, the denoising
  stage's rate of useful matrix work (``denoise_tflops``: GEN FLOPs counted from the config and
  token counts by :mod:`cosmos3_gym.model.flops`, over the stage's seconds), the GPU-busy
  fraction, kernel count and heaviest kernels of one profiled call, and peak memory;
- diffusers' own ``Cosmos3OmniTransformer`` at the same configuration and shapes, on the same
  device in the same run: one denoising forward (it recomputes the text and runs one sample per
  call) against one step of ours, at B=1 and for B samples;
- each execution option flipped against the benchmark's configuration at B=1 and at B=8
  (paired, alternating runs), the CUDA graphs and the fused kernels among them; an option that
  another needs takes that one with it (``also``: switching the K/V buffers off switches the
  fused kernels off too).

Before anything is timed, one short call checks the configuration (``self_check`` in the JSON):
an option that raises on this device (``cuda_graphs`` or ``triton_kernels``: they need more of
the CUDA toolchain than torch itself) is switched off by the pipeline, as it is in production,
with its error recorded, and the rest is measured; the configuration's actions are compared
with the eager ones (no graphs, no fused kernels) of the same weights, noise and inputs. A flip
that raises, or whose option the pipeline had to switch off, is recorded the same way.
A benchmark on a borrowed GPU thus returns every number it can, and says which it could not.

A case may carry a released checkpoint's recipe (:mod:`cosmos3_gym.recipes`): the DROID policy
cases run the official server's 540x640 view at ``nano-policy-droid`` (4 steps, guidance 3 on
every step, a state row, 32-action chunks) and ``edge-policy-droid`` (the same, guided on the
first step only), at the recipe's step count whatever ``--steps`` says, their FLOPs counting the
guided steps' unconditional rows.

Users size their hardware with it before they have weights. Results are a JSON file whose
``rows`` are ``{"case", "batch_size", "steps", "call_s", "denoise_tflops", "gpu_busy", ...}``.
"""

from __future__ import annotations

import json
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from cosmos3_gym.bench.latency import PROMPTS
from cosmos3_gym.bench.paired import paired, peak_memory_mb, stage_seconds
from cosmos3_gym.jsonio import write_text_atomic
from cosmos3_gym.settings import (
    SYNTHETIC_PRESETS,
    csv,
    device_setting,
    int_list,
    positive_int,
    precision_setting,
    setting,
    threads_setting,
)

if TYPE_CHECKING:
    import torch

    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.pipeline.options import InferenceOptions


@dataclass(frozen=True)
class Case:
    """One observation size, with the policy settings a checkpoint of that embodiment uses."""

    name: str
    image_hw: tuple[int, int]
    resolution_tier: int
    domain_name: str
    view_point: str | None
    # A recipe's whole head and sampler (its steps replace --steps); None: the fields above,
    # 16 actions of 10-D, no guidance.
    recipe: str | None = None
    # The fp8 flip's bf16 steps at each end (InferenceOptions.fp8_bf16_steps) for this case:
    # at 4 steps the default 3 would leave no step in FP8. None: as configured.
    fp8_bf16_steps: int | None = None


CASES = {
    # Agentview and wrist side by side, 256 each (the LIBERO adapter's layout).
    "libero_256x512": Case("libero_256x512", (256, 512), 256, "libero", "concat_view"),
    # DROID-size single view at the 480 tier (sglang's published Cosmos3 policy benchmark shape).
    "droid_480x832": Case("droid_480x832", (480, 832), 480, "droid_lerobot", "ego_view"),
    # The official DROID server's image (wrist over both exteriors) at the released recipes.
    "nano-policy-droid_540x640": Case("nano-policy-droid_540x640", (540, 640), 480,
                                      "droid_lerobot", "concat_view", recipe="nano-policy-droid",
                                      fp8_bf16_steps=1),
    "edge-policy-droid_540x640": Case("edge-policy-droid_540x640", (540, 640), 480,
                                      "droid_lerobot", "concat_view", recipe="edge-policy-droid",
                                      fp8_bf16_steps=1),
}
ACTION_HORIZON = 16  # 17 frames: the LIBERO and DROID policy recipes
RAW_ACTION_DIM = 10
# Option flips measured against the configuration under test: the benchmark's name -> field.
FLIPS = ("cuda_graphs", "triton_kernels", "text_cache", "kv_buffers", "frame_encoder",
         "prompt_cache", "fp8")


def synthetic_pipeline(
    preset: str,
    case: Case,
    *,
    device: torch.device,
    dtype: torch.dtype,
    options: InferenceOptions,
    components: tuple[Any, Any, Any] | None = None,
) -> tuple[Cosmos3ActionPipeline, tuple[Any, Any, Any]]:
    """A pipeline over a random generator and VAE of ``preset``'s shapes
    (:meth:`Cosmos3ActionPipeline.from_preset`); pass the returned components back in to build
    another case or option set around the same weights."""
    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.checkpoint import PolicyConfig
    from cosmos3_gym.recipes import get_recipe

    if case.recipe is not None:
        policy = PolicyConfig(**get_recipe(case.recipe).settings)
    else:
        policy = PolicyConfig(
            domain_name=case.domain_name, raw_action_dim=RAW_ACTION_DIM,
            action_horizon=ACTION_HORIZON, normalization="none",
            resolution_tier=case.resolution_tier, view_point=case.view_point,
        )
    if components is None:
        pipe = Cosmos3ActionPipeline.from_preset(preset, policy, device=device, dtype=dtype,
                                                 options=options)
        return pipe, (pipe.transformer, pipe.vae, pipe.tokenizer)
    return Cosmos3ActionPipeline(*components, policy, options=options), components


def call_inputs(pipe: Cosmos3ActionPipeline, count: int) -> dict[str, Any]:
    """The call arguments a head needs beyond images and prompts: zero state rows for a
    state-conditioned one (the values do not change the timing)."""
    if not pipe.history_length:
        return {}
    return {"state": np.zeros((count, pipe.history_length, pipe.action_dim), np.float32)}


def guided_steps(pipe: Cosmos3ActionPipeline, steps: int) -> int:
    """How many of ``steps`` denoising steps run the unconditional rows too (the policy's
    guidance and interval)."""
    from cosmos3_gym.pipeline.stages import SamplingParams

    p = pipe.policy
    return sum(SamplingParams(steps, p.guidance_scale, p.flow_shift, False,
                              guidance_interval=p.guidance_interval).guided_steps())


def case_steps(case: Case, steps: tuple[int, ...]) -> tuple[int, ...]:
    """The step counts a case runs: its recipe's, else ``steps``."""
    if case.recipe is None:
        return steps
    from cosmos3_gym.recipes import get_recipe

    return (int(get_recipe(case.recipe).settings["num_inference_steps"]),)


def busy_time(spans: list[tuple[float, float]]) -> float:
    """Length of the union of ``(start, end)`` intervals (overlapping kernels count once).

    >>> busy_time([(0, 4), (2, 6), (10, 11)])
    7
    """
    busy, end = 0, float("-inf")
    for start, stop in sorted(spans):
        if stop > end:
            busy += stop - max(start, end)
            end = stop
    return busy


def profile_call(fn: Callable[[], Any], device: torch.device, top: int = 8) -> dict[str, Any]:
    """One profiled run of ``fn``: the fraction of its wall time during which the GPU ran a
    kernel or a copy (the union of their intervals), the kernel count, and the ``top``
    kernels by total time (where a step's time goes, e.g. why one batch size is slow).
    Fields are ``None`` off CUDA."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return {"gpu_busy": None, "kernels": None, "top_kernels": None}
    torch.cuda.synchronize(device)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize(device)
        wall_us = (time.perf_counter() - start) * 1e6
    events = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    busy = busy_time([(e.time_range.start, e.time_range.end) for e in events])
    totals: dict[str, list[float]] = {}
    for e in events:
        entry = totals.setdefault(e.name, [0.0, 0])
        entry[0] += e.time_range.end - e.time_range.start
        entry[1] += 1
    ranked = sorted(totals.items(), key=lambda item: -item[1][0])[:top]
    return {
        "gpu_busy": busy / wall_us,
        "kernels": len(events),
        "top_kernels": [{"name": name[:120], "ms": us / 1e3, "count": count}
                        for name, (us, count) in ranked],
    }


def _median_call(call: Callable[[], dict[str, float]], warmup: int, repeats: int,
                 sync: Callable[[], None]) -> tuple[float, dict[str, float]]:
    for _ in range(warmup):
        call()
    walls, stages = [], []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        stages.append(call())
        sync()
        walls.append(time.perf_counter() - start)
    keys = stages[0].keys()
    return statistics.median(walls), {k: statistics.median(s[k] for s in stages) for k in keys}


def reference_step_s(
    preset: str, *, device: torch.device, dtype: torch.dtype, counts: dict[str, int],
    latent_grid: tuple[int, int, int], repeats: int,
) -> float | None:
    """Seconds of one denoising forward of diffusers' ``Cosmos3OmniTransformer`` (its own random
    initialisation at ``preset``'s config, built on the device) for one sample at these token
    counts; ``None`` if it does not fit in memory next to ours."""
    import torch
    from diffusers import Cosmos3OmniTransformer

    from cosmos3_gym.bench.diffusers_reference import reference_forward
    from cosmos3_gym.model.presets import GENERATOR_PRESETS

    previous = torch.get_default_dtype()
    try:
        torch.set_default_dtype(dtype)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(2)
            with torch.device(device), torch.no_grad():
                model = Cosmos3OmniTransformer(**GENERATOR_PRESETS[preset]).eval()
        model.time_embedder.float()  # as diffusers keeps it (``_keep_in_fp32_modules``)
    except torch.OutOfMemoryError:
        return None
    finally:
        torch.set_default_dtype(previous)
    t, h, w = latent_grid
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, 1000, (counts["text"],), generator=gen).to(device)
    vision = torch.randn(1, 48, t, h, w, generator=gen).to(device, dtype)
    actions = torch.randn(counts["action"], 64, generator=gen).to(device, dtype)

    def step() -> dict[str, float]:
        reference_forward(model, ids, vision, actions, 500.0, domain=5, fps=20.0)
        return {}

    with torch.no_grad():
        seconds, _ = _median_call(step, 1, repeats, _synchronizer(device))
    return seconds


def _synchronizer(device: torch.device) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _latent_grid(pipe: Cosmos3ActionPipeline, case: Case) -> tuple[int, int, int]:
    """(T, h, w) of the latent the denoiser sees: the content region of the case's canvas."""
    from cosmos3_gym.pipeline.preprocess import latent_content_shape, plan_canvas

    plan = plan_canvas(*case.image_hw, case.resolution_tier)
    return (pipe.noise.num_latent_frames, *latent_content_shape(plan))


def token_counts(pipe: Cosmos3ActionPipeline, case: Case, prompts: list[str]) -> dict[str, int]:
    """Text tokens (the padded length of the batch's captions, as the prompt stage makes
    them), vision and action GEN tokens."""
    from cosmos3_gym.pipeline.preprocess import plan_canvas
    from cosmos3_gym.pipeline.stages import MicroBatch, SamplingParams

    batch = MicroBatch(indices=list(range(len(prompts))), images=[], prompts=prompts,
                       seeds=[0] * len(prompts),
                       plan=plan_canvas(*case.image_hw, case.resolution_tier))
    params = SamplingParams(num_inference_steps=1, guidance_scale=1.0, flow_shift=1.0,
                            progress=False)
    text = pipe.prompt.tokenize(batch, params)[0].shape[1]
    p = pipe.transformer.config.latent_patch_size
    t, h, w = _latent_grid(pipe, case)
    return {"text": int(text), "vision": t * -(-h // p) * -(-w // p),
            "action": pipe.history_length + pipe.action_horizon}


@dataclass
class _Run:
    """What every measurement of one benchmark run shares."""

    preset: str
    device: torch.device
    dtype: torch.dtype
    options: InferenceOptions
    warmup: int
    repeats: int
    save: Callable[[], None]  # writes what is measured so far (a killed run keeps its rows)
    flips: tuple[str, ...] = FLIPS  # the options flipped against the configuration
    components: tuple[Any, Any, Any] | None = None


def _error_line(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".splitlines()[0][:300]


def check_options(run: _Run, case: Case) -> dict[str, Any]:
    """One short call (B=1, 2 steps) with ``run.options``. An option that fails on this device
    is switched off by the pipeline itself (as in production: one warning, the error kept in
    ``disabled_options``); ``run.options`` becomes what the pipeline ran. Returns the record
    (``options`` as measured, ``disabled`` option -> error, and the largest action difference
    from the eager configuration on the same weights, noise and inputs)."""
    image = np.random.default_rng(0).integers(0, 256, size=(1, *case.image_hw, 3), dtype=np.uint8)
    prompt = [PROMPTS[0]]

    def actions(options: InferenceOptions) -> tuple[np.ndarray, Cosmos3ActionPipeline]:
        pipe, run.components = synthetic_pipeline(run.preset, case, device=run.device,
                                                   dtype=run.dtype, options=options,
                                                   components=run.components)
        out = pipe(image, prompt, seed=[0], num_inference_steps=2, progress=False,
                   **call_inputs(pipe, 1))
        return out.actions, pipe

    from cosmos3_gym.pipeline.stages import FALLIBLE_OPTIONS

    eager = replace(run.options, **{name: False for name in FALLIBLE_OPTIONS})
    reference, _ = actions(eager)  # torch alone: if this raises, nothing can be measured
    measured, pipe = actions(run.options)
    run.options = pipe.options
    return {
        "options": asdict(run.options),
        "disabled": pipe.disabled_options,
        "max_abs_action_diff_vs_eager": float(np.abs(measured - reference).max()),
    }


def _measure_case(run: _Run, case: Case, batch_sizes: tuple[int, ...], steps: tuple[int, ...],
                  compare_batches: tuple[int, ...], reference: bool,
                  rows: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    from cosmos3_gym.model.flops import gen_step_flops
    from cosmos3_gym.policy.adapters import get_adapter

    dev, sync = run.device, _synchronizer(run.device)
    pipe, run.components = synthetic_pipeline(run.preset, case, device=dev, dtype=run.dtype,
                                              options=run.options, components=run.components)
    max_b = max((*batch_sizes, *compare_batches))
    images = np.random.default_rng(0).integers(0, 256, size=(max_b, *case.image_hw, 3),
                                               dtype=np.uint8)
    augment = get_adapter("libero").prompt  # the task plus the view-point sentence
    prompts = [augment(PROMPTS[i % len(PROMPTS)]) for i in range(max_b)]

    def call(p: Cosmos3ActionPipeline, b: int, n: int) -> dict[str, float]:
        out = p(images[:b], prompts[:b], seed=list(range(b)), num_inference_steps=n,
                progress=False, **call_inputs(p, b))
        return stage_seconds(out.timings)

    def step_flops(b: int, n: int) -> float:
        """GEN FLOPs of a call: B rows per step, 2B on the guided steps."""
        counts = token_counts(pipe, case, prompts[:b])
        return (n + guided_steps(pipe, n)) * gen_step_flops(
            pipe.transformer.config, batch_size=b, text_tokens=counts["text"],
            vision_tokens=counts["vision"], action_tokens=counts["action"],
        )

    steps = case_steps(case, steps)
    for b in batch_sizes:
        counts = token_counts(pipe, case, prompts[:b])
        for n in steps:
            if dev.type == "cuda":
                torch.cuda.reset_peak_memory_stats(dev)
            call_s, stages = _median_call(lambda b=b, n=n: call(pipe, b, n), run.warmup,
                                          run.repeats, sync)
            flops = step_flops(b, n)
            rows.append({
                "case": case.name, "batch_size": b, "steps": n, "call_s": call_s,
                "recipe": case.recipe, "guided_steps": guided_steps(pipe, n),
                "denoise_tflops": flops / stages["denoise"] / 1e12,
                **profile_call(lambda b=b, n=n: call(pipe, b, n), dev),
                "stages_s": stages, "peak_memory_mb": peak_memory_mb(dev),
                "tokens": counts, "denoise_step_s": stages["denoise"] / n,
            })
            run.save()

    n = min(steps)
    flips: dict[str, Any] = {}
    for b in compare_batches:
        flips[str(b)] = {}
        for field in run.flips:
            flipped, also = run.options.flip(field)  # with what it needs, or what needs it
            if dev.type != "cuda" and (flipped.cuda_graphs or flipped.triton_kernels):
                continue  # graphs exist on CUDA only; on CPU the kernels are interpreted
            if field == "fp8" and flipped.fp8 and case.fp8_bf16_steps is not None:
                flipped = replace(flipped, fp8_bf16_steps=case.fp8_bf16_steps)
            entry: dict[str, Any] = {"flipped_to": getattr(flipped, field), "also": list(also)}
            if field == "fp8":
                entry["fp8_bf16_steps"] = flipped.fp8_bf16_steps
            try:
                variant, _ = synthetic_pipeline(run.preset, case, device=dev, dtype=run.dtype,
                                                options=flipped, components=run.components)
                m = paired(lambda v=variant, b=b: call(v, b, n), lambda b=b: call(pipe, b, n),
                            run.warmup, run.repeats)
                if variant.disabled_options:  # it ran, but without what was to be measured
                    raise RuntimeError("; ".join(f"{k} switched off: {v}"
                                                 for k, v in variant.disabled_options.items()))
                flops = step_flops(b, n)
                # The same FLOP count over each side's time: for fp8, "bf16-equivalent" TFLOP/s.
                entry.update(ratio=m["ratio"], denoise_ratio=m["denoise_ratio"], steps=n,
                             flipped_call_s=m["a_s"], configured_call_s=m["b_s"],
                             flipped_denoise_tflops=flops / m["a_stages_s"]["denoise"] / 1e12,
                             configured_denoise_tflops=flops / m["b_stages_s"]["denoise"] / 1e12)
            except Exception as err:  # noqa: BLE001 - the flip's failure is its result
                entry.update(ratio=None, denoise_ratio=None, error=_error_line(err))
            flips[str(b)][field] = entry

    result: dict[str, Any] = {"flips": flips, "reference": None,
                              "sampler": pipe.sampler_record}
    if reference:
        ours = {r["batch_size"]: r["denoise_step_s"] for r in rows
                if r["case"] == case.name and r["steps"] == n}
        ref_s = reference_step_s(run.preset, device=dev, dtype=run.dtype,
                                 counts=token_counts(pipe, case, prompts[:1]),
                                 latent_grid=_latent_grid(pipe, case), repeats=run.repeats)
        if dev.type == "cuda":
            torch.cuda.empty_cache()  # the reference's weights are gone with its call
        result["reference"] = {
            "diffusers_step_s": ref_s, "ours_step_s": {str(b): s for b, s in ours.items()},
            # One sample per diffusers call: B samples cost B calls.
            "speedup": {str(b): None if ref_s is None else b * ref_s / s
                        for b, s in ours.items()},
        }
    return result


def run_synthetic(
    preset: str,
    *,
    device: str = "cpu",
    precision_name: str = "auto",
    cases: tuple[str, ...] = tuple(CASES),
    batch_sizes: dict[str, tuple[int, ...]] | None = None,
    steps: tuple[int, ...] = (10, 30),
    warmup: int = 1,
    repeats: int = 3,
    options: InferenceOptions | None = None,
    compare_batches: tuple[int, ...] = (1, 8),
    reference: bool = True,
    out: Path | None = None,
    flips: tuple[str, ...] = FLIPS,
) -> dict[str, Any]:
    """Run the synthetic benchmark; returns its JSON-ready result (see the module docstring),
    written to ``out`` after every measurement (``"complete": false`` until the end)."""
    import torch

    from cosmos3_gym.devices import resolve_device, resolve_precision
    from cosmos3_gym.pipeline.options import InferenceOptions

    dev = resolve_device(device)
    dtype, fp8 = resolve_precision(precision_name, dev)
    # The production default: on CUDA the fast path (graphs and fused kernels).
    base = options or InferenceOptions()
    options = replace(base, fp8=base.fp8 or fp8).resolve(dev.type)
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "none (cpu)",
        "preset": preset, "device": str(dev), "dtype": str(dtype).removeprefix("torch."),
        "host": platform.node(), "torch": torch.__version__, "options": asdict(options),
        "warmup": warmup, "repeats": repeats, "statistic": "median", "complete": False,
        "self_check": None, "rows": [], "reference": {}, "flips": {}, "samplers": {},
    }

    def save() -> None:
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(out, json.dumps(result, indent=2))

    run = _Run(preset, dev, dtype, options, warmup, repeats, save, flips)
    result["self_check"] = check_options(run, CASES[cases[0]])
    result["options"] = result["self_check"]["options"]
    save()
    sizes = batch_sizes or {"libero_256x512": (1, 2, 4, 8, 16, 32), "droid_480x832": (1, 2, 4, 8),
                            "nano-policy-droid_540x640": (1, 8),
                            "edge-policy-droid_540x640": (1, 8)}
    for name in cases:
        measured = _measure_case(run, CASES[name], sizes[name], steps, compare_batches,
                                 reference, result["rows"])
        result["flips"][name] = measured["flips"]
        result["reference"][name] = measured["reference"]
        result["samplers"][name] = measured["sampler"]
        save()
    result["complete"] = True
    save()
    return result


def format_synthetic(result: dict[str, Any]) -> str:
    """A plain-text table of a synthetic benchmark result."""
    lines = [
        f"cosmos3-gym bench --synthetic {result['preset']} on {result['gpu']} "
        f"({result['dtype']}), medians of {result['repeats']} calls",
        f"{'case':<16} {'B':>3} {'steps':>5} {'call s':>8} {'denoise TFLOP/s':>15} "
        f"{'GPU busy':>8} {'peak MB':>8} {'text/gen tokens':>15}",
    ]
    for r in result["rows"]:
        busy = "-" if r["gpu_busy"] is None else f"{100 * r['gpu_busy']:.0f}%"
        t = r["tokens"]
        lines.append(
            f"{r['case']:<16} {r['batch_size']:>3} {r['steps']:>5} {r['call_s']:>8.3f} "
            f"{r['denoise_tflops']:>15.3g} {busy:>8} {r['peak_memory_mb']:>8.0f} "
            f"{t['text']:>7}/{t['vision'] + t['action']:<7}"
        )
    for case, ref in result["reference"].items():
        if ref is None:
            continue
        if ref["diffusers_step_s"] is None:
            lines.append(f"{case}: diffusers' reference did not fit in memory")
            continue
        lines.append(
            f"{case}: one step, diffusers {1e3 * ref['diffusers_step_s']:.1f} ms/sample; ours "
            + ", ".join(f"B={b} {1e3 * s:.1f} ms ({ref['speedup'][str(b)]:.2f}x)"
                        for b, s in ref["ours_step_s"].items())
        )
    for case, per_b in result["flips"].items():
        for b, flips in per_b.items():
            lines.append(f"{case} B={b}, each option flipped (time flipped / as configured): "
                         + ", ".join(f"{k}->{v['flipped_to']}"
                                     + "".join(f"+{a}" for a in v.get("also", ()))
                                     + (" failed" if v["ratio"] is None else f" {v['ratio']:.2f}x")
                                     for k, v in flips.items()))
            fp8 = flips.get("fp8")
            if fp8 and fp8["ratio"] is not None:
                lines.append(f"{case} B={b}: {fp8_line(fp8)}")
    check = result.get("self_check")
    if check:
        lines.append(f"self-check: actions vs eager max |diff| "
                     f"{check['max_abs_action_diff_vs_eager']:.3g}")
        for name, error in check["disabled"].items():
            lines.append(f"self-check: {name} switched off, it failed on this device: {error}")
        for case, per_b in result["flips"].items():
            for b, flips in per_b.items():
                for k, v in flips.items():
                    if "error" in v:
                        lines.append(f"{case} B={b}: flipping {k} failed: {v['error']}")
    return "\n".join(lines)


def fp8_line(entry: dict[str, Any]) -> str:
    """One flip entry of ``fp8`` as FP8 beside bf16 (whichever side was configured)."""
    on, off = "flipped", "configured"
    if not entry["flipped_to"]:
        on, off = off, on
    fp8_s, bf16_s = entry[f"{on}_call_s"], entry[f"{off}_call_s"]
    return (f"{entry['steps']} steps, fp8 {fp8_s:.3f} s vs bf16 {bf16_s:.3f} s per call "
            f"({bf16_s / fp8_s:.2f}x); denoise bf16-equivalent TFLOP/s "
            f"{entry[f'{on}_denoise_tflops']:.3g} vs {entry[f'{off}_denoise_tflops']:.3g}")


def _flips(text: str) -> tuple[str, ...]:
    if text == "all":
        return FLIPS
    if text == "none":
        return ()
    chosen = tuple(t.strip() for t in text.split(",") if t.strip())
    unknown = sorted(set(chosen) - set(FLIPS))
    if unknown:
        raise ValueError(f"unknown flips {unknown}; expected all, none, or some of {list(FLIPS)}")
    return chosen


@dataclass
class SizeConfig:
    """Every knob of ``cosmos3-gym size`` (its options are generated from these fields)."""

    synthetic: str = setting(
        "nano", "a published model shape with random weights instead of a checkpoint (nano, "
        "super, edge; tiny on a CPU); its timings are the real model's, its success rates "
        "meaningless", group="model", choices=SYNTHETIC_PRESETS)
    out: str = setting("size.json", "where the command writes its results; a JSON file, "
                       "rewritten after every measurement", group="bench")
    cases: tuple[str, ...] = setting(
        tuple(CASES), "the input cases, comma-separated", group="bench", parse=csv)
    step_counts: tuple[int, ...] = setting(
        (10, 30), "denoising step counts to time, comma-separated (a case with a recipe runs "
        "at its recipe's)", group="bench", parse=int_list)
    batch_sizes: tuple[int, ...] | None = setting(
        None, "batch sizes to time, comma-separated (default: each case's own)", group="bench",
        parse=int_list)
    flips: tuple[str, ...] = setting(
        FLIPS, "the inference options each turned over in paired runs: all, none, or some of "
        f"{','.join(FLIPS)} (fp8 alone measures FP8 beside bf16)", group="bench", parse=_flips)
    compare_batch: int = setting(8, "batch size of the on/off comparisons", group="bench",
                                 parse=positive_int)
    reference: bool = setting(
        True, "time diffusers' reference forward beside ours (it needs a second copy of the "
        "weights in memory)", group="bench", flag="no-reference")
    warmup: int = setting(1, "untimed pairs before each comparison", group="bench", parse=int)
    repeats: int = setting(
        3, "how many times each measurement runs; here the timed pairs of each comparison",
        group="bench", parse=positive_int)
    device: str = device_setting()
    precision: str = precision_setting()
    threads: int | None = threads_setting()

    def __post_init__(self) -> None:
        from cosmos3_gym.model.presets import preset_config

        preset_config(self.synthetic)  # an unknown name fails here, before anything is built
        unknown = [c for c in self.cases if c not in CASES]
        if unknown:
            raise ValueError(f"--cases: unknown {unknown}; expected some of {sorted(CASES)}")


def run_size_command(config: SizeConfig) -> dict[str, Any]:
    """``cosmos3-gym size``: measure, write the JSON as it goes, print the table."""
    if config.threads is not None:
        import torch

        torch.set_num_threads(config.threads)
    sizes = None if config.batch_sizes is None else {c: tuple(config.batch_sizes)
                                                     for c in config.cases}
    result = run_synthetic(
        config.synthetic, device=config.device, precision_name=config.precision,
        cases=tuple(config.cases), batch_sizes=sizes, flips=tuple(config.flips),
        steps=tuple(config.step_counts), warmup=config.warmup, repeats=config.repeats,
        compare_batches=tuple(sorted({1, config.compare_batch})) if config.flips else (),
        reference=config.reference, out=Path(config.out),
    )
    print(format_synthetic(result))
    return result
