"""Action statistics and (un)normalisation between the model's [-1, 1] space and raw actions.

Stats files use the cosmos-framework layout: ``{"global": {...}, "global_raw": {...}}`` (plus
optional ``metadata``), each block holding vectors of length ``raw_action_dim``: ``mean``,
``std``, ``min``, ``max``, ``q01``, ``q99`` (and LeRobot's ``q10``, ``q90``). A file holding one
flat block is read as ``global``. A block needs only the vectors its mode reads
(:data:`MODE_KEYS`); LeRobot's processor state holds what its dataset computed, which need not be
all of them.

Modes (the four the official LIBERO policy server supports, and LeRobot's fifth):

* ``quantile``:      ``a = (â + 1)/2 · (q99 − q01) + q01`` with the ``global`` block
  (LeRobot's ``QUANTILES``).
* ``quantile_rot``:  the same formula on *all* dims with the ``global_raw`` block (the raw rot6d
  statistics the LIBERO recipe trains with). sglang reads ``global`` here, which passes the rot6d
  dims through unchanged; we follow the official server.
* ``meanstd``:       ``a = â · std + mean`` (``global``; LeRobot's ``MEAN_STD``).
* ``minmax``:        ``a = (â + 1)/2 · (max − min) + min`` (``global``; LeRobot's ``MIN_MAX``).
* ``quantile10``:    ``a = (â + 1)/2 · (q90 − q10) + q10`` (``global``; LeRobot's ``QUANTILE10``).

As in the official server, ranges are clamped to ``>= 1e-6`` and ``std`` to ``>= 1e-8`` (a
constant action dimension would otherwise divide by zero when normalising), and the forward
direction uses the same clamped values so the two are exact inverses.

What is checked, and where:

* Every block, when a file is read (:meth:`ActionStats.from_dict`): vectors of numbers, one
  length, all finite. A mode reads one block, and the other may hold placeholders for the dims
  its recipe passes through (cosmos-framework's ``skip_rotation_dims``), so nothing more is
  asked of a block no mode reads.
* The block the mode reads, whenever the mode asks for it (:meth:`ActionStats.block_for`: when
  a command checks its head before the model loads, when the pipeline is built, at each call):
  statistics that data can have. ``std >= 0``, ``max >= min`` and ``q99 >= q01`` in every dim (a
  negative spread or a swapped pair is a broken file, never data). The spread the mode uses
  (``std``: meanstd; ``q99 − q01``: quantile, quantile_rot; ``max − min``: minmax) must be
  positive in at least one dim: with none, every action would be the same vector whatever the
  model predicts. meanstd also needs ``std > 0`` wherever ``max > min`` (a dim whose actions
  vary has a spread; a zero there makes each of its actions the mean).
* Not refused: a single dim of zero spread, clamped as the official server clamps it. A constant
  action dim is data (``min == max``, ``std == 0``), and quantiles may meet: a real LIBERO file's
  rot6d dims have q01 close to q99 (``global_raw``: 0.935 and 1.0), a dim that holds one value
  in 98% of the frames has q01 equal to q99, and its gripper has q01 0 and q99 1.

:func:`normalize_actions` does not clip to [-1, 1] by default (cosmos-framework's helper does
not; sglang's does), because clipping makes the round trip lossy; pass ``clip=True`` for
sglang's behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import numpy as np

from cosmos3_gym.tensors import is_tensor

if TYPE_CHECKING:
    import torch

NormalizationMode = Literal["quantile", "quantile_rot", "meanstd", "minmax", "quantile10"]
MODES: tuple[str, ...] = ("quantile", "quantile_rot", "meanstd", "minmax", "quantile10")
STAT_KEYS: tuple[str, ...] = ("mean", "std", "min", "max", "q01", "q99", "q10", "q90")
# The vectors each mode reads: (low, high), or (mean, std) for meanstd.
MODE_KEYS: dict[str, tuple[str, str]] = {
    "quantile": ("q01", "q99"), "quantile_rot": ("q01", "q99"), "meanstd": ("mean", "std"),
    "minmax": ("min", "max"), "quantile10": ("q10", "q90"),
}
_MIN_RANGE = 1e-6
_MIN_STD = 1e-8

# numpy arrays or torch tensors; torch is not imported here (a tensor brings it), so reading
# statistics before a model loads costs no torch.
ArrayT = TypeVar("ArrayT", np.ndarray, "torch.Tensor")


@dataclass(frozen=True)
class StatsBlock:
    """Per-dimension statistics, each a float32 ``[raw_action_dim]`` vector, or None where the
    file has no such vector (a mode that reads it then refuses the block)."""

    mean: np.ndarray | None = None
    std: np.ndarray | None = None
    min: np.ndarray | None = None
    max: np.ndarray | None = None
    q01: np.ndarray | None = None
    q99: np.ndarray | None = None
    q10: np.ndarray | None = None
    q90: np.ndarray | None = None

    @property
    def width(self) -> int:
        return next(int(v.shape[0]) for v in self.vectors().values())

    def vectors(self) -> dict[str, np.ndarray]:
        """The vectors the block holds, by name."""
        return {k: getattr(self, k) for k in STAT_KEYS if getattr(self, k) is not None}

    def pair(self, mode: str, where: str) -> tuple[np.ndarray, np.ndarray]:
        """The two vectors ``mode`` reads (:data:`MODE_KEYS`); a ``ValueError`` naming the
        missing ones otherwise."""
        keys = MODE_KEYS[mode]
        missing = [k for k in keys if getattr(self, k) is None]
        if missing:
            raise ValueError(f"mode {mode!r} reads {' and '.join(keys)} from {where}, which has "
                             f"no {', '.join(missing)} (it holds {sorted(self.vectors())})")
        return getattr(self, keys[0]), getattr(self, keys[1])


@dataclass(frozen=True)
class ActionStats:
    """The ``global`` and (optional) ``global_raw`` blocks of an action stats file."""

    global_: StatsBlock
    global_raw: StatsBlock | None = None

    @property
    def raw_action_dim(self) -> int:
        return self.global_.width

    @classmethod
    def from_json(cls, path: str | Path) -> ActionStats:
        """Load a cosmos-framework action stats JSON file."""
        from cosmos3_gym.jsonio import read_json

        return cls.from_dict(read_json(path, what="action statistics JSON"), source=str(path))

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "stats") -> ActionStats:
        """Build from the parsed JSON; every vector must have the same length."""
        if not isinstance(data, dict):
            raise ValueError(f"{source}: expected a JSON object, got {type(data).__name__}")
        global_data = data.get("global", data)
        global_ = _block(global_data, f"{source}['global']")
        raw = None
        if "global_raw" in data:
            raw = _block(data["global_raw"], f"{source}['global_raw']")
            if raw.width != global_.width:
                raise ValueError(
                    f"{source}: expected 'global' and 'global_raw' of one length, got "
                    f"{global_.width} and {raw.width}"
                )
        return cls(global_=global_, global_raw=raw)

    def block_for(self, mode: str) -> StatsBlock:
        """The block a mode reads: ``global_raw`` for ``quantile_rot``, ``global`` otherwise,
        checked for what the mode needs of it (its two vectors, and a spread data can have: the
        module notes); a ``ValueError`` naming the dims otherwise."""
        _check_mode(mode)
        if mode == "quantile_rot":
            if self.global_raw is None:
                raise ValueError(
                    "mode 'quantile_rot': expected a 'global_raw' stats block, found none"
                )
            block, name = self.global_raw, "global_raw"
        else:
            block, name = self.global_, "global"
        block.pair(mode, f"the {name!r} block")
        _check_spread(block, mode, f"stats[{name!r}]")
        return block


def _check_spread(block: StatsBlock, mode: str, where: str) -> None:
    """Refuse statistics no data has, and a block that would make every action one vector
    (vectors the block does not hold are not checked)."""
    def dims(mask: np.ndarray) -> list[int]:
        return np.flatnonzero(mask).tolist()

    shown = ", ".join(f"{k} {v.tolist()}" for k, v in block.vectors().items() if k != "mean")
    checks = [("std < 0", block.std is not None and block.std < 0),
              ("max < min", block.max is not None and block.min is not None
               and block.max < block.min),
              ("q99 < q01", block.q99 is not None and block.q01 is not None
               and block.q99 < block.q01),
              ("q90 < q10", block.q90 is not None and block.q10 is not None
               and block.q90 < block.q10)]
    for name, bad in checks:
        if isinstance(bad, np.ndarray) and bad.any():
            raise ValueError(
                f"{where}: {name} in dims {dims(bad)} ({shown}); expected statistics of "
                "actions: std >= 0, min <= max, q01 <= q99, q10 <= q90")
    low, high = block.pair(mode, where)
    spread, what = {"meanstd": (high, "std"), "minmax": (high - low, "max - min"),
                    "quantile10": (high - low, "q90 - q10")}.get(mode, (high - low, "q99 - q01"))
    if not (spread > 0).any():
        raise ValueError(
            f"{where}: {what} is 0 in every dim, so mode {mode!r} would make every vector it "
            "maps (an action, or a state) the same one; expected the statistics of the "
            "checkpoint's training data")
    if mode == "meanstd" and block.max is not None and block.min is not None:
        flat = (block.std == 0) & (block.max > block.min)
        if flat.any():
            raise ValueError(
                f"{where}: std is 0 in dims {dims(flat)}, whose actions vary (min "
                f"{block.min[flat].tolist()}, max {block.max[flat].tolist()}), so meanstd would "
                "make each of their actions the mean; expected std > 0 wherever min < max")


def _block(data: Any, where: str) -> StatsBlock:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object with {list(STAT_KEYS)}, got "
                         f"{type(data).__name__}")
    present = [k for k in STAT_KEYS if k in data]
    if not present:
        raise ValueError(f"{where}: expected statistics vectors among {list(STAT_KEYS)}, found "
                         f"keys {sorted(data)}")
    try:
        vectors = {k: np.asarray(data[k], dtype=np.float32) for k in present}
    except (TypeError, ValueError):
        found = {k: type(data[k]).__name__ for k in present}
        raise ValueError(f"{where}: expected vectors of numbers for {present}, got "
                         f"{found}") from None
    lengths = {k: v.shape for k, v in vectors.items()}
    first = next(iter(vectors.values())).shape
    if len(first) != 1 or first[0] == 0 or any(s != first for s in lengths.values()):
        raise ValueError(f"{where}: expected non-empty 1-D vectors of one length, got {lengths}")
    bad = {k: np.flatnonzero(~np.isfinite(v)).tolist() for k, v in vectors.items()
           if not np.isfinite(v).all()}
    if bad:
        raise ValueError(f"{where}: expected finite numbers; found NaN or infinity in (key: "
                         f"dims) {bad}")
    return StatsBlock(**vectors)


def _check_mode(mode: str) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")


def _low_and_range(stats: ActionStats, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """``(low, range)`` float32 ``[D]`` vectors: (q01, q99−q01), (min, max−min), (q10, q90−q10)
    or (mean, std)."""
    block = stats.block_for(mode)
    where = "the 'global_raw' block" if mode == "quantile_rot" else "the 'global' block"
    low, high = block.pair(mode, where)
    if mode == "meanstd":
        return low, np.maximum(high, np.float32(_MIN_STD))
    return low, np.maximum(high - low, np.float32(_MIN_RANGE))


def _check_actions(actions: Any, stats: ActionStats, name: str) -> None:
    if not (isinstance(actions, np.ndarray) or is_tensor(actions)):
        raise ValueError(f"{name}: expected an ndarray or tensor, got {type(actions).__name__}")
    if actions.ndim < 1 or actions.shape[-1] != stats.raw_action_dim:
        raise ValueError(
            f"{name}: expected last dim raw_action_dim={stats.raw_action_dim}, got shape "
            f"{tuple(actions.shape)}"
        )
    floating = actions.dtype.is_floating_point if is_tensor(actions) else (
        np.issubdtype(actions.dtype, np.floating)
    )
    if not floating:
        raise ValueError(f"{name}: expected a floating dtype, got {actions.dtype}")


def _as_like(vector: np.ndarray, like: ArrayT) -> ArrayT:
    if is_tensor(like):
        import torch

        return torch.as_tensor(vector, device=like.device).to(like.dtype)
    return vector.astype(like.dtype, copy=False)


def denormalize_actions(normalized: ArrayT, stats: ActionStats, mode: NormalizationMode) -> ArrayT:
    """Map model actions ``[..., D]`` back to raw units; returns a new array of the same type.

    ``D`` must equal ``stats.raw_action_dim`` (slice the 64 padded model dims first).
    """
    _check_mode(mode)
    _check_actions(normalized, stats, "normalized")
    low, spread = (_as_like(v, normalized) for v in _low_and_range(stats, mode))
    if mode == "meanstd":
        return normalized * spread + low
    return (normalized + 1.0) / 2.0 * spread + low


def normalize_actions(
    actions: ArrayT, stats: ActionStats, mode: NormalizationMode, *, clip: bool = False
) -> ArrayT:
    """Map raw actions ``[..., D]`` to the model's space (the inverse of denormalisation)."""
    _check_mode(mode)
    _check_actions(actions, stats, "actions")
    low, spread = (_as_like(v, actions) for v in _low_and_range(stats, mode))
    if mode == "meanstd":
        normalized = (actions - low) / spread
    else:
        normalized = 2.0 * (actions - low) / spread - 1.0
    if clip:
        normalized = normalized.clip(-1.0, 1.0)
    return normalized
