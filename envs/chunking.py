"""Chunk stepping: run `[B, H, D]` action chunks on a vector env, each env stopping at its done.

A Gymnasium ``VectorEnv`` steps all its sub-envs together, and its autoreset starts a new episode
on its own. Executing a chunk therefore needs a little help from each sub-env: an
:class:`EpisodeEndHold` around it keeps it still once its episode has ended (so the other envs
can finish their chunks and no action of the old chunk reaches a new episode), and
:class:`ChunkedActionWrapper` performs the resets itself at chunk boundaries, following the
vector env's ``autoreset_mode``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import Box
from gymnasium.vector import AutoresetMode, VectorEnv, VectorWrapper
from gymnasium.vector.utils import iterate

from cosmos3_gym.vector_env import ForwardingVectorWrapper, autoreset_mode

# Info keys through which EpisodeEndHold reports the true episode end while it is armed.
_TERMINATED_KEY = "episode_terminated"
_TRUNCATED_KEY = "episode_truncated"


def make_held_env(
    make: Callable[..., gym.Env], wrappers: tuple[Callable[[gym.Env], gym.Env], ...] = (),
    **kwargs: Any,
) -> gym.Env:
    """``make(**kwargs)`` with ``wrappers`` applied in order, then :class:`EpisodeEndHold`
    outermost: one sub-env of a chunk-stepping vector env. A module-level function, so that
    spawn / forkserver workers can unpickle ``functools.partial(make_held_env, EnvClass, ...)``.
    """
    env = make(**kwargs)
    for wrapper in wrappers:
        env = wrapper(env)
    return EpisodeEndHold(env)


def observation_problem(space: gym.Space, obs: Any, path: str = "observation") -> str | None:
    """What is wrong with ``obs`` for ``space`` (None: nothing): an array of another shape than
    its ``Box``, or a float array holding NaN (an infinity may be a reading, e.g. a range
    sensor that saw nothing; NaN never is). Dict and Tuple spaces are walked key by key.

    >>> observation_problem(Box(0, 255, (4, 4, 3), np.uint8), np.zeros((2, 4, 3), np.uint8))
    'observation has shape [2, 4, 3]; its observation space says [4, 4, 3]'
    >>> observation_problem(gym.spaces.Dict({"state": Box(-1, 1, (2,))}),
    ...                     {"state": np.array([0.0, np.nan])})
    "observation['state'] holds NaN in dims [1]"
    """
    if isinstance(space, gym.spaces.Dict):
        if not isinstance(obs, dict):
            return f"{path} is a {type(obs).__name__}; its observation space is a Dict"
        for key, sub in space.spaces.items():
            if key not in obs:
                return f"{path} lacks {key!r}; its observation space has {list(space.spaces)}"
            problem = observation_problem(sub, obs[key], f"{path}[{key!r}]")
            if problem is not None:
                return problem
        return None
    if isinstance(space, gym.spaces.Tuple):
        for k, sub in enumerate(space.spaces):
            problem = observation_problem(sub, obs[k], f"{path}[{k}]")
            if problem is not None:
                return problem
        return None
    if not isinstance(space, Box) or not hasattr(obs, "shape"):
        return None
    if tuple(obs.shape) != tuple(space.shape):
        return (f"{path} has shape {list(obs.shape)}; its observation space says "
                f"{list(space.shape)}")
    if isinstance(obs, np.ndarray) and obs.dtype.kind == "f":
        nan = np.isnan(obs)
        if nan.any():
            where = np.flatnonzero(nan.reshape(-1)).tolist()
            shown = where[:8] + (["..."] if len(where) > 8 else [])
            return f"{path} holds NaN in dims {shown}"
    return None


class EpisodeEndHold(gym.Wrapper):
    """Hold a sub-env still after its episode ends, until it is reset; for chunk stepping.

    Inert until :class:`ChunkedActionWrapper` arms it (``chunk_hold_armed = True``). Once armed,
    the vector env above never sees a done: the wrapper reports ``terminated=truncated=False``,
    puts the true flags in ``info["episode_terminated"]`` / ``info["episode_truncated"]``, and
    after the end answers every ``step`` with the cached final observation and info, reward 0,
    without touching the simulator. It does the same while ``chunk_hold`` is set (an env that
    sits out a chunk). The vector env's own autoreset therefore never fires; the chunk wrapper
    resets envs itself, only between chunks.

    Armed, it also checks each observation the env returns against the env's own observation
    space: an array whose shape differs from the space's, or a float array holding NaN, is a
    fault of this env (``env_faulted``, a ``ValueError`` naming the key, the step and what was
    found), where the vector env above would fail to stack it naming no env and no key, or
    pass a NaN on to the policy.

    Use it as the outermost wrapper of each sub-env. Wrappers inside it see every env step and
    every episode end, also under chunk stepping (the place for per-episode statistics such as
    ``gymnasium.wrappers.RecordEpisodeStatistics``); the vector env above sees neither. The task
    attributes ``task_description`` and ``task`` of the env inside are visible on this wrapper
    (``hasattr`` included), since ``gymnasium.Wrapper`` forwards no attributes, and setting
    ``task_description`` here sets it on that env.

    Example:
        >>> import gymnasium as gym
        >>> from cosmos3_gym.envs import ColorReachEnv
        >>> env = EpisodeEndHold(ColorReachEnv(max_episode_steps=1))
        >>> env.chunk_hold_armed = True
        >>> _ = env.reset(seed=0)
        >>> _, _, terminated, truncated, info = env.step(env.action_space.sample())
        >>> terminated, truncated, info["episode_truncated"]
        (False, False, True)
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.chunk_hold_armed = False
        self.chunk_hold = False
        # Set when the env inside raised from reset or step: in a SyncVectorEnv, where an
        # exception does not say which sub-env raised it, this names the one that faulted.
        self.env_faulted = False
        self._episode_over = False
        self._last_obs: Any = None
        self._last_info: dict[str, Any] = {}
        self._steps = 0

    def _check_obs(self, obs: Any, when: str) -> None:
        problem = observation_problem(self.env.observation_space, obs)
        if problem is not None:
            self.env_faulted = True
            raise ValueError(f"{problem} at {when}")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        try:
            obs, info = self.env.reset(seed=seed, options=options)
        except Exception:
            self.env_faulted = True
            raise
        self._episode_over = False
        self._steps = 0
        if self.chunk_hold_armed:
            self._check_obs(obs, "reset")
        self._last_obs, self._last_info = obs, info
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if not self.chunk_hold_armed:
            return self._faulting_step(action)
        if self.chunk_hold or self._episode_over:
            return self._last_obs, 0.0, False, False, self._last_info
        obs, reward, terminated, truncated, info = self._faulting_step(action)
        self._steps += 1
        self._check_obs(obs, f"step {self._steps} of its episode")
        self._episode_over = bool(terminated or truncated)
        info = {**info, _TERMINATED_KEY: bool(terminated), _TRUNCATED_KEY: bool(truncated)}
        self._last_obs, self._last_info = obs, info
        return obs, reward, False, False, info

    def _faulting_step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        try:
            return self.env.step(action)
        except Exception:
            self.env_faulted = True
            raise

    @property
    def task_description(self) -> str:
        return self.env.get_wrapper_attr("task_description")

    @task_description.setter
    def task_description(self, value: str) -> None:
        # What `envs.set_attr("task_description", prompts)` reaches: the env that holds it.
        self.env.set_wrapper_attr("task_description", value)

    @property
    def task(self) -> str:
        return self.env.get_wrapper_attr("task")


class ChunkedActionWrapper(ForwardingVectorWrapper):
    """Step a vector env with ``[B, H, D]`` action chunks (or plain ``[B, D]`` actions).

    Each env executes its chunk row by row until its episode ends, then stands still for the rest
    of the call, so no action of a chunk reaches the next episode. Returns the observation after
    each env's last executed step, the summed rewards, the terminated / truncated flags of the
    episodes that ended in this call, and ``infos["steps_executed"]`` (int ``[B]``). A ``[B, D]``
    action is a chunk of length 1. Stepping stops early when every env is done.

    Resets happen only at chunk boundaries and follow ``env.metadata["autoreset_mode"]``, read at
    the macro level (one call = one step):

    * ``NEXT_STEP``: a finished env returns its final observation and info. On the next call it is
      reset instead of stepped: its chunk is ignored, it returns the reset observation and info,
      reward 0, not done, 0 steps executed.
    * ``SAME_STEP``: a finished env is reset at the end of the call; it returns the reset
      observation, with ``infos["final_obs"]`` / ``infos["final_info"]`` holding the final ones.
    * ``DISABLED``: a finished env returns its final observation; the caller must reset it with
      ``reset(options={"reset_mask": ...})`` before the next call, or ``step`` raises.

    Every sub-env must be wrapped (outermost) in :class:`EpisodeEndHold`;
    :func:`~cosmos3_gym.envs.make_libero_vector_env` and
    :func:`~cosmos3_gym.envs.make_color_reach_vector_env` do it.

    Statistics: wrap each sub-env, inside its :class:`EpisodeEndHold` (the factories' ``wrappers``
    argument, or ``gym.make_vec(..., wrappers=[RecordEpisodeStatistics, EpisodeEndHold])``), so
    they count env steps. A vector ``RecordEpisodeStatistics`` between this wrapper and the vector
    env never sees an episode end (the holds keep them from the vector env) and is refused; one
    on top of this wrapper counts calls, not env steps.

    Example:
        >>> import numpy as np
        >>> from cosmos3_gym.envs import make_color_reach_vector_env
        >>> envs = ChunkedActionWrapper(make_color_reach_vector_env(2, max_episode_steps=3))
        >>> _ = envs.reset(seed=0)
        >>> obs, rewards, terminated, truncated, infos = envs.step(np.zeros((2, 5, 2)))
        >>> infos["steps_executed"].tolist(), truncated.tolist()
        ([3, 3], [True, True])
        >>> envs.close()
    """

    def __init__(self, env: VectorEnv) -> None:
        super().__init__(env)
        if not isinstance(env.single_action_space, Box):
            raise TypeError(
                f"chunk stepping needs a Box action space, got {env.single_action_space}"
            )
        try:
            env.unwrapped.get_attr("chunk_hold_armed")
        except AttributeError as error:
            raise TypeError(
                "every sub-env must be wrapped in EpisodeEndHold, e.g. "
                "gym.make_vec(env_id, n, wrappers=[EpisodeEndHold]); "
                f"the sub-envs have no 'chunk_hold_armed' attribute ({error})"
            ) from error
        _refuse_blind_statistics(env)
        env.unwrapped.set_attr("chunk_hold_armed", True)
        self.autoreset_mode = autoreset_mode(env)
        # Envs whose episode ended in an earlier call and that have not been reset yet.
        self._awaiting_reset = np.zeros(self.num_envs, dtype=np.bool_)

    def reset(
        self,
        *,
        seed: int | list[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        mask = None if options is None else options.get("reset_mask")
        # Gymnasium pops "reset_mask" from the dict it receives; keep the caller's dict intact.
        obs, infos = self.env.reset(seed=seed, options=None if options is None else dict(options))
        if mask is None:
            self._awaiting_reset[:] = False
        else:
            self._awaiting_reset[np.asarray(mask, dtype=np.bool_)] = False
        return obs, infos

    def step(
        self, actions: np.ndarray
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        chunk = self._as_chunk(actions)
        num_envs, horizon = chunk.shape[:2]
        if self.autoreset_mode == AutoresetMode.DISABLED and self._awaiting_reset.any():
            raise ValueError(
                "with autoreset DISABLED, finished envs must be reset before the next step; "
                f"envs {np.flatnonzero(self._awaiting_reset).tolist()} are still finished: call "
                "reset(options={'reset_mask': mask})"
            )

        rewards = np.zeros(num_envs, dtype=np.float64)
        steps = np.zeros(num_envs, dtype=np.int64)
        terminated = np.zeros(num_envs, dtype=np.bool_)
        truncated = np.zeros(num_envs, dtype=np.bool_)
        obs: Any = None
        infos: dict[str, Any] = {}

        # NEXT_STEP: the call after an episode's end is that env's reset step; it sits out.
        sitting_out = self._awaiting_reset.copy()
        if sitting_out.any():
            obs, infos = self.env.reset(options={"reset_mask": sitting_out.copy()})
            self._awaiting_reset[:] = False
            self.unwrapped.set_attr("chunk_hold", sitting_out.tolist())
        try:
            for h in range(horizon):
                active = ~(terminated | truncated | sitting_out)
                if not active.any():
                    break
                obs, reward, _, _, infos = self.env.step(chunk[:, h])
                rewards += np.where(active, reward, 0.0)
                steps += active
                terminated |= active & info_flags(infos, _TERMINATED_KEY, num_envs)
                truncated |= active & info_flags(infos, _TRUNCATED_KEY, num_envs)
        finally:
            if sitting_out.any():
                self.unwrapped.set_attr("chunk_hold", False)

        for key in (_TERMINATED_KEY, _TRUNCATED_KEY):
            infos.pop(key, None)
            infos.pop(f"_{key}", None)
        ended = terminated | truncated
        if ended.any():
            if self.autoreset_mode == AutoresetMode.SAME_STEP:
                obs, infos = self._reset_finished(obs, infos, ended)
            else:
                self._awaiting_reset = ended.copy()
        infos["steps_executed"] = steps
        infos["_steps_executed"] = np.ones(num_envs, dtype=np.bool_)
        return obs, rewards, terminated, truncated, infos

    def _as_chunk(self, actions: np.ndarray) -> np.ndarray:
        actions = np.asarray(actions)
        action_shape = self.env.single_action_space.shape
        if actions.shape == (self.num_envs, *action_shape):
            return actions[:, None]
        if (
            actions.ndim == len(action_shape) + 2
            and actions.shape[0] == self.num_envs
            and actions.shape[1] >= 1
            and actions.shape[2:] == action_shape
        ):
            return actions
        raise ValueError(
            f"actions must be [B, D] = {[self.num_envs, *action_shape]} or [B, H, D] = "
            f"{[self.num_envs, 'H', *action_shape]} with H >= 1, got {list(actions.shape)}"
        )

    def _reset_finished(
        self, obs: Any, infos: dict[str, Any], ended: np.ndarray
    ) -> tuple[Any, dict[str, Any]]:
        """SAME_STEP: reset the finished envs now; their final obs and info go into the infos."""
        final_obs = [copy.deepcopy(o) for o in iterate(self.env.observation_space, obs)]
        step_infos = [_env_info(infos, i) for i in range(self.num_envs)]
        reset_obs, reset_infos = self.env.reset(options={"reset_mask": ended.copy()})
        merged = []
        for i in range(self.num_envs):
            if ended[i]:
                merged.append(
                    {
                        **_env_info(reset_infos, i),
                        "final_obs": final_obs[i],
                        "final_info": step_infos[i],
                    }
                )
            else:
                merged.append(step_infos[i])
        return reset_obs, _batch_infos(merged)


def _refuse_blind_statistics(env: VectorEnv) -> None:
    while isinstance(env, VectorWrapper):
        if isinstance(env, gym.wrappers.vector.RecordEpisodeStatistics):
            raise TypeError(
                "a vector RecordEpisodeStatistics under ChunkedActionWrapper never sees an episode "
                "end (each sub-env's EpisodeEndHold hides them from the vector env); expected "
                "the statistics wrapper on each sub-env, inside its EpisodeEndHold: e.g. "
                "make_libero_vector_env(..., wrappers=[gymnasium.wrappers.RecordEpisodeStatistics])"
            )
        env = env.env


def info_presence(infos: dict[str, Any], key: str, num_envs: int) -> np.ndarray:
    """bool ``[B]``: which envs' infos hold ``key`` (Gymnasium's ``_key`` mask where there is
    one).

    >>> info_presence({"is_success": np.array([True, False]),
    ...                "_is_success": np.array([True, False])}, "is_success", 2).tolist()
    [True, False]
    """
    if key not in infos:
        return np.zeros(num_envs, bool)
    present = infos.get(f"_{key}")
    return np.ones(num_envs, bool) if present is None else np.asarray(present, bool).copy()


def info_flags(infos: dict[str, Any], key: str, num_envs: int) -> np.ndarray:
    """bool ``[B]``: a per-env info flag, False where an env did not report it."""
    values = infos.get(key)
    if values is None:
        return np.zeros(num_envs, bool)
    present = infos.get(f"_{key}")
    flags = np.asarray(values).astype(bool)
    return flags & np.asarray(present, bool) if present is not None else flags


def _env_info(infos: dict[str, Any], index: int) -> dict[str, Any]:
    """The info dict of one sub-env, out of Gymnasium's batched ``{key, _key mask}`` layout."""
    out: dict[str, Any] = {}
    for key, value in infos.items():
        if key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        if mask is not None and not mask[index]:
            continue
        out[key] = _env_info(value, index) if isinstance(value, dict) else value[index]
    return out


def _batch_infos(per_env: list[dict[str, Any]]) -> dict[str, Any]:
    """The inverse of :func:`_env_info`: per-env dicts into the batched layout with masks."""
    num_envs = len(per_env)
    keys = list(dict.fromkeys(key for info in per_env for key in info))
    out: dict[str, Any] = {}
    for key in keys:
        present = np.array([key in info for info in per_env], dtype=np.bool_)
        values = [info[key] for info in per_env if key in info]
        if all(isinstance(v, dict) for v in values):
            out[key] = _batch_infos([info.get(key, {}) for info in per_env])
        else:
            out[key] = _stack(values, present, num_envs)
        out[f"_{key}"] = present
    return out


def _stack(values: list[Any], present: np.ndarray, num_envs: int) -> np.ndarray:
    # Same dtypes as Gymnasium's own vector infos: bool, int, float, else object.
    if all(isinstance(v, (bool, np.bool_)) for v in values):
        array = np.zeros(num_envs, dtype=np.bool_)
    elif all(isinstance(v, (int, np.integer)) for v in values):
        array = np.zeros(num_envs, dtype=np.int64)
    elif all(isinstance(v, (float, np.floating)) for v in values):
        array = np.zeros(num_envs, dtype=np.float64)
    else:
        array = np.full(num_envs, None, dtype=object)
    for index, value in zip(np.flatnonzero(present), values, strict=True):
        array[index] = value
    return array
