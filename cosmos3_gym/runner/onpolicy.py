"""On-policy batches in memory: roll a VectorPolicy for a step budget and keep every step.

:func:`collect_on_policy` runs the episode runner over a :class:`~cosmos3_gym.runner.TaskRotation`
(tasks in turn; GRPO groups of ``group_size`` slots that share their start state) for
``num_steps`` vector steps and returns torch tensors, time-major ``[T, B, ...]``: per-step
rewards and dones, per-chunk rewards (the rewards of the steps executed from the chunk),
per-episode returns and success, the bootstrap observation (after the last step), and per chunk
the seeds, noise and, with a stochastic sampler, the stochastic-step record and log-probability
(:class:`~cosmos3_gym.pipeline.sde.StochasticRecord`) that
:func:`~cosmos3_gym.pipeline.sde.chunk_log_prob` recomputes under new weights
(:func:`stochastic_record`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, VectorEnv

from cosmos3_gym.envs.base import EvalEnv
from cosmos3_gym.policy.observations import to_numpy
from cosmos3_gym.policy.vector_policy import VectorPolicy
from cosmos3_gym.runner.loop import (
    EpisodeResult,
    EpisodeRunner,
    PlannedChunks,
    RowAssembler,
    RunnerOptions,
    RunObserver,
    StepRow,
    group_layout,
)
from cosmos3_gym.runner.schedule import EpisodeSpec, RotationTag, Schedule, TaskRotation
from cosmos3_gym.vector_env import autoreset_mode


def refuse_autoreset(envs: VectorEnv) -> None:
    """The runner resets every episode itself (task rotation, GRPO groups): refuse a vector env
    that autoresets."""
    if autoreset_mode(envs) != AutoresetMode.DISABLED:
        raise ValueError(
            "the runner resets episodes itself (task rotation, GRPO groups); build the vector "
            f"env with autoreset_mode=DISABLED (EvalEnv.make does), found "
            f"{autoreset_mode(envs).value}"
        )


class EpisodeTable(RunObserver):
    """Keeps each episode's start (env slot, task, trial, seed, init state, GRPO group) and
    outcome (length, return, success, finished), by episode id."""

    def __init__(self) -> None:
        self.started: dict[int, tuple[int, EpisodeSpec]] = {}
        self.ended: dict[int, EpisodeResult] = {}

    def episode_started(self, slot: int, spec: EpisodeSpec, obs: Any, step: int) -> None:
        self.started[spec.id] = (slot, spec)

    def episode_ended(self, result: EpisodeResult) -> None:
        self.ended[result.spec.id] = result

    def arrays(self, ids: Sequence[int]) -> dict[str, np.ndarray]:
        """The ``episode_*`` arrays of episodes ``ids``, in that order."""
        rows = []
        for e in ids:
            slot, spec = self.started[e]
            tag = spec.tag
            episode, group = (tag.episode, tag.group) if isinstance(tag, RotationTag) else (
                None, -1)
            end = self.ended.get(e)
            rows.append((slot, group, episode, end))

        def column(get: Callable[[Any], Any], dtype: Any) -> np.ndarray:
            return np.asarray([get(r) for r in rows], dtype=dtype)

        return {
            "episode_env": column(lambda r: r[0], np.int64),
            "episode_group": column(lambda r: r[1], np.int64),
            "episode_task": column(lambda r: r[2].task if r[2] else "", str),
            "episode_task_index": column(lambda r: r[2].task_index if r[2] else -1, np.int64),
            "episode_trial": column(lambda r: r[2].trial if r[2] else -1, np.int64),
            "episode_seed": column(lambda r: r[2].seed if r[2] else -1, np.int64),
            "episode_init_state": column(
                lambda r: -1 if r[2] is None or r[2].init_state_id is None
                else r[2].init_state_id, np.int64),
            # The step of an episode's first action (num_steps for episodes started at the end).
            "episode_start_step": column(lambda r: r[3].start_step, np.int64),
            "episode_length": column(lambda r: r[3].steps, np.int64),
            "episode_return": column(lambda r: r[3].total_reward, np.float32),
            "episode_success": column(lambda r: r[3].success, bool),
            "episode_finished": column(lambda r: r[3].finished, bool),
        }


class _InMemory(EpisodeTable):
    def __init__(self, layout: list[range], bar: Any) -> None:
        super().__init__()
        self.rows: list[StepRow] = []
        self.chunks: list[PlannedChunks] = []
        self._assembler = RowAssembler(layout)
        self._bar = bar

    def stepped(self, row: StepRow) -> None:
        done = self._assembler.add(row)
        self.rows.extend(done)
        self._bar.update(len(done))

    def chunks_planned(self, chunks: PlannedChunks) -> None:
        self.chunks.append(chunks)


def flatten_obs(obs: Any, prefix: str) -> dict[str, np.ndarray]:
    """A (vector) observation as host arrays by name: ``PREFIX.KEY`` per key, a nested key by
    its path (``obs.sensor_data/base_camera/rgb``, ManiSkill3's camera); torch tensors (a GPU
    simulator's) come to the host. What rollout shards and on-policy batches hold."""
    if not isinstance(obs, Mapping):
        return {prefix: np.asarray(to_numpy(obs))}
    out: dict[str, np.ndarray] = {}

    def walk(node: Mapping[str, Any], path: str) -> None:
        for key, value in node.items():
            if isinstance(value, Mapping):
                walk(value, f"{path}{key}/")
            else:
                out[f"{prefix}.{path}{key}"] = np.asarray(to_numpy(value))

    walk(obs, "")
    return out


def chunk_arrays(planned: Sequence[PlannedChunks]) -> dict[str, np.ndarray]:
    """Per-chunk arrays of planned chunks, rows in chunk-id order, including the state rows
    (``chunk_state``), the real-time timing (``chunk_delay``, ``chunk_stalls``, ...) and the
    stochastic-step fields (``chunk_log_prob``, ``chunk_sde_*``) where the chunks have them.
    ``chunk_env`` is the global env slot and ``chunk_episode`` the run-wide episode id."""
    planned = sorted(planned, key=lambda p: p.first_id)
    records = [p.record for p in planned]

    def cat(get: Callable[[Any], Any], dtype: Any, source: Sequence[Any] = records) -> np.ndarray:
        if not source:
            return np.zeros(0, dtype)
        return np.concatenate([np.asarray(get(r), dtype) for r in source])

    out = {
        "chunk_env": cat(lambda p: p.slots, np.int64, planned),
        "chunk_episode": cat(lambda p: p.episode_ids, np.int64, planned),
        "chunk_index": cat(lambda r: r.chunk_indices, np.int64),
        "chunk_seed": cat(lambda r: r.seeds, np.int64),
        "chunk_noise": cat(lambda r: r.action_noise, np.float32),
        "chunk_raw_actions": cat(lambda r: r.raw_actions, np.float32),
        "chunk_actions": cat(lambda r: r.actions, np.float32),
        "chunk_prompts": cat(lambda r: r.prompts, str),
    }
    if records and all(r.step_noise_seeds is not None for r in records):
        # The seeds of the scored Gaussian draws, where the seed rule set them apart.
        out["chunk_step_noise_seed"] = cat(lambda r: r.step_noise_seeds, np.int64)
    if records and all(r.state is not None for r in records):
        # A state-conditioned head's clean leading rows: replaying a chunk needs them too.
        out["chunk_state"] = cat(lambda r: r.state, np.float32)
    if records and all(r.timing is not None for r in records):
        # Real-time execution: each chunk's request step, delay, wall time, committed rows (RTC:
        # chunk_raw_actions[k, :chunk_committed[k]] are the actions executed meanwhile),
        # dropped actions, stalls and superseded ones (ChunkTiming).
        from cosmos3_gym.policy.realtime import ChunkTiming

        for name in ChunkTiming.FIELDS:
            out[f"chunk_{name}"] = cat(lambda r, name=name: getattr(r.timing, name),
                                       np.float64 if name == "latency_s" else np.int64)
    if records and all(r.sde is not None for r in records):
        from cosmos3_gym.pipeline.sde import StochasticRecord

        sde = StochasticRecord.concat([r.sde for r in records])
        out["chunk_log_prob"] = sde.log_prob
        for name in StochasticRecord.ARRAYS:
            if name != "log_prob":
                out[f"chunk_sde_{name}"] = getattr(sde, name)
    return out


def sde_metadata(planned: Sequence[PlannedChunks]) -> tuple[dict[str, Any] | None, str | None]:
    """``(settings, weights hash)`` of stochastic chunks (``None, None`` for a deterministic
    sampler): what :func:`stochastic_record` needs beside the arrays."""
    sde = planned[0].record.sde if planned else None
    return (None, None) if sde is None else (dict(sde.settings), sde.weights)


def collect_on_policy(
    policy: VectorPolicy, envs: VectorEnv, num_steps: int, *, eval_env: EvalEnv,
    seed: int = 0, group_size: int = 1, progress: bool = False,
    env_timeout: float | None = 300.0, schedule: Schedule | None = None,
) -> dict[str, Any]:
    """Roll ``policy`` in ``envs`` (built by ``eval_env.make(n, async_)``: autoreset disabled,
    each sub-env held) for ``num_steps`` vector steps; everything as torch tensors, time-major
    ``[T, B, ...]``. ``envs`` stay open; an env fault ends the episodes in flight unfinished
    and the run goes on in a vector env rebuilt by ``eval_env``.

    The episodes are ``TaskRotation(eval_env, seed, num_envs, group_size)``'s unless
    ``schedule`` names them (:class:`~cosmos3_gym.runner.GroupEpisodes`: one episode per slot, a
    GRPO iteration; then ``seed`` and ``group_size`` are the schedule's, and the run ends when
    every slot's episode has ended, or after ``num_steps``).

    Keys: ``obs`` (or ``obs.{key}``), ``actions``, ``raw_actions``, ``rewards``,
    ``terminations``, ``truncations``, ``dones``, ``chunk_ids`` (row of the chunk arrays each
    action came from), ``episode_ids`` (the episode's run-wide id: the row of the episode
    arrays under a TaskRotation, which numbers from 0; ``episode_id`` maps rows to ids); per
    chunk ``chunk_*``
    (``chunk_episode``: its episode's run-wide id; ``chunk_rewards``: the summed rewards of
    its executed steps; ``chunk_log_prob`` and
    ``chunk_sde_*`` with a stochastic sampler); per episode ``episode_*`` (``episode_group``:
    the GRPO group, ``episode_return``, ``episode_success``, ``episode_finished``: ended within
    the run); ``last_obs``, the bootstrap observation; and plain values ``prompts`` (``[T][B]``
    strings), ``chunk_prompts``, ``episode_task``, ``sde_settings`` and ``weights`` (the
    sampling weights' hash, ``None`` for a deterministic sampler).
    """
    import torch

    from cosmos3_gym.progress import progress_bar

    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; found {num_steps}")
    if schedule is not None and (seed, group_size) != (0, 1):
        raise ValueError("collect_on_policy: the schedule given fixes the episodes' seeds and "
                         f"groups; found seed={seed}, group_size={group_size} beside it")
    refuse_autoreset(envs)
    num_envs, async_ = envs.num_envs, isinstance(envs, AsyncVectorEnv)
    options = RunnerOptions(num_envs=num_envs, async_envs=async_, env_timeout=env_timeout,
                            faults="cut", max_steps=num_steps)
    bar = progress_bar(enabled=progress, total=num_steps, desc="collect", unit="step")
    keep = _InMemory(group_layout(num_envs, False), bar)
    if schedule is None:
        schedule = TaskRotation(eval_env, seed, num_envs, group_size)
    runner = EpisodeRunner(policy, lambda n: eval_env.make(n, async_), schedule, options, keep,
                           envs=envs)
    try:
        runner.run()
    finally:
        bar.close()
    out: dict[str, Any] = {}
    rows, last_obs = keep.rows, runner.last_obs
    flat = [flatten_obs(r.obs, "obs") for r in rows]
    for name in flat[0]:
        out[name] = torch.from_numpy(np.stack([f[name] for f in flat]))
    for name, value in flatten_obs(last_obs, "last_obs").items():
        out[name] = torch.from_numpy(value.copy())
    for key in ("actions", "raw_actions", "rewards", "terminations", "truncations",
                "chunk_ids", "episode_ids"):
        out[key] = torch.from_numpy(np.stack([getattr(r, key) for r in rows]))
    out["dones"] = out["terminations"] | out["truncations"]
    out["prompts"] = [list(r.prompts) for r in rows]
    chunks = chunk_arrays(keep.chunks)
    ids = out["chunk_ids"].flatten()
    rewards = out["rewards"].flatten()
    chunk_rewards = torch.zeros(len(chunks["chunk_env"]), dtype=torch.float32)
    chunk_rewards.index_add_(0, ids[ids >= 0], rewards[ids >= 0])
    for key, value in chunks.items():
        out[key] = value.tolist() if key == "chunk_prompts" else torch.from_numpy(value)
    out["chunk_rewards"] = chunk_rewards
    started = sorted(keep.started)
    out["episode_id"] = torch.tensor(started, dtype=torch.int64)
    for key, value in keep.arrays(started).items():
        out[key] = value.tolist() if key == "episode_task" else torch.from_numpy(value)
    out["sde_settings"], out["weights"] = sde_metadata(keep.chunks)
    return out


def stochastic_record(batch: dict[str, Any], rows: Any = None) -> Any:
    """The :class:`~cosmos3_gym.pipeline.sde.StochasticRecord` of chunks ``rows`` (default:
    all) of a batch (:func:`collect_on_policy`, or a rollout folder's
    :func:`~cosmos3_gym.runner.load_rollouts`), for ``chunk_log_prob``."""
    from cosmos3_gym.pipeline.sde import StochasticRecord

    if batch.get("sde_settings") is None:
        raise ValueError("this batch was sampled deterministically: it has no log-probabilities")
    n = len(batch["chunk_env"])
    rows = np.arange(n) if rows is None else np.asarray(rows, np.int64)
    arrays = {name: np.asarray(batch["chunk_log_prob" if name == "log_prob"
                                     else f"chunk_sde_{name}"])[rows]
              for name in StochasticRecord.ARRAYS}
    return StochasticRecord(**arrays, settings=dict(batch["sde_settings"]),
                            weights=batch["weights"])
