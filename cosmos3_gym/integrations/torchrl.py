"""TorchRL: a VectorPolicy as a policy module TorchRL's collectors take, and a Gymnasium vector
env as the TorchRL env they collect from, its batches carrying the env's success. TorchRL (and
tensordict) are imported only when one of these is built.

    >>> envs = make_color_reach_vector_env(4)                       # doctest: +SKIP
    >>> env = torchrl_env(envs)                                     # doctest: +SKIP
    >>> module = torchrl_policy(VectorPolicy(pipeline), env)        # doctest: +SKIP
    >>> collector = Collector(env, module, frames_per_batch=64, total_frames=640)  # doctest: +SKIP
    >>> batch = next(iter(collector))                               # doctest: +SKIP
    >>> ended = batch["next", "done"]                               # doctest: +SKIP
    >>> batch["next", "success"][ended].float().mean()  # the ended episodes' rate  # doctest: +SKIP

Success. Each step's ``("next", "success")``, bool ``[num_envs, 1]`` like ``done``, is the
success a declared rule (:mod:`cosmos3_gym.envs.success`) reads in that step's info: by default
the env's own flag (``is_success``, else ``success``). Where ``("next", "done")`` is set it is
the episode's outcome, as the evaluator counts it. An env that reports no flag gets no
``success`` entry (and a warning), never one that reads as failures: see :func:`torchrl_env`.

Observation keys. :func:`torchrl_policy` reads the observation entries the policy needs from
the env's observation space: the uint8 ``[H, W, C]`` image (the rule of
:func:`~cosmos3_gym.envs.gym.has_image` and the generic adapter: exactly one, else name it with
``image_key``) and the robot state where one is named (``state_key``, else the adapter's own),
and hands them to the policy under the names the Gymnasium env gives them, as our own loop does.

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
import math
import warnings
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv, VectorEnv

from cosmos3_gym.envs.gym import has_image
from cosmos3_gym.envs.success import SUCCESS_KEYS, SuccessRule, parse_success, probe_action
from cosmos3_gym.vector_env import autoreset_mode, base_vector_env

_INSTALL = "TorchRL is not installed: pip install torchrl (or the project's 'gym' extra)"
# The entry torchrl_env's batches carry each step's success under ("next", SUCCESS).
SUCCESS = "success"
# The rules an info reader can evaluate at each step (not "return >= X": see torchrl_env).
_SYNTAX = "auto, info.KEY (a bool flag), 'info.KEY > X' (>, >=, <, <=), terminated, or none"
# A TensorDict key: a name, or a path into nested entries.
Key = str | tuple[str, ...]


def torchrl_env(envs: VectorEnv, *, success: SuccessRule | str | None = "auto",
                **wrapper_kwargs: Any) -> Any:
    """``envs`` as a TorchRL env: ``TransformedEnv(GymWrapper(envs), InitTracker())``, batch
    ``[num_envs]``, autoreset handled as the module notes say; ``wrapper_kwargs`` go to
    ``GymWrapper`` (``device``, ...).

    ``success`` is the rule each step's ``("next", "success")`` (bool ``[num_envs, 1]``) follows,
    a :class:`~cosmos3_gym.envs.success.SuccessRule` or its ``--success`` text: ``"auto"`` (the
    default) the env's flag ``is_success``, else ``success``, looked for in one reset and step
    of ``envs`` here (TorchRL's own info readers probe the same way; seed the collection after
    it, e.g. ``env.set_seed``); ``"info.KEY"`` a named bool flag; ``"info.KEY > X"`` a threshold;
    ``"terminated"`` the termination; ``None`` or ``"none"`` no entry. Success counts only what
    the env reported: where ``auto`` finds neither flag the batches carry no ``success`` entry
    (and a warning says so), and a step whose info lacks the key the rule reads is a
    ``ValueError`` naming the keys found, never a failure by default. ``"return >= X"`` is
    refused: an info reader keeps no episode return (TorchRL's ``RewardSum`` does). The entry is
    written by a TorchRL info-dict reader (``GymWrapper.set_info_dict_reader``), which declares
    its spec; at a reset, before any step, it is ``False``.
    """
    try:
        from torchrl.envs import GymWrapper, InitTracker, TransformedEnv
    except ImportError as err:
        raise ImportError(_INSTALL) from err
    rule = _success_rule(success)
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
    if rule is not None and rule.kind == "flag" and rule.key is None:
        rule = _found_flag(envs, rule)
    wrapped = GymWrapper(envs, **wrapper_kwargs)
    # Under SAME_STEP, GymWrapper returns itself inside TorchRL's VecGymEnvTransform.
    gym_env = wrapped.base_env if isinstance(wrapped, TransformedEnv) else wrapped
    if rule is not None:
        gym_env.set_info_dict_reader(
            _success_reader_class()(rule, gym_env.batch_size, gym_env.device))
    if gym_env is wrapped:
        return TransformedEnv(wrapped, InitTracker())
    wrapped.append_transform(InitTracker())
    return wrapped


def _success_rule(success: SuccessRule | str | None) -> SuccessRule | None:
    """``success`` as a rule torchrl_env can read each step (``None``: no success entry)."""
    declared_by = f"torchrl_env(success={success!r})"
    try:
        rule = parse_success(success, declared_by) if isinstance(success, str) else success
    except ValueError:
        rule = None
    if success is not None and not isinstance(rule, SuccessRule):
        raise ValueError(f"torchrl_env: success: expected {_SYNTAX} (or None, or a SuccessRule); "
                         f"found {success!r}")
    if rule is None or rule.kind == "none":
        return None
    if rule.kind == "return":
        raise ValueError(
            f"torchrl_env: success {rule.text!r} needs each episode's return, which an info "
            "reader does not keep; add TorchRL's RewardSum transform and compare its "
            f"('next', 'episode_reward'), or give {_SYNTAX}")
    return rule


def _found_flag(envs: VectorEnv, rule: SuccessRule) -> SuccessRule | None:
    """``auto`` made definite: the flag one reset and step of ``envs`` report (``is_success``,
    else ``success``), or ``None``, with a warning, where they report neither."""
    envs.reset()
    info = envs.step(probe_action(envs.action_space))[4]
    # Under SAME_STEP an env that ended at this step reports its step in final_info.
    key = rule.flag_key({**info.get("final_info", {}), **info})
    if key is None:
        found = sorted(k for k in info if not k.startswith("_"))
        warnings.warn(
            f"torchrl_env: the env's step info holds neither {' nor '.join(SUCCESS_KEYS)} "
            f"(found {found}), so its batches carry no ('next', {SUCCESS!r}); declare one with "
            "success='info.KEY', 'info.KEY > X' or 'terminated', or give success=None",
            stacklevel=3)
        return None
    return SuccessRule("flag", key, declared_by=rule.declared_by)


@functools.cache
def _success_reader_class() -> type:
    """The info-dict reader class, defined once TorchRL is imported (it subclasses its base).
    TorchRL's ``default_info_dict_reader`` copies info keys as they are: under the info's own
    name and shape ``[num_envs]``, zeros where a key is missing, no rule; hence this one."""
    import torch
    from torchrl.data import Categorical, Composite
    from torchrl.envs.gym_like import BaseInfoDictReader

    class SuccessReader(BaseInfoDictReader):
        """Each step's success by ``rule`` as ``success``, bool ``[num_envs, 1]``."""

        def __init__(self, rule: SuccessRule, batch_size: Any, device: Any) -> None:
            self.rule = rule
            flag = Categorical(2, shape=(*batch_size, 1), dtype=torch.bool, device=device)
            self._info_spec = Composite({SUCCESS: flag}, shape=batch_size, device=device)

        @property
        def info_spec(self) -> Any:
            return self._info_spec

        def __call__(self, info: dict[str, Any], tensordict: Any) -> Any:
            num_envs = int(tensordict.batch_size[0])
            if "terminated" in tensordict:  # a step (a reset's tensordict holds no done keys)
                terminated = tensordict.get("terminated").reshape(num_envs).tolist()
                outcomes = [self._outcome(_sub_env_info(info, i), terminated[i], i)
                            for i in range(num_envs)]
            else:
                outcomes = [False] * num_envs
            tensordict.set(SUCCESS, torch.tensor(outcomes, dtype=torch.bool,
                                                 device=tensordict.device).reshape(num_envs, 1))
            return tensordict

        def _outcome(self, info: dict[str, Any], terminated: bool, index: int) -> bool:
            try:  # never None: auto is made definite, return rules are refused
                return self.rule.outcome(info, terminated=terminated, episode_return=math.nan)
            except ValueError as err:
                raise ValueError(f"torchrl_env, env {index}: {err}") from None

    return SuccessReader


def _sub_env_info(info: Mapping[str, Any], index: int) -> dict[str, Any]:
    """Env ``index``'s own info out of a Gymnasium vector info (each key's values stacked, a
    ``_KEY`` mask of the envs that reported it); under ``SAME_STEP`` an env whose episode ended
    at this step reports that step in ``final_info``.

    >>> info = {"is_success": np.array([True, False]), "_is_success": np.array([True, False])}
    >>> _sub_env_info(info, 0)["is_success"].item(), _sub_env_info(info, 1)
    (True, {})
    """
    ended = info.get("_final_info")
    if ended is not None and ended[index]:
        return _sub_env_info(info["final_info"], index)
    own = {}
    for key, value in info.items():
        reported = info.get(f"_{key}")
        if key.startswith("_") or key in ("final_info", "final_obs") or (
                reported is not None and not reported[index]):
            continue
        if isinstance(value, Mapping):
            own[key] = _sub_env_info(value, index)
        else:  # a scalar is every env's (ManiSkill3's vector infos hold some)
            own[key] = value if np.ndim(value) == 0 else value[index]
    return own


def torchrl_policy(
    policy: Any,
    env: Any = None,
    *,
    prompts: str | Sequence[str] | None = None,
    image_key: str | Sequence[str] | None = None,
    state_key: str | None = None,
    in_keys: Sequence[Key] | None = None,
    action_key: str = "action",
) -> Any:
    """A ``tensordict.nn.TensorDictModuleBase`` that writes ``policy.select_action`` into
    ``action_key`` of each tensordict TorchRL's collectors hand it.

    ``policy`` is a :class:`~cosmos3_gym.policy.VectorPolicy`; ``env`` is the TorchRL env
    (:func:`torchrl_env`'s) or the Gymnasium vector env inside it. The observation entries the
    module reads come from the env's observation space (:func:`observation_keys`): an array
    observation is the image itself (TorchRL's ``"observation"``); in a dict observation the
    image is its one uint8 ``[H, W, C]`` entry, or ``image_key`` (``"a/b"`` for nested; several
    keys for an adapter that joins cameras), or the policy adapter's own ``image_key``; the
    state is ``state_key``, else the adapter's ``state_key`` where the observation has it, else
    none. The policy gets them as a dict under the Gymnasium env's names (what its adapter reads
    in our own loop), as tensors on their device. ``in_keys`` instead names the tensordict
    entries directly: one is handed over as it is, several as a dict by their keys.

    Prompts are ``prompts`` (one for all envs, or one per env), else each env's
    ``task_description``, read from the Gymnasium envs at every episode start.

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
    if in_keys is not None:
        if image_key is not None or state_key is not None:
            raise ValueError("torchrl_policy: in_keys names the entries itself; give in_keys, "
                             "or image_key / state_key, not both")
        reads = _given_keys(in_keys)
    elif envs is None:
        if image_key is not None or state_key is not None:
            raise ValueError("torchrl_policy: image_key / state_key are looked up in the env's "
                             "observation space; give the env too (or in_keys=...)")
        reads = {"observation": None}
    else:
        adapter = getattr(policy, "adapter", None)
        reads = observation_keys(
            envs.single_observation_space, image_key=image_key, state_key=state_key,
            adapter_image_key=getattr(adapter, "image_key", None),
            adapter_state_key=getattr(adapter, "state_key", None))
        if env is not envs:
            _check_in_spec(reads, env.observation_spec)
    return _policy_module_class()(policy, envs, prompts, reads, action_key)


def observation_keys(
    space: spaces.Space,
    *,
    image_key: str | Sequence[str] | None = None,
    state_key: str | None = None,
    adapter_image_key: str | Sequence[str] | None = None,
    adapter_state_key: str | None = None,
) -> dict[Key, tuple[str, ...] | None]:
    """The entries of a Gymnasium observation ``space`` a policy reads, as ``{TorchRL key: the
    path the policy finds it under}`` (``None``: the array observation, handed over as it is).
    The rule, the generic adapter's: the image is ``image_key``, else the adapter's, else the
    one uint8 ``[H, W, C]`` entry; the state ``state_key``, else the adapter's where the space
    has it. The keys are GymWrapper's: an array observation is ``"observation"``, and so is a
    dict's top-level ``"state"`` where it has no ``"observation"``.

    >>> image = spaces.Box(0, 255, (64, 64, 3), np.uint8)
    >>> observation_keys(spaces.Dict({"pixels": image, "agent_pos": spaces.Box(-1, 1, (2,))}),
    ...                  state_key="agent_pos")
    {'pixels': ('pixels',), 'agent_pos': ('agent_pos',)}
    >>> observation_keys(spaces.Dict({"front": image, "wrist": image}))
    Traceback (most recent call last):
    ...
    ValueError: torchrl_policy: expected one uint8 [H, W, C] image in the observation, found 2: {'front': 'uint8 [64, 64, 3]', 'wrist': 'uint8 [64, 64, 3]'}; name it with image_key=...
    """  # noqa: E501
    if not isinstance(space, spaces.Dict):
        if image_key is not None or state_key is not None:
            raise ValueError(f"torchrl_policy: image_key / state_key name entries of a dict "
                             f"observation; the env's observation is one array: {space}")
        if not has_image(space):
            raise ValueError(f"torchrl_policy: expected a uint8 [H, W, C] image as the env's "
                             f"observation; found {space} (give in_keys=...)")
        return {"observation": None}
    leaves = dict(_leaves(space))
    found = {name: f"{leaf.dtype} {list(leaf.shape)}" if isinstance(leaf, spaces.Box) else
             str(leaf) for name, leaf in leaves.items()}
    given = image_key if image_key is not None else adapter_image_key
    if given is not None:
        images = [given] if isinstance(given, str) else list(given)
        for name in images:
            if name not in leaves:
                raise ValueError(f"torchrl_policy: image_key {name!r} is not in the "
                                 f"observation; found {found}")
            if not has_image(leaves[name]):
                raise ValueError(f"torchrl_policy: image_key {name!r} holds {found[name]}, not "
                                 "a uint8 [H, W, C] image")
    else:
        images = [name for name, leaf in leaves.items() if has_image(leaf)]
        if len(images) != 1:
            raise ValueError(f"torchrl_policy: expected one uint8 [H, W, C] image in the "
                             f"observation, found {len(images)}: {found}; name it with "
                             "image_key=...")
    if state_key is not None and state_key not in leaves:
        raise ValueError(f"torchrl_policy: state_key {state_key!r} is not in the observation; "
                         f"found {found}")
    state = state_key if state_key is not None else (
        adapter_state_key if adapter_state_key in leaves else None)
    names = dict.fromkeys([*images, *([state] if state is not None else [])])
    return {_gym_wrapper_key(space, name): tuple(name.split("/")) for name in names}


def _leaves(space: spaces.Dict, prefix: str = "") -> Iterator[tuple[str, spaces.Space]]:
    """A dict space's entries by ``"a/b"`` name, nested dicts walked into."""
    for key, sub in space.spaces.items():
        if isinstance(sub, spaces.Dict):
            yield from _leaves(sub, f"{prefix}{key}/")
        else:
            yield f"{prefix}{key}", sub


def _gym_wrapper_key(space: spaces.Dict, name: str) -> Key:
    """The TensorDict key GymWrapper gives the entry ``name`` of a dict observation: its path,
    with a top-level ``"state"`` renamed ``"observation"`` where there is none (TorchRL's
    ``GymLikeEnv.read_obs``)."""
    path = tuple(name.split("/"))
    if path == ("state",) and "observation" not in space.spaces:
        return "observation"
    return path[0] if len(path) == 1 else path


def _given_keys(in_keys: Sequence[Key]) -> dict[Key, tuple[str, ...] | None]:
    """Explicit ``in_keys``: one entry handed over as it is, several as a dict by their keys."""
    keys = [key if isinstance(key, str) else tuple(key) for key in in_keys]
    if not keys:
        raise ValueError("torchrl_policy: in_keys: expected at least one key; found none")
    if len(keys) == 1:
        return {keys[0]: None}
    return {key: (key,) if isinstance(key, str) else key for key in keys}


def _check_in_spec(reads: Mapping[Key, Any], spec: Any) -> None:
    """Each key is in the TorchRL env's observation spec (a transform may have renamed one)."""
    present = set(spec.keys(True, True))
    missing = [key for key in reads if key not in present]
    if missing:
        raise ValueError(f"torchrl_policy: the TorchRL env's observation spec has no "
                         f"{', '.join(map(repr, missing))}; it holds {sorted(map(str, present))} "
                         "(give in_keys=...)")


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
                     reads: dict[Key, tuple[str, ...] | None], action_key: str) -> None:
            super().__init__()
            self.policy, self.envs = policy, envs
            self.reads = reads  # TorchRL key -> where the policy finds it (None: as it is)
            self.in_keys, self.out_keys = list(reads), [action_key]
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
            (first, path), *_ = self.reads.items()
            if path is None:
                return tensordict.get(first)
            obs: dict[str, Any] = {}
            for key, path in self.reads.items():
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
