"""Per-env action queues that remember where every action came from.

A queue holds the first ``n_action_steps`` env actions of the env's latest chunk. Each action
popped comes with its :class:`ActionSource`: the :class:`~cosmos3_gym.policy.ChunkRecord`, the
row of that record and the step within the chunk, so a rollout reads which chunk (seed, noise,
raw action) every executed action belongs to instead of keeping a mirror of the queue.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cosmos3_gym.policy.planner import ChunkRecord


@dataclass(frozen=True)
class ActionSource:
    """Where a queued action came from: step ``step`` of row ``row`` of ``record``."""

    record: ChunkRecord
    row: int
    step: int

    @property
    def raw_action(self) -> np.ndarray:
        """The pipeline's action behind it, before the adapter: float32 ``[D]``."""
        return self.record.raw_actions[self.row, self.step]


class ActionQueues:
    """One FIFO of env actions per env, each action tagged with its :class:`ActionSource`.

    >>> import numpy as np
    >>> from cosmos3_gym.policy.planner import ChunkRecord
    >>> chunk = np.arange(12, dtype=np.float32).reshape(1, 3, 4)  # one env, H=3, D=4
    >>> record = ChunkRecord(np.array([1]), np.array([0]), np.array([0]), ["t"], ["t"], [0],
    ...                      chunk, chunk, chunk, chunk[..., :2], True)
    >>> queues = ActionQueues(num_envs=2)
    >>> queues.fill(record, steps=2)          # env 1 gets the first 2 of its 3 actions
    >>> queues.lengths()
    array([0, 2])
    >>> action, source = queues.pop(1)
    >>> action, source.row, source.step, source.raw_action
    (array([0., 1.], dtype=float32), 0, 0, array([0., 1., 2., 3.], dtype=float32))
    """

    def __init__(self, num_envs: int) -> None:
        self._actions: list[np.ndarray] = [np.zeros((0, 0), np.float32)] * num_envs
        self._sources: list[ActionSource | None] = [None] * num_envs

    def lengths(self) -> np.ndarray:
        """int64 ``[B]``: actions left in each env's queue."""
        return np.array([len(q) for q in self._actions], dtype=np.int64)

    def fill(self, record: ChunkRecord, steps: int | None) -> None:
        """Replace each planned env's queue by the first ``steps`` actions of its chunk (all of
        them for ``None``); the other envs' queues are untouched."""
        for row, env in enumerate(record.env_indices):
            self._actions[env] = record.actions[row, :steps].copy()
            self._sources[env] = ActionSource(record, row, 0)

    def install(self, record: ChunkRecord, row: int, start: int, stop: int) -> None:
        """Replace ``record``'s row ``row``'s env's queue by that chunk's actions ``start`` to
        ``stop`` (real-time execution installs a chunk from its first action not in the past)."""
        env = int(record.env_indices[row])
        self._actions[env] = record.actions[row, start:stop].copy()
        self._sources[env] = ActionSource(record, row, start)

    def upcoming_raw(self, env: int, count: int) -> np.ndarray:
        """The pipeline's actions behind the next ``count`` actions of ``env``'s queue: float32
        ``[count, D]`` (real-time chunking commits them to the next chunk)."""
        if not 0 < count <= len(self._actions[env]):
            raise ValueError(f"env {env}'s queue holds {len(self._actions[env])} actions; "
                             f"asked for the next {count}")
        source = self._sources[env]
        assert source is not None, "a non-empty queue always has a source"
        return source.record.raw_actions[source.row, source.step:source.step + count].copy()

    def pop(self, env: int) -> tuple[np.ndarray, ActionSource]:
        """The next action of ``env`` and where it came from."""
        action, self._actions[env] = self._actions[env][0], self._actions[env][1:]
        source = self._sources[env]
        assert source is not None, "a non-empty queue always has a source"
        self._sources[env] = ActionSource(source.record, source.row, source.step + 1)
        return action, source

    def clear(self, env: int) -> None:
        """Drop what is left of ``env``'s queue."""
        self._actions[env] = self._actions[env][:0]
        self._sources[env] = None
