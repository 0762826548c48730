"""Every env by its ``--env`` name: the built-in families (:data:`EVAL_ENVS`), ``gym:ID``
(:data:`PREFIXED_ENVS`) and the benchmark presets (:mod:`~cosmos3_gym.envs.presets`).

Every command that takes ``--env`` checks the name here (:func:`check_env_name`) and builds the
env here (:func:`make_eval_env`). Imports run one way: this table imports the families and the
presets, the families import :mod:`~cosmos3_gym.envs.base`, and nothing imports back.
"""

from __future__ import annotations

import difflib
from typing import Any

from .base import EvalEnv
from .color_reach import ColorReachEval
from .gym_eval import GymEval
from .libero_eval import LiberoEval
from .metaworld import MetaWorldEval
from .presets import PRESETS, preset_eval_env, split_preset_name

# Every env the command line and the benchmark know, by --env name: a new env is one entry here
# (an EvalEnv subclass with its adapter, reset options and vector-env factory).
EVAL_ENVS: dict[str, type[EvalEnv]] = {
    "color_reach": ColorReachEval, "libero": LiberoEval, "metaworld": MetaWorldEval,
}
ENV_NAMES = tuple(EVAL_ENVS)
# Env families named with an id after a prefix (--env gym:ID).
GYM_PREFIX = "gym:"
PREFIXED_ENVS: dict[str, type[EvalEnv]] = {GYM_PREFIX: GymEval}
# The options that only --env gym:ID and the benchmark presets (envs/presets.py) take, with
# their flags.
GYM_OPTIONS = {"prompt": "--prompt", "import_modules": "--import", "env_kwargs": "--env-kwargs",
               "success_key": "--success-key", "success": "--success",
               "image_key": "--image-key", "state_key": "--state-key",
               "render_size": "--render-size", "flip": "--flip"}



def check_env_name(text: str) -> str:
    """``text`` if it names an env: a family of :data:`EVAL_ENVS`, ``gym:ID``, or a benchmark
    preset (``pusht``, ``aloha:insertion``, ``metaworld:mt10``: :mod:`~cosmos3_gym.envs.
    presets`); a ``ValueError`` otherwise, with the closest known name where one is close
    (``--env pushtt``: did you mean ``pusht``?) and what is known. Every command that takes
    ``--env`` parses it here.

    >>> check_env_name("colour_reach")
    Traceback (most recent call last):
    ...
    ValueError: unknown env 'colour_reach' (did you mean color_reach?); expected one of ...
    """
    if text in ENV_NAMES or (text.startswith(GYM_PREFIX) and text[len(GYM_PREFIX):].strip()):
        return text
    found = split_preset_name(text)
    if found is not None:
        preset, selector = found
        preset.select(selector)  # a variant it does not have is refused now, not at the run
        return text
    known = [*ENV_NAMES, *PRESETS, *(f"{p.name}:{choice}" for p in PRESETS.values()
                                     for choice in (*(v.task for v in p.variants), *p.sets))]
    close = difflib.get_close_matches(text, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ValueError(f"unknown env {text!r}{hint}; expected one of {', '.join(ENV_NAMES)}, a "
                     "benchmark preset "
                     f"({', '.join(PRESETS)}, optionally NAME:VARIANT), or gym:ID (a registered "
                     f"Gymnasium id, e.g. gym:gym_pusht/PushT-v0)")


def make_eval_env(
    env: str,
    *,
    suite: str | None = None,
    tasks: list[str] | None = None,
    image_size: int | None = None,
    max_episode_steps: int | None = None,
    step_budget: str | None = None,
    **gym_options: Any,
) -> EvalEnv:
    """The :class:`EvalEnv` the command line names (``tasks`` as given by ``--tasks``):
    ``gym:ID`` is :class:`GymEval`, a benchmark preset (``pusht``, ``metaworld:mt10``, ...)
    the family its entry in :data:`~cosmos3_gym.envs.presets.PRESETS` builds; only these take
    ``gym_options`` (:data:`GYM_OPTIONS`)."""
    common = dict(suite=suite, tasks=tasks, image_size=image_size,
                  max_episode_steps=max_episode_steps, step_budget=step_budget)
    options = {k: v for k, v in gym_options.items() if v is not None}
    unknown = sorted(set(options) - set(GYM_OPTIONS))
    if unknown:
        raise TypeError(f"make_eval_env: unknown options {unknown}; expected {list(GYM_OPTIONS)}")
    if env.startswith(GYM_PREFIX):
        env_id = env[len(GYM_PREFIX):].strip()
        if not env_id:
            raise ValueError(f"--env {env!r}: expected gym:ID with a registered Gymnasium id, "
                             "e.g. gym:gym_pusht/PushT-v0")
        return PREFIXED_ENVS[GYM_PREFIX].from_cli(**common, env_id=env_id, **options)
    if env not in EVAL_ENVS and split_preset_name(env) is not None:
        return preset_eval_env(env, **common, **options)
    if env not in EVAL_ENVS:
        check_env_name(env)
    family = EVAL_ENVS[env]
    env_kwargs = options.pop("env_kwargs", None) if family.env_kwargs_keys else None
    given = [GYM_OPTIONS[k] for k, v in options.items() if v not in ((), [])]
    if given:
        raise ValueError(f"{', '.join(given)} apply to --env gym:ID and the benchmark presets "
                         f"only; found --env {env}")
    if env_kwargs:
        unknown = sorted(set(env_kwargs) - set(family.env_kwargs_keys))
        if unknown:
            raise ValueError(f"--env-kwargs {unknown}: --env {env} takes "
                             f"{list(family.env_kwargs_keys)} only")
        return family.from_cli(**common, env_kwargs=env_kwargs)
    return family.from_cli(**common)


# The module that held every built-in family until each moved beside its env; a run folder
# written then records its env's family there (EvalEnv.identity's "family").
_FAMILIES_MODULE_BEFORE = "cosmos3_gym.envs.families"


# The real-time execution settings a family holds (a GymEval's, from its preset), which an
# identity written before real-time execution lacks.
_REALTIME_KEYS = ("control_hz", "hold")


def upgrade_env_identity(stored: dict[str, Any],
                         current: dict[str, Any] | None = None) -> dict[str, Any]:
    """An env identity a run folder stored (:meth:`EvalEnv.identity`) in today's terms: a
    built-in family recorded under the module it was in before reads as the module it is in
    now, so such a folder resumes. An identity written before real-time execution holds no
    ``control_hz`` and ``hold``: its run was synchronous, where they take no part, so they read
    as ``current``'s (the env this run makes; a run with a latency differs in its latency
    settings all the same).

    >>> upgrade_env_identity({"family": "cosmos3_gym.envs.families.ColorReachEval"})["family"]
    'cosmos3_gym.envs.color_reach.ColorReachEval'
    >>> upgrade_env_identity({"family": "x.GymEval"}, {"control_hz": 10.0, "hold": "still"})
    {'family': 'x.GymEval', 'control_hz': 10.0, 'hold': 'still'}
    """
    out = dict(stored)
    if isinstance(current, dict):
        out.update({k: current[k] for k in _REALTIME_KEYS if k in current and k not in out})
    module, _, name = str(out.get("family", "")).rpartition(".")
    moved = {cls.__qualname__: cls for cls in (ColorReachEval, LiberoEval, MetaWorldEval, GymEval)}
    if module != _FAMILIES_MODULE_BEFORE or name not in moved:
        return out
    cls = moved[name]
    return {**out, "family": f"{cls.__module__}.{cls.__qualname__}"}
