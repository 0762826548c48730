"""Statistics the project's results report: Wilson intervals, the exact McNemar test, and the
interval of a paired difference in success rate."""

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


def paired_difference(pairs: list[tuple[bool, bool]], z: float = Z_95) -> dict[str, float]:
    """The difference in success rate between an arm and its control over paired episodes
    (``(arm succeeded, control succeeded)`` per pair: the same task, trial, init state and env
    seed), with Newcombe's interval for paired proportions (1998, "Improved confidence
    intervals for the difference between binomial proportions based on paired data", method
    10: the Wilson intervals of the two rates, combined through the pairs' correlation) and
    the exact McNemar p-value.

    Pairing removes the episode-to-episode variation both arms share, so the interval is
    narrower than the two arms' own intervals suggest when the outcomes agree on most pairs.

    >>> d = paired_difference([(True, True)] * 6 + [(False, True)] * 3 + [(False, False)])
    >>> round(d["difference"], 2), [round(x, 3) for x in d["interval"]], d["control_only"]
    (-0.3, [-0.593, 0.07], 3)
    """
    n = len(pairs)
    both = sum(1 for a, c in pairs if a and c)
    arm_only = sum(1 for a, c in pairs if a and not c)
    control_only = sum(1 for a, c in pairs if c and not a)
    neither = n - both - arm_only - control_only
    out = {"pairs": n, "both": both, "arm_only": arm_only, "control_only": control_only,
           "neither": neither, "mcnemar_p": mcnemar_p(arm_only, control_only)}
    if n == 0:
        return {**out, "difference": None, "interval": [None, None]}
    p1, p2 = (both + arm_only) / n, (both + control_only) / n
    l1, u1 = wilson_interval_of_rate(p1, n, z)
    l2, u2 = wilson_interval_of_rate(p2, n, z)
    # The pairs' correlation (phi), with Newcombe's continuity correction of its numerator.
    margins = (both + arm_only) * (control_only + neither) * (both + control_only) * (
        arm_only + neither)
    cross = both * neither - arm_only * control_only
    corrected = cross - n / 2 if cross > n / 2 else (cross if cross < 0 else 0.0)
    phi = corrected / math.sqrt(margins) if margins > 0 else 0.0
    difference = p1 - p2
    low = difference - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2)
                                     + (u2 - p2) ** 2))
    high = difference + math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1)
                                      + (u1 - p1) ** 2))
    return {**out, "difference": difference, "interval": [max(-1.0, low), min(1.0, high)]}
