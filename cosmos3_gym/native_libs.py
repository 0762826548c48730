"""Load Triton's native library so that it keeps its own LLVM, whatever was rendered before.

Mesa's software renderer puts the system's LLVM symbols in the process's global scope at the
first EGL render; a ``libtriton.so`` opened after that would bind to them and crash in
``import triton``. :func:`isolate_triton_llvm` (called on import; the model stack imports this
module before diffusers or Triton) opens Triton's library with ``RTLD_DEEPBIND`` first, so a
simulator may render before or after the model is imported. ``COSMOS3_GYM_TRITON_DEEPBIND=1`` or
``=0`` forces it on or off. Why, and when it stands aside: docs/troubleshooting.md, "Rendering
first, then the model".
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
from pathlib import Path

NVIDIA_DRIVER = "/proc/driver/nvidia/version"
_done = False
_handle: ctypes.CDLL | None = None  # kept, so the library stays loaded


def isolate_triton_llvm() -> bool:
    """Open Triton's native library with ``RTLD_DEEPBIND``, once per process; ``True`` if this
    call did. A no-op where Triton is not installed or already imported, or off glibc Linux.

    Only the shared library is opened (no Triton Python code runs, so Triton still reads
    ``TRITON_INTERPRET`` and its other settings when it is imported later); the import of
    ``triton._C.libtriton`` then finds it loaded, its symbols already bound to its own LLVM.
    """
    global _done, _handle
    if _done:
        return False
    _done = True
    deepbind = getattr(os, "RTLD_DEEPBIND", None)
    if deepbind is None or not sys.platform.startswith("linux") or "triton" in sys.modules:
        return False
    forced = os.environ.get("COSMOS3_GYM_TRITON_DEEPBIND")
    if forced == "0" or (forced != "1" and Path(NVIDIA_DRIVER).exists()):
        return False
    spec = importlib.util.find_spec("triton")
    if spec is None or spec.origin is None:
        return False
    libraries = sorted((Path(spec.origin).parent / "_C").glob("libtriton*.so"))
    if not libraries:
        return False
    try:
        _handle = ctypes.CDLL(str(libraries[0]), mode=os.RTLD_NOW | os.RTLD_LOCAL | deepbind)
    except OSError:
        return False  # a broken Triton fails later, where it is used, with its own message
    return True

isolate_triton_llvm()
