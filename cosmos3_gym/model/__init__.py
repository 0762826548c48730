"""The Cosmos3 generator: configuration, transformer, mRoPE and weight loading."""

# First, before diffusers or Triton load: Triton's library must keep its own LLVM.
from cosmos3_gym import native_libs  # noqa: F401  (see cosmos3_gym/native_libs.py)

# isort: split
from cosmos3_gym.model.config import Cosmos3Config
from cosmos3_gym.model.transformer import Cosmos3Transformer, GenLayout, TextKVCache

__all__ = ["Cosmos3Config", "Cosmos3Transformer", "GenLayout", "TextKVCache"]
