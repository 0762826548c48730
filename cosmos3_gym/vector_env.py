"""What every wrapper of a Gymnasium ``VectorEnv`` in this project needs, written once.

The chunk-stepping wrapper (envs), the policy's feed (policy) and rollout collection (eval) all
read the vector env's autoreset mode and pass ``call`` / ``get_attr`` / ``set_attr`` through to
the env they wrap. This module imports Gymnasium only, so ``cosmos3_gym.envs`` stays free of
torch and the model stack.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper

# The sub-env attributes a prompt is read from, in order of preference.
TASK_ATTRIBUTES = ("task_description", "task")


def autoreset_mode(envs: VectorEnv) -> AutoresetMode:
    """``envs.metadata["autoreset_mode"]`` as an ``AutoresetMode`` (Gymnasium's ``NEXT_STEP``
    when absent), or a ``ValueError`` that names the value found.

    >>> import gymnasium as gym
    >>> envs = gym.vector.SyncVectorEnv(
    ...     [lambda: gym.make("CartPole-v1")], autoreset_mode=AutoresetMode.SAME_STEP
    ... )
    >>> autoreset_mode(envs)
    <AutoresetMode.SAME_STEP: 'SameStep'>
    >>> envs.close()
    """
    mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    try:
        return AutoresetMode(mode)
    except ValueError:
        raise ValueError(
            f"envs.metadata['autoreset_mode'] is {mode!r}; expected one of "
            f"{[m.value for m in AutoresetMode]}"
        ) from None


def task_attribute(envs: VectorEnv) -> str:
    """The attribute every sub-env names its task by (``task_description``, else ``task``), or a
    ``ValueError`` listing which envs have which. Probed with ``has_wrapper_attr``: a failing
    ``call`` would close an ``AsyncVectorEnv``'s pipes."""
    found = {}
    for name in TASK_ATTRIBUTES:
        found[name] = np.array(envs.call("has_wrapper_attr", name), dtype=bool)
        if found[name].all():
            return name
    listed = ", ".join(f"with {name}: {np.flatnonzero(has).tolist()}"
                       for name, has in found.items())
    raise ValueError(
        "every env needs a task_description (or task) attribute to read prompts from; envs "
        f"{listed}, of {envs.num_envs}"
    )


def base_vector_env(envs: VectorEnv) -> VectorEnv:
    """The vector env whose ``call`` / ``get_attr`` / ``set_attr`` answer for ``envs``: the first
    one down the wrapper chain that is not a plain ``VectorWrapper`` (Gymnasium's wrappers do not
    forward them). Not ``envs.unwrapped``: a vector env may name its simulator there (ManiSkill's
    ``ManiSkillVectorEnv.unwrapped`` is its batched task env, which has no ``call``)."""
    while isinstance(envs, VectorWrapper) and not isinstance(envs, ForwardingVectorWrapper):
        envs = envs.env
    return envs


class ForwardingVectorWrapper(VectorWrapper):
    """A ``VectorWrapper`` whose ``call``, ``get_attr`` and ``set_attr`` reach the sub-envs.

    Gymnasium's ``VectorWrapper`` does not forward them, so without this a policy could not
    read prompts with ``envs.call("task_description")`` through a wrapper.
    """

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``call`` of the wrapped vector env."""
        return base_vector_env(self.env).call(name, *args, **kwargs)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """``get_attr`` of the wrapped vector env."""
        return base_vector_env(self.env).get_attr(name)

    def set_attr(self, name: str, values: list[Any] | tuple[Any, ...] | Any) -> None:
        """``set_attr`` of the wrapped vector env."""
        base_vector_env(self.env).set_attr(name, values)
