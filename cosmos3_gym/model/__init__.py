"""The Cosmos3 generator: configuration, transformer, mRoPE and weight loading."""

from cosmos3_gym.model.config import Cosmos3Config
from cosmos3_gym.model.transformer import Cosmos3Transformer, GenLayout, TextKVCache

__all__ = ["Cosmos3Config", "Cosmos3Transformer", "GenLayout", "TextKVCache"]
