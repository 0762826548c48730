"""On-policy collection: roll a VectorPolicy in a VectorEnv and keep every step in memory.

The collector resets episodes itself (the vector env's autoreset is off), so it decides which
episode each env slot runs next, from an :class:`EpisodeSchedule`:

- **Coverage.** Episodes take the run's tasks in turn, in the order they start: the k-th episode
  (or GRPO group) runs task ``k % n_tasks``, trial ``k // n_tasks``; its env seed and (LIBERO)
  init state are the evaluation's for that ``(task, trial)``
  (:meth:`~cosmos3_gym.eval.tasks.EvalEnv.episodes`), so a run covers every task it was given,
  evenly, and each episode says which it was.
- **GRPO groups.** With ``group_size`` G, env slots ``[g·G, (g+1)·G)`` form group ``g``; the
  e-th episode of each of its slots is one group episode: the same task, trial, env seed and
  init state, so the G episodes start from the same state and differ only by the policy's
  noise. A slot that finishes starts its next group episode at once (no slot waits for its
  group), so a group's members may run at different times; ``episode_group`` says which
  episodes compare.

:func:`collect_on_policy` returns torch tensors (nothing on disk): per-step rewards and dones,
per-chunk rewards (the rewards of the steps executed from the chunk), per-episode returns and
success, the bootstrap observation (after the last step), and per chunk the seeds, noise and,
with a stochastic sampler, the stochastic-step record and log-probability
(:class:`~cosmos3_gym.pipeline.sde.StochasticRecord`) that
:func:`~cosmos3_gym.pipeline.sde.chunk_log_prob` recomputes under new weights.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from cosmos3_gym.eval.tasks import Episode, EvalEnv, derive_seed
from cosmos3_gym.policy.planner import ChunkRecord
from cosmos3_gym.vector_env import autoreset_mode


class EpisodeSchedule:
    """Which episode each env slot runs next: tasks in turn, GRPO groups of ``group_size``.

    >>> from cosmos3_gym.eval.tasks import ColorReachEval
    >>> schedule = EpisodeSchedule(ColorReachEval(["red", "blue"]), seed=0, num_envs=4,
    ...                            group_size=2)
    >>> [(e.task, e.trial, g) for e, g in (schedule.start(s) for s in range(4))]
    [('red', 0, 0), ('red', 0, 0), ('blue', 0, 1), ('blue', 0, 1)]
    >>> [(e.task, e.trial, g) for e, g in (schedule.start(3), schedule.start(3))]  # slot 3 next
    [('red', 1, 2), ('blue', 1, 3)]
    """

    def __init__(
        self, eval_env: EvalEnv, seed: int, num_envs: int, group_size: int = 1,
        first_group: int = 0,
    ) -> None:
        if group_size < 1 or num_envs % group_size:
            raise ValueError(
                f"group_size must be >= 1 and divide num_envs ({num_envs}); found {group_size}"
            )
        self.eval_env, self.seed, self.group_size = eval_env, int(seed), group_size
        self._rounds = [0] * num_envs
        self._groups: dict[tuple[int, int], int] = {}
        self.first_group = first_group  # a resumed run goes on where the saved part stopped

    def start(self, slot: int) -> tuple[Episode, int]:
        """The next episode of ``slot`` and its group id (in order of first start)."""
        key = (slot // self.group_size, self._rounds[slot])
        self._rounds[slot] += 1
        group = self._groups.setdefault(key, self.first_group + len(self._groups))
        n = len(self.eval_env.tasks)
        task_index, trial = group % n, group // n
        task = self.eval_env.tasks[task_index]
        episode = Episode(
            task=task, task_index=task_index, suite=self.eval_env.suite, trial=trial,
            seed=derive_seed(self.seed, task, trial),
            init_state_id=self.eval_env.init_state_id(trial),
        )
        return episode, group


@dataclass
class _EpisodeLog:
    env: list[int] = field(default_factory=list)
    group: list[int] = field(default_factory=list)
    task: list[str] = field(default_factory=list)
    task_index: list[int] = field(default_factory=list)
    trial: list[int] = field(default_factory=list)
    seed: list[int] = field(default_factory=list)
    init_state_id: list[int] = field(default_factory=list)
    start_step: list[int] = field(default_factory=list)
    length: list[int] = field(default_factory=list)
    ret: list[float] = field(default_factory=list)
    success: list[bool] = field(default_factory=list)
    finished: list[bool] = field(default_factory=list)


def roll_episodes(
    policy: Any, envs: VectorEnv, num_steps: int, schedule: EpisodeSchedule, *,
    on_step: Callable[[dict[str, Any]], None], progress: bool = False,
    desc: str = "rollout", first_episode: int = 0,
) -> tuple[dict[str, np.ndarray], Any]:
    """The stepping loop of the collectors: ``num_steps`` vector steps of ``policy`` in
    ``envs`` (autoreset DISABLED), each finished slot restarted at once with its next scheduled
    episode. ``on_step`` gets one dict per step: ``obs`` (the observation the action was chosen
    from), ``prompts``, ``actions``, ``raw_actions``, ``chunk_ids`` (run-wide chunk row of each
    action), ``episode_ids`` (run-wide episode id, from ``first_episode``), ``rewards``,
    ``terminations``, ``truncations``, and ``record`` (the :class:`ChunkRecord` planned at this
    step or None), ``record_first_id`` (its row 0's chunk id) and ``record_episodes`` (each of
    its rows' episode id). Returns the episode table (``episode_*`` arrays, row k = episode
    ``first_episode + k``) and the observation after the last step."""
    from cosmos3_gym.progress import progress_bar

    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1; found {num_steps}")
    if autoreset_mode(envs) != AutoresetMode.DISABLED:
        raise ValueError(
            "the collector resets episodes itself (task rotation, GRPO groups); build the "
            f"vector env with autoreset_mode=DISABLED, found {autoreset_mode(envs).value}"
        )
    num_envs = envs.num_envs
    feed = policy.attach(envs)
    log = _EpisodeLog()
    current = np.full(num_envs, -1, np.int64)  # episode id per slot
    # Run-wide chunk id of each live record's row 0; a record leaves once no queue holds it.
    first_id: WeakKeyDictionary[ChunkRecord, int] = WeakKeyDictionary()
    chunk_count = 0
    raw_dim = 0
    obs = None

    def start(slot: int) -> Any:
        episode, group = schedule.start(slot)
        mask = np.zeros(num_envs, bool)
        mask[slot] = True
        seeds = [episode.seed if j == slot else None for j in range(num_envs)]
        options = {"reset_mask": mask, **schedule.eval_env.reset_options(episode)}
        new_obs, _ = feed.reset(seed=seeds, options=options)
        current[slot] = first_episode + len(log.env)
        for name, value in (("env", slot), ("group", group), ("task", episode.task),
                            ("task_index", episode.task_index), ("trial", episode.trial),
                            ("seed", episode.seed),
                            ("init_state_id", -1 if episode.init_state_id is None
                             else episode.init_state_id),
                            ("start_step", first_step), ("length", 0), ("ret", 0.0),
                            ("success", False), ("finished", False)):
            getattr(log, name).append(value)
        return new_obs

    first_step = 0  # the step at which an episode started now takes its first action
    feed.reset(seed=[0] * num_envs)  # every sub-env valid before the masked starts
    for slot in range(num_envs):
        obs = start(slot)
    bar = progress_bar(enabled=progress, total=num_steps, desc=desc, unit="step")
    for step in range(num_steps):
        actions = policy.select_action(obs)
        record = policy.last_chunk_record
        record_first = chunk_count
        if record is not None:
            first_id[record] = chunk_count
            chunk_count += len(record)
            raw_dim = record.raw_actions.shape[-1]
        raw = np.zeros((num_envs, raw_dim), np.float32)
        ids = np.full(num_envs, -1, np.int64)
        for env, source in enumerate(policy.last_action_sources):
            if source is not None:
                raw[env] = source.raw_action
                ids[env] = first_id[source.record] + source.row
        row = {"obs": obs, "prompts": np.asarray(feed.tasks, dtype=str),
               "actions": np.asarray(actions, np.float32), "raw_actions": raw,
               "chunk_ids": ids, "episode_ids": current.copy(), "record": record,
               "record_first_id": record_first,
               "record_episodes": None if record is None else current[record.env_indices].copy()}
        obs, rewards, terminations, truncations, infos = feed.step(actions)
        rewards = np.asarray(rewards, np.float32)
        done = np.logical_or(terminations, truncations)
        row.update(rewards=rewards, terminations=np.asarray(terminations, bool),
                   truncations=np.asarray(truncations, bool))
        on_step(row)
        first_step = step + 1
        for env in range(num_envs):
            e = current[env] - first_episode
            log.length[e] += 1
            log.ret[e] += float(rewards[env])
        for env in np.flatnonzero(done):
            e = current[env] - first_episode
            log.finished[e] = True
            log.success[e] = bool(_flag(infos, "is_success", env)
                                  if "is_success" in infos else terminations[env])
            obs = start(int(env))
        bar.update(1)
    bar.close()
    episodes = {
        "episode_env": np.asarray(log.env, np.int64),
        "episode_group": np.asarray(log.group, np.int64),
        "episode_task": np.asarray(log.task, dtype=str),
        "episode_task_index": np.asarray(log.task_index, np.int64),
        "episode_trial": np.asarray(log.trial, np.int64),
        "episode_seed": np.asarray(log.seed, np.int64),
        "episode_init_state": np.asarray(log.init_state_id, np.int64),
        # The step of an episode's first action (num_steps for episodes started at the end).
        "episode_start_step": np.asarray(log.start_step, np.int64),
        "episode_length": np.asarray(log.length, np.int64),
        "episode_return": np.asarray(log.ret, np.float32),
        "episode_success": np.asarray(log.success, bool),
        "episode_finished": np.asarray(log.finished, bool),
    }
    return episodes, obs


def _flag(info: dict[str, Any], key: str, i: int) -> bool:
    mask = info.get(f"_{key}")
    if mask is not None and not bool(mask[i]):
        return False
    return bool(info[key][i])


def chunk_arrays(records: list[ChunkRecord]) -> dict[str, np.ndarray]:
    """Per-chunk arrays of planned records, rows in planning order (chunk ids), including the
    stochastic-step fields (``chunk_log_prob``, ``chunk_sde_*``) where the records have them."""
    def cat(get: Callable[[ChunkRecord], Any], dtype: Any) -> np.ndarray:
        return np.concatenate([np.asarray(get(r), dtype) for r in records])

    out = {
        "chunk_env": cat(lambda r: r.env_indices, np.int64),
        "chunk_episode": cat(lambda r: r.episode_indices, np.int64),
        "chunk_index": cat(lambda r: r.chunk_indices, np.int64),
        "chunk_seed": cat(lambda r: r.seeds, np.int64),
        "chunk_noise": cat(lambda r: r.action_noise, np.float32),
        "chunk_raw_actions": cat(lambda r: r.raw_actions, np.float32),
        "chunk_actions": cat(lambda r: r.actions, np.float32),
        "chunk_prompts": cat(lambda r: r.prompts, str),
    }
    if records and all(r.sde is not None for r in records):
        from cosmos3_gym.pipeline.sde import StochasticRecord

        sde = StochasticRecord.concat([r.sde for r in records])
        out["chunk_log_prob"] = sde.log_prob
        for name in StochasticRecord.ARRAYS:
            if name != "log_prob":
                out[f"chunk_sde_{name}"] = getattr(sde, name)
    return out


def collect_on_policy(
    policy: Any, envs: VectorEnv, num_steps: int, *, eval_env: EvalEnv, seed: int = 0,
    group_size: int = 1, progress: bool = False,
) -> dict[str, Any]:
    """Roll ``policy`` in ``envs`` (built by ``eval_env.make(..., autoreset_mode=DISABLED)``)
    for ``num_steps`` vector steps; everything as torch tensors, time-major ``[T, B, ...]``.

    Keys: ``obs`` (or ``obs.{key}``), ``actions``, ``raw_actions``, ``rewards``,
    ``terminations``, ``truncations``, ``dones``, ``chunk_ids`` (row of the chunk arrays each
    action came from), ``episode_ids`` (row of the episode arrays); per chunk ``chunk_*``
    (``chunk_rewards``: the summed rewards of its executed steps; ``chunk_log_prob`` and
    ``chunk_sde_*`` with a stochastic sampler); per episode ``episode_*`` (``episode_group``:
    the GRPO group, ``episode_return``, ``episode_success``, ``episode_finished``: ended within
    the run); ``last_obs``, the bootstrap observation; and plain values ``prompts`` (``[T][B]``
    strings), ``chunk_prompts``, ``episode_task``, ``sde_settings`` and ``weights`` (the
    sampling weights' hash, ``None`` for a deterministic sampler).
    """
    import torch

    steps: list[dict[str, Any]] = []
    records: list[ChunkRecord] = []
    chunk_episodes: list[np.ndarray] = []

    def keep(row: dict[str, Any]) -> None:
        steps.append(row)
        if row["record"] is not None:
            records.append(row["record"])
            chunk_episodes.append(row["record_episodes"])

    schedule = EpisodeSchedule(eval_env, seed, envs.num_envs, group_size)
    episodes, last_obs = roll_episodes(
        policy, envs, num_steps, schedule, on_step=keep, progress=progress, desc="collect",
    )
    out: dict[str, Any] = {}
    obs = [s["obs"] for s in steps]
    if isinstance(obs[0], dict):
        for key in obs[0]:
            out[f"obs.{key}"] = torch.from_numpy(np.stack([np.asarray(o[key]) for o in obs]))
            out[f"last_obs.{key}"] = torch.from_numpy(np.asarray(last_obs[key]).copy())
    else:
        out["obs"] = torch.from_numpy(np.stack([np.asarray(o) for o in obs]))
        out["last_obs"] = torch.from_numpy(np.asarray(last_obs).copy())
    for key in ("actions", "raw_actions", "rewards", "terminations", "truncations",
                "chunk_ids", "episode_ids"):
        out[key] = torch.from_numpy(np.stack([s[key] for s in steps]))
    out["dones"] = out["terminations"] | out["truncations"]
    out["prompts"] = [s["prompts"].tolist() for s in steps]
    chunks = chunk_arrays(records)
    ids = out["chunk_ids"].flatten()
    rewards = out["rewards"].flatten()
    chunk_rewards = torch.zeros(len(chunks["chunk_env"]), dtype=torch.float32)
    chunk_rewards.index_add_(0, ids[ids >= 0], rewards[ids >= 0])
    for key, value in chunks.items():
        out[key] = value.tolist() if key == "chunk_prompts" else torch.from_numpy(value)
    out["chunk_rewards"] = chunk_rewards
    out["chunk_episode"] = torch.from_numpy(np.concatenate(chunk_episodes))  # run-wide ids
    for key, value in episodes.items():
        out[key] = value.tolist() if key == "episode_task" else torch.from_numpy(value)
    sde = records[0].sde if records else None
    out["sde_settings"] = None if sde is None else dict(sde.settings)
    out["weights"] = None if sde is None else sde.weights
    return out


def stochastic_record(batch: dict[str, Any], rows: Any = None) -> Any:
    """The :class:`~cosmos3_gym.pipeline.sde.StochasticRecord` of chunks ``rows`` (default:
    all) of a :func:`collect_on_policy` batch, for ``chunk_log_prob``."""
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
