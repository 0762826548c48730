"""The policy: the chunk planner, VectorPolicy around it, and the benchmark adapters.

``ChunkPlanner`` is the one place where observations become env actions (adapter -> pipeline
call -> adapter -> ``ChunkRecord``); ``VectorPolicy`` keeps per-env prompts, episode counters and
``ActionQueues`` around it. The policy talks to the pipeline only through its call, and to envs
only through the Gymnasium vector API; benchmark conventions live in the adapters.
"""

from typing import TYPE_CHECKING

from cosmos3_gym.lazy import exports

if TYPE_CHECKING:
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

# Loaded on first use (cosmos3_gym/lazy.py): importing one light submodule does not import
# the heavy ones.
__getattr__, __dir__ = exports(__name__, {
    "Adapter": "adapters",
    "DroidAdapter": "adapters",
    "GenericAdapter": "adapters",
    "LiberoAdapter": "adapters",
    "MetaWorldAdapter": "adapters",
    "check_action_fit": "adapters",
    "get_adapter": "adapters",
    "take_envs": "observations",
    "ChunkPlanner": "planner",
    "ChunkRecord": "planner",
    "SeedRule": "planner",
    "chunk_seed": "planner",
    "pipeline_action_head": "planner",
    "pipeline_state_rows": "planner",
    "ActionQueues": "queues",
    "ActionSource": "queues",
    "PolicyFeed": "vector_policy",
    "VectorPolicy": "vector_policy",
    "VectorPolicyConfig": "vector_policy",
})

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
