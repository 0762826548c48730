"""Gymnasium vector observations, read without knowing their layout: an array ``[B, ...]`` or a
(nested) dict or tuple of them. How many envs they hold, one env's slice, and how to name what
was found in an error message.

An array may be a numpy array or a torch tensor (GPU simulators such as ManiSkill3 return CUDA
tensors): slices of a tensor stay tensors on its device, so images reach the pipeline without a
host round trip.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np

from cosmos3_gym.tensors import is_tensor

Observation = Any  # a Gymnasium vector observation: an array [B, ...] or a (nested) dict of them


def is_array(value: Any) -> bool:
    """A numpy array or a torch tensor: what an observation leaf may be."""
    return isinstance(value, np.ndarray) or is_tensor(value)


def to_numpy(value: Any) -> Any:
    """A tensor as a numpy array on the host (a copy from a GPU); anything else unchanged."""
    return value.detach().cpu().numpy() if is_tensor(value) else value


def as_env_batch(obs: Observation) -> Observation:
    """``obs`` with its env axis: one image ``[H, W, C]`` (uint8, C in 1, 3, 4, an array or
    tensor on its own) is one env's observation, ``[1, H, W, C]``, as the pipeline reads it
    (B = 1); anything else is already a batch and comes back as it is.

    >>> as_env_batch(np.zeros((64, 128, 3), np.uint8)).shape
    (1, 64, 128, 3)
    >>> as_env_batch(np.zeros((2, 64, 128, 3), np.uint8)).shape
    (2, 64, 128, 3)
    """
    if (is_array(obs) and obs.ndim == 3 and obs.shape[-1] in (1, 3, 4)
            and str(obs.dtype) in ("uint8", "torch.uint8")):
        return obs[None]
    return obs


def batch_size(obs: Observation) -> int:
    """B, the leading size every array in the observation shares."""
    leading = {path: arr.shape for path, arr in _arrays(obs)}
    sizes = {shape[0] if shape else None for shape in leading.values()}
    if not leading:
        raise ValueError(
            f"expected an observation array [B, ...] or a dict of them; found {describe(obs)}"
        )
    if len(sizes) != 1 or None in sizes:
        raise ValueError(
            "observation arrays must share their leading (env) axis; found shapes "
            f"{ {p: list(s) for p, s in leading.items()} }"
        )
    size = int(sizes.pop())
    if size == 0:
        raise ValueError(f"observation batch is empty: {shapes(obs)}; expected B >= 1 envs")
    return size


def take_envs(obs: Observation, envs: np.ndarray | int) -> Observation:
    """The vector observation of ``envs`` only, leading axis kept (an int gives a batch of 1);
    a copy, so the caller's arrays are never written."""
    envs = np.atleast_1d(np.asarray(envs))
    if isinstance(obs, np.ndarray):
        return obs[envs]
    if is_tensor(obs):
        return obs[sys.modules["torch"].as_tensor(envs, device=obs.device)]
    if isinstance(obs, Mapping):
        return {k: take_envs(v, envs) for k, v in obs.items()}
    if isinstance(obs, tuple):
        return tuple(take_envs(v, envs) for v in obs)
    return obs


def shapes(obs: Observation) -> str:
    """Every array of the observation with its shape, e.g. ``obs['image'] [2, 64, 64, 3]``."""
    return ", ".join(f"{p} {list(a.shape)}" for p, a in _arrays(obs))


def describe(value: Any) -> str:
    """``float32 [2, 8]`` for an array, the type name otherwise: what an error says it found."""
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {list(value.shape)}"
    if is_tensor(value):
        dtype = str(value.dtype).removeprefix("torch.")
        return f"tensor {dtype} {list(value.shape)} on {value.device}"
    return type(value).__name__


def _arrays(obs: Observation, path: str = "obs") -> list[tuple[str, Any]]:
    if is_array(obs):
        return [(path, obs)]
    if isinstance(obs, Mapping):
        return [a for k, v in obs.items() for a in _arrays(v, f"{path}[{k!r}]")]
    if isinstance(obs, tuple):
        return [a for i, v in enumerate(obs) for a in _arrays(v, f"{path}[{i}]")]
    return []
