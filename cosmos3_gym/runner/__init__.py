"""The one episode runner and the run folder it writes into.

- :mod:`~cosmos3_gym.runner.loop`: :class:`EpisodeRunner`, the loop every job that steps a
  policy in envs runs (slots, masked resets, action checks, fault recovery, overlap);
- :mod:`~cosmos3_gym.runner.schedule`: which episode each slot runs next, and their seeds;
- :mod:`~cosmos3_gym.runner.envs`: the runner's guarded vector env;
- :mod:`~cosmos3_gym.runner.folder`: :class:`RunFolder`, the lock and identity of a run folder;
- :mod:`~cosmos3_gym.runner.onpolicy`: on-policy batches in memory;
- :mod:`~cosmos3_gym.runner.rollouts`: rollouts on disk (the shard format, resume, loading).
"""

from typing import TYPE_CHECKING

from cosmos3_gym.lazy import exports

if TYPE_CHECKING:
    from cosmos3_gym.runner.envs import EnvFault, GuardedEnvs
    from cosmos3_gym.runner.folder import FolderInUse, RunFolder, RunMismatch
    from cosmos3_gym.runner.loop import (
        EndedEpisodes,
        EpisodeResult,
        EpisodeRunner,
        PlannedChunks,
        RowAssembler,
        RunnerOptions,
        RunObserver,
        StepRow,
        TooManyFaults,
        hash_observation,
    )
    from cosmos3_gym.runner.onpolicy import collect_on_policy, stochastic_record
    from cosmos3_gym.runner.rollouts import (
        collect_rollouts,
        iter_rollout_shards,
        load_rollouts,
    )
    from cosmos3_gym.runner.schedule import (
        EpisodeList,
        EpisodeSpec,
        GroupEpisodes,
        RotationTag,
        Schedule,
        TaskRotation,
        episode_seed_rule,
        episode_specs,
        group_seed_rule,
    )

# Loaded on first use (cosmos3_gym/lazy.py): importing one light submodule does not import
# the heavy ones.
__getattr__, __dir__ = exports(__name__, {
    "EnvFault": "envs",
    "GuardedEnvs": "envs",
    "FolderInUse": "folder",
    "RunFolder": "folder",
    "RunMismatch": "folder",
    "EndedEpisodes": "loop",
    "EpisodeResult": "loop",
    "EpisodeRunner": "loop",
    "PlannedChunks": "loop",
    "RowAssembler": "loop",
    "RunnerOptions": "loop",
    "RunObserver": "loop",
    "StepRow": "loop",
    "TooManyFaults": "loop",
    "hash_observation": "loop",
    "collect_on_policy": "onpolicy",
    "stochastic_record": "onpolicy",
    "collect_rollouts": "rollouts",
    "iter_rollout_shards": "rollouts",
    "load_rollouts": "rollouts",
    "EpisodeList": "schedule",
    "EpisodeSpec": "schedule",
    "GroupEpisodes": "schedule",
    "RotationTag": "schedule",
    "Schedule": "schedule",
    "TaskRotation": "schedule",
    "episode_seed_rule": "schedule",
    "episode_specs": "schedule",
    "group_seed_rule": "schedule",
})

__all__ = [
    "EndedEpisodes",
    "EnvFault",
    "EpisodeList",
    "EpisodeResult",
    "EpisodeRunner",
    "EpisodeSpec",
    "FolderInUse",
    "GroupEpisodes",
    "GuardedEnvs",
    "PlannedChunks",
    "RotationTag",
    "RowAssembler",
    "RunFolder",
    "RunMismatch",
    "RunObserver",
    "RunnerOptions",
    "Schedule",
    "StepRow",
    "TaskRotation",
    "TooManyFaults",
    "collect_on_policy",
    "collect_rollouts",
    "episode_seed_rule",
    "episode_specs",
    "group_seed_rule",
    "hash_observation",
    "iter_rollout_shards",
    "load_rollouts",
    "stochastic_record",
]
