"""How the benchmarks compare two calls (``cosmos3-gym bench`` and ``cosmos3-gym size``): the two
sides alternated in pairs after untimed warm-up pairs, each pair's ratio, and the checks that
tell a real difference from a busy machine's noise; per-stage seconds and peak memory beside
them."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

Stages = dict[str, float]

# A quiet machine repeats a comparison's ratio to within a few percent from pair to pair; pairs
# whose ratios differ by more than this factor (largest over smallest) measured the machine.
MAX_PAIR_SPREAD = 1.5
# At B=1 "batched" and "serial" are one and the same call: sides further apart than this factor
# mean the timing is noise, and so is every other ratio of the run.
SAME_CALL_TOLERANCE = 1.2


def timed(fn: Callable[[], Stages]) -> tuple[float, Stages]:
    """Run ``fn`` (a call that returns its stages' seconds); its wall seconds and stages: the
    benchmarks' one timer."""
    start = time.perf_counter()
    stages = fn()
    return time.perf_counter() - start, stages


def paired(
    run_a: Callable[[], Stages], run_b: Callable[[], Stages], warmup: int, repeats: int
) -> dict[str, Any]:
    """Time ``a`` and ``b`` alternately (a, b, a, b, ...) after ``warmup`` untimed pairs.

    Returns each side's median seconds and median per-stage seconds, and the median of the
    per-pair ratios ``a / b`` (whole call and denoising stage). Pairing the two sides in time
    keeps a shared machine's drift out of the ratio.
    """
    for _ in range(warmup):
        run_a()
        run_b()
    pairs = [(timed(run_a), timed(run_b)) for _ in range(repeats)]

    def median_stages(side: int) -> Stages:
        keys = pairs[0][side][1].keys()
        return {k: statistics.median(p[side][1][k] for p in pairs) for k in keys}

    ratios = [a[0] / b[0] for a, b in pairs]
    denoise_ratios = [a[1]["denoise"] / b[1]["denoise"] for a, b in pairs]
    return {
        "a_s": statistics.median(a[0] for a, _ in pairs),
        "b_s": statistics.median(b[0] for _, b in pairs),
        "a_stages_s": median_stages(0),
        "b_stages_s": median_stages(1),
        "ratio": statistics.median(ratios),
        "denoise_ratio": statistics.median(denoise_ratios),
        "pair_ratios": ratios,
        "pair_denoise_ratios": denoise_ratios,
    }


def why_unstable(m: dict[str, Any], same_call: bool = False) -> str | None:
    """Why the ratios of a :func:`paired` measurement cannot be trusted, or None if they can.

    ``same_call``: both sides ran the same call, so their ratio must be 1.

    >>> why_unstable({"pair_ratios": [1.0, 3.1, 1.1], "pair_denoise_ratios": [1.0, 1.0, 1.0]})
    'its paired ratios range from 1.00x to 3.10x'
    """
    for ratios in (m["pair_ratios"], m["pair_denoise_ratios"]):
        if max(ratios) / min(ratios) > MAX_PAIR_SPREAD:
            return f"its paired ratios range from {min(ratios):.2f}x to {max(ratios):.2f}x"
    if same_call:
        for what, ratio in (("paired ratio", m["ratio"]),
                            ("ratio of their median seconds", m["a_s"] / m["b_s"])):
            if not 1 / SAME_CALL_TOLERANCE <= ratio <= SAME_CALL_TOLERANCE:
                return f"both sides are the same call, yet the {what} is {ratio:.2f}x"
    return None


def stage_seconds(timings: dict[str, float]) -> Stages:
    """A pipeline call's per-stage seconds (its ``timings``' ``*_s`` keys, ``total_s`` left out)."""
    return {k[:-2]: v for k, v in timings.items() if k.endswith("_s") and k != "total_s"}


def peak_memory_mb(device: torch.device) -> float:
    """The process's peak memory so far: CUDA max-allocated on a GPU, peak RSS on the CPU."""
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
