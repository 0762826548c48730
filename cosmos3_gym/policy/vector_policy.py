"""VectorPolicy: a batched Cosmos3 action pipeline behind LeRobot's policy surface, per env.

Each env has its own prompt, action queue and episode and chunk counters; ``select_action``
replans only the envs whose queue is empty, in one pipeline call, and an episode end clears that
env's queue only, as the vector env's autoreset mode says. Chunks are planned by
:class:`~cosmos3_gym.policy.ChunkPlanner`, queued in :class:`~cosmos3_gym.policy.ActionQueues`.

Design (the queues under each autoreset mode, the seeds): docs/design.md, "The policy".
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.policy.adapters import (
    Adapter,
    adapter_for_contract,
    adapter_for_domain,
    check_action_fit,
    get_adapter,
)
from cosmos3_gym.policy.observations import (
    Observation,
    as_env_batch,
    batch_size,
    shapes,
    take_envs,
    to_numpy,
)
from cosmos3_gym.policy.planner import (
    ChunkPlanner,
    ChunkRecord,
    SeedRule,
    pipeline_action_head,
    takes_committed_actions,
)
from cosmos3_gym.policy.queues import ActionQueues, ActionSource
from cosmos3_gym.policy.realtime import ChunkTiming, EnvClocks, RealTime
from cosmos3_gym.seeding import check_noise, check_seed
from cosmos3_gym.vector_env import ForwardingVectorWrapper, autoreset_mode, task_attribute


@dataclass(frozen=True)
class VectorPolicyConfig:
    """Every knob of :class:`VectorPolicy`, with its default and the reason for it."""

    # Actions executed from each chunk before that env replans; None = the whole chunk (H),
    # as the official LIBERO client does (open loop for the full horizon).
    n_action_steps: int | None = None
    # Root of every env's noise seeds, so a run is reproducible from one integer.
    seed: int = 0
    # How every chunk is denoised, and the noise rule: "per_chunk" (the default) draws fresh
    # noise per (env, episode, chunk), as RL exploration and unbiased success rates need;
    # "fixed" starts every chunk from the noise of `seed` itself, so a chunk is a function of
    # (image, prompt) alone, like the official server (seed 0 for every request). A stochastic
    # sampler's chunks record their log-probability over the n_action_steps executed actions.
    sampling: SamplerConfig = field(default_factory=SamplerConfig)
    # A progress bar per pipeline call is noise inside a step loop.
    progress: bool = False
    # "raise": a chunk with a non-finite action is a ValueError (nothing changes). "return":
    # such chunks are queued and returned as they are, for a caller that ends the episode
    # itself (the episode runner records it as a failed episode, never sends it to an env).
    nonfinite_actions: str = "raise"
    # Real-time execution on a virtual clock (cosmos3_gym/policy/realtime.py): each env keeps
    # executing while its next chunk is computed. None: the env waits for every chunk (the
    # synchronous protocol every harness runs).
    realtime: RealTime | None = None

    def __post_init__(self) -> None:
        n = self.n_action_steps
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise ValueError(f"n_action_steps must be a positive int or None; found {n!r}")
        check_seed(self.seed)
        if not isinstance(self.sampling, SamplerConfig):
            raise TypeError(f"sampling must be a SamplerConfig; found "
                            f"{type(self.sampling).__name__}")
        if self.realtime is not None and not isinstance(self.realtime, RealTime):
            raise TypeError(f"realtime must be a RealTime or None; found "
                            f"{type(self.realtime).__name__}")
        if self.nonfinite_actions not in ("raise", "return"):
            raise ValueError(f"nonfinite_actions must be 'raise' or 'return'; found "
                             f"{self.nonfinite_actions!r}")
        if self.sampling.stochastic:  # the pipeline's own check, before any call
            from cosmos3_gym.pipeline.sde import stochastic_sampling

            s = self.sampling
            stochastic_sampling(s.sampler, s.noise_level, s.sde_steps, n)


class VectorPolicy:
    """Cosmos3 as a policy for a Gymnasium ``VectorEnv``: one prompt and one chunk queue per env.

    ``pipeline`` is anything with ``Cosmos3ActionPipeline.__call__``'s signature; the policy calls
    it and nothing else (it reads optional ``action_horizon``, ``action_dim`` and
    ``policy.domain_name`` attributes, which describe the checkpoint). The ``adapter``
    (``"generic"``, ``"libero"`` or your own :class:`~cosmos3_gym.policy.Adapter`) holds the
    benchmark's image, prompt and action conventions.

    - ``policy(obs, prompts)`` / ``predict_action_chunk``: plan every env, one call, ``[B, H, D]``.
    - ``select_action(obs, prompts)``: ``[B, D]``, one action per env from per-env queues; only
      the envs whose queue is empty are replanned, together, in one call.
    - ``reset(mask)``: the masked envs (default: all) start a new episode (queues cleared).
    - ``attach(envs)``: a wrapper that feeds the policy each env's ``task_description`` and its
      episode ends, honouring ``envs.metadata["autoreset_mode"]``; then ``prompts`` may be omitted.
      ``attach(envs, prompts)`` gives envs that name no task their instructions.
      It first checks that the checkpoint's actions, through the adapter, are as wide as the
      envs' action space (where the pipeline has ``action_dim``).
    - A head conditioned on the robot state (the pipeline's ``history_length`` > 0) gets each
      planned env's state from the adapter's ``state(obs)`` hook; ``ChunkRecord.state``
      records it.
    - ``realtime`` (:class:`~cosmos3_gym.policy.realtime.RealTime`): each env keeps executing
      its queue while its next chunk is computed, on a virtual clock of its own; a step with
      nothing to execute holds (a stall: ``last_action_sources`` is None there).
    - ``last_chunk_record``: the :class:`ChunkRecord` of the most recent call's pipeline call
      (``None`` if that call planned nothing): noise, seeds, raw actions, prompts, for RL;
      ``last_action_sources``: per env, the :class:`ActionSource` (chunk record, row, step) of
      the action the last ``select_action`` returned (``None`` for a placeholder).

    Each chunk's noise seed follows ``(seed, env, episode, chunk)`` alone, so a batch returns
    what its envs' single requests return (docs/design.md, "The policy").

    Example (any callable with the pipeline's signature works; production passes a
    ``Cosmos3ActionPipeline``):

        >>> import numpy as np
        >>> from cosmos3_gym import VectorPolicy
        >>> from cosmos3_gym.pipeline.output import ActionOutput
        >>> def pipeline(images, prompts, *, seed=None, action_noise=None, **sampler):
        ...     noise = np.zeros((len(prompts), 16, 64), np.float32)
        ...     actions = np.full((len(prompts), 16, 7), len(prompts), np.float32)
        ...     return ActionOutput(actions, actions, noise, list(seed))
        >>> policy = VectorPolicy(pipeline, adapter="generic", n_action_steps=8, seed=0)
        >>> obs = np.zeros((2, 64, 64, 3), np.uint8)  # what a VectorEnv of 2 image envs returns
        >>> prompts = ["pick up the red cube", "open the top drawer"]
        >>> policy(obs, prompts).shape
        (2, 16, 7)
        >>> policy.select_action(obs, prompts).shape
        (2, 7)
        >>> policy.reset(mask=np.array([False, True]))  # env 1 starts a new episode
        >>> policy.select_action(obs, prompts)[:, 0]     # env 1 replanned alone (batch of 1)
        array([2., 1.], dtype=float32)
        >>> policy.last_chunk_record.env_indices
        array([1])

    With a real vector env, ``envs = policy.attach(envs)`` once, then the loop is
    ``obs, _ = envs.reset(seed=0)`` and ``obs, *_ = envs.step(policy.select_action(obs))``.
    """

    def __init__(
        self,
        pipeline: Any,
        adapter: str | Adapter | None = None,
        n_action_steps: int | None = None,
        seed: int = 0,
        *,
        sampling: SamplerConfig | None = None,
        progress: bool = False,
        seed_rule: SeedRule | None = None,
        nonfinite_actions: str = "raise",
        realtime: RealTime | None = None,
        **sampler_settings: Any,
    ) -> None:
        if not callable(pipeline):
            raise TypeError(
                f"pipeline must be callable like Cosmos3ActionPipeline; found {pipeline!r}"
            )
        known = {f.name for f in fields(SamplerConfig)}
        unknown = sorted(set(sampler_settings) - known)
        if unknown:
            raise TypeError(f"VectorPolicy got unknown settings {unknown}; the sampler's are "
                            f"{sorted(known)} (SamplerConfig)")
        self.pipeline = pipeline
        contract = getattr(pipeline, "contract", None)
        if adapter is None:  # the contract the checkpoint declares, else the generic one
            adapter = adapter_for_contract(contract) if contract is not None else "generic"
        self.adapter = get_adapter(adapter)
        if n_action_steps is None and contract is not None:
            n_action_steps = contract.n_action_steps
        self.config = VectorPolicyConfig(
            n_action_steps=n_action_steps,
            seed=seed,
            sampling=replace(sampling or SamplerConfig(), **sampler_settings),
            progress=progress,
            nonfinite_actions=nonfinite_actions,
            realtime=realtime,
        )
        if realtime is not None and realtime.rtc and not takes_committed_actions(pipeline):
            raise ValueError(f"realtime.rtc: the pipeline {type(pipeline).__name__} takes no "
                             "committed action rows (committed_actions, as "
                             "Cosmos3ActionPipeline takes them)")
        if seed_rule is not None and not isinstance(seed_rule, SeedRule):
            raise TypeError(f"seed_rule must be a SeedRule; found {type(seed_rule).__name__}")
        # None: the rule follows config.seed and the sampling's noise rule (see `planner`).
        self._seed_rule = seed_rule
        horizon = getattr(pipeline, "action_horizon", None)
        self._horizon: int | None = int(horizon) if isinstance(horizon, (int, np.integer)) else None
        if self._horizon is not None:
            self._check_horizon(self._horizon)
        self._action_dim: int | None = None
        self._feed: PolicyFeed | None = None
        self.last_chunk_record: ChunkRecord | None = None
        self.last_action_sources: list[ActionSource | None] = []
        self._num_envs: int | None = None

    # ------------------------------------------------------------------ public surface

    @property
    def action_horizon(self) -> int | None:
        """H: the pipeline's ``action_horizon`` if it has one, else learnt on the first call."""
        return self._horizon

    @property
    def n_action_steps(self) -> int | None:
        """Actions executed per chunk (``config.n_action_steps``, or H once H is known)."""
        return self.config.n_action_steps or self._horizon

    @property
    def sampling(self) -> SamplerConfig:
        """How chunks are denoised, and their noise rule (``config.sampling``); assign a
        :class:`~cosmos3_gym.pipeline.SamplerConfig` to switch it, e.g. between RL collection
        (``flow_sde``, ``per_chunk``) and an evaluation like the official server's (``fixed``)."""
        return self.config.sampling

    @sampling.setter
    def sampling(self, value: SamplerConfig) -> None:
        self.config = replace(self.config, sampling=value)

    @property
    def seed_rule(self) -> SeedRule:
        """How each chunk's noise seed follows from ``(env, episode, chunk)``: the rule given to
        the constructor, else per chunk from ``seed`` under the ``per_chunk`` noise rule,
        ``seed`` for every chunk under ``fixed``."""
        if self._seed_rule is not None:
            return self._seed_rule
        cfg = self.config
        fresh = cfg.sampling.fresh_noise
        return SeedRule.per_chunk(cfg.seed) if fresh else SeedRule.fixed(cfg.seed)

    @property
    def planner(self) -> ChunkPlanner:
        """The :class:`~cosmos3_gym.policy.ChunkPlanner` under the current config and
        :attr:`seed_rule`."""
        cfg = self.config
        return ChunkPlanner(self.pipeline, self.adapter, self.seed_rule, sampling=cfg.sampling,
                            progress=cfg.progress, executed_actions=cfg.n_action_steps)

    def clone(self, *, seed_rule: SeedRule | None = None) -> VectorPolicy:
        """A policy with this one's pipeline, adapter and config and fresh per-env state (no
        envs yet), seeded by ``seed_rule`` where given (else by this one's rule): one policy
        per group of envs that are stepped apart."""
        other = VectorPolicy.__new__(VectorPolicy)
        other.pipeline, other.adapter, other.config = self.pipeline, self.adapter, self.config
        other._seed_rule = seed_rule if seed_rule is not None else self._seed_rule
        other._horizon = self._horizon
        other._action_dim = None
        other._feed = None
        other.last_chunk_record = None
        other.last_action_sources = []
        other._num_envs = None
        return other

    @property
    def num_envs(self) -> int | None:
        """The number of envs served, fixed by the first call or by :meth:`attach`."""
        return self._num_envs

    @property
    def episode_index(self) -> np.ndarray:
        """int64 ``[B]``: each env's episode count (an episode counts once the env planned)."""
        return self._episode.copy() if self._num_envs is not None else np.zeros(0, np.int64)

    @property
    def queue_lengths(self) -> np.ndarray:
        """int64 ``[B]``: actions left in each env's queue."""
        if self._num_envs is None:
            return np.zeros(0, np.int64)
        return self._queues.lengths()

    def replans_next(self) -> np.ndarray:
        """bool ``[B]``: the envs the next :meth:`select_action` plans a chunk for (an empty
        queue; under ``realtime``, the queue at the replanning point with nothing in flight,
        once this step's arrivals are in)."""
        if self._num_envs is None:
            return np.zeros(0, bool)
        return self._wants_chunk(arrived=False) & ~self._stale

    def __call__(
        self, obs: Observation, prompts: str | Sequence[str] | None = None, *,
        action_noise: np.ndarray | None = None, seeds: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Same as :meth:`predict_action_chunk`."""
        return self.predict_action_chunk(obs, prompts, action_noise=action_noise, seeds=seeds)

    def predict_action_chunk(
        self, obs: Observation, prompts: str | Sequence[str] | None = None, *,
        action_noise: np.ndarray | None = None, seeds: Sequence[int] | None = None,
    ) -> np.ndarray:
        """Plan every env in one pipeline call: float32 ``[B, H, D_env]``. Queues are untouched.

        Each env's chunk index advances (so stochastic mode draws fresh noise each call).
        ``seeds`` (one per env) replace the policy's noise seeds; ``action_noise``
        (``[B, H, 64]``) replaces the seeded action noise, while the video noise, which the
        actions depend on too, still comes from the seeds. ``action_noise`` without ``seeds``
        takes the policy's root ``seed`` for every env, so the chunk is a function of the
        observation, prompt and noise alone (what LeRobot's ``noise`` argument means). To replay
        a recorded chunk of every env, pass both from its record:
        ``action_noise=record.action_noise, seeds=record.seeds``. One image ``[H, W, C]`` is
        one env's observation (B = 1), as the pipeline reads it.
        """
        obs = as_env_batch(obs)
        num_envs = self._check_num_envs(batch_size(obs))
        tasks = self._resolve_tasks(prompts, num_envs, obs)
        if action_noise is not None:
            action_noise = self._check_noise(action_noise, num_envs)
            if seeds is None:
                seeds = [self.config.seed] * num_envs
        record = self._plan(obs, tasks, np.arange(num_envs), action_noise, seeds)
        self._commit(record, num_envs)
        return record.actions.copy()

    def select_action(
        self, obs: Observation, prompts: str | Sequence[str] | None = None, *,
        video: Sequence[bool] | np.ndarray | None = None,
    ) -> np.ndarray:
        """One action per env, float32 ``[B, D_env]``, from per-env queues.

        Only envs whose queue is empty are replanned, all in one pipeline call. An env whose
        observation is a stale final one (docs/design.md, "The policy"), or whose episode was ended
        with :meth:`end_episodes`, gets a zero placeholder and is not planned for. ``video``
        (one bool per env) asks the chunks planned for those envs to decode their predicted
        future too (``last_chunk_record.video``); no action changes. One image ``[H, W, C]``
        is one env's observation (B = 1).
        """
        obs = as_env_batch(obs)
        num_envs = self._check_num_envs(batch_size(obs))
        tasks = self._resolve_tasks(prompts, num_envs, obs)
        if video is not None:
            video = np.asarray(video, dtype=bool)
            if video.shape != (num_envs,):
                raise ValueError(f"video: expected one bool per env ({num_envs}); found shape "
                                 f"{list(video.shape)}")
        clocks = self._clocks if self._num_envs is not None else None
        if clocks is not None:  # this step's arrivals join their queues first
            for env in np.flatnonzero(~self._stale).tolist():
                clocks.arrive(env, self._queues, self.n_action_steps)
        if self._num_envs is None:
            wants, stale = np.ones(num_envs, bool), np.zeros(num_envs, bool)
        else:
            wants, stale = self._wants_chunk(arrived=True), self._stale
        replan = np.flatnonzero(wants & ~stale)
        wall = 0.0
        if replan.size:
            rows = None if video is None else video[replan]
            committed = None if clocks is None else [
                clocks.committed(int(e), self._queues, int(self._episode[e]),
                                 int(self._chunk[e]), self._horizon) for e in replan]
            start = time.perf_counter()
            record = self._plan(obs, tasks, replan, None, None, video=rows, committed=committed)
            wall = time.perf_counter() - start
        else:
            # Nothing to plan, but a malformed observation should fail now, not at the next
            # replan: one env's slice through the adapter is a cheap check of the format.
            self.planner.images(take_envs(obs, np.arange(1)), 1)
            record = None
        self._commit(record, num_envs)
        clocks = self._clocks
        if record is not None and clocks is None:
            self._queues.fill(record, self.n_action_steps)
        elif record is not None:
            record = self._dispatch(record, wall)
        if self._action_dim is None:
            raise RuntimeError("no chunk has been planned yet, so the action size is unknown")
        out = np.zeros((num_envs, self._action_dim), dtype=np.float32)
        sources: list[ActionSource | None] = [None] * num_envs
        for env in range(num_envs):
            if self._stale[env]:
                continue
            if clocks is None:
                out[env], sources[env] = self._queues.pop(env)
                continue
            if self._queues.lengths()[env]:
                out[env], sources[env] = self._queues.pop(env)
                clocks.last_action[env] = out[env].copy()
            else:  # a stall: the chunk in flight has not arrived
                out[env] = clocks.hold(env)
            clocks.step[env] += 1
        self.last_action_sources = sources
        return out

    def _wants_chunk(self, arrived: bool) -> np.ndarray:
        """bool ``[B]``: which envs ask for a chunk at this step (stale ones aside): an empty
        queue, or under ``realtime`` a queue at the replanning point with nothing in flight
        (``arrived``: this step's arrivals are already installed)."""
        queues = self._queues.lengths()
        clocks = self._clocks
        if clocks is None:
            return queues == 0
        wants = np.zeros(queues.shape, bool)
        n = self.n_action_steps or 0
        for env in range(queues.size):
            length, flying = (int(queues[env]), clocks.flights[env] is not None) if arrived \
                else clocks.queue_after_arrival(env, int(queues[env]), n)
            chunk = int(self._chunk[env])
            wants[env] = not flying and (chunk == 0 or length <= clocks.replan_point(
                env, int(self._episode[env]), chunk))
        return wants

    def _dispatch(self, record: ChunkRecord, wall: float) -> ChunkRecord:
        """Under ``realtime``: the record with each row's timing, each planned env's chunk on its
        way (installed now, or in flight until its delay has passed)."""
        clocks = self._clocks
        queues = self._queues.lengths()
        rows = [clocks.timing(env, record, row, wall, int(queues[env]))
                for row, env in enumerate(record.env_indices.tolist())]
        step, delay, dropped, stalls, superseded = (np.array(c, np.int64)
                                                    for c in zip(*rows, strict=True))
        committed = record.committed or [None] * len(record)
        record = replace(record, timing=ChunkTiming(
            request_step=step, latency_s=np.full(len(record), wall),
            batch=np.full(len(record), len(record), np.int64), delay=delay,
            committed=np.array([0 if c is None else len(c) for c in committed], np.int64),
            dropped=dropped, stalls=stalls, superseded=superseded))
        self.last_chunk_record = record
        for row, env in enumerate(record.env_indices.tolist()):
            clocks.send(env, record, row, self._queues, self.n_action_steps)
        return record

    def reset(
        self, mask: np.ndarray | Sequence[bool] | None = None, *, seed: int | None = None,
        episode_ids: Sequence[int] | None = None,
    ) -> None:
        """Start a new episode for the masked envs (default: all): their queues are cleared.

        Without :meth:`attach`: call it with the envs you reset yourself under ``DISABLED``, or
        with ``terminated | truncated`` right after ``step`` under ``SAME_STEP``. ``NEXT_STEP``
        needs :meth:`attach`, which knows that the obs returned with a done is a final one.
        ``episode_ids`` (one int per masked env) set the episode index the seed rule reads for
        those envs' new episodes (a runner that numbers its episodes run-wide passes them);
        without it each env counts its own episodes. ``seed`` restarts the noise schedule from
        a new root (all counters to zero) and must come without a mask.
        """
        if seed is not None:
            if mask is not None or episode_ids is not None:
                raise ValueError("reset(seed=...) restarts every env; expected mask=None and "
                                 "no episode_ids")
            if self._seed_rule is not None:
                raise ValueError("reset(seed=...) restarts the policy's own seed schedule; this "
                                 "policy was given a seed_rule, which owns its seeds")
            self.config = replace(self.config, seed=check_seed(seed))
            if self._num_envs is not None:
                self._init_state(self._num_envs)
            return
        if mask is None:
            if episode_ids is not None:
                raise ValueError("episode_ids go with a mask (one id per masked env)")
            if self._num_envs is not None:
                self._begin_episodes(np.ones(self._num_envs, bool))
            return
        mask = self._check_mask(mask, "reset mask")
        if self._num_envs is None:
            self._init_state(mask.shape[0])
        if episode_ids is not None:
            ids = np.asarray(episode_ids)
            if ids.shape != (int(mask.sum()),) or (ids.size and ids.dtype.kind not in "iu"):
                raise ValueError(f"episode_ids: expected {int(mask.sum())} integers, one per "
                                 f"masked env; found {ids.dtype} {list(ids.shape)}")
        self._begin_episodes(mask)
        if episode_ids is not None:
            self._episode[np.flatnonzero(mask)] = ids

    def end_episodes(self, mask: np.ndarray | Sequence[bool]) -> None:
        """The masked envs' episodes are over: their queues are cleared and they are not planned
        (``select_action`` gives them a zero placeholder) until :meth:`reset` starts their next
        episode. For a caller that ends episodes itself (an invalid action, an env that sits
        idle) where the env reports no done."""
        mask = self._check_mask(mask, "end_episodes mask")
        if self._num_envs is None:
            self._init_state(mask.shape[0])
        self._end_episodes(mask)

    def check_envs(self, envs: VectorEnv) -> None:
        """Refuse ``envs`` if this policy serves another number of envs, or if the checkpoint's
        actions, through the adapter, are not as wide as their action space (where the pipeline
        has ``action_dim``); what :meth:`attach` checks, without attaching."""
        if not isinstance(envs, VectorEnv):
            raise TypeError(
                f"expected a gymnasium.vector.VectorEnv; found {type(envs).__name__}"
            )
        self._check_num_envs(envs.num_envs, what="the envs")
        self._check_action_fit(envs)

    def _check_mask(self, mask: Any, what: str) -> np.ndarray:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_ or mask.ndim != 1:
            raise ValueError(
                f"{what} must be a 1-D bool array; found {mask.dtype} {list(mask.shape)}"
            )
        self._check_num_envs(mask.shape[0], what=what)
        return mask

    def attach(
        self, envs: VectorEnv, prompts: str | Sequence[str] | None = None
    ) -> PolicyFeed:
        """Wrap ``envs`` so that they feed this policy prompts and episode ends; use the result.

        ``prompts`` (one string for all envs, or one per env) are the envs' instructions where
        they name none themselves (a benchmark without ``task_description``, or a vector env
        without sub-envs to ``call``, such as ManiSkill3's ``ManiSkillVectorEnv``); they stay
        fixed. Without them the feed reads each env's ``task_description`` (or ``task``).
        """
        if not isinstance(envs, VectorEnv):
            raise TypeError(
                f"attach expects a gymnasium.vector.VectorEnv; found {type(envs).__name__}"
            )
        self._check_num_envs(envs.num_envs, what="attached envs")
        fixed = None if prompts is None else self._resolve_tasks(
            prompts, envs.num_envs, None, envs_label=f"the {envs.num_envs} attached envs")
        self._check_action_fit(envs)
        feed = PolicyFeed(envs, self, prompts=fixed)
        if self._num_envs is None:
            self._init_state(envs.num_envs)
        self._feed = feed
        return feed

    # ------------------------------------------------------------------ per-env state

    def _init_state(self, num_envs: int) -> None:
        self._num_envs = num_envs
        self._episode = np.zeros(num_envs, np.int64)
        self._chunk = np.zeros(num_envs, np.int64)
        self._stale = np.zeros(num_envs, bool)
        self._queues = ActionQueues(num_envs)
        realtime = self.config.realtime
        self._clocks = None if realtime is None else EnvClocks(num_envs, realtime)

    def _begin_episodes(self, mask: np.ndarray) -> None:
        # An episode in which the env never planned does not count, so resetting twice (e.g. the
        # wrapper and then the user) does not skip an episode index.
        for env in np.flatnonzero(mask):
            if self._chunk[env] > 0:
                self._episode[env] += 1
            self._chunk[env] = 0
            self._stale[env] = False
            self._queues.clear(env)
            if self._clocks is not None:
                self._clocks.begin(env)

    def _end_episodes(self, mask: np.ndarray) -> None:
        for env in np.flatnonzero(mask):
            self._stale[env] = True
            self._queues.clear(env)
            if self._clocks is not None:
                self._clocks.end(env)

    # ------------------------------------------------------------------ checks

    def _check_num_envs(self, found: int, what: str = "observation batch") -> int:
        if self._num_envs is not None and found != self._num_envs:
            raise ValueError(
                f"{what} has {found} envs; this policy serves {self._num_envs} (fixed by its first "
                "call or attach); build a new VectorPolicy for a different number of envs"
            )
        return found

    def _check_action_fit(self, envs: VectorEnv) -> None:
        head = pipeline_action_head(self.pipeline)
        if head is None:  # a callable that does not describe its checkpoint: nothing to check
            return
        raw_dim, domain = head
        made_for = adapter_for_domain(domain)
        hint = "" if made_for is None else (
            f"; adapter={made_for!r} is the one made for domain {domain!r} checkpoints"
        )
        check_action_fit(
            self.adapter, raw_dim, domain, envs.single_action_space,
            checkpoint="the pipeline's checkpoint", env_label="the attached envs'",
            fix=(
                "Fix: use a checkpoint trained for these envs, or an adapter that turns its "
                f"{raw_dim}-D actions into the envs' (VectorPolicy(pipeline, adapter=...)){hint}."
            ),
        )

    def _check_horizon(self, horizon: int) -> None:
        n = self.config.n_action_steps
        if n is not None and n > horizon:
            raise ValueError(f"n_action_steps must be <= the action horizon H={horizon}; found {n}")

    def _resolve_tasks(
        self, prompts: str | Sequence[str] | None, num_envs: int, obs: Observation,
        envs_label: str | None = None,
    ) -> list[str]:
        """One task per env from ``prompts`` (or the attached feed's); errors name the
        observation batch, or ``envs_label`` where there is no observation yet."""
        if prompts is None:
            if self._feed is None:
                raise ValueError(
                    "no prompts: pass prompts= (a str for all envs, or one per env), or "
                    "envs = policy.attach(envs) to read each env's task_description"
                )
            tasks: list[Any] = list(self._feed.tasks)
            source = "attached env"
        elif isinstance(prompts, str):
            tasks, source = [prompts] * num_envs, "prompt"
        else:
            tasks, source = list(prompts), "prompt"
            if len(tasks) != num_envs:
                where = envs_label or f"the observation batch {shapes(obs)}"
                raise ValueError(
                    f"expected {num_envs} prompts, one per env of {where}; found {len(tasks)}"
                )
        for env, task in enumerate(tasks):
            if not isinstance(task, str) or not task.strip():
                hint = "" if prompts is not None else (
                    " (reset the envs through the wrapper attach() returned)"
                )
                raise ValueError(
                    f"{source} for env {env} is {task!r}; expected a non-empty string{hint}"
                )
        return tasks

    def _check_noise(self, noise: Any, num_envs: int) -> np.ndarray:
        noise = np.asarray(noise)
        horizon = self._horizon if self._horizon is not None else "H"
        check_noise(noise, "action_noise", num_envs, (horizon, 64))
        return noise.astype(np.float32, copy=False)

    # ------------------------------------------------------------------ planning

    def _plan(
        self, obs: Observation, tasks: list[str], envs: np.ndarray,
        action_noise: np.ndarray | None, seeds: Sequence[int] | None,
        video: np.ndarray | None = None, committed: list[np.ndarray | None] | None = None,
    ) -> ChunkRecord:
        """One planner call for ``envs``, at their episode and chunk counters; checks everything
        and changes no state."""
        started = self._num_envs is not None
        episodes = self._episode[envs] if started else np.zeros(envs.size, np.int64)
        chunks = self._chunk[envs] if started else np.zeros(envs.size, np.int64)
        record = self.planner.plan(
            obs, envs, [tasks[e] for e in envs], episodes, chunks, action_noise=action_noise,
            seeds=seeds, horizon=self._horizon, action_dim=self._action_dim,
            video=None if video is None else video.tolist(), committed=committed,
        )
        self._check_horizon(record.horizon)
        if self.config.nonfinite_actions == "raise" and not np.isfinite(record.raw_actions).all():
            raise ValueError("pipeline returned non-finite actions")
        return record

    def _commit(self, record: ChunkRecord | None, num_envs: int) -> None:
        """Apply a successful call: the first state change of the call happens here."""
        if self._num_envs is None:
            self._init_state(num_envs)
        self.last_chunk_record = record
        if record is None:
            return
        self._horizon = record.horizon
        self._action_dim = record.actions.shape[2]
        self._chunk[record.env_indices] += 1


class PolicyFeed(ForwardingVectorWrapper):
    """Feeds a :class:`VectorPolicy` each env's prompt and episode ends; passes everything through.

    Made by ``policy.attach(envs)``. Prompts are read with ``envs.call("task_description")``
    (or ``"task"`` where the envs have no ``task_description``) whenever envs reset, and, for an
    env that autoresets, when its new episode begins: at the done step under ``SAME_STEP``, at
    the reset step after it under ``NEXT_STEP``; prompts given to ``attach(envs, prompts)`` are
    used instead, and nothing is read. The queue rules: docs/design.md, "The policy". The done flags
    may be numpy arrays or torch tensors (GPU simulators return them on their device).
    """

    def __init__(
        self, env: VectorEnv, policy: VectorPolicy, prompts: Sequence[str] | None = None
    ) -> None:
        super().__init__(env)
        self.policy = policy
        self.autoreset_mode = autoreset_mode(env)
        self.fixed_prompts = prompts is not None
        self.task_attribute = None if self.fixed_prompts else task_attribute(self)
        self.tasks: list[str | None] = [None] * self.num_envs if prompts is None else list(prompts)
        self._pending_reset = np.zeros(self.num_envs, bool)

    @property
    def envs(self) -> list[Any]:
        """The sub-envs, as the wrapped ``SyncVectorEnv`` holds them (LeRobot reads
        ``env.envs[0]``); an ``AttributeError`` where they live in worker processes."""
        for env in (self.env, self.unwrapped):
            sub_envs = getattr(env, "envs", None)
            if sub_envs is not None:
                return sub_envs
        raise AttributeError(
            f"the attached {type(self.unwrapped).__name__} keeps no sub-envs in this process "
            "(only a SyncVectorEnv has .envs); read theirs with call() or get_attr()"
        )

    def _refresh_tasks(self, mask: np.ndarray) -> None:
        if self.fixed_prompts:
            return
        values = self.call(self.task_attribute)
        for env in np.flatnonzero(mask):
            task = values[env]
            if not isinstance(task, str) or not task.strip():
                raise ValueError(
                    f"env {env}'s {self.task_attribute} is {task!r}; expected a non-empty string"
                )
            self.tasks[env] = task

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Observation, dict[str, Any]]:
        mask = None if options is None else options.get("reset_mask")
        mask = np.ones(self.num_envs, bool) if mask is None else np.array(mask, dtype=bool)
        # The vector env pops reset_mask from the dict it gets; keep the caller's intact.
        obs, info = self.env.reset(seed=seed, options=None if options is None else dict(options))
        self._refresh_tasks(mask)
        self._pending_reset[mask] = False
        self.policy.reset(mask)
        return obs, info

    def step(self, actions: Any) -> tuple[Observation, Any, Any, Any, dict[str, Any]]:
        obs, rewards, terminations, truncations, info = self.env.step(actions)
        done = np.logical_or(to_numpy(terminations), to_numpy(truncations))
        if self.autoreset_mode == AutoresetMode.NEXT_STEP:
            restarted, self._pending_reset = self._pending_reset, done.copy()
            if restarted.any():  # this step was their reset step: obs is the new episode's
                self._refresh_tasks(restarted)
                self.policy.reset(restarted)
            if done.any():  # obs is the final one; the next action is ignored
                self.policy.end_episodes(done)
        elif self.autoreset_mode == AutoresetMode.SAME_STEP:
            if done.any():  # obs is already the new episode's
                self._refresh_tasks(done)
                self.policy.reset(done)
        elif done.any():  # DISABLED: stale until the caller resets these envs
            self.policy.end_episodes(done)
        return obs, rewards, terminations, truncations, info

