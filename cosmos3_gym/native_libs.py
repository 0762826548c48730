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
after no longer matter. Importing this module calls it; the model stack imports it before its
first import of diffusers or Triton (``cosmos3_gym.model``, ``cosmos3_gym.pipeline``,
``cosmos3_gym.tiny``). ``envs/`` does not, so env workers never load Triton.
"""

from __future__ import annotations

import importlib.util
import os
import sys

_done = False


def isolate_triton_llvm() -> bool:
    """Open Triton's native library with ``RTLD_DEEPBIND``, once per process; ``True`` if this
    call did. A no-op where Triton is not installed or already imported, or off glibc Linux."""
    global _done
    if _done:
        return False
    _done = True
    deepbind = getattr(os, "RTLD_DEEPBIND", None)
    if deepbind is None or not sys.platform.startswith("linux") or "triton" in sys.modules:
        return False
    if importlib.util.find_spec("triton") is None:
        return False
    flags = sys.getdlopenflags()
    sys.setdlopenflags(os.RTLD_NOW | os.RTLD_LOCAL | deepbind)
    try:
        importlib.import_module("triton._C.libtriton")
    except ImportError:
        return False  # a broken Triton fails later, where it is used, with its own message
    finally:
        sys.setdlopenflags(flags)
    return True


isolate_triton_llvm()
