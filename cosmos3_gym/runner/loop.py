"""The episode runner: the one loop that steps a policy in envs, for every job that does.

Evaluations, rollouts on disk, on-policy batches, GRPO's held-out success and the overlap
benchmark are thin layers over :class:`EpisodeRunner`; they differ in their schedule (which
episodes, how long), their seed rule (in the policy) and what they keep (a :class:`RunObserver`).
The runner gives free slots their next episodes at once, checks every action before it is sent,
charges an env fault to the episodes whose own env faulted, and can overlap two env groups.

Design (slots, actions, faults, overlap): docs/design.md, "The episode runner".
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
from gymnasium.vector import VectorEnv

from cosmos3_gym.envs.chunking import info_flags, info_presence
from cosmos3_gym.policy.observations import Observation, is_tensor, take_envs
from cosmos3_gym.policy.planner import ChunkRecord
from cosmos3_gym.policy.queues import ActionSource
from cosmos3_gym.policy.vector_policy import VectorPolicy
from cosmos3_gym.runner.envs import EnvFault, GuardedEnvs
from cosmos3_gym.runner.schedule import EpisodeSpec, Schedule

FAULT_MODES = ("restart", "cut")


class TooManyFaults(RuntimeError):
    """More env faults in a row than ``max_consecutive_faults``, with no episode ending."""
OUT_OF_RANGE = ("report", "fail")


@dataclass(frozen=True)
class RunnerOptions:
    """How the runner steps its envs and what it does when they fail."""

    num_envs: int
    # Sub-envs in worker processes: needed for crash and hang recovery of real simulators.
    async_envs: bool = False
    # Seconds a step, reset or call of an async env may take before its worker counts as hung
    # (None: no limit).
    env_timeout: float | None = 300.0
    max_episode_restarts: int = 2
    max_consecutive_faults: int = 5
    # Actions outside the action space: "report" (count them, send them) or "fail".
    out_of_range: str = "report"
    # Episodes in flight when their env faults: "restart" them or "cut" them (docs/design.md).
    faults: str = "restart"
    # Two env groups taking turns: one executes while the other's chunks are planned.
    overlap: bool = False
    # Vector steps per slot, then the run stops (rollouts); None: until the schedule is done.
    max_steps: int | None = None

    def __post_init__(self) -> None:
        for name in ("num_envs",):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; found {value!r}")
        for name in ("max_episode_restarts", "max_consecutive_faults"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0; found {value!r}")
        if self.env_timeout is not None and not self.env_timeout > 0:
            raise ValueError(f"env_timeout must be a positive number of seconds or None; "
                             f"found {self.env_timeout!r}")
        if self.out_of_range not in OUT_OF_RANGE:
            raise ValueError(f"out_of_range must be one of {OUT_OF_RANGE}; found "
                             f"{self.out_of_range!r}")
        if self.faults not in FAULT_MODES:
            raise ValueError(f"faults must be one of {FAULT_MODES}; found {self.faults!r}")
        if self.overlap and self.num_envs < 2:
            raise ValueError(f"overlap needs at least 2 envs (two groups); found num_envs="
                             f"{self.num_envs}")
        if self.max_steps is not None and (isinstance(self.max_steps, bool)
                                           or self.max_steps < 1):
            raise ValueError(f"max_steps must be None or >= 1; found {self.max_steps!r}")


@dataclass(frozen=True)
class PlannedChunks:
    """One pipeline call's chunks, as the runner numbered them: row ``k`` has run-wide chunk
    id ``first_id + k`` and belongs to slot ``slots[k]``, episode ``episode_ids[k]``, planned
    after ``episode_steps[k]`` steps of it."""

    record: ChunkRecord
    first_id: int
    slots: np.ndarray
    episode_ids: np.ndarray
    episode_steps: np.ndarray
    # The group step at which the chunks' first actions are executed.
    step: int


@dataclass(frozen=True)
class StepRow:
    """One vector step of one group: arrays over its slots (``slots``, global indices).

    ``obs`` is the observation the actions were chosen from and ``next_obs`` the one the step
    returned; ``valid`` is False for slots that ran no episode (or whose action failed its
    check and was not sent); ``chunk_ids`` is -1 where no chunk action was executed.
    """

    step: int
    slots: np.ndarray
    obs: Observation
    next_obs: Observation
    prompts: list[str]
    actions: np.ndarray
    raw_actions: np.ndarray
    chunk_ids: np.ndarray
    episode_ids: np.ndarray
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    success: np.ndarray
    valid: np.ndarray


@dataclass(frozen=True)
class EpisodeResult:
    """How one episode ended, with what replays it (``spec``) and a hash of what it saw.

    ``obs_sha256`` is a SHA-256 over every observation of the episode exactly as the env
    returned it (the reset observation, then one per step; each array by sorted key path, with
    its dtype and shape, then its bytes): two runs that record the same hash saw the same
    episode, frame for frame. ``finished`` is False for an episode cut by the step budget or by
    a fault (``faults="cut"``).
    """

    spec: EpisodeSpec
    slot: int
    # The env's info["is_success"] at the step that ended the episode; None where that step
    # reported none (an env without a success signal), or no step ended it.
    success: bool | None
    finished: bool
    steps: int
    chunks: int
    total_reward: float
    # The step (of the slot's group) of the episode's first action, and of its last row: the
    # step that ended it (terminal, or an action refused), else its last executed step.
    start_step: int
    end_step: int
    obs_sha256: str
    wall_time_s: float
    invalid_action: str | None
    error: str | None
    out_of_range_steps: int
    max_action_excess: float
    restarts: int
    # The instruction the policy was given for the whole episode: the env's own task_description
    # at its reset, or the prompt the schedule set (a shuffled-prompt check).
    prompt: str
    # Steps whose action the adapter clipped into the env's bounds, and the largest distance
    # it lay outside them (the box map: ChunkRecord.clipped); 0 where nothing was clipped.
    clipped_steps: int = 0
    max_clip: float = 0.0
    # Steps the env held because its next chunk had not arrived (real-time execution).
    stalls: int = 0


def group_layout(num_envs: int, overlap: bool) -> list[range]:
    """The global slots of each env group: one group, or two halves with ``overlap``.

    >>> group_layout(5, overlap=True)
    [range(0, 3), range(3, 5)]
    """
    if not overlap:
        return [range(num_envs)]
    first = num_envs - num_envs // 2
    return [range(first), range(first, num_envs)]


def concat_obs(parts: list[Observation]) -> Observation:
    """Vector observations of consecutive env groups joined along the env axis (one group's
    as it is; torch tensors, a GPU simulator's, stay tensors on their device)."""
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    if isinstance(first, Mapping):
        return {k: concat_obs([p[k] for p in parts]) for k in first}
    if isinstance(first, tuple):
        return tuple(concat_obs([p[i] for p in parts]) for i in range(len(first)))
    if is_tensor(first):
        return sys.modules["torch"].cat(list(parts), dim=0)
    return np.concatenate([np.asarray(p) for p in parts], axis=0)


class RowAssembler:
    """Joins the groups' :class:`StepRow` of one step into a row over every slot, in step order:
    :meth:`add` returns the rows it completed (none until every group has taken that step)."""

    def __init__(self, group_slots: list[range]) -> None:
        self.group_slots = group_slots
        self._pending: dict[int, dict[int, StepRow]] = {}
        self._next = 0

    def add(self, row: StepRow) -> list[StepRow]:
        if len(self.group_slots) == 1:
            return [row]
        group = next(g for g, r in enumerate(self.group_slots) if row.slots[0] == r.start)
        self._pending.setdefault(row.step, {})[group] = row
        done = []
        while len(self._pending.get(self._next, {})) == len(self.group_slots):
            by_group = self._pending.pop(self._next)
            parts = [by_group[g] for g in range(len(self.group_slots))]
            done.append(StepRow(
                step=self._next, slots=np.concatenate([p.slots for p in parts]),
                obs=concat_obs([p.obs for p in parts]),
                next_obs=concat_obs([p.next_obs for p in parts]),
                prompts=[t for p in parts for t in p.prompts],
                **{name: np.concatenate([getattr(p, name) for p in parts])
                   for name in ("actions", "raw_actions", "chunk_ids", "episode_ids", "rewards",
                                "terminations", "truncations", "success", "valid")}))
            self._next += 1
        return done


class RunObserver:
    """What a layer over the runner hears, in the order it happens. Override what you need."""

    def episode_started(self, slot: int, spec: EpisodeSpec, obs: Observation,
                        step: int) -> None:
        """``spec`` began in ``slot``; ``obs`` is its reset observation (a batch of 1) and
        ``step`` the group step of its first action."""

    def chunks_planned(self, chunks: PlannedChunks) -> None:
        """A pipeline call planned ``chunks``."""

    def stepped(self, row: StepRow) -> None:
        """One group took a vector step."""

    def episode_ended(self, result: EpisodeResult) -> None:
        """An episode ended (or was cut)."""

    def fault(self, incident: dict[str, Any]) -> None:
        """An env fault was handled (the incident says what happened and to whom)."""


class EndedEpisodes(RunObserver):
    """Every episode's :class:`EpisodeResult`, by its spec's id (``results``): what a
    measurement over the runner reads back once the run is over."""

    def __init__(self) -> None:
        self.results: dict[int, EpisodeResult] = {}

    def episode_ended(self, result: EpisodeResult) -> None:
        self.results[result.spec.id] = result


def hash_observation(digest: Any, obs: Any, env: int, path: str = "obs") -> None:
    """Feed env ``env``'s slice of a vector observation to a ``hashlib`` digest: every array by
    sorted key path, with its dtype and shape, then its bytes."""
    if isinstance(obs, Mapping):
        for key in sorted(obs):
            hash_observation(digest, obs[key], env, f"{path}/{key}")
    elif isinstance(obs, tuple):
        for k, value in enumerate(obs):
            hash_observation(digest, value, env, f"{path}/{k}")
    else:
        row = obs[env]
        if is_tensor(row):  # a GPU simulator's observation: this env's row comes to the host
            row = row.detach().cpu().numpy()
        array = np.ascontiguousarray(np.asarray(row))
        digest.update(f"{path}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())


@dataclass
class _Slot:
    """One sub-env's episode in flight (None: idle)."""

    spec: EpisodeSpec | None = None
    needs_reset: bool = False
    prompt: str = ""
    steps: int = 0
    chunks: int = 0
    total_reward: float = 0.0
    restarts: int = 0
    start_step: int = 0
    started: float = 0.0
    out_of_range_steps: int = 0
    max_excess: float = 0.0
    clipped_steps: int = 0
    max_clip: float = 0.0
    stalls: int = 0
    digest: Any = field(default_factory=hashlib.sha256)

    def start(self, spec: EpisodeSpec, start_step: int, restarts: int = 0) -> None:
        self.spec, self.needs_reset, self.restarts = spec, True, restarts
        self.prompt = ""  # set at its reset; an episode cut before it sent none
        self.steps = self.chunks = self.out_of_range_steps = self.clipped_steps = 0
        self.stalls = 0
        self.total_reward = self.max_excess = self.max_clip = 0.0
        self.start_step = start_step
        self.started = time.perf_counter()
        self.digest = hashlib.sha256()

    @property
    def active(self) -> bool:
        return self.spec is not None and not self.needs_reset


@dataclass
class _Stepped:
    """What one executed vector step of a group returned, before the main thread reads it."""

    obs: Observation
    prompts: list[str]
    actions: np.ndarray
    sources: list[ActionSource | None]
    active: np.ndarray
    refused: dict[int, str]  # local slot -> why its action was not sent
    excess: np.ndarray
    next_obs: Observation
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    success: np.ndarray
    reported: np.ndarray  # where the step's info held is_success


class _Group:
    """A vector env, its policy and its slots; ``offset`` is its first slot's global index."""

    def __init__(self, index: int, offset: int, size: int, policy: VectorPolicy,
                 envs: GuardedEnvs) -> None:
        self.index, self.offset, self.size = index, offset, size
        self.policy, self.envs = policy, envs
        self.slots = [_Slot() for _ in range(size)]
        self.obs: Observation = None
        self.tasks: list[str] = []
        self.steps = 0  # vector steps this group has taken in this run
        self.finished = False

    def active_mask(self) -> np.ndarray:
        return np.array([s.active for s in self.slots], bool)


class EpisodeRunner:
    """Steps ``policy`` in envs built by ``make_envs(num_envs)`` over ``schedule``'s episodes.

    ``make_envs`` builds a vector env of chunk-held sub-envs with autoreset disabled (every
    :class:`~cosmos3_gym.envs.EvalEnv`'s ``make``); it is called again to rebuild after a
    fault, and once per group with ``overlap``. ``envs``, a vector env the caller built and
    keeps (no overlap), is used first and left open. ``observer`` hears every start, plan, step, end
    and fault. :meth:`run` returns when the schedule is exhausted and every slot idle, or when
    every slot has taken ``options.max_steps`` steps.
    """

    def __init__(
        self,
        policy: VectorPolicy,
        make_envs: Callable[[int], VectorEnv],
        schedule: Schedule,
        options: RunnerOptions,
        observer: RunObserver | None = None,
        *,
        first_chunk_id: int = 0,
        envs: VectorEnv | None = None,
    ) -> None:
        if not isinstance(policy, VectorPolicy):
            raise TypeError(f"the runner drives a VectorPolicy; found {type(policy).__name__}")
        # A clone, fresh and handing non-finite chunks over (the runner fails those episodes
        # itself): the caller's policy is left as it is.
        self.policy = policy.clone()
        self.policy.config = replace(policy.config, nonfinite_actions="return")
        self.make_envs, self.schedule = make_envs, schedule
        self.options = options
        if envs is not None and (options.overlap or envs.num_envs != options.num_envs):
            raise ValueError(f"envs given to the runner must be its one group of "
                             f"{options.num_envs} envs (no overlap); found {envs.num_envs}")
        self._given_envs = envs
        self.observer = observer or RunObserver()
        self.next_chunk_id = first_chunk_id
        self._chunk_ids: WeakKeyDictionary[ChunkRecord, int] = WeakKeyDictionary()
        self._raw_dim = 0  # the pipeline's raw action width, once a chunk is planned
        self._consecutive_faults = 0
        self.groups: list[_Group] = []
        # Seconds in pipeline calls (planning); env time is in each group's GuardedEnvs.
        self.pipeline_s = 0.0
        self.chunks = 0
        self.env_steps = 0
        self.episodes_ended = 0

    @property
    def env_s(self) -> float:
        """Seconds in env calls (builds, resets, steps), summed over groups."""
        return sum(g.envs.env_s for g in self.groups)

    @property
    def last_obs(self) -> Observation:
        """The vector observation where the run stopped (every slot, in slot order)."""
        return concat_obs([g.obs for g in self.groups])

    # ------------------------------------------------------------------ run

    def run(self) -> None:
        """Run until the schedule is exhausted (or the step budget is spent)."""
        opts = self.options
        layout = group_layout(opts.num_envs, opts.overlap)
        try:
            for index, slots in enumerate(layout):
                offset, size = slots.start, len(slots)
                policy = self.policy if len(layout) == 1 else self.policy.clone(
                    seed_rule=self.policy.seed_rule.shifted(offset))
                envs = GuardedEnvs(self.make_envs, size, opts.env_timeout,
                                   given=self._given_envs)
                group = _Group(index, offset, size, policy, envs)
                self.groups.append(group)
                self._open(group)
            with ThreadPoolExecutor(max_workers=len(self.groups)) as pool:
                self._loop(pool if opts.overlap else None)
        finally:
            for group in self.groups:
                group.envs.close()

    def _loop(self, pool: ThreadPoolExecutor | None) -> None:
        running: dict[int, Future] = {}
        while True:
            for group in self.groups:
                if group.finished:
                    continue
                if group.index in running:
                    stepped, fault = running.pop(group.index).result()
                    self._settle(group, stepped, fault)
                if not self._prepare(group):
                    continue
                choice = self._choose(group)
                if choice is None:
                    continue
                if pool is None:
                    self._settle(group, *self._execute(group, *choice))
                else:
                    running[group.index] = pool.submit(self._execute, group, *choice)
            if not running and all(g.finished for g in self.groups):
                return

    # ------------------------------------------------------------------ main-thread steps

    def _open(self, group: _Group) -> None:
        """Build (or rebuild) the group's envs, retrying through faults like any other call."""
        while True:
            try:
                group.obs = (group.envs.rebuild() if group.envs.envs is not None
                             else group.envs.open())
                group.policy.check_envs(group.envs.envs)
                group.tasks = group.envs.tasks()
                return
            except EnvFault as fault:
                self._count_fault(fault)
                self._record_incident(group, fault, [], "rebuilding the vector env again")

    def _prepare(self, group: _Group) -> bool:
        """Give free slots their next episodes and reset them; False where the group is done
        (or a fault needs another turn)."""
        budget = self.options.max_steps
        spent = budget is not None and group.steps >= budget
        # Once the budget is spent, slots that just finished still start their next episode, so
        # the last observation is where each slot's episode stands (as with SAME_STEP
        # autoreset); those episodes end at once, unfinished, with no step.
        for local, slot in enumerate(group.slots):
            if slot.spec is None:
                spec = self.schedule.next(group.offset + local)
                if spec is not None:
                    slot.start(spec, group.steps)
        try:
            self._reset_slots(group)
        except EnvFault as fault:
            self._settle(group, [], fault)
            return False
        idle = ~group.active_mask()
        if idle.any():
            group.policy.end_episodes(idle)
        if spent:
            self._cut(group, "the run's step budget ended")
            group.finished = True
            return False
        if not group.active_mask().any():
            group.finished = True
            return False
        return True

    def _reset_slots(self, group: _Group) -> None:
        for local, slot in enumerate(group.slots):
            if not slot.needs_reset:
                continue
            spec = slot.spec
            assert spec is not None
            obs = group.envs.reset_slot(local, spec.seed, spec.reset_options)
            group.obs = obs
            tasks = group.envs.tasks()
            group.tasks[local] = tasks[local]
            slot.prompt = spec.prompt if spec.prompt is not None else tasks[local]
            slot.needs_reset = False
            mask = np.zeros(group.size, bool)
            mask[local] = True
            group.policy.reset(
                mask, episode_ids=None if spec.rule_episode is None else [spec.rule_episode])
            hash_observation(slot.digest, obs, local)
            self.observer.episode_started(group.offset + local, spec, take_envs(obs, local),
                                          group.steps)

    def _prompts(self, group: _Group) -> list[str]:
        return [s.prompt if s.spec is not None else group.tasks[i]
                for i, s in enumerate(group.slots)]

    def _choose(self, group: _Group) -> tuple[np.ndarray, list[ActionSource | None]] | None:
        """The group's next actions, planning the slots whose queue is empty (one pipeline
        call); slots whose new chunk is not finite end here. None: nothing left to step."""
        video = [s.active and s.spec.video for s in group.slots]
        start = time.perf_counter()
        actions = group.policy.select_action(group.obs, self._prompts(group), video=video)
        record = group.policy.last_chunk_record
        if record is not None:
            self.pipeline_s += time.perf_counter() - start
            self._number(group, record)
        sources = list(group.policy.last_action_sources)
        if record is not None:
            queued = group.policy.n_action_steps
            for row, local in enumerate(record.env_indices.tolist()):
                slot = group.slots[local]
                # The actions the env will execute: under real-time execution its first
                # `dropped` are in the past; row k is the action for step slot.steps + k.
                first = 0 if record.timing is None else int(record.timing.dropped[row])
                chunk = record.actions[row, first:first + queued]
                bad = ~np.isfinite(chunk).all(axis=-1)
                if bad.any():
                    k = first + int(np.argmax(bad))
                    self._finish(group, local, False, invalid=(
                        f"non-finite action at step {slot.steps + k}: {chunk[k].tolist()}"))
        if not group.active_mask().any():
            return None
        return actions, sources

    def _number(self, group: _Group, record: ChunkRecord) -> None:
        first = self.next_chunk_id
        self._raw_dim = record.raw_actions.shape[-1]
        self._chunk_ids[record] = first
        self.next_chunk_id += len(record)
        self.chunks += len(record)
        locals_ = record.env_indices
        slots = [group.slots[i] for i in locals_.tolist()]
        for slot in slots:
            slot.chunks += 1
        self.observer.chunks_planned(PlannedChunks(
            record=record, first_id=first, slots=locals_ + group.offset,
            episode_ids=np.array([s.spec.id for s in slots], np.int64),
            episode_steps=np.array([s.steps for s in slots], np.int64), step=group.steps))

    # ------------------------------------------------------------------ executing (any thread)

    def _execute(self, group: _Group, actions: np.ndarray, sources: list[ActionSource | None]
                 ) -> tuple[list[_Stepped], EnvFault | None]:
        """Step the group until it needs the main thread: a queue ran empty, an episode ended,
        an action was refused, or the step budget is spent. Touches only this group's state, so
        it may run in a helper thread while another group is planned."""
        out: list[_Stepped] = []
        active = group.active_mask()
        space = group.envs.action_space
        budget = self.options.max_steps
        prompts = self._prompts(group)
        policy = group.policy
        while True:
            refused: dict[int, str] = {}
            excess = np.zeros(group.size)
            send = np.zeros((group.size, *space.shape), np.float32)
            for local in np.flatnonzero(active).tolist():
                action = actions[local]
                step = group.slots[local].steps + len(out)
                if not np.isfinite(action).all():
                    refused[local] = f"non-finite action at step {step}: {action.tolist()}"
                    continue
                excess[local] = float(np.max(np.maximum(action - space.high, space.low - action)))
                if excess[local] > 0 and self.options.out_of_range == "fail":
                    refused[local] = (f"action out of range at step {step}: {action.tolist()} "
                                      f"(exceeds the box by {excess[local]:.3g})")
                    continue
                send[local] = action
            obs = group.obs
            try:
                next_obs, rewards, infos = group.envs.step(send)
            except EnvFault as fault:
                return out, fault
            group.obs = next_obs
            group.steps += 1
            terminated = info_flags(infos, "episode_terminated", group.size)
            truncated = info_flags(infos, "episode_truncated", group.size)
            # Success is what the env reports, never inferred here (a termination is not one).
            success = info_flags(infos, "is_success", group.size)
            reported = info_presence(infos, "is_success", group.size)
            out.append(_Stepped(obs, prompts, send, sources, active.copy(), refused, excess,
                                next_obs, rewards, terminated, truncated, success, reported))
            ended = (terminated | truncated) & active
            if refused or ended.any() or (budget is not None and group.steps >= budget):
                return out, None
            if policy.replans_next()[active].any():  # some slot plans next
                return out, None
            actions = policy.select_action(next_obs, prompts)  # every active queue has actions
            assert policy.last_chunk_record is None, "planned outside the main thread"
            sources = list(policy.last_action_sources)

    # ------------------------------------------------------------------ settling (main thread)

    def _settle(self, group: _Group, stepped: list[_Stepped], fault: EnvFault | None) -> None:
        """Read what the group's execution returned: rows, episode ends, then any fault."""
        first_step = group.steps - len(stepped)
        for k, st in enumerate(stepped):
            self._settle_step(group, first_step + k, st)
        if fault is not None:
            self._fault(group, fault)

    def _settle_step(self, group: _Group, step: int, st: _Stepped) -> None:
        valid = st.active.copy()
        for local in st.refused:
            valid[local] = False
        raw = np.zeros((group.size, self._raw_dim), np.float32)
        chunk_ids = np.full(group.size, -1, np.int64)
        for local in np.flatnonzero(valid).tolist():
            source = st.sources[local]
            if source is not None:
                raw[local] = source.raw_action
                chunk_ids[local] = self._chunk_ids[source.record] + source.row
        episode_ids = np.array([s.spec.id if s.spec is not None and st.active[i] else -1
                                for i, s in enumerate(group.slots)], np.int64)
        self.observer.stepped(StepRow(
            step=step, slots=np.arange(group.offset, group.offset + group.size),
            obs=st.obs, next_obs=st.next_obs, prompts=list(st.prompts), actions=st.actions,
            raw_actions=raw, chunk_ids=chunk_ids, episode_ids=episode_ids,
            rewards=np.where(valid, st.rewards, 0.0).astype(np.float32),
            terminations=st.terminated & valid, truncations=st.truncated & valid,
            success=st.success & valid, valid=valid))
        for local in np.flatnonzero(st.active).tolist():
            slot = group.slots[local]
            if local in st.refused:
                self._finish(group, local, False, invalid=st.refused[local], row=step)
                continue
            if st.excess[local] > 0:
                slot.out_of_range_steps += 1
                slot.max_excess = max(slot.max_excess, float(st.excess[local]))
            source = st.sources[local]
            if source is None:  # a stall: real-time execution's chunk in flight not yet there
                slot.stalls += 1
            elif source.record.clipped is not None:
                clip = float(source.record.clipped[source.row, source.step])
                if clip > 0:
                    slot.clipped_steps += 1
                    slot.max_clip = max(slot.max_clip, clip)
            slot.steps += 1
            slot.total_reward += float(st.rewards[local])
            self.env_steps += 1
            hash_observation(slot.digest, st.next_obs, local)
            if st.terminated[local] or st.truncated[local]:
                outcome = bool(st.success[local]) if st.reported[local] else None
                self._finish(group, local, outcome, row=step)

    def _finish(self, group: _Group, local: int, success: bool | None, *,
                invalid: str | None = None,
                error: str | None = None, finished: bool = True, row: int | None = None) -> None:
        """End slot ``local``'s episode; ``row``: the step that ended it, if one did."""
        slot = group.slots[local]
        spec = slot.spec
        assert spec is not None
        result = EpisodeResult(
            spec=spec, slot=group.offset + local,
            success=None if success is None else bool(success), finished=finished,
            steps=slot.steps, chunks=slot.chunks, total_reward=slot.total_reward,
            start_step=slot.start_step,
            end_step=slot.start_step + slot.steps - 1 if row is None else row,
            obs_sha256=slot.digest.hexdigest(),
            wall_time_s=time.perf_counter() - slot.started, invalid_action=invalid, error=error,
            out_of_range_steps=slot.out_of_range_steps, max_action_excess=slot.max_excess,
            restarts=slot.restarts, prompt=slot.prompt, clipped_steps=slot.clipped_steps,
            max_clip=slot.max_clip, stalls=slot.stalls)
        slot.spec = None
        slot.needs_reset = False
        mask = np.zeros(group.size, bool)
        mask[local] = True
        group.policy.end_episodes(mask)
        if finished:
            self._consecutive_faults = 0
        self.episodes_ended += 1
        self.observer.episode_ended(result)

    def _cut(self, group: _Group, why: str) -> None:
        """End every episode in flight in the group as unfinished."""
        for local, slot in enumerate(group.slots):
            if slot.spec is not None:
                self._finish(group, local, False, finished=False,
                             error=None if why.startswith("the run's") else why)

    # ------------------------------------------------------------------ faults

    def _count_fault(self, fault: EnvFault) -> None:
        self._consecutive_faults += 1
        if self._consecutive_faults > self.options.max_consecutive_faults:
            raise TooManyFaults(
                f"{self._consecutive_faults} env faults in a row with no episode ending; last: "
                f"{fault}. Giving up") from fault

    def _record_incident(self, group: _Group, fault: EnvFault,
                         in_flight: list[tuple[int, EpisodeSpec]], action: str) -> None:
        culprits = [group.offset + i for i in fault.slots]
        self.observer.fault({
            "time": time.time(), "kind": fault.kind, "detail": fault.detail,
            "env_slots_at_fault": culprits if fault.slots else None,
            "episodes": [{"env_slot": slot, "episode_id": spec.id,
                          "at_fault": not fault.slots or slot in culprits, "tag": spec.tag}
                         for slot, spec in in_flight],
            "action": action,
        })

    def _fault(self, group: _Group, fault: EnvFault) -> None:
        """Rebuild the group's envs; restart or cut its episodes in flight (docs/design.md)."""
        self._count_fault(fault)
        in_flight = [(group.offset + i, s.spec) for i, s in enumerate(group.slots)
                     if s.spec is not None]
        restart = self.options.faults == "restart"
        self._record_incident(group, fault, in_flight, (
            "rebuilt the vector env; re-running the episodes in flight from their start"
            if restart else "rebuilt the vector env; the episodes in flight end there (cut)"))
        # Unknown culprits (the fault could not be pinned on a sub-env) charge everyone.
        charged = set(fault.slots) if fault.slots else {i for i, s in enumerate(group.slots)}
        for local, slot in enumerate(group.slots):
            if slot.spec is None:
                continue
            if not restart:
                self._finish(group, local, False, finished=False, error=f"cut by env fault: "
                                                                        f"{fault}")
            elif local in charged and slot.restarts >= self.options.max_episode_restarts:
                slot.restarts += 1  # this fault counts too
                self._finish(group, local, False, error=(
                    f"abandoned after {slot.restarts} env faults; last: {fault}"))
            else:
                slot.start(slot.spec, group.steps, slot.restarts + (local in charged))
        self._open(group)
