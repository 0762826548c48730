"""RL rollouts on disk: the episode runner's steps in ``.npz`` shards, resumable from any kill.

:func:`collect_rollouts` writes a folder (``rollout.json``, the identity, before the first step;
``shard-{k:05d}.npz`` atomically; ``meta.json`` last) and resumes it after a kill as a new part
whose chunk, episode and group ids continue the run's; :func:`load_rollouts` and
:func:`iter_rollout_shards` read it (schema ``SCHEMA_VERSION`` 3, and 1 and 2).

The format, file by file and key by key, and what resume guarantees: docs/rl.md, "Rollouts on disk".
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cosmos3_gym.envs.base import EvalEnv
from cosmos3_gym.jsonio import atomic_write, read_json_object, write_json_atomic
from cosmos3_gym.policy.vector_policy import VectorPolicy
from cosmos3_gym.runner.folder import RunFolder
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
from cosmos3_gym.runner.onpolicy import chunk_arrays, flatten_obs, sde_metadata
from cosmos3_gym.runner.schedule import EpisodeSpec, RotationTag, TaskRotation

SCHEMA_VERSION = 3
READABLE_SCHEMAS = (1, 2, 3)
PROGRESS = "rollout.json"
META = "meta.json"


def shard_name(k: int) -> str:
    return f"shard-{k:05d}.npz"


@dataclass
class _EpisodeRow:
    """One episode's line of the table, as the saved steps have it."""

    slot: int
    spec: EpisodeSpec
    start_step: int  # run-wide
    length: int = 0
    total_reward: float = 0.0
    end: EpisodeResult | None = None


@dataclass
class _PartState:
    """Where a rollout folder stands: what a new part continues from."""

    shards: list[str] = field(default_factory=list)
    parts: list[dict[str, Any]] = field(default_factory=list)
    steps: int = 0
    chunks: int = 0
    episodes: int = 0
    groups: int = 0


class ShardWriter(RunObserver):
    """Buffers the runner's steps, chunks and episodes of one part; writes them as shards."""

    def __init__(self, out: Path, shard_steps: int, state: _PartState, layout: list[range],
                 bar: Any = None) -> None:
        self.out, self.shard_steps, self.state = out, shard_steps, state
        self.part_first = state.steps  # run-wide step of the part's first row
        self.step_first = state.steps  # run-wide step of the buffer's first row
        self.chunk_first = state.chunks
        self._assembler = RowAssembler(layout)
        self._rows: list[StepRow] = []
        self._chunks: list[PlannedChunks] = []
        self._episodes: dict[int, _EpisodeRow] = {}
        self._touched: set[int] = set()
        self._bar = bar

    # ------------------------------------------------------------------ observer

    def episode_started(self, slot: int, spec: EpisodeSpec, obs: Any, step: int) -> None:
        self._episodes[spec.id] = _EpisodeRow(slot, spec, self.part_first + step)
        self._touched.add(spec.id)

    def chunks_planned(self, chunks: PlannedChunks) -> None:
        self._chunks.append(chunks)

    def stepped(self, row: StepRow) -> None:
        for full in self._assembler.add(row):
            if len(self._rows) == self.shard_steps:
                self.flush()
            self._rows.append(full)
            for slot in np.flatnonzero(full.valid).tolist():
                episode = self._episodes[int(full.episode_ids[slot])]
                episode.length += 1
                episode.total_reward += float(full.rewards[slot])
                self._touched.add(episode.spec.id)
            if self._bar is not None:
                self._bar.update(1)

    def episode_ended(self, result: EpisodeResult) -> None:
        self._episodes[result.spec.id].end = result
        self._touched.add(result.spec.id)

    # ------------------------------------------------------------------ shards

    def flush(self, last_obs: Any = None) -> None:
        """Write the buffered rows (and ``last_obs``, at a part's end) as the next shard."""
        rows = self._rows
        if not rows:
            return
        end = rows[-1].step + 1  # part-local step after the shard
        data: dict[str, np.ndarray] = {}
        flat = [flatten_obs(r.obs, "obs") for r in rows]
        for name in flat[0]:
            data[name] = np.stack([f[name] for f in flat])
        data["prompts"] = np.asarray([r.prompts for r in rows], dtype=str)
        for name in ("actions", "raw_actions", "rewards", "terminations", "truncations",
                     "valid", "chunk_ids", "episode_ids"):
            data[name] = np.stack([getattr(r, name) for r in rows])
        data["step_first"] = np.int64(self.step_first)
        # The chunk table is in id order (row k of the run's table is chunk k), so a shard takes
        # every chunk planned for its steps and every chunk planned before one of those: with
        # overlap a group ahead of the other has planned chunks for a later shard already.
        last = max((k for k, c in enumerate(self._chunks) if c.step < end), default=-1)
        due, self._chunks = self._chunks[:last + 1], self._chunks[last + 1:]
        # A shard during whose steps nothing was planned holds no chunk rows (chunk_env only).
        chunks = chunk_arrays(due) if due else {"chunk_env": np.zeros(0, np.int64)}
        data.update(chunks)
        settings, weights = sde_metadata(due)
        if settings is not None:
            data["sde_settings"] = np.str_(json.dumps(settings))
            data["weights"] = np.str_(weights)
        data["chunk_first"] = np.int64(self.chunk_first)
        if due and due[0].first_id != self.chunk_first:
            raise AssertionError("chunk ids must be written in order")
        data.update(self._episode_table(self.part_first + end))
        if last_obs is not None:
            data.update(flatten_obs(last_obs, "last_obs"))
        name = shard_name(len(self.state.shards))
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **data)
        atomic_write(self.out / name, lambda f: f.write(buffer.getbuffer()))
        self.state.shards.append(name)
        self.state.steps += len(rows)
        self.state.chunks += len(chunks["chunk_env"])
        self.chunk_first += len(chunks["chunk_env"])
        self.step_first += len(rows)
        self._rows = []

    def _episode_table(self, end: int) -> dict[str, np.ndarray]:
        """The touched episodes' rows as of run-wide step ``end`` (the shard's end). An episode
        that starts after ``end`` waits for a later shard: with overlap a group ahead of the
        other has started it already, and a folder cut after this shard must hold the episodes
        (and so continue the ids) a run without overlap holds."""
        ids = sorted(e for e in self._touched if self._episodes[e].start_step <= end)
        self._touched -= set(ids)
        rows = [self._episodes[e] for e in ids]

        def over(row: _EpisodeRow) -> bool:  # its end lies within the saved steps
            return row.end is not None and self.part_first + row.end.end_step < end

        def tag(row: _EpisodeRow) -> Any:
            return row.spec.tag.episode if isinstance(row.spec.tag, RotationTag) else None

        return {
            "episode_id": np.asarray(ids, np.int64),
            "episode_env": np.asarray([r.slot for r in rows], np.int64),
            "episode_group": np.asarray([r.spec.tag.group if isinstance(r.spec.tag, RotationTag)
                                         else -1 for r in rows], np.int64),
            "episode_task": np.asarray([tag(r).task if tag(r) else "" for r in rows], str),
            "episode_task_index": np.asarray([tag(r).task_index if tag(r) else -1
                                              for r in rows], np.int64),
            "episode_trial": np.asarray([tag(r).trial if tag(r) else -1 for r in rows],
                                        np.int64),
            "episode_seed": np.asarray([-1 if r.spec.seed is None else r.spec.seed
                                        for r in rows], np.int64),
            "episode_init_state": np.asarray([
                -1 if tag(r) is None or tag(r).init_state_id is None else tag(r).init_state_id
                for r in rows], np.int64),
            "episode_start_step": np.asarray([r.start_step for r in rows], np.int64),
            "episode_length": np.asarray([r.length for r in rows], np.int64),
            "episode_return": np.asarray([r.total_reward for r in rows], np.float32),
            "episode_success": np.asarray([over(r) and r.end.success for r in rows], bool),
            "episode_finished": np.asarray([over(r) and r.end.finished for r in rows], bool),
        }


# ---------------------------------------------------------------------- the collection


def rollout_identity(policy: VectorPolicy, eval_env: EvalEnv, *, num_envs: int,
                     num_steps: int, seed: int, shard_steps: int,
                     command: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a rollout folder's ``rollout.json`` binds it to: the settings and weights that
    decide its rollouts (no path, no machine: a moved folder, or one resumed on another GPU,
    goes on; another checkpoint's weights or another sampler does not)."""
    return {"schema_version": SCHEMA_VERSION, "num_envs": num_envs, "num_steps": num_steps,
            "seed": seed, "shard_steps": shard_steps, "command": command,
            **policy_description(policy, eval_env)}


def collect_rollouts(
    policy: VectorPolicy,
    eval_env: EvalEnv,
    num_steps: int,
    out_dir: str | Path,
    *,
    num_envs: int,
    async_envs: bool = False,
    seed: int = 0,
    shard_steps: int = 256,
    progress: bool = False,
    overlap: bool = False,
    env_timeout: float | None = 300.0,
    provenance: dict[str, Any] | None = None,
    session: dict[str, Any] | None = None,
) -> Path:
    """Roll ``policy`` (a :class:`~cosmos3_gym.policy.VectorPolicy`) in ``num_envs`` envs of
    ``eval_env`` for ``num_steps`` vector steps into ``out_dir`` (format and resume:
    docs/rl.md). ``provenance`` goes into ``meta.json`` beside what the policy knows (sampler
    settings, weights hash, domain, action statistics) and the package versions. An env fault
    ends the episodes in flight unfinished; the run goes on in a rebuilt vector env.
    """
    from cosmos3_gym.progress import progress_bar

    if num_steps < 1 or shard_steps < 1:
        raise ValueError(
            f"num_steps and shard_steps must be >= 1; found {num_steps}, {shard_steps}"
        )
    out = Path(out_dir)
    identity = rollout_identity(policy, eval_env, num_envs=num_envs, num_steps=num_steps,
                                seed=seed, shard_steps=shard_steps,
                                command=(provenance or {}).get("command"))
    with RunFolder(out, kind="rollouts") as folder:
        state = read_state(out)
        if (out / META).exists() and state.steps >= num_steps:
            bind_rollout(folder, identity, state, session)
            return out  # complete
        bind_rollout(folder, identity, state, session)
        if state.steps < num_steps:
            _collect_part(policy, eval_env, num_steps, folder, state, identity, session,
                          num_envs=num_envs,
                          async_envs=async_envs, seed=seed, shard_steps=shard_steps,
                          overlap=overlap, env_timeout=env_timeout,
                          provenance=session_provenance(provenance),
                          bar=progress_bar(enabled=progress, total=num_steps,
                                           initial=state.steps, desc="rollout", unit="step"))
        _write_meta(out, identity, state)
    return out


def bind_rollout(folder: RunFolder, identity: dict[str, Any], state: _PartState,
                 session: dict[str, Any] | None = None) -> None:
    """Bind the folder to ``identity`` (refusing another run's once it holds a shard)."""
    extra = {"parts": state.parts, **({} if session is None else {"session": session})}
    folder.bind(PROGRESS, identity, bound=bool(state.shards), extra=extra,
                what="rollouts of another command",
                upgrade=lambda stored: _upgrade(stored, identity))


def _upgrade(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """A stored identity in today's terms (the command's settings as a ``--synthetic`` run
    writes them now: :func:`~cosmos3_gym.settings.stored_model_source`, latency 0 before it was
    a setting: :func:`~cosmos3_gym.settings.stored_latency`; the env's family where its class is
    now: :func:`~cosmos3_gym.envs.names.upgrade_env_identity`)."""
    from cosmos3_gym.envs.names import upgrade_env_identity
    from cosmos3_gym.settings import stored_latency, stored_model_source

    if isinstance(stored.get("command"), dict):
        stored = {**stored, "command": stored_latency(stored_model_source(stored["command"]))}
    if isinstance(stored.get("policy"), dict):  # before real-time execution: synchronous
        stored = {**stored, "policy": {"realtime": None, **stored["policy"]}}
    if isinstance(stored.get("env"), dict):
        stored = {**stored, "env": upgrade_env_identity(stored["env"], current.get("env"))}
    return stored


def _collect_part(policy: VectorPolicy, eval_env: EvalEnv, num_steps: int, folder: RunFolder,
                  state: _PartState, identity: dict[str, Any], session: dict[str, Any] | None,
                  *, num_envs: int,
                  async_envs: bool, seed: int, shard_steps: int, overlap: bool,
                  env_timeout: float | None, provenance: dict[str, Any], bar: Any) -> None:
    out = folder.path
    if state.parts and state.parts[-1]["first_shard"] == len(state.shards):
        # The last attempt saved nothing (a full disk, a kill before its first shard): it is
        # not a part, and this one takes its place, so the folder is the one a run without it
        # writes.
        state.parts.pop()
    part_seed = seed if not state.parts else _part_seed(seed, len(state.parts))
    policy = policy.clone()
    policy.reset(seed=part_seed)
    steps = num_steps - state.steps
    # Every part is listed as it starts, so a cut one that saved shards stays on record.
    state.parts.append({"steps": steps, "seed": part_seed, "first_shard": len(state.shards),
                        "first_step": state.steps, "provenance": provenance})
    bind_rollout(folder, identity, state, session)
    layout = group_layout(num_envs, overlap)
    writer = ShardWriter(out, shard_steps, state, layout, bar)
    schedule = TaskRotation(eval_env, seed, num_envs, first_group=state.groups,
                            first_id=state.episodes)
    options = RunnerOptions(num_envs=num_envs, async_envs=async_envs, env_timeout=env_timeout,
                            faults="cut", overlap=overlap, max_steps=steps)
    runner = EpisodeRunner(policy, lambda n: eval_env.make(n, async_envs), schedule, options,
                           writer, first_chunk_id=state.chunks)
    try:
        runner.run()
        writer.flush(last_obs=runner.last_obs)
    finally:
        if bar is not None:
            bar.close()


def _part_seed(seed: int, part: int) -> int:
    """The noise root of a resumed part: fresh noise, reproducible from the run's seed."""
    return int(np.random.SeedSequence([int(seed), 7, int(part)]).generate_state(1)[0] >> 1)


def _write_meta(out: Path, identity: dict[str, Any], state: _PartState) -> None:
    settings, weights = _sampler_of(out, state)
    latest = state.parts[-1].get("provenance", {}) if state.parts else {}
    write_json_atomic(out / META, {
        "schema_version": SCHEMA_VERSION, "num_envs": identity["num_envs"],
        "num_steps": identity["num_steps"], "shards": state.shards, "parts": state.parts,
        "provenance": {**identity, **latest}, "sde_settings": settings, "weights": weights})


def _sampler_of(out: Path, state: _PartState) -> tuple[dict[str, Any] | None, str | None]:
    """The stochastic sampler's settings and weights hash, as the shards' first chunks were
    sampled (the settings travel in every shard as ``sde_settings``)."""
    for name in state.shards:
        with np.load(out / name) as shard:
            if "sde_settings" in shard.files:
                return json.loads(str(shard["sde_settings"])), str(shard["weights"])
    return None, None


def read_state(out: Path) -> _PartState:
    """Where a rollout folder stands (its shards read in order; a folder of an older schema or
    of a run without ``rollout.json`` is refused)."""
    state = _PartState()
    progress = out / PROGRESS
    if progress.exists():
        state.parts = list(read_json_object(progress, what="rollout progress file")
                           .get("parts", []))
    else:
        held = sorted(p.name for p in [out / META, *out.glob("shard-*.npz")] if p.exists())
        if held:
            shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
            raise FileExistsError(f"{out} already holds rollouts ({shown}); expected a new or "
                                  f"empty folder (one with a {PROGRESS} resumes)")
    while (out / shard_name(len(state.shards))).exists():
        name = shard_name(len(state.shards))
        try:
            with np.load(out / name) as shard:
                if "step_first" not in shard.files:
                    raise FileExistsError(f"{out / name} is a rollout shard of an older schema; "
                                          "expected a new folder")
                state.steps += len(shard["actions"])
                state.chunks = int(shard["chunk_first"]) + len(shard["chunk_env"])
                if shard["episode_id"].size:
                    state.episodes = max(state.episodes, int(shard["episode_id"].max()) + 1)
                    state.groups = max(state.groups, int(shard["episode_group"].max()) + 1)
        except (OSError, ValueError, KeyError) as err:
            raise ValueError(f"{out / name} is not a readable rollout shard ({err}); it was "
                             "written whole or not at all, so the folder was changed by hand"
                             ) from None
        state.shards.append(name)
    return state


# ---------------------------------------------------------------------- reading


def _read_meta(out: Path) -> dict[str, Any]:
    meta_path = out / META
    if not meta_path.exists():
        raise FileNotFoundError(f"no {META} in {out}; expected a folder written by "
                                "collect_rollouts (an interrupted run: rerun its command)")
    meta = read_json_object(meta_path, what="rollout meta.json")
    if meta.get("schema_version") not in READABLE_SCHEMAS:
        raise ValueError(f"{meta_path}: rollout schema_version {meta.get('schema_version')}; "
                         f"expected one of {list(READABLE_SCHEMAS)}")
    return meta


def iter_rollout_shards(out_dir: str | Path) -> Iterator[dict[str, np.ndarray]]:
    """The shards of ``out_dir`` one at a time (for runs larger than memory), chunk ids
    run-wide in every schema (``chunk_first``: the run-wide id of the shard's first chunk)."""
    out = Path(out_dir)
    meta = _read_meta(out)
    offset = 0
    for name in meta["shards"]:
        with np.load(out / name) as shard:
            data = {k: shard[k] for k in shard.files}
        if meta["schema_version"] == 1:  # shard-local chunk ids
            data["chunk_ids"] = np.where(data["chunk_ids"] >= 0, data["chunk_ids"] + offset, -1)
            data["chunk_first"] = np.int64(offset)
        offset += len(data["chunk_env"])
        yield data


def load_rollouts(out_dir: str | Path) -> dict[str, Any]:
    """All shards of ``out_dir`` concatenated (time-major), chunk ids run-wide; the episode
    table one row per episode (by ``episode_id``, schema 3); plus ``meta``, and ``sde_settings``
    and ``weights`` for :func:`~cosmos3_gym.runner.stochastic_record`.

    Reads schema 1, 2 and 3. For runs larger than memory, :func:`iter_rollout_shards` reads one
    shard at a time instead.
    """
    out = Path(out_dir)
    meta = _read_meta(out)
    parts: dict[str, list[np.ndarray]] = {}
    tables: list[dict[str, np.ndarray]] = []
    for data in iter_rollout_shards(out):
        for name in ("chunk_first", "step_first", "sde_settings", "weights"):
            data.pop(name, None)
        if meta["schema_version"] >= 3:
            tables.append({k: data.pop(k) for k in list(data) if k.startswith("episode_")
                           and k != "episode_ids"})
        for k, v in data.items():
            parts.setdefault(k, []).append(v)
    merged: dict[str, Any] = {}
    for k, vs in parts.items():
        merged[k] = vs[-1] if k.startswith("last_obs") else np.concatenate(vs)
    if tables:
        merged.update(_merge_tables(tables))
    merged["meta"] = meta
    merged["sde_settings"] = meta.get("sde_settings")
    merged["weights"] = meta.get("weights")
    return merged


def _merge_tables(tables: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """One row per episode id, the last one written (the shards' rows are cumulative)."""
    latest: dict[int, tuple[int, int]] = {}
    for t, table in enumerate(tables):
        for r, e in enumerate(table["episode_id"].tolist()):
            latest[e] = (t, r)
    ids = sorted(latest)
    # Each shard's string columns are as wide as its own longest name: take the widest.
    return {key: np.asarray([tables[latest[e][0]][key][latest[e][1]] for e in ids],
                            dtype=np.result_type(*(t[key].dtype for t in tables)))
            for key in tables[0]} if ids else {key: tables[0][key][:0] for key in tables[0]}


def policy_description(policy: Any, eval_env: Any) -> dict[str, Any]:
    """The policy, its checkpoint's head and weights, and the env family, as a rollout's
    identity records them."""
    config = getattr(policy, "config", None)
    pipeline = getattr(policy, "pipeline", None)
    head = getattr(pipeline, "policy", None)
    transformer = getattr(pipeline, "transformer", None)
    weights = None
    if transformer is not None:
        from cosmos3_gym.pipeline.sde import weights_digest

        weights = weights_digest(transformer)
    policy_config = None if config is None else json.loads(json.dumps(asdict(config)))
    if policy_config is not None:
        policy_config.pop("nonfinite_actions", None)
    return {
        "policy": policy_config,
        "adapter": type(getattr(policy, "adapter", None)).__name__,
        "weights_sha256_16": weights,
        "domain": getattr(head, "domain_name", None),
        "raw_action_dim": getattr(head, "raw_action_dim", None),
        "normalization": getattr(head, "normalization", None),
        "action_stats": getattr(head, "stats", None),
        "sampler_defaults": None if head is None else {
            "num_inference_steps": head.num_inference_steps, "flow_shift": head.flow_shift,
            "guidance_scale": head.guidance_scale},
        # The env family and every setting it holds (EvalEnv.identity): two differently made
        # envs never resume into each other's folder.
        "env": None if eval_env is None else {
            **eval_env.identity(), "episode_budget": eval_env.episode_budget()},
    }


def session_provenance(given: dict[str, Any] | None) -> dict[str, Any]:
    """Where one part of a rollout ran: the package versions, plus what the caller adds (the
    checkpoint path, the device)."""
    from importlib import metadata

    versions = {}
    for package in ("cosmos3-gym", "torch", "numpy", "gymnasium", "diffusers", "transformers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    return {"packages": versions, **(given or {})}
