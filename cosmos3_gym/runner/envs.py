"""The runner's vector env: every call guarded, faults pinned to the sub-env that caused them.

:class:`GuardedEnvs` holds one chunk-held vector env (autoreset disabled, each sub-env wrapped
outermost in :class:`~cosmos3_gym.envs.EpisodeEndHold`, armed) and makes its calls the runner's:
a masked single-slot reset, a step, a ``call``. A sub-env that raises, dies (a simulator
segfault kills its worker) or does not answer within ``timeout`` seconds (async envs) becomes an
:class:`EnvFault` naming the slots at fault:

- ``AsyncVectorEnv``: workers that died, workers that reported an exception, and, after a
  timeout, workers that have not answered;
- ``SyncVectorEnv``: the sub-env whose hold saw its env raise (``env_faulted``).

The vector env is then discarded (its workers killed) and rebuilt by :meth:`GuardedEnvs.rebuild`;
the runner decides what happens to the episodes in flight.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from gymnasium.spaces import Box
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv

from cosmos3_gym.vector_env import task_attribute


class EnvFault(RuntimeError):
    """A sub-env crashed, raised or hung; the vector env must be rebuilt.

    ``slots`` are the sub-envs at fault (empty where they could not be told apart).
    """

    def __init__(self, kind: str, detail: str, slots: tuple[int, ...] = ()) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail, self.slots = kind, detail, tuple(slots)


class GuardedEnvs:
    """One vector env of ``num_envs`` chunk-held sub-envs, built by ``make(num_envs)``.

    ``timeout`` (seconds, async envs only) bounds every reset, step and call; ``None`` waits
    forever. ``env_s`` accumulates the seconds spent in env calls (builds, resets, steps).
    """

    def __init__(self, make: Callable[[int], VectorEnv], num_envs: int,
                 timeout: float | None, given: VectorEnv | None = None) -> None:
        if timeout is not None and not timeout > 0:
            raise ValueError(f"env timeout must be a positive number of seconds or None; found "
                             f"{timeout}")
        self.make, self.num_envs, self.timeout = make, num_envs, timeout
        # A vector env the caller built and keeps: used first, and not closed at the end
        # (unless a fault breaks it: then it is replaced by one of ours).
        self._given = given
        self.envs: VectorEnv | None = None
        self.obs: Any = None
        self.task_attribute = "task_description"
        self.env_s = 0.0

    # ------------------------------------------------------------------ life cycle

    def open(self) -> Any:
        """Build the vector env, arm its holds and reset every sub-env (idle ones too, so all
        hold a valid state); returns the observation."""
        start = time.perf_counter()
        try:
            envs = self._given if self._given is not None else self.make(self.num_envs)
            self.envs = envs
            if envs.num_envs != self.num_envs:
                raise ValueError(f"the env factory built {envs.num_envs} sub-envs; expected "
                                 f"{self.num_envs}")
            if not isinstance(envs.single_action_space, Box):
                raise TypeError(
                    f"the runner needs a Box action space; found {envs.single_action_space}")
            held = np.array(envs.call("has_wrapper_attr", "chunk_hold_armed"), dtype=bool)
            if not held.all():
                raise TypeError(
                    "every sub-env must be wrapped (outermost) in EpisodeEndHold; sub-envs "
                    f"without it: {np.flatnonzero(~held).tolist()}")
            self.task_attribute = task_attribute(envs)
            envs.set_attr("chunk_hold_armed", True)
        finally:
            self.env_s += time.perf_counter() - start
        return self._reset_all()

    def rebuild(self) -> Any:
        """Throw the vector env away (killing its workers) and build a fresh one."""
        self.close(broken=True)
        return self.open()

    def close(self, broken: bool = False) -> None:
        """Close the vector env (one the caller gave is left open unless ``broken``)."""
        envs, self.envs = self.envs, None
        if envs is None:
            return
        if envs is self._given:
            if not broken:
                return
            self._given = None
        try:
            envs.close(terminate=True) if isinstance(envs, AsyncVectorEnv) else envs.close()
        except Exception:  # a dead worker's pipe can make close itself fail; kill what is left
            for process in getattr(envs, "processes", []):
                if process.is_alive():
                    process.kill()
                process.join(timeout=5)
            envs.closed = True  # keep __del__ from closing the broken pipes a second time

    # ------------------------------------------------------------------ calls

    @property
    def action_space(self) -> Box:
        assert self.envs is not None
        return self.envs.single_action_space

    def reset_slot(self, slot: int, seed: int | None, options: dict[str, Any]) -> Any:
        """Reset sub-env ``slot`` alone (``reset_mask``) with ``seed`` and ``options``; returns
        the whole vector observation (the other sub-envs' unchanged)."""
        mask = np.zeros(self.num_envs, bool)
        mask[slot] = True
        seeds = [seed if j == slot else None for j in range(self.num_envs)]
        return self._reset(f"reset of env {slot}", seeds, {"reset_mask": mask, **options})

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, dict[str, Any]]:
        """Step every sub-env; returns ``(obs, rewards, infos)`` (the holds report episode ends
        in ``infos``; the vector env's own flags are always False)."""
        envs = self.envs
        assert envs is not None
        start = time.perf_counter()
        try:
            if isinstance(envs, AsyncVectorEnv):
                self._guard("step", envs.step_async, actions)
                obs, rewards, _, _, infos = self._guard("step", envs.step_wait,
                                                        timeout=self.timeout)
            else:
                obs, rewards, _, _, infos = self._guard("step", envs.step, actions)
        finally:
            self.env_s += time.perf_counter() - start
        self.obs = obs
        return obs, np.asarray(rewards, np.float32), infos

    def tasks(self) -> list[str]:
        """Every sub-env's task (``task_description``, else ``task``)."""
        assert self.envs is not None
        values = self._guard("task_description", self._call, self.task_attribute)
        return list(values)

    def _call(self, name: str) -> tuple[Any, ...]:
        envs = self.envs
        assert envs is not None
        if isinstance(envs, AsyncVectorEnv):
            envs.call_async(name)
            return envs.call_wait(timeout=self.timeout)
        return envs.call(name)

    def _reset_all(self) -> Any:
        return self._reset("reset", [0] * self.num_envs, None)

    def _reset(self, what: str, seeds: list[int | None], options: dict[str, Any] | None) -> Any:
        envs = self.envs
        assert envs is not None
        start = time.perf_counter()
        try:
            if isinstance(envs, AsyncVectorEnv):
                self._guard(what, envs.reset_async, seed=seeds, options=options)
                obs, _ = self._guard(what, envs.reset_wait, timeout=self.timeout)
            else:
                obs, _ = self._guard(what, envs.reset, seed=seeds, options=options)
        finally:
            self.env_s += time.perf_counter() - start
        self.obs = obs
        return obs

    def _guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except multiprocessing.TimeoutError as err:
            raise EnvFault("hang", f"{what} took longer than {self.timeout} s",
                           self._unanswered()) from err
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:
            raise EnvFault("crash", f"{what} failed: {type(err).__name__}: {err}",
                           self._faulted()) from err

    # ------------------------------------------------------------------ who is at fault

    def _faulted(self) -> tuple[int, ...]:
        """The sub-envs that raised or died in the call that just failed."""
        envs = self.envs
        if isinstance(envs, SyncVectorEnv):
            return tuple(i for i, env in enumerate(envs.envs)
                         if getattr(env, "env_faulted", False))
        if isinstance(envs, AsyncVectorEnv):
            for attempt in range(10):  # a killed worker may take a moment to be reaped
                pipes = envs.parent_pipes
                found = tuple(i for i, process in enumerate(envs.processes)
                              if not process.is_alive() or pipes[i] is None)
                if found or attempt == 9:
                    return found
                time.sleep(0.05)
        return ()

    def _unanswered(self) -> tuple[int, ...]:
        """After a timeout: the async workers that have not answered (a hung simulator)."""
        envs = self.envs
        if not isinstance(envs, AsyncVectorEnv):
            return ()
        return tuple(i for i, pipe in enumerate(envs.parent_pipes)
                     if pipe is None or pipe.closed or not pipe.poll(0))
