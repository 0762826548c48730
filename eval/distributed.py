"""torchrun support: which share of the episodes this process runs, and a barrier before merging.

Under ``torchrun`` (``RANK`` / ``WORLD_SIZE`` set) rank ``r`` of ``w`` runs the episodes whose
index in the canonical order is ``r`` mod ``w``. Ranks talk only through a gloo process group
(CPU-only, so it works without GPUs and beside NCCL users), and only at the end: a barrier, then
each rank's own log files handed to the others (:func:`exchange_files`), so every rank can read
the whole run from its folder whether or not the ranks share a file system.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

T = TypeVar("T")

# Ranks finish at different times; a fast rank may wait hours at the barrier for a slow one.
BARRIER_TIMEOUT = timedelta(days=2)


@dataclass(frozen=True)
class RankInfo:
    """This process's place in the launch."""

    rank: int = 0
    world_size: int = 1

    @classmethod
    def from_env(cls) -> RankInfo:
        """From torchrun's ``RANK`` and ``WORLD_SIZE``; a plain run is rank 0 of 1."""
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
        if not 0 <= rank < world:
            raise ValueError(
                f"expected 0 <= RANK < WORLD_SIZE; found RANK={rank} WORLD_SIZE={world}"
            )
        return cls(rank, world)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def shard(self, items: list[T]) -> list[T]:
        """The items this rank runs: every ``world_size``-th, starting at ``rank``."""
        return items[self.rank :: self.world_size]


def init_process_group(info: RankInfo, backend: str = "gloo") -> bool:
    """Join the process group (only for ``world_size > 1``); True where this call made it, so
    the caller that made it is the one that destroys it (an evaluation inside a GRPO run uses
    the run's group and leaves it standing). ``backend``: gloo (CPU tensors, the barrier), or
    ``cpu:gloo,cuda:nccl`` where CUDA tensors are reduced too (data-parallel training)."""
    if info.world_size == 1:
        return False
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    dist.init_process_group(backend, timeout=BARRIER_TIMEOUT)
    return True


def barrier(info: RankInfo) -> None:
    """Wait until every rank has written its results."""
    if info.world_size == 1:
        return
    import torch.distributed as dist

    dist.barrier()


def exchange_files(info: RankInfo, files: dict[str, bytes]) -> dict[str, bytes]:
    """Every rank's ``files`` (name -> contents), gathered on every rank; a name two ranks
    send is one file (their shared folder's). Through gloo: a caller's group of another backend
    (NCCL) gets a gloo group for the call."""
    if info.world_size == 1:
        return dict(files)
    import torch.distributed as dist

    group = None if "gloo" in str(dist.get_backend()) else dist.new_group(backend="gloo")
    gathered: list[dict[str, bytes] | None] = [None] * info.world_size
    try:
        dist.all_gather_object(gathered, files, group=group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
    return {name: data for part in gathered for name, data in (part or {}).items()}


def destroy_process_group(info: RankInfo) -> None:
    if info.world_size == 1:
        return
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
