"""The one episode runner and the run folder it writes into.

- :mod:`~cosmos3_gym.runner.loop`: :class:`EpisodeRunner`, the loop every job that steps a
  policy in envs runs (slots, masked resets, action checks, fault recovery, overlap);
- :mod:`~cosmos3_gym.runner.schedule`: which episode each slot runs next, and their seeds;
- :mod:`~cosmos3_gym.runner.envs`: the runner's guarded vector env;
- :mod:`~cosmos3_gym.runner.folder`: :class:`RunFolder`, the lock and identity of a run folder;
- :mod:`~cosmos3_gym.runner.onpolicy`: on-policy batches in memory;
- :mod:`~cosmos3_gym.runner.rollouts`: rollouts on disk (the shard format, resume, loading).
"""

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
