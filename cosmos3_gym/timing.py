"""One timing mechanism for every stage of the stack: wall time and peak memory per named stage."""

from __future__ import annotations

import time
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch


@dataclass
class StageTimer:
    """Accumulates per-stage wall time (seconds) and peak memory (bytes) over a call.

    On CUDA the peak is ``torch.cuda.max_memory_allocated`` during the stage; on CPU it is the
    Python-heap peak from ``tracemalloc`` when ``track_cpu_memory`` is on (it slows Python code,
    so it is off unless asked for). Torch's CPU allocator is not visible to either; the benchmark
    reports process RSS for that.
    """

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    track_cpu_memory: bool = False
    seconds: dict[str, float] = field(default_factory=dict)
    peak_bytes: dict[str, int] = field(default_factory=dict)
    # Events counted over the call (e.g. prompt-cache hits), reported as they are named.
    counts: dict[str, int] = field(default_factory=dict)

    def count(self, name: str, n: int = 1) -> None:
        self.counts[name] = self.counts.get(name, 0) + n

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        cuda = self.device.type == "cuda"
        tracing = False
        if cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.track_cpu_memory and not tracemalloc.is_tracing():
            tracemalloc.start()
            tracing = True
        start = time.perf_counter()
        try:
            yield
        finally:
            if cuda:
                torch.cuda.synchronize(self.device)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            if cuda:
                peak = torch.cuda.max_memory_allocated(self.device)
            elif tracing:
                peak = tracemalloc.get_traced_memory()[1]
                tracemalloc.stop()
            else:
                peak = None
            if peak is not None:
                self.peak_bytes[name] = max(self.peak_bytes.get(name, 0), int(peak))

    def as_dict(self) -> dict[str, float]:
        out = {f"{k}_s": v for k, v in self.seconds.items()}
        out.update({f"{k}_peak_bytes": float(v) for k, v in self.peak_bytes.items()})
        out["total_s"] = sum(self.seconds.values())
        out.update({k: float(v) for k, v in self.counts.items()})
        return out
