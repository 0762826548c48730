"""RL rollout collection: roll a VectorPolicy in a VectorEnv and save trajectories as .npz shards.

Format (``SCHEMA_VERSION`` 1). ``out_dir/meta.json`` holds ``schema_version``, ``num_envs``,
``autoreset_mode``, ``num_steps`` and the shard file names. Each ``shard-{k:05d}.npz`` holds
``T`` vector steps (time-major, ``B`` envs):

- ``obs`` (array obs) or ``obs.{key}`` (dict obs): the observation each action was chosen from,
  ``[T, B, ...]``, images as uint8, exactly as the env returned it;
- ``prompts``: unicode ``[T, B]``, each env's task string at that step;
- ``actions``: float32 ``[T, B, D_env]`` sent to the env; ``raw_actions``: float32
  ``[T, B, D_raw]``, the pipeline's action behind it (before the adapter);
- ``rewards`` float32, ``terminations`` / ``truncations`` bool, ``[T, B]``;
- ``valid``: bool ``[T, B]``, False where the env ignored the action (the reset step that follows
  an episode end under ``NEXT_STEP`` autoreset);
- ``chunk_ids``: int64 ``[T, B]``, the row of the chunk arrays the action came from (-1 if none);
- chunk arrays, one row per planned chunk: ``chunk_env``, ``chunk_episode``, ``chunk_index``
  (int64), ``chunk_seed`` (int64, the seed of the chunk's video and action noise),
  ``chunk_noise`` float32 ``[N, H, 64]`` (the initial action noise; with ``chunk_seed``, enough to
  replay the chunk), ``chunk_raw_actions``.

The last shard also holds ``last_obs`` (``[B, ...]`` or ``last_obs.{key}``), the observation after
the final step, for bootstrapping. :func:`load_rollouts` concatenates shards (chunk ids offset).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any
from weakref import WeakKeyDictionary

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv

from cosmos3_gym.policy.planner import ChunkRecord
from cosmos3_gym.vector_env import autoreset_mode

SCHEMA_VERSION = 1


def _flatten_obs(obs: Any, prefix: str) -> dict[str, np.ndarray]:
    if isinstance(obs, dict):
        return {f"{prefix}.{k}": np.asarray(v) for k, v in obs.items()}
    return {prefix: np.asarray(obs)}


def collect_rollouts(
    policy: Any,
    envs: VectorEnv,
    num_steps: int,
    out_dir: str | Path,
    *,
    seed: int = 0,
    shard_steps: int = 256,
    progress: bool = False,
    meta: dict[str, Any] | None = None,
) -> Path:
    """Roll ``policy`` (a :class:`~cosmos3_gym.policy.VectorPolicy`) in ``envs`` for
    ``num_steps`` vector steps and write the shards described in the module notes.

    ``envs`` must autoreset (``NEXT_STEP`` or ``SAME_STEP``); it is attached to the policy here.
    ``meta`` entries (e.g. where the model ran) are added to ``meta.json``.
    """
    from cosmos3_gym.progress import progress_bar

    if num_steps < 1 or shard_steps < 1:
        raise ValueError(
            f"num_steps and shard_steps must be >= 1; found {num_steps}, {shard_steps}"
        )
    mode = autoreset_mode(envs)
    if mode == AutoresetMode.DISABLED:
        raise ValueError("collect_rollouts needs an autoresetting env; found autoreset DISABLED")
    check_rollout_folder(out_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    feed = policy.attach(envs)
    obs, _ = feed.reset(seed=seed)
    num_envs = envs.num_envs
    # Rollout-wide id of each live record's first row; a record leaves once no queue holds it.
    first_id: WeakKeyDictionary[ChunkRecord, int] = WeakKeyDictionary()
    raw_dim = 0
    prev_done = np.zeros(num_envs, bool)
    shards: list[str] = []
    steps: list[dict[str, np.ndarray]] = []
    chunks: dict[str, list[Any]] = {k: [] for k in
                                    ("env", "episode", "index", "seed", "noise", "raw_actions")}
    chunk_base = 0
    bar = progress_bar(enabled=progress, total=num_steps, desc="rollout", unit="step")

    def flush(last_obs: Any | None) -> None:
        nonlocal steps, chunks, chunk_base
        data = {k: np.stack([s[k] for s in steps]) for k in steps[0]}
        data["chunk_ids"] = np.where(data["chunk_ids"] >= 0, data["chunk_ids"] - chunk_base, -1)
        data.update({
            "chunk_env": np.asarray(chunks["env"], np.int64),
            "chunk_episode": np.asarray(chunks["episode"], np.int64),
            "chunk_index": np.asarray(chunks["index"], np.int64),
            "chunk_seed": np.asarray(chunks["seed"], np.int64),
            "chunk_noise": np.asarray(chunks["noise"], np.float32).reshape(-1, *_tail(chunks)),
            "chunk_raw_actions": np.asarray(chunks["raw_actions"], np.float32),
        })
        if last_obs is not None:
            data.update(_flatten_obs(last_obs, "last_obs"))
        name = f"shard-{len(shards):05d}.npz"
        np.savez_compressed(out / name, **data)
        shards.append(name)
        chunk_base += len(chunks["env"])
        steps = []
        chunks = {k: [] for k in chunks}

    for t in range(num_steps):
        actions = policy.select_action(obs)
        record = policy.last_chunk_record
        if record is not None:
            first_id[record] = chunk_base + len(chunks["env"])
            raw_dim = record.raw_actions.shape[-1]
            for row, env in enumerate(record.env_indices):
                chunks["env"].append(int(env))
                chunks["episode"].append(int(record.episode_indices[row]))
                chunks["index"].append(int(record.chunk_indices[row]))
                chunks["seed"].append(int(record.seeds[row]))
                chunks["noise"].append(record.action_noise[row])
                chunks["raw_actions"].append(record.raw_actions[row])
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
        steps.append(step)
        prev_done = np.logical_or(terminations, truncations)
        bar.update(1)
        if len(steps) == shard_steps or t == num_steps - 1:
            flush(obs if t == num_steps - 1 else None)
    bar.close()
    info = {"schema_version": SCHEMA_VERSION, "num_envs": num_envs, "autoreset_mode": mode.value,
            "num_steps": num_steps, "shards": shards, **(meta or {})}
    (out / "meta.json").write_text(json.dumps(info, indent=2) + "\n")
    return out


def check_rollout_folder(out_dir: str | Path) -> None:
    """Refuse a folder that holds rollouts already (``meta.json`` or shards): new shards would
    overwrite or mix with them, and rollouts do not resume."""
    out = Path(out_dir)
    held = sorted(p.name for p in [out / "meta.json", *out.glob("shard-*.npz")] if p.exists())
    if held:
        raise FileExistsError(
            f"{out} already holds rollouts ({', '.join(held[:3])}{', ...' if len(held) > 3 else ''}"
            "); expected a new or empty folder"
        )


def _tail(chunks: dict[str, list[Any]]) -> tuple[int, ...]:
    return tuple(chunks["noise"][0].shape) if chunks["noise"] else (0, 64)


def load_rollouts(out_dir: str | Path) -> dict[str, Any]:
    """All shards of ``out_dir`` concatenated (time-major), chunk ids made global; plus ``meta``."""
    out = Path(out_dir)
    meta_path = out / "meta.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"no meta.json in {out}; expected a folder written by "
                                "collect_rollouts")
    meta = json.loads(meta_path.read_text())
    if meta.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(f"rollout schema_version {meta.get('schema_version')}; expected "
                         f"{SCHEMA_VERSION}")
    parts: dict[str, list[np.ndarray]] = {}
    offset = 0
    for name in meta["shards"]:
        with np.load(out / name) as shard:
            data = {k: shard[k] for k in shard.files}
        data["chunk_ids"] = np.where(data["chunk_ids"] >= 0, data["chunk_ids"] + offset, -1)
        offset += len(data["chunk_env"])
        for k, v in data.items():
            parts.setdefault(k, []).append(v)
    merged: dict[str, Any] = {}
    for k, vs in parts.items():
        merged[k] = vs[-1] if k.startswith("last_obs") else np.concatenate(vs)
    merged["meta"] = meta
    return merged


def run_rollout_command(args: Any) -> Path:
    """``cosmos3-gym rollout``: the built env, the policy, then :func:`collect_rollouts`."""
    from gymnasium.vector import AutoresetMode as Mode

    from cosmos3_gym.devices import resolve_device, resolve_dtype
    from cosmos3_gym.eval.evaluate import load_pipeline
    from cosmos3_gym.eval.synthetic import synthetic_adapter, synthetic_pipeline, view_size
    from cosmos3_gym.eval.tasks import make_eval_env
    from cosmos3_gym.policy import VectorPolicy, get_adapter

    check_rollout_folder(args.out)  # before the env and the model load
    image_size = view_size(args.env, args.synthetic, args.image_size)
    eval_env = make_eval_env(args.env, suite=args.suite, tasks=args.tasks,
                             image_size=image_size, max_episode_steps=args.max_episode_steps,
                             step_budget=args.step_budget)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    from cosmos3_gym.pipeline import InferenceOptions

    options = InferenceOptions(fp8=getattr(args, "precision", "bf16") == "fp8")
    if args.synthetic is not None:
        pipeline = synthetic_pipeline(args.synthetic, device=device, dtype=dtype, options=options)
        adapter = synthetic_adapter(eval_env)
    else:
        pipeline = load_pipeline(args.checkpoint, args.domain, args.action_stats, device=device,
                                 dtype=dtype, options=options)
        adapter = get_adapter(eval_env.adapter)
    # Tasks are assigned to envs round-robin; episodes follow each other by autoreset.
    envs = eval_env.make(args.num_envs, args.async_envs, autoreset_mode=Mode.NEXT_STEP)
    policy = VectorPolicy(pipeline, adapter=adapter,
                          n_action_steps=args.n_action_steps, seed=args.seed,
                          stochastic=not args.deterministic,
                          num_inference_steps=args.num_inference_steps)
    runtime = {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
               "synthetic": args.synthetic, "options": asdict(pipeline.options)}
    fps = float(envs.metadata.get("render_fps") or 20)
    try:
        out = collect_rollouts(policy, envs, args.steps, args.out, seed=args.seed,
                               shard_steps=args.shard_steps, progress=not args.no_progress,
                               meta=runtime)
    finally:
        envs.close()
    if getattr(args, "format", "npz") == "lerobot":
        from cosmos3_gym.integrations.lerobot_dataset import write_lerobot_dataset

        write_lerobot_dataset(out, Path(out) / "lerobot", fps=fps)
    return out
