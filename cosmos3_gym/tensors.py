"""Telling torch tensors from numpy arrays without importing torch.

A value can only be a tensor if torch is already imported, so the checks below read
``sys.modules`` instead of importing it: modules that take either (observations, action
statistics) stay light for the command line's checks, and load no model stack of their own.
"""

from __future__ import annotations

import sys
from typing import Any


def is_tensor(value: Any) -> bool:
    """Whether ``value`` is a torch tensor (if torch is not imported, nothing can be one).

    >>> import numpy as np
    >>> is_tensor(np.zeros(2))
    False
    """
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)
