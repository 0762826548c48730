"""The policy: the chunk planner, VectorPolicy around it, and the benchmark adapters.

``ChunkPlanner`` is the one place where observations become env actions (adapter -> pipeline
call -> adapter -> ``ChunkRecord``); ``VectorPolicy`` keeps per-env prompts, episode counters and
``ActionQueues`` around it. The policy talks to the pipeline only through its call, and to envs
only through the Gymnasium vector API; benchmark conventions live in the adapters.
"""

from cosmos3_gym.policy.adapters import (
    Adapter,
    DroidAdapter,
    GenericAdapter,
    LiberoAdapter,
    MetaWorldAdapter,
    check_action_fit,
    get_adapter,
)
from cosmos3_gym.policy.observations import take_envs
from cosmos3_gym.policy.planner import (
    ChunkPlanner,
    ChunkRecord,
    SeedRule,
    chunk_seed,
    pipeline_action_head,
    pipeline_state_rows,
)
from cosmos3_gym.policy.queues import ActionQueues, ActionSource
from cosmos3_gym.policy.vector_policy import PolicyFeed, VectorPolicy, VectorPolicyConfig

__all__ = [
    "ActionQueues",
    "ActionSource",
    "Adapter",
    "ChunkPlanner",
    "ChunkRecord",
    "DroidAdapter",
    "GenericAdapter",
    "LiberoAdapter",
    "MetaWorldAdapter",
    "PolicyFeed",
    "SeedRule",
    "VectorPolicy",
    "VectorPolicyConfig",
    "check_action_fit",
    "chunk_seed",
    "get_adapter",
    "pipeline_action_head",
    "pipeline_state_rows",
    "take_envs",
]
