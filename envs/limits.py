"""Envs that end their own episodes report the limit where Gymnasium tools look for it.

Our envs truncate themselves after ``max_episode_steps`` (no ``TimeLimit`` on top: LIBERO's limit
changes with the task a reset switches to). Tools read that limit in two places:
``env.spec.max_episode_steps`` (Gymnasium's checker and wrappers, RL libraries) and
``env._max_episode_steps`` (``TimeLimit``'s attribute; LeRobot's rollout reads it with
``envs.call("_max_episode_steps")``). :class:`OwnTimeLimit` answers both, for an env built
directly as well as through ``gymnasium.make``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from gymnasium.envs.registration import EnvSpec


class OwnTimeLimit:
    """Mixin (before ``gymnasium.Env`` in the bases) for an env that truncates at its own limit.

    The env sets ``max_episode_steps`` and ``_spec_kwargs`` (its constructor arguments) in
    ``__init__``. ``spec`` is the one ``gymnasium.make`` stored, or else one that rebuilds the env
    from ``spec_id`` and ``_spec_kwargs``; either way its ``max_episode_steps`` is the env's current
    limit, so ``gymnasium.make(env.spec)`` makes an equivalent env.

    Example:
        >>> import gymnasium as gym
        >>> class Counter(OwnTimeLimit, gym.Env):
        ...     spec_id = "demo/Counter-v0"
        ...     def __init__(self, max_episode_steps: int = 3) -> None:
        ...         self.max_episode_steps = max_episode_steps
        ...         self._spec_kwargs = {"max_episode_steps": max_episode_steps}
        >>> env = Counter(5)
        >>> env.spec.max_episode_steps, env._max_episode_steps, env.spec.kwargs
        (5, 5, {'max_episode_steps': 5})
    """

    spec_id: ClassVar[str]
    max_episode_steps: int
    _spec_kwargs: dict[str, Any]
    _made_spec: EnvSpec | None = None

    @property
    def _max_episode_steps(self) -> int:
        return self.max_episode_steps

    @property
    def spec(self) -> EnvSpec:
        made = self._made_spec
        if made is None:
            entry_point = f"{type(self).__module__}:{type(self).__qualname__}"
            made = EnvSpec(self.spec_id, entry_point=entry_point, kwargs=dict(self._spec_kwargs))
        return dataclasses.replace(made, max_episode_steps=self.max_episode_steps)

    @spec.setter
    def spec(self, value: EnvSpec | None) -> None:
        # gymnasium.make stores the spec it made the env from here.
        self._made_spec = value
