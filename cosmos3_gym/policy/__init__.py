"""The policy: VectorPolicy and the benchmark adapters it uses.

``VectorPolicy`` talks to the pipeline only through its call, and to envs only through the
Gymnasium vector API; benchmark conventions live in the adapters.
"""

from cosmos3_gym.policy.adapters import Adapter, GenericAdapter, LiberoAdapter, get_adapter
from cosmos3_gym.policy.vector_policy import (
    ChunkRecord,
    PolicyFeed,
    VectorPolicy,
    VectorPolicyConfig,
    chunk_seed,
    take_envs,
)

__all__ = [
    "Adapter",
    "ChunkRecord",
    "GenericAdapter",
    "LiberoAdapter",
    "PolicyFeed",
    "VectorPolicy",
    "VectorPolicyConfig",
    "chunk_seed",
    "get_adapter",
    "take_envs",
]
