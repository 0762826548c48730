"""RL rollout collection: roll a VectorPolicy in a VectorEnv and save trajectories as .npz shards.

Format, ``SCHEMA_VERSION`` 2 (:func:`load_rollouts` reads 1 and 2). ``out_dir/meta.json``
holds ``schema_version``, ``num_envs``, ``autoreset_mode``, ``num_steps``, the shard file names
and the run's provenance (``provenance``: checkpoint path and weights hash, domain, action
statistics, sampler settings, seed, env / suite / tasks, package versions). Each
``shard-{k:05d}.npz`` holds ``T`` vector steps (time-major, ``B`` envs):

- ``obs`` (array obs) or ``obs.{key}`` (dict obs): the observation each action was chosen from,
  ``[T, B, ...]``, images as uint8, exactly as the env returned it;
- ``prompts``: unicode ``[T, B]``, each env's task string at that step;
- ``actions``: float32 ``[T, B, D_env]`` sent to the env; ``raw_actions``: float32
  ``[T, B, D_raw]``, the pipeline's action behind it (before the adapter);
- ``rewards`` float32, ``terminations`` / ``truncations`` bool, ``[T, B]``;
- ``valid``: bool ``[T, B]``, False where the env ignored the action (the reset step that follows
  an episode end under ``NEXT_STEP`` autoreset; never with the command's own episode schedule);
- ``chunk_ids``: int64 ``[T, B]``, the run-wide chunk the action came from (-1 if none);
  ``episode_ids``: int64 ``[T, B]``, the run-wide episode (scheduled runs);
- chunk arrays, one row per chunk planned during the shard's steps, starting at run-wide chunk
  ``chunk_first``: ``chunk_env``, ``chunk_episode`` (the run-wide episode in scheduled runs,
  the env's own episode count otherwise), ``chunk_index`` (int64), ``chunk_seed`` (int64, the
  seed of the chunk's video and action noise), ``chunk_noise`` float32 ``[N, H, 64]`` (the
  initial action noise; with ``chunk_seed``, enough to replay the chunk), ``chunk_raw_actions``,
  ``chunk_actions``; with a stochastic sampler also ``chunk_log_prob`` float32 ``[N]`` and the
  stochastic steps ``chunk_sde_steps``, ``_sigmas``, ``_timesteps``, ``_vision``,
  ``_actions_before``, ``_actions_after``, ``_action_mask``, ``_image_hw``
  (:class:`~cosmos3_gym.pipeline.sde.StochasticRecord`);
- in the last shard of a run (or of a resumed part of it): ``last_obs`` (``[B, ...]`` or
  ``last_obs.{key}``), the observation after the final step, and, for scheduled runs, the
  episode table ``episode_*`` (env slot, task, trial, seed, init state, first step, length,
  return, success, finished) of the episodes started in that part.

Scheduled runs (the command; ``collect_rollouts(..., eval_env=...)``) pick every episode from
:class:`~cosmos3_gym.eval.onpolicy.EpisodeSchedule`: the run's tasks in turn (and LIBERO's init
states by trial), so a run covers every task it was given, evenly. Schema 1 stored chunk ids per
shard; schema 2 stores them run-wide, so a shard read alone (:func:`iter_rollout_shards`) still
points at the right chunk.

Resume. A scheduled run writes ``rollout.json`` (its identity) first and each shard atomically.
Rerunning the same command after an interruption keeps the saved shards and collects the
remaining steps as a new part with fresh episodes (a new noise root and the schedule's next
tasks); episodes cut by the interruption keep their steps but have no row in the episode table.
A complete folder runs nothing; a folder of another run is refused.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from cosmos3_gym.policy.planner import ChunkRecord
from cosmos3_gym.vector_env import autoreset_mode

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)


def _flatten_obs(obs: Any, prefix: str) -> dict[str, np.ndarray]:
    if isinstance(obs, dict):
        return {f"{prefix}.{k}": np.asarray(v) for k, v in obs.items()}
    return {prefix: np.asarray(obs)}


class _ShardWriter:
    """Buffers steps and the chunks planned during them; writes a shard atomically."""

    def __init__(self, out: Path, shard_steps: int, shards: list[str], chunk_first: int) -> None:
        self.out, self.shard_steps, self.shards = out, shard_steps, shards
        self.chunk_first = chunk_first  # run-wide id of the next chunk row
        self.steps: list[dict[str, np.ndarray]] = []
        self.records: list[ChunkRecord] = []
        self.record_episodes: list[np.ndarray] = []

    def add(self, row: dict[str, Any], record: ChunkRecord | None,
            record_episodes: np.ndarray | None) -> None:
        self.steps.append(row)
        if record is not None:
            self.records.append(record)
            self.record_episodes.append(
                record.episode_indices if record_episodes is None else record_episodes)

    @property
    def full(self) -> bool:
        return len(self.steps) == self.shard_steps

    def flush(self, extra: dict[str, np.ndarray] | None = None) -> None:
        from cosmos3_gym.eval.onpolicy import chunk_arrays

        data = {k: np.stack([s[k] for s in self.steps]) for k in self.steps[0]}
        if self.records:
            chunks = chunk_arrays(self.records)
            chunks["chunk_episode"] = np.concatenate(self.record_episodes).astype(np.int64)
            chunks.pop("chunk_prompts")  # the step prompts hold them
            data.update(chunks)
        else:
            data.update(chunk_env=np.zeros(0, np.int64))
        data["chunk_first"] = np.int64(self.chunk_first)
        data.update(extra or {})
        name = f"shard-{len(self.shards):05d}.npz"
        tmp = self.out / f".{name}.{os.getpid()}.tmp.npz"
        np.savez_compressed(tmp, **data)
        os.replace(tmp, self.out / name)
        self.shards.append(name)
        self.chunk_first += len(data["chunk_env"])
        self.steps, self.records, self.record_episodes = [], [], []


def collect_rollouts(
    policy: Any,
    envs: VectorEnv,
    num_steps: int,
    out_dir: str | Path,
    *,
    seed: int = 0,
    shard_steps: int = 256,
    progress: bool = False,
    eval_env: Any = None,
    provenance: dict[str, Any] | None = None,
) -> Path:
    """Roll ``policy`` (a :class:`~cosmos3_gym.policy.VectorPolicy`) in ``envs`` for
    ``num_steps`` vector steps and write the shards described in the module notes.

    With ``eval_env`` (an :class:`~cosmos3_gym.eval.tasks.EvalEnv`; ``envs`` built by it with
    autoreset DISABLED) episodes follow the schedule (tasks in turn, recorded per episode) and
    an interrupted run resumes; without it ``envs`` must autoreset (``NEXT_STEP`` or
    ``SAME_STEP``) and each env keeps what its autoreset gives it. ``provenance`` goes into
    ``meta.json`` beside what the policy knows (sampler settings, weights hash, domain, action
    statistics) and the package versions.
    """
    if num_steps < 1 or shard_steps < 1:
        raise ValueError(
            f"num_steps and shard_steps must be >= 1; found {num_steps}, {shard_steps}"
        )
    out = Path(out_dir)
    mode = autoreset_mode(envs)
    meta = {"schema_version": SCHEMA_VERSION, "num_envs": envs.num_envs,
            "autoreset_mode": mode.value, "num_steps": num_steps}
    identity = {**meta, "seed": seed, "shard_steps": shard_steps,
                "provenance": _provenance(policy, eval_env, provenance, seed)}
    if eval_env is None:
        if mode == AutoresetMode.DISABLED:
            raise ValueError("collect_rollouts needs an autoresetting env (or eval_env=, which "
                             "schedules the episodes itself); found autoreset DISABLED")
        check_rollout_folder(out)
        out.mkdir(parents=True, exist_ok=True)
        shards: list[str] = []
        _collect_autoreset(policy, envs, num_steps, _ShardWriter(out, shard_steps, shards, 0),
                           seed=seed, progress=progress)
        parts = [{"steps": num_steps, "seed": seed}]
    else:
        state = _resume_state(out, identity)
        if state is None:  # complete
            return out
        shards, parts = state["shards"], state["parts"]
        done = state["steps"]
        part_seed = seed if not parts else _part_seed(seed, len(parts))
        policy.reset(seed=part_seed)
        # Every part is listed as it starts, so a cut one stays on record.
        parts.append({"steps": num_steps - done, "seed": part_seed,
                      "first_shard": state["num_shards"]})
        _write_json(out / "rollout.json", {"identity": identity, "parts": parts})
        _collect_scheduled(policy, envs, num_steps - done,
                           _ShardWriter(out, shard_steps, shards, state["chunks"]),
                           eval_env=eval_env, seed=seed, first_group=state["groups"],
                           first_episode=state["episodes"], progress=progress)
    meta.update(shards=shards, parts=parts, provenance=identity["provenance"])
    _write_json(out / "meta.json", meta)
    return out


def _part_seed(seed: int, part: int) -> int:
    """The noise root of a resumed part: fresh noise, reproducible from the run's seed."""
    return int(np.random.SeedSequence([int(seed), 7, int(part)]).generate_state(1)[0] >> 1)


def _write_json(path: Path, data: Any) -> None:
    from cosmos3_gym.eval.results import write_json_atomic

    write_json_atomic(path, data)


def _collect_autoreset(policy: Any, envs: VectorEnv, num_steps: int, writer: _ShardWriter, *,
                       seed: int, progress: bool) -> None:
    from cosmos3_gym.progress import progress_bar

    mode = autoreset_mode(envs)
    feed = policy.attach(envs)
    obs, _ = feed.reset(seed=seed)
    num_envs = envs.num_envs
    # Run-wide id of each live record's first row; a record leaves once no queue holds it.
    first_id: WeakKeyDictionary[ChunkRecord, int] = WeakKeyDictionary()
    chunk_count = 0
    raw_dim = 0
    prev_done = np.zeros(num_envs, bool)
    bar = progress_bar(enabled=progress, total=num_steps, desc="rollout", unit="step")
    for t in range(num_steps):
        actions = policy.select_action(obs)
        record = policy.last_chunk_record
        if record is not None:
            first_id[record] = chunk_count
            chunk_count += len(record)
            raw_dim = record.raw_actions.shape[-1]
        valid = ~prev_done if mode == AutoresetMode.NEXT_STEP else np.ones(num_envs, bool)
        raw = np.zeros((num_envs, raw_dim), np.float32)
        ids = np.full(num_envs, -1, np.int64)
        for env in np.flatnonzero(valid):
            source = policy.last_action_sources[env]
            if source is not None:  # None: the placeholder of an env that ignores its action
                raw[env] = source.raw_action
                ids[env] = first_id[source.record] + source.row
        step = {
            **_flatten_obs(obs, "obs"),
            "prompts": np.asarray(feed.tasks, dtype=str),
            "actions": np.asarray(actions, np.float32),
            "raw_actions": raw,
            "chunk_ids": ids,
            "valid": valid,
        }
        obs, rewards, terminations, truncations, _ = feed.step(actions)
        step.update(rewards=np.asarray(rewards, np.float32),
                    terminations=np.asarray(terminations, bool),
                    truncations=np.asarray(truncations, bool))
        writer.add(step, record, None)
        prev_done = np.logical_or(terminations, truncations)
        bar.update(1)
        if writer.full or t == num_steps - 1:
            writer.flush(_flatten_obs(obs, "last_obs") if t == num_steps - 1 else None)
    bar.close()


def _collect_scheduled(policy: Any, envs: VectorEnv, num_steps: int, writer: _ShardWriter, *,
                       eval_env: Any, seed: int, first_group: int, first_episode: int,
                       progress: bool) -> None:
    from cosmos3_gym.eval.onpolicy import EpisodeSchedule, roll_episodes

    schedule = EpisodeSchedule(eval_env, seed, envs.num_envs, first_group=first_group)

    written = 0

    def write(row: dict[str, Any]) -> None:
        nonlocal written
        step = {**_flatten_obs(row["obs"], "obs"),
                **{k: row[k] for k in ("prompts", "actions", "raw_actions", "chunk_ids",
                                       "episode_ids", "rewards", "terminations",
                                       "truncations")},
                "valid": np.ones(len(row["actions"]), bool)}
        writer.add(step, row["record"], row["record_episodes"])
        written += 1
        if writer.full and written < num_steps:  # the last shard also takes the tables
            writer.flush()

    episodes, last_obs = roll_episodes(policy, envs, num_steps, schedule, on_step=write,
                                       progress=progress, first_episode=first_episode)
    episodes["episode_id"] = first_episode + np.arange(len(episodes["episode_env"]))
    writer.flush({**_flatten_obs(last_obs, "last_obs"), **episodes})


def _resume_state(out: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """Where a scheduled run stands in ``out``: None when it is complete; else the saved shards
    and parts and the counters a new part continues from. Refuses another run's folder."""
    if out.exists() and not out.is_dir():
        raise ValueError(f"{out} is a file; expected a folder")
    progress_path = out / "rollout.json"
    meta_path = out / "meta.json"
    if progress_path.exists():
        stored = json.loads(progress_path.read_text())
        if _comparable(stored.get("identity")) != _comparable(identity):
            raise FileExistsError(
                f"{out} holds rollouts of another run; refusing to mix them. Use a new --out, "
                "or rerun with the stored settings (rollout.json)"
            )
        if meta_path.exists():
            return None
    elif meta_path.exists() or any(out.glob("shard-*.npz")):
        check_rollout_folder(out)  # a folder from before rollout.json: refused
    out.mkdir(parents=True, exist_ok=True)
    stored = json.loads(progress_path.read_text()) if progress_path.exists() else {}
    parts = stored.get("parts", [])
    shards = []
    steps = chunks = groups = episodes = 0
    while (out / f"shard-{len(shards):05d}.npz").exists():
        name = f"shard-{len(shards):05d}.npz"
        with np.load(out / name) as shard:
            steps += len(shard["actions"])
            chunks = int(shard["chunk_first"]) + len(shard["chunk_env"])
            if "episode_ids" in shard.files and shard["episode_ids"].size:
                episodes = max(episodes, int(shard["episode_ids"].max()) + 1)
            if "episode_group" in shard.files and shard["episode_group"].size:
                groups = max(groups, int(shard["episode_group"].max()) + 1)
        shards.append(name)
    if steps >= identity["num_steps"]:
        raise ValueError(f"{out} holds {steps} steps but no meta.json; its last part was cut "
                         "while finishing: use a new --out")
    _write_json(progress_path, {"identity": identity, "parts": parts})
    for stray in out.glob(f"shard-{len(shards):05d}*.npz"):
        stray.unlink()
    # A cut part's episodes and groups have no table row: count them from the steps' ids.
    groups = max(groups, episodes)
    return {"shards": shards, "parts": parts, "steps": steps, "chunks": chunks,
            "groups": groups, "episodes": episodes, "num_shards": len(shards)}


def _comparable(identity: Any) -> Any:
    return json.loads(json.dumps(identity))


def _provenance(policy: Any, eval_env: Any, given: dict[str, Any] | None,
                seed: int) -> dict[str, Any]:
    """What a dataset needs to say where it came from (meta.json ``provenance``)."""
    from dataclasses import asdict
    from importlib import metadata

    versions = {}
    for package in ("cosmos3-gym", "torch", "numpy", "gymnasium", "diffusers", "transformers"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    config = getattr(policy, "config", None)
    pipeline = getattr(policy, "pipeline", None)
    head = getattr(pipeline, "policy", None)
    transformer = getattr(pipeline, "transformer", None)
    weights = None
    if transformer is not None:
        from cosmos3_gym.pipeline.sde import weights_digest

        weights = weights_digest(transformer)
    found = {
        "seed": seed,
        "policy": None if config is None else json.loads(json.dumps(asdict(config))),
        "adapter": type(getattr(policy, "adapter", None)).__name__,
        "weights_sha256_16": weights,
        "domain": getattr(head, "domain_name", None),
        "raw_action_dim": getattr(head, "raw_action_dim", None),
        "normalization": getattr(head, "normalization", None),
        "action_stats": getattr(head, "stats", None),
        "sampler_defaults": None if head is None else {
            "num_inference_steps": head.num_inference_steps, "flow_shift": head.flow_shift,
            "guidance_scale": head.guidance_scale},
        "env": None if eval_env is None else {
            "family": type(eval_env).__name__, "suite": eval_env.suite,
            "tasks": list(eval_env.tasks), "episode_budget": eval_env.episode_budget()},
        "packages": versions,
    }
    return {**found, **(given or {})}


def check_rollout_folder(out_dir: str | Path) -> None:
    """Refuse a folder that holds rollouts already (``meta.json`` or shards) for a collection
    that cannot resume (autoresetting envs): new shards would overwrite or mix with them."""
    out = Path(out_dir)
    held = sorted(p.name for p in [out / "meta.json", *out.glob("shard-*.npz")] if p.exists())
    if held:
        raise FileExistsError(
            f"{out} already holds rollouts ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}"
            "); expected a new or empty folder"
        )


def _read_meta(out: Path) -> dict[str, Any]:
    meta_path = out / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"no meta.json in {out}; expected a folder written by "
                                "collect_rollouts (an interrupted run: rerun its command)")
    meta = json.loads(meta_path.read_text())
    if meta.get("schema_version") not in READABLE_SCHEMAS:
        raise ValueError(f"rollout schema_version {meta.get('schema_version')}; expected one of "
                         f"{list(READABLE_SCHEMAS)}")
    return meta


def iter_rollout_shards(out_dir: str | Path) -> Iterator[dict[str, np.ndarray]]:
    """The shards of ``out_dir`` one at a time (for runs larger than memory), chunk ids
    run-wide in both schemas (``chunk_first``: the run-wide id of the shard's first chunk)."""
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
    """All shards of ``out_dir`` concatenated (time-major), chunk ids run-wide; plus ``meta``.

    Reads schema 1 and 2. For runs larger than memory, :func:`iter_rollout_shards` reads one
    shard at a time instead.
    """
    out = Path(out_dir)
    meta = _read_meta(out)
    parts: dict[str, list[np.ndarray]] = {}
    for data in iter_rollout_shards(out):
        data.pop("chunk_first", None)
        for k, v in data.items():
            parts.setdefault(k, []).append(v)
    merged: dict[str, Any] = {}
    for k, vs in parts.items():
        merged[k] = vs[-1] if k.startswith("last_obs") else np.concatenate(vs)
    merged["meta"] = meta
    return merged


def check_rollout_command(out_dir: str | Path, command: dict[str, Any]) -> None:
    """Before anything loads: refuse a folder that holds another command's rollouts (a rerun of
    the same command resumes or, complete, runs nothing)."""
    out = Path(out_dir)
    progress_path = out / "rollout.json"
    if not progress_path.exists():
        if (out / "meta.json").exists() or any(out.glob("shard-*.npz")):
            check_rollout_folder(out)
        return
    stored = json.loads(progress_path.read_text())
    found = stored.get("identity", {}).get("provenance", {}).get("command")
    if _comparable(found) != _comparable(command):
        diff = {k: {"stored": (found or {}).get(k), "this command": command.get(k)}
                for k in sorted(set(found or {}) | set(command))
                if (found or {}).get(k) != command.get(k)}
        raise FileExistsError(
            f"{out} holds rollouts of another command; refusing to mix them. Differences: "
            f"{diff}. Use a new --out, or rerun with the stored settings"
        )


def run_rollout_command(args: Any) -> Path:
    """``cosmos3-gym rollout``: the built env, the policy, then :func:`collect_rollouts`."""
    from gymnasium.vector import AutoresetMode as Mode

    from cosmos3_gym.devices import resolve_device, resolve_dtype
    from cosmos3_gym.eval.evaluate import load_pipeline
    from cosmos3_gym.eval.synthetic import synthetic_adapter, synthetic_pipeline, view_size
    from cosmos3_gym.eval.tasks import make_eval_env
    from cosmos3_gym.policy import VectorPolicy, get_adapter
    from cosmos3_gym.policy.adapters import with_action_map

    # The run's identity; checked against the folder before the env and the model load (any
    # GPU gives the same rollouts, so --device is not part of it; --dtype is).
    command = {k: v for k, v in sorted(vars(args).items())
               if k not in ("no_progress", "command", "device")}
    check_rollout_command(args.out, command)
    image_size = view_size(args.env, args.synthetic, args.image_size)
    eval_env = make_eval_env(args.env, suite=args.suite, tasks=args.tasks,
                             image_size=image_size, max_episode_steps=args.max_episode_steps,
                             step_budget=args.step_budget, prompt=args.prompt,
                             import_modules=args.import_modules, env_kwargs=args.env_kwargs,
                             success_key=args.success_key)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    from cosmos3_gym.pipeline import InferenceOptions

    options = InferenceOptions(fp8=getattr(args, "precision", "bf16") == "fp8")
    if args.synthetic is not None:
        pipeline = synthetic_pipeline(args.synthetic, device=device, dtype=dtype, options=options,
                                      eval_env=eval_env)
        adapter = synthetic_adapter(eval_env)
    else:
        pipeline = load_pipeline(args.checkpoint, args.domain, args.action_stats, device=device,
                                 dtype=dtype, options=options)
        adapter = get_adapter(eval_env.adapter)
    adapter = with_action_map(adapter, args.action_map, eval_env.single_action_space())
    # The collector starts every episode itself: the run's tasks in turn, recorded per episode.
    envs = eval_env.make(args.num_envs, args.async_envs, autoreset_mode=Mode.DISABLED)
    policy = VectorPolicy(pipeline, adapter=adapter,
                          n_action_steps=args.n_action_steps, seed=args.seed,
                          stochastic=not args.deterministic,
                          num_inference_steps=args.num_inference_steps,
                          sampler=args.sampler, noise_level=args.noise_level,
                          sde_steps=args.sde_steps)
    runtime = {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
               "synthetic": args.synthetic, "options": asdict(pipeline.options)}
    fps = float(envs.metadata.get("render_fps") or 20)
    try:
        out = collect_rollouts(policy, envs, args.steps, args.out, seed=args.seed,
                               shard_steps=args.shard_steps, progress=not args.no_progress,
                               eval_env=eval_env,
                               provenance={"command": command, "checkpoint": args.checkpoint,
                                           "runtime": runtime})
    finally:
        envs.close()
    if getattr(args, "format", "npz") == "lerobot":
        from cosmos3_gym.integrations.lerobot_dataset import write_lerobot_dataset

        write_lerobot_dataset(out, Path(out) / "lerobot", fps=fps)
    return out
