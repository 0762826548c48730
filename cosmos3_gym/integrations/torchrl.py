"""TorchRL: a VectorPolicy as a policy module TorchRL's collectors take, and a Gymnasium vector
env as the TorchRL env they collect from. TorchRL (and tensordict) are imported only when one of
these is built.

    >>> envs = make_color_reach_vector_env(4)                       # doctest: +SKIP
    >>> env = torchrl_env(envs)                                     # doctest: +SKIP
    >>> module = torchrl_policy(VectorPolicy(pipeline), env)        # doctest: +SKIP
    >>> collector = Collector(env, module, frames_per_batch=64, total_frames=640)  # doctest: +SKIP

Autoreset. TorchRL resets finished envs itself, and takes a Gymnasium vector env only under
``AutoresetMode.DISABLED`` (what it prefers; its ``reset`` passes Gymnasium a ``reset_mask``)
or ``SAME_STEP``, never Gymnasium's default ``NEXT_STEP``. :func:`torchrl_env` switches a
``SyncVectorEnv`` to ``DISABLED`` before its first step; an ``AsyncVectorEnv`` fixes the mode
in its workers, so make it with ``autoreset_mode=AutoresetMode.DISABLED``.

Episode ends. :func:`torchrl_env` adds TorchRL's ``InitTracker``, whose ``is_init`` marks each
env's first step of an episode; the module clears that env's action queue there (and reads its
prompt again), so no action of an old chunk reaches a new episode.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

from cosmos3_gym.vector_env import autoreset_mode, base_vector_env

_INSTALL = "TorchRL is not installed: pip install torchrl (or the project's 'gym' extra)"


def torchrl_env(envs: VectorEnv, **wrapper_kwargs: Any) -> Any:
    """``envs`` as a TorchRL env: ``TransformedEnv(GymWrapper(envs), InitTracker())``, batch
    ``[num_envs]``, autoreset handled as the module notes say; ``wrapper_kwargs`` go to
    ``GymWrapper`` (``device``, ...)."""
    try:
        from torchrl.envs import GymWrapper, InitTracker, TransformedEnv
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    mode = autoreset_mode(envs)
    if mode == AutoresetMode.NEXT_STEP:
        base = base_vector_env(envs)
        if not isinstance(base, SyncVectorEnv) or base is not envs:
            raise ValueError(
                "TorchRL takes a Gymnasium vector env only with autoreset DISABLED (or "
                f"SAME_STEP); found NEXT_STEP on a {type(envs).__name__}, which cannot switch "
                "once built: make it with autoreset_mode=AutoresetMode.DISABLED"
            )
        # Before its first step a SyncVectorEnv's mode is only these two fields.
        envs.autoreset_mode = AutoresetMode.DISABLED
        envs.metadata["autoreset_mode"] = AutoresetMode.DISABLED
    return TransformedEnv(GymWrapper(envs, **wrapper_kwargs), InitTracker())


def torchrl_policy(
    policy: Any,
    env: Any = None,
    *,
    prompts: str | Sequence[str] | None = None,
    in_keys: Sequence[str | tuple[str, ...]] = ("observation",),
    action_key: str = "action",
) -> Any:
    """A ``tensordict.nn.TensorDictModuleBase`` that writes ``policy.select_action`` into
    ``action_key`` of each tensordict TorchRL's collectors hand it.

    ``policy`` is a :class:`~cosmos3_gym.policy.VectorPolicy`; ``env`` is the TorchRL env
    (:func:`torchrl_env`'s) or the Gymnasium vector env inside it. Its observation is
    ``td[key]`` for one ``in_keys`` entry (``"observation"``: what ``GymWrapper`` names an
    array observation), else the dict of them (a dict observation's keys, e.g. ``("pixels",)``);
    the tensors go to the policy as they are (on their device). Prompts are ``prompts`` (one
    for all envs, or one per env), else each env's ``task_description``, read from the
    Gymnasium envs at every episode start.

    A TorchRL collector runs its policy once on the first reset to learn its outputs: that call
    plans a chunk that no env executes, so the envs' first episodes count from 1 (each episode
    still starts from cleared queues and its own noise).
    """
    envs = env
    if env is not None and not isinstance(env, VectorEnv):
        envs = env.base_env._env  # the Gymnasium vector env TorchRL's GymWrapper holds
    if prompts is None and envs is None:
        raise ValueError("torchrl_policy: give prompts=..., or the env to read each env's "
                         "task_description from")
    return _policy_module_class()(policy, envs, prompts, tuple(in_keys), action_key)


@functools.cache
def _policy_module_class() -> type:
    """The module class, defined once tensordict is imported (it subclasses its base)."""
    try:
        import torch
        from tensordict.nn import TensorDictModuleBase
    except ImportError as err:
        raise ImportError(_INSTALL) from err

    class VectorPolicyModule(TensorDictModuleBase):
        """A VectorPolicy behind TensorDict's module surface (see :func:`torchrl_policy`)."""

        def __init__(self, policy: Any, envs: VectorEnv | None,
                     prompts: str | Sequence[str] | None,
                     in_keys: tuple[str | tuple[str, ...], ...], action_key: str) -> None:
            super().__init__()
            self.policy, self.envs = policy, envs
            self.in_keys, self.out_keys = list(in_keys), [action_key]
            self.action_key = action_key
            self.fixed_prompts = prompts
            self.prompts: list[str] | None = None

        def forward(self, tensordict: Any) -> Any:
            num_envs = int(tensordict.batch_size[0]) if tensordict.batch_dims else 1
            starts = self._episode_starts(tensordict, num_envs)
            if starts.any():
                self.policy.reset(starts)
                self._read_prompts(num_envs)
            obs = self._observation(tensordict)
            actions = torch.as_tensor(self.policy.select_action(obs, self.prompts))
            tensordict.set(self.action_key, actions.to(tensordict.device or _obs_device(obs)))
            return tensordict

        def _episode_starts(self, tensordict: Any, num_envs: int) -> np.ndarray:
            if self.prompts is None:  # the first call: every env starts
                return np.ones(num_envs, bool)
            flags = tensordict.get("is_init", None)
            if flags is None:
                raise ValueError(
                    "the tensordict has no 'is_init': wrap the env with TorchRL's InitTracker "
                    "(torchrl_env does), so the policy sees each env's episode start"
                )
            return flags.reshape(num_envs, -1).any(-1).cpu().numpy()

        def _read_prompts(self, num_envs: int) -> None:
            if self.fixed_prompts is not None:
                given = self.fixed_prompts
                self.prompts = [given] * num_envs if isinstance(given, str) else list(given)
            else:
                self.prompts = list(self.envs.call("task_description"))

        def _observation(self, tensordict: Any) -> Any:
            if len(self.in_keys) == 1:
                return tensordict.get(self.in_keys[0])
            obs: dict[str, Any] = {}
            for key in self.in_keys:
                path = (key,) if isinstance(key, str) else tuple(key)
                node = obs
                for part in path[:-1]:
                    node = node.setdefault(part, {})
                node[path[-1]] = tensordict.get(key)
            return obs

    return VectorPolicyModule


def _obs_device(obs: Any) -> Any:
    """The device of an observation's first tensor (``None`` for numpy observations)."""
    if isinstance(obs, dict):
        return next((_obs_device(v) for v in obs.values()), None)
    return getattr(obs, "device", None)
