"""The Cosmos3 generator: configuration, transformer, mRoPE and weight loading."""

# First, before diffusers or Triton load: Triton's library must keep its own LLVM.
from cosmos3_gym import native_libs  # noqa: F401  (see cosmos3_gym/native_libs.py)

# isort: split

from typing import TYPE_CHECKING

from cosmos3_gym.lazy import exports

if TYPE_CHECKING:
    from cosmos3_gym.model.config import Cosmos3Config
    from cosmos3_gym.model.transformer import Cosmos3Transformer, GenLayout, TextKVCache

# Loaded on first use (cosmos3_gym/lazy.py): importing one light submodule does not import
# the heavy ones.
__getattr__, __dir__ = exports(__name__, {
    "Cosmos3Config": "config",
    "Cosmos3Transformer": "transformer",
    "GenLayout": "transformer",
    "TextKVCache": "transformer",
})

__all__ = ["Cosmos3Config", "Cosmos3Transformer", "GenLayout", "TextKVCache"]
