"""Where the model runs and in which precision: ``--device`` and ``--precision`` of every command.

``auto`` is the GPU where there is one: ``cuda:LOCAL_RANK`` (``cuda:0`` outside ``torchrun``),
else the CPU; its precision is bfloat16 on CUDA and float32 on the CPU. ``--precision``
(:func:`resolve_precision`) is ``auto``, ``fp32``, ``bf16``, or ``fp8``: the generation tower's
GEMMs in FP8, everything else as ``auto`` would run it. A device that is not
there (``cuda`` on a machine without CUDA, ``cuda:3`` on a two-GPU machine, more torchrun ranks
on a node than it has GPUs) is a ``ValueError`` raised here, before anything loads, saying what
was asked for and what the machine has.
"""

from __future__ import annotations

import os
import re

import torch

from cosmos3_gym.settings import PRECISIONS

DEVICE_CHOICES = "auto, cpu, cuda or cuda:N"
DTYPES: dict[str, torch.dtype] = {"bfloat16": torch.bfloat16, "float32": torch.float32}
DTYPE_CHOICES = ("auto", *DTYPES)
_PRECISION_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def local_rank() -> int | None:
    """torchrun's ``LOCAL_RANK`` (this process's index on its node), or ``None`` outside it."""
    value = os.environ.get("LOCAL_RANK")
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"LOCAL_RANK must be a non-negative integer; found {value!r}")
    return int(value)


def _what_cuda_there_is() -> str:
    if torch.version.cuda is None:
        return f"this torch ({torch.__version__}) is a CPU build, without CUDA"
    count = torch.cuda.device_count()
    if count == 0:
        return f"this torch ({torch.__version__}, CUDA {torch.version.cuda}) sees no GPU"
    return f"this machine has {count} CUDA device{'s' if count != 1 else ''} (cuda:0..{count - 1})"


def resolve_device(spec: str | torch.device = "auto") -> torch.device:
    """The device ``spec`` names on this machine, checked.

    ``auto``: ``cuda:LOCAL_RANK`` where CUDA is available (``cuda:0`` outside torchrun), else
    ``cpu``. ``cuda`` without an index is ``cuda:LOCAL_RANK`` too, so each torchrun rank takes
    its own GPU. ``cuda:N`` is taken as given (every rank on that GPU).

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    text = str(spec).strip().lower()
    if text == "cpu":
        return torch.device("cpu")
    match = re.fullmatch(r"cuda(?::(\d+))?", text)
    if text != "auto" and match is None:
        raise ValueError(f"--device: expected {DEVICE_CHOICES}; found {str(spec)!r}")
    available = torch.cuda.is_available()
    if text == "auto" and not available:
        return torch.device("cpu")
    if not available:
        raise ValueError(f"--device {text}: no CUDA device here; {_what_cuda_there_is()}. "
                         "Use --device cpu (or auto)")
    rank = local_rank()
    index = int(match.group(1)) if match is not None and match.group(1) else (rank or 0)
    count = torch.cuda.device_count()
    if index >= count:
        source = "" if match is not None and match.group(1) else f" (LOCAL_RANK={rank})"
        raise ValueError(f"--device {text}{source}: cuda:{index} does not exist; "
                         f"{_what_cuda_there_is()}")
    return torch.device("cuda", index)


def resolve_dtype(spec: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    """``auto`` (or ``None``): bfloat16 on CUDA, float32 elsewhere; else the named dtype.

    >>> resolve_dtype("auto", torch.device("cpu"))
    torch.float32
    """
    if isinstance(spec, torch.dtype):
        if spec not in DTYPES.values():
            raise ValueError(f"dtype: expected one of {list(DTYPES)}; found {spec}")
        return spec
    if spec is None or spec == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if spec not in DTYPES:
        raise ValueError(f"dtype: expected one of {list(DTYPE_CHOICES)}; found {spec!r}")
    return DTYPES[spec]


def resolve_precision(spec: str, device: torch.device) -> tuple[torch.dtype, bool]:
    """``--precision`` on ``device``: the model's dtype, and whether the generation tower's
    GEMMs run in FP8 (``InferenceOptions.fp8``).

    >>> cpu = torch.device("cpu")
    >>> resolve_precision("auto", cpu), resolve_precision("fp8", cpu)
    ((torch.float32, False), (torch.float32, True))
    """
    if spec not in PRECISIONS:
        raise ValueError(f"--precision: expected one of {list(PRECISIONS)}; found {spec!r}")
    if spec in _PRECISION_DTYPES:
        return _PRECISION_DTYPES[spec], False
    return resolve_dtype("auto", device), spec == "fp8"


def precision_name(dtype: torch.dtype, fp8: bool) -> str:
    """What a run records as its precision: ``fp8``, else its dtype's ``fp32`` / ``bf16``.

    >>> precision_name(torch.bfloat16, False)
    'bf16'
    """
    if fp8:
        return "fp8"
    return {v: k for k, v in _PRECISION_DTYPES.items()}[dtype]


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"`` (how results files record it)."""
    return str(dtype).removeprefix("torch.")
