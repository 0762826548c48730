"""Seeds and explicit noise: the one check of each, shared by the pipeline, the policy and eval.

A seed is an int in ``[0, 2**64)``: the pipeline draws an item's noise from it (numpy's
``RandomState`` takes it as one or two 32-bit words), and root seeds of the policy and the
evaluator, from which they derive per-chunk seeds, live in the same range. Noise passed instead
of a seed (RL replay, parity tests) is finite floating-point data with one row per item.
This module needs numpy only, so the policy and the evaluator check their inputs without torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

SEED_LIMIT = 2**64


def check_seed(seed: Any, name: str = "seed") -> int:
    """``seed`` as a Python int, or a ``ValueError`` naming ``name`` and what was found.

    >>> check_seed(np.uint64(2**63))
    9223372036854775808
    >>> check_seed(-1, "seed[2]")
    Traceback (most recent call last):
    ...
    ValueError: seed[2]: expected an int in [0, 2**64), got -1
    """
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or not (
        0 <= seed < SEED_LIMIT
    ):
        raise ValueError(f"{name}: expected an int in [0, 2**64), got {seed!r}")
    return int(seed)


def check_noise(noise: np.ndarray, name: str, batch: int, item_shape: Sequence[int | str]) -> None:
    """Raise a ``ValueError`` unless ``noise`` is finite floating-point ``[batch, *item_shape]``.

    An entry of ``item_shape`` that is a string (e.g. ``"H"`` before the horizon is known)
    accepts any size and names the axis in the message.

    >>> check_noise(np.zeros((2, 4, 64), np.float32), "action_noise", 3, (4, 64))
    Traceback (most recent call last):
    ...
    ValueError: action_noise must be [B=3, 4, 64]; found [2, 4, 64]: expected a leading batch axis of 3, one per item
    """  # noqa: E501
    expected = (batch, *item_shape)
    shape = tuple(int(s) for s in noise.shape)
    if len(shape) != len(expected) or any(
        not isinstance(e, str) and s != e for s, e in zip(shape, expected, strict=False)
    ):
        dims = ", ".join(str(e) for e in (f"B={batch}", *item_shape))
        hint = ""
        if not shape or shape[0] != batch:
            hint = f": expected a leading batch axis of {batch}, one per item"
        raise ValueError(f"{name} must be [{dims}]; found {list(shape)}{hint}")
    if not np.issubdtype(noise.dtype, np.floating):
        raise ValueError(f"{name} must be floating-point noise; found dtype {noise.dtype}")
    if not np.isfinite(noise).all():
        raise ValueError(f"{name} contains NaN or infinite values; expected finite noise")


# Keeps a repeat's mixing apart from any other use of SeedSequence on the same seed.
_REPEAT_TAG = 2


def repeat_seed(seed: int, repeat: int) -> int:
    """The noise seed of repeat ``repeat`` of a draw seeded ``seed`` (``--repeats``: the same
    episodes rerun with fresh noise). Repeat 0 is the draw itself, so a run's first repeat is
    the run without repeats, byte for byte; repeat ``r > 0`` mixes ``(seed, r)`` by
    ``SeedSequence`` into another 31-bit seed.

    >>> repeat_seed(12345, 0)
    12345
    >>> repeat_seed(12345, 1) != repeat_seed(12345, 2) != 12345
    True
    """
    check_seed(seed)
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 0:
        raise ValueError(f"repeat: expected an integer >= 0; found {repeat!r}")
    if repeat == 0:
        return int(seed)
    words = [int(seed) & 0xFFFFFFFF, int(seed) >> 32, _REPEAT_TAG, repeat]
    return int(np.random.SeedSequence(words).generate_state(1)[0] >> 1)
