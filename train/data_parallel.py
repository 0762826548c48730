"""Data parallelism for GRPO under ``torchrun``: DDP's arithmetic without its wrapper.

Rank ``r`` of ``w`` collects groups ``r, r + w, ...`` of each iteration (:meth:`DataParallel.
groups_of`). Chunks keep a run-wide order (episode id, chunk index: :meth:`~DataParallel.
all_keys`); every rank takes the same minibatches of it and scores the chunks it holds; each
rank's gradient (its sum over the minibatch, divided by the minibatch's size) is summed over the
ranks (:meth:`~DataParallel.reduce_gradients`, one all-reduce per step) before the same AdamW
step on every rank. The episodes do not depend on the launch, so ``w`` ranks make the update
one process makes, to float rounding. (The scoring calls ``encode_text`` and ``forward_gen``,
not the module's ``forward``, which DDP's wrapper would need.) One process: no communication.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class DataParallel:
    """The ranks of a launch, as the update sees them (one process: no communication)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def groups_of(self, groups: list[int]) -> list[int]:
        """This rank's share of an iteration's groups."""
        return groups[self.rank :: self.world_size]

    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        if not self.active:
            return dict(values)
        import torch.distributed as dist

        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist(), strict=True))

    def all_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's chunk keys, sorted run-wide, and which rank holds each."""
        if not self.active:
            order = np.lexsort((keys[:, 1], keys[:, 0]))
            return keys[order], np.zeros(len(keys), np.int64)
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, keys)
        owners = np.concatenate([np.full(len(k), r, np.int64) for r, k in enumerate(gathered)])
        stacked = np.concatenate(gathered) if gathered else np.zeros((0, 2), np.int64)
        order = np.lexsort((stacked[:, 1], stacked[:, 0]))
        return stacked[order], owners[order]

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every trained parameter's gradient over the ranks (a rank with no chunk in the
        minibatch contributes zeros)."""
        if not self.active:
            return
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(reduced)

    def broadcast_parameters(self, params: list[torch.nn.Parameter]) -> None:
        """Rank 0's values everywhere (the ranks start from the same weights)."""
        if not self.active:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, 0)

    def any(self, flag: bool) -> bool:
        if not self.active:
            return flag
        import torch.distributed as dist

        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())
