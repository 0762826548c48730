"""Statistics the project's results report: Wilson intervals and the exact McNemar test."""

from __future__ import annotations

import math

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: int, trials: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion (95% by default).

    Unlike the normal approximation it stays inside ``[0, 1]`` and is meaningful at 0 or
    ``trials`` successes, which small per-task counts hit often. ``(0.0, 1.0)`` for no trials.

    >>> [round(x, 4) for x in wilson_interval(5, 10)]
    [0.2366, 0.7634]
    """
    if trials < 0 or not 0 <= successes <= trials:
        raise ValueError(f"expected 0 <= successes <= trials; found {successes} of {trials}")
    if trials == 0:
        return 0.0, 1.0
    return wilson_interval_of_rate(successes / trials, trials, z)


def wilson_interval_of_rate(p: float, n: float, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a proportion ``p`` observed over ``n`` (> 0) trials; ``n``
    may be an effective count (a mean of suites' rates) or the episodes a run would have.

    >>> [round(x, 4) for x in wilson_interval_of_rate(0.5, 10)]
    [0.2366, 0.7634]
    """
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # At 0 or n successes the bound is exactly 0 or 1; floating point would miss it by an ulp.
    lo = 0.0 if p == 0 else max(0.0, centre - half)
    hi = 1.0 if p == 1 else min(1.0, centre + half)
    return lo, hi


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value from the discordant pair counts ``b`` and ``c``.

    >>> mcnemar_p(0, 0), round(mcnemar_p(1, 6), 4)
    (1.0, 0.125)
    """
    n = b + c
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2**n
    return min(1.0, 2 * tail)
