"""ManiSkill3 on its own vector env: every sub-env in one process, on the GPU where there is one.

``--env maniskill[:TASK]`` simulates in one of two ways, chosen by the ``sim_backend`` of
``--env-kwargs`` (default ``"auto"``: ``physx_cuda`` where ``torch.cuda.is_available()``, else
``physx_cpu``):

- a GPU backend (``physx_cuda``, ``gpu``): ManiSkill3's own ``ManiSkillVectorEnv`` holds all
  ``--num-envs`` envs in one batched scene; observations, rewards and infos are torch tensors
  on the GPU, and the images reach the pipeline as they are (no host copy);
- ``physx_cpu``: one ``CPUGymWrapper`` env per sub-env (sync or ``--async-envs``), as any
  Gymnasium env; or, with ``"vector_env": "maniskill"`` in ``--env-kwargs``, ManiSkill3's vector
  env on the CPU (one env: what CI runs of the GPU path).

The run's identity records both (``simulation``: the backend as resolved, and which vector env),
so a resumed run never switches backend silently. :class:`ManiSkillHold` gives the runner what
:class:`~cosmos3_gym.envs.EpisodeEndHold` gives it for sub-envs: no autoreset, a finished env held
on its final observation until it is reset alone, with its scheduled seed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from .gym import Variant, import_env_modules, per_env_prompts
from .gym_eval import GymEval
from .success import SuccessRule

CPU_WRAPPER = "mani_skill.utils.wrappers.gymnasium:CPUGymWrapper"
# Which vector env holds the sub-envs: ManiSkill3's own, or Gymnasium's over CPUGymWrapper envs.
VECTOR_ENVS = ("maniskill", "sub_envs")


# What to do where SAPIEN (ManiSkill3's renderer) finds no Vulkan driver it can use.
VULKAN_FIX = ("install a Vulkan driver: the GPU's (NVIDIA's driver ships its Vulkan ICD) or, "
              "without a GPU, Mesa's lavapipe 23 or newer (apt-get install mesa-vulkan-drivers; "
              "Debian 12's Mesa 22.3 is too old: .ci/vulkan unpacks a newer one and prints the "
              "VK_ICD_FILENAMES that selects it), then rerun")


@contextlib.contextmanager
def vulkan_errors(label: str) -> Iterator[None]:
    """SAPIEN's failure to start Vulkan as one ``ValueError`` naming the fix. SAPIEN raises it
    as a ``RuntimeError`` from the Vulkan call that failed (``vk::createInstanceUnique:
    ErrorIncompatibleDriver`` where the driver is missing or too old, ``vk::...:
    ErrorInitializationFailed``); any other error passes through unchanged.

    >>> try:
    ...     with vulkan_errors("maniskill"):
    ...         raise RuntimeError("vk::createInstanceUnique: ErrorIncompatibleDriver")
    ... except ValueError as err:
    ...     print(str(err).split(" (")[0])
    --env maniskill: ManiSkill3 renders through Vulkan and found no driver it can use
    """
    try:
        yield
    except RuntimeError as err:
        if not str(err).startswith("vk::"):
            raise
        raise ValueError(f"--env {label}: ManiSkill3 renders through Vulkan and found no driver "
                         f"it can use ({err}); {VULKAN_FIX}") from None


def is_gpu_backend(sim_backend: str) -> bool:
    """Whether ManiSkill3 simulates ``sim_backend`` on the GPU (``gpu``, ``physx_cuda[:N]``)."""
    return sim_backend == "gpu" or sim_backend.startswith("physx_cuda")


def resolve_sim_backend(requested: str) -> str:
    """``requested``, or for ``"auto"``: ``physx_cuda`` where torch sees a CUDA device, else
    ``physx_cpu``."""
    if requested != "auto":
        return requested
    import torch

    return "physx_cuda" if torch.cuda.is_available() else "physx_cpu"


def _host(value: Any) -> Any:
    """A torch tensor as a numpy array on the host; anything else as it is."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    return value


class ManiSkillHold(VectorEnv):
    """ManiSkill3's ``ManiSkillVectorEnv`` as the runner's chunk-held vector env.

    Built with ``auto_reset=False``: ManiSkill's own SAME_STEP autoreset would start the next
    episode with a seed from its own generator, where the runner's schedule gives each slot's
    episode its seed. So an env whose episode ended is *held*: every later step answers its final
    observation and info, reward 0, while the batched scene steps on (it cannot step a subset);
    ``reset(options={"reset_mask": m})`` resets the masked envs alone (ManiSkill's
    ``env_idx``), one at a time, each with its own seed. Episode ends are reported as
    :class:`~cosmos3_gym.envs.EpisodeEndHold` reports them (``info["episode_terminated"]`` /
    ``["episode_truncated"]``, the vector flags always False), success as ``info["is_success"]``
    by ``success`` (the run's rule), infos, rewards and flags on the host as numpy arrays (one
    copy of ``[B]`` values per step); observations stay torch tensors on the sim's device.

    Example (needs ManiSkill3 and a Vulkan driver):
        >>> envs = ManiSkillHold("PickCube-v1", 1, prompt="pick up the cube",
        ...                      obs_mode="rgb", sim_backend="physx_cpu")  # doctest: +SKIP
        >>> obs, _ = envs.reset(seed=[3])  # doctest: +SKIP
        >>> type(obs["sensor_data"]["base_camera"]["rgb"]).__name__  # doctest: +SKIP
        'Tensor'
    """

    def __init__(self, env_id: str, num_envs: int, *, prompt: str | Sequence[str],
                 success: SuccessRule | None = None, max_episode_steps: int | None = None,
                 **env_kwargs: Any) -> None:
        import gymnasium as gym
        from mani_skill.vector.wrappers.gymnasium import ManiSkillVectorEnv

        if max_episode_steps is not None:
            env_kwargs["max_episode_steps"] = max_episode_steps
        self.env = ManiSkillVectorEnv(gym.make(env_id, num_envs=num_envs, **env_kwargs),
                                      auto_reset=False)
        self.num_envs = num_envs
        self.single_observation_space = self.env.single_observation_space
        self.single_action_space = self.env.single_action_space
        self.observation_space = self.env.observation_space
        self.action_space = self.env.action_space
        self.metadata = {**self.env.metadata, "autoreset_mode": AutoresetMode.DISABLED}
        self.spec = self.env.spec
        self.device = self.env.device
        self.success = success or SuccessRule("flag", declared_by="ManiSkill3")
        self.task_description = list(per_env_prompts(prompt, num_envs))
        self.chunk_hold_armed = False
        self.closed = False
        self._held = np.zeros(num_envs, bool)
        self._returns = np.zeros(num_envs, np.float64)
        self._last_obs: Any = None
        self._last_info: dict[str, np.ndarray] = {}

    # ------------------------------------------------------------------ the runner's calls

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``call("task_description")`` and ``call("has_wrapper_attr", NAME)``, per env."""
        if name == "has_wrapper_attr":
            return (hasattr(self, args[0]),) * self.num_envs
        value = getattr(self, name)
        if callable(value):
            value = value(*args, **kwargs)
        if isinstance(value, list) and len(value) == self.num_envs:
            return tuple(value)
        return (value,) * self.num_envs

    def set_attr(self, name: str, values: Any) -> None:
        if name == "task_description":
            self.task_description = list(per_env_prompts(values, self.num_envs))
        elif name == "chunk_hold_armed":
            self.chunk_hold_armed = bool(np.all(values))
        else:
            raise AttributeError(f"ManiSkillHold sets task_description and chunk_hold_armed; "
                                 f"found {name!r}")

    def reset(self, *, seed: int | Sequence[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        import torch

        options = dict(options or {})
        mask = options.pop("reset_mask", None)
        prompt = options.pop("task_description", None)
        seeds = list(seed) if isinstance(seed, Sequence) else [seed] * self.num_envs
        if len(seeds) != self.num_envs:
            raise ValueError(f"reset: expected one seed per env ({self.num_envs}); found "
                             f"{len(seeds)}")
        chosen = np.ones(self.num_envs, bool) if mask is None else np.asarray(mask, bool)
        if not chosen.any():
            return self._last_obs, {}
        if mask is None:
            given = None if all(s is None for s in seeds) else [int(s or 0) for s in seeds]
            obs, info = self.env.reset(seed=given, options=options or None)
        else:
            # ManiSkill seeds the episode's torch draws with the seed list's first entry, for
            # every env reset together: one env per call, its seed everywhere in the list, so an
            # episode depends on its seed only, never on its slot or on the other envs.
            for k in np.flatnonzero(chosen).tolist():
                s = seeds[k]
                obs, info = self.env.reset(
                    seed=None if s is None else [int(s)] * self.num_envs,
                    options={**options, "env_idx": torch.tensor([k], device=self.device)})
        if prompt is not None:
            for k in np.flatnonzero(chosen).tolist():
                self.task_description[k] = prompt
        self._held &= ~chosen
        self._returns[chosen] = 0.0
        obs = self._with_held(obs)
        self._last_obs = obs
        return obs, {k: _host(v) for k, v in info.items()}

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray,
                                          dict[str, Any]]:
        held = self._held.copy()
        if not self.chunk_hold_armed:
            raise RuntimeError("ManiSkillHold is driven by the episode runner: arm it with "
                               "set_attr('chunk_hold_armed', True) first")
        if held.all():  # nothing runs: nothing to simulate
            zeros = np.zeros(self.num_envs, bool)
            return self._last_obs, np.zeros(self.num_envs, np.float32), zeros, zeros, \
                dict(self._last_info)
        obs, rewards, terminated, truncated, info = self.env.step(actions)
        rewards = np.asarray(_host(rewards), np.float32).reshape(self.num_envs)
        terminated = np.asarray(_host(terminated), bool).reshape(self.num_envs)
        truncated = np.asarray(_host(truncated), bool).reshape(self.num_envs)
        info = {k: _host(v) for k, v in info.items()}
        rewards[held] = 0.0
        self._returns += rewards
        info["episode_terminated"] = terminated
        info["episode_truncated"] = truncated
        if self.success.counts:
            info["is_success"] = np.array([
                self.success.outcome({k: v[j] for k, v in info.items()
                                      if isinstance(v, np.ndarray) and len(v) == self.num_envs},
                                     terminated=bool(terminated[j]),
                                     episode_return=float(self._returns[j]))
                for j in range(self.num_envs)], bool)
        for k, last in self._last_info.items():  # held envs: their final info, as it was
            now = info.get(k)
            if held.any() and isinstance(now, np.ndarray) and isinstance(last, np.ndarray) \
                    and now.shape == last.shape and now.shape[:1] == (self.num_envs,):
                info[k] = now.copy()
                info[k][held] = last[held]
        self._held |= terminated | truncated
        obs = self._with_held(obs, held)
        self._last_obs, self._last_info = obs, info
        zeros = np.zeros(self.num_envs, bool)
        return obs, rewards, zeros, zeros.copy(), info

    def close(self, **kwargs: Any) -> None:
        if not self.closed:
            self.env.close()
            self.closed = True

    def _with_held(self, obs: Any, held: np.ndarray | None = None) -> Any:
        """``obs`` with the held envs' rows replaced by their final observation."""
        held = self._held if held is None else held
        if self._last_obs is None or not held.any():
            return obs
        import torch

        rows = torch.as_tensor(np.flatnonzero(held), device=self.device)

        def keep(new: Any, old: Any) -> Any:
            if isinstance(new, Mapping):
                return {k: keep(new[k], old[k]) for k in new}
            out = new.clone()
            out[rows.to(out.device)] = old[rows.to(old.device)]
            return out

        return keep(obs, self._last_obs)


class ManiSkillEval(GymEval):
    """The ``maniskill`` preset's env family: :class:`GymEval` with the backend resolved
    (module docstring) and, on ManiSkill's own vector env, :class:`ManiSkillHold` as the
    runner's vector env. The action space and the success signal are checked before a run on
    one CPU env, so the GPU is first touched by the run itself."""

    def __init__(self, variants: Sequence[Variant], *, env_kwargs: Mapping[str, Any] | None = None,
                 env_wrappers: Sequence[str] = (CPU_WRAPPER,), **options: Any) -> None:
        kwargs = dict(env_kwargs or {})
        label = options.get("label") or "maniskill"
        backend = resolve_sim_backend(str(kwargs.get("sim_backend", "auto")))
        gpu = is_gpu_backend(backend)
        vector_env = kwargs.pop("vector_env", "maniskill" if gpu else "sub_envs")
        if vector_env not in VECTOR_ENVS:
            raise ValueError(f"--env {label}: vector_env must be one of {VECTOR_ENVS}; found "
                             f"{vector_env!r}")
        if gpu and vector_env == "sub_envs":
            raise ValueError(f"--env {label}: sim_backend {backend!r} simulates every env in one "
                             "GPU scene, which only ManiSkill3's own vector env holds; drop "
                             "vector_env or choose sim_backend 'physx_cpu'")
        kwargs["sim_backend"] = backend
        own = vector_env == "maniskill"
        if own and len(variants) != 1:
            raise ValueError(f"--env {label}: ManiSkill3's vector env runs one task; found "
                             f"{[v.task for v in variants]} (choose one with --tasks)")
        super().__init__(variants, env_kwargs=kwargs,
                         env_wrappers=() if own else tuple(env_wrappers), **options)
        self.vector_env = vector_env
        self.simulation = {"sim_backend": backend, "vector_env": vector_env}
        self._probe = GymEval(
            variants, env_kwargs={**kwargs, "sim_backend": "physx_cpu"},
            env_wrappers=(CPU_WRAPPER,), **options) if own else None
        self._open: ManiSkillHold | None = None  # the vector env made last, if any

    def single_action_space(self) -> Any:
        with vulkan_errors(self.label):
            if self._probe is None:
                return super().single_action_space()
            return self._probe.single_action_space()

    def check_success(self) -> None:
        with vulkan_errors(self.label):
            if self._probe is None:
                return super().check_success()
            self._probe.check_success()

    def make(self, num_envs: int, async_: bool,
             autoreset_mode: AutoresetMode = AutoresetMode.DISABLED) -> VectorEnv:
        with vulkan_errors(self.label):
            return self._make(num_envs, async_, autoreset_mode)

    def _make(self, num_envs: int, async_: bool, autoreset_mode: AutoresetMode) -> VectorEnv:
        if self.vector_env == "sub_envs":
            return super().make(num_envs, async_, autoreset_mode)
        if async_:
            raise ValueError(f"--env {self.label}: ManiSkill3's vector env simulates every env "
                             "in this process; --async-envs applies to sim_backend "
                             "'physx_cpu' sub-envs only")
        if autoreset_mode != AutoresetMode.DISABLED:
            raise ValueError("ManiSkill3's vector env is made for the episode runner "
                             "(autoreset disabled); for your own loop use "
                             "make_gym_vector_env(..., vectorization_mode='vector_entry_point')")
        if self._open is not None and not self._open.closed:
            raise ValueError(f"--env {self.label}: ManiSkill3's vector env is one scene per "
                             "process, and another one is open (--overlap makes two env groups); "
                             "run it without --overlap")
        import_env_modules(self.import_modules)
        v = self._variants[0]
        self._open = ManiSkillHold(v.env_id, num_envs, prompt=v.prompt or "",
                                   success=self._rule, max_episode_steps=v.max_episode_steps,
                                   **v.env_kwargs)
        return self._open
