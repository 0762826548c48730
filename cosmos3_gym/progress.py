"""The one progress-bar helper for long loops (denoising, evaluation, training)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def is_rank_zero() -> bool:
    """True unless this process is a non-zero rank of a ``torchrun`` launch."""
    return int(os.environ.get("RANK", "0")) == 0


def progress(iterable: Iterable[T], *, enabled: bool = True, **kwargs) -> Iterator[T]:
    """Wrap ``iterable`` in a tqdm bar that shows on rank 0 only and can be switched off."""
    return iter(tqdm(iterable, disable=not (enabled and is_rank_zero()), **kwargs))


def progress_bar(*, enabled: bool = True, **kwargs) -> tqdm:
    """A manually updated bar (``.update(n)``) with the same rank-0 / on-off rule."""
    return tqdm(disable=not (enabled and is_rank_zero()), **kwargs)
