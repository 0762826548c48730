"""Load Triton's native library so that it keeps its own LLVM, whatever was rendered before.

Triton's ``libtriton.so`` carries a whole LLVM, built into it and exported under LLVM's usual
symbol names (``llvm::cl::opt``, ``LLVMContextCreate``...). Mesa's software renderer (llvmpipe,
what EGL renders with on a machine without a GPU) links the system's ``libLLVM-15.so``, and Mesa
opens its DRI driver with ``RTLD_GLOBAL``, so the first EGL context a simulator makes (MuJoCo,
robosuite, Meta-World) puts LLVM 15's symbols in the process's global scope. A library opened
after that resolves its symbols from the global scope before its own: ``libtriton.so``'s static
initialisers then run LLVM 15 code on their own LLVM's data, and the process dies with a
segmentation fault in ``import triton`` (diffusers imports Triton, through ``torch._dynamo``,
whenever it is installed). Opened the other way round, Triton first, nothing clashes: Triton's
library is opened ``RTLD_LOCAL``, so its symbols never reach Mesa.

:func:`isolate_triton_llvm` opens ``libtriton.so`` with ``RTLD_DEEPBIND`` before anything
imports Triton: the library then binds to its own definitions first, and renders before or
after no longer matter (later opens of the same file return the loaded library, already bound).
Importing this module calls it; the model stack imports it before its
first import of diffusers or Triton (``cosmos3_gym.model``, ``cosmos3_gym.pipeline``,
``cosmos3_gym.tiny``). ``envs/`` does not, so env workers never load Triton.

Where NVIDIA's driver is loaded (``/proc/driver/nvidia/version``), Triton is left to load as
usual: there EGL renders through the driver, not through Mesa's LLVM, and Triton compiles the
GPU kernels exactly as it did in the measured device runs. ``COSMOS3_GYM_TRITON_DEEPBIND=1``
or ``=0`` forces the isolation on or off.
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
