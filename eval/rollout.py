"""``cosmos3-gym rollout``: RL rollouts of a checkpoint into a folder of ``.npz`` shards.

The collection, its format and its resume are the library's
(:func:`cosmos3_gym.runner.collect_rollouts`, :mod:`cosmos3_gym.runner.rollouts`); this module
turns the command's arguments into the env, the pipeline and the policy, checks them before the
model loads, and prints what was written.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from cosmos3_gym.jsonio import read_json_object
from cosmos3_gym.runner import RunFolder, RunMismatch, load_rollouts
from cosmos3_gym.runner.folder import identity_differences
from cosmos3_gym.runner.rollouts import META, PROGRESS, read_state

# Command-line settings that do not change which rollouts a folder holds (where the model
# runs, how the run shows its progress, the folder's own name).
NOT_IDENTITY = ("no_progress", "command", "device", "out", "overlap", "env_timeout")


def rollout_command_identity(args: Any) -> dict[str, Any]:
    """The command's settings that decide the rollouts (stored in the folder's provenance)."""
    return {k: v for k, v in sorted(vars(args).items()) if k not in NOT_IDENTITY}


def check_rollout_folder(out: Path, command: dict[str, Any]) -> None:
    """Before anything loads: refuse a folder that holds another command's rollouts, or
    rollouts this command did not write (a rerun of the same command resumes or, complete,
    runs nothing), or one another run holds."""
    with RunFolder(out):
        state = read_state(out)
        if not state.shards:
            return
        stored = read_json_object(out / PROGRESS, what="rollout progress file")
        diff = identity_differences(stored.get("identity", {}).get("command") or {}, command)
        if diff:
            raise RunMismatch(f"{out} holds rollouts of another command; refusing to mix them. "
                              f"Differences: {diff}. Use a new --out, or rerun with the stored "
                              "settings")


def run_rollout_command(args: Any) -> Path:
    """``cosmos3-gym rollout``: the env, the policy, then :func:`collect_rollouts`."""
    from cosmos3_gym.devices import resolve_device, resolve_dtype
    from cosmos3_gym.envs import make_eval_env
    from cosmos3_gym.eval.synthetic import synthetic_adapter, synthetic_pipeline, view_size
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline, InferenceOptions
    from cosmos3_gym.policy import VectorPolicy, get_adapter
    from cosmos3_gym.policy.adapters import with_action_map
    from cosmos3_gym.runner import collect_rollouts

    out = Path(args.out)
    # The run's identity; checked against the folder before the env and the model load (any
    # GPU gives the same rollouts, so --device is not part of it; --dtype is).
    command = rollout_command_identity(args)
    if args.synthetic is None:
        from cosmos3_gym.checkpoint import check_files, resolve_checkpoint

        check_files(resolve_checkpoint(args.checkpoint))
    check_rollout_folder(out, command)
    image_size = view_size(args.env, args.synthetic, args.image_size)
    eval_env = make_eval_env(args.env, suite=args.suite, tasks=args.tasks,
                             image_size=image_size, max_episode_steps=args.max_episode_steps,
                             step_budget=args.step_budget, prompt=args.prompt,
                             import_modules=args.import_modules, env_kwargs=args.env_kwargs,
                             success_key=args.success_key)
    device = resolve_device(args.device)
    dtype = resolve_dtype(args.dtype, device)
    options = InferenceOptions(fp8=getattr(args, "precision", "bf16") == "fp8")
    if args.synthetic is not None:
        pipeline = synthetic_pipeline(args.synthetic, device=device, dtype=dtype, options=options,
                                      eval_env=eval_env)
        adapter = synthetic_adapter(eval_env)
    else:
        pipeline = Cosmos3ActionPipeline.from_pretrained(
            args.checkpoint, domain=args.domain, action_stats=args.action_stats, device=device,
            dtype=dtype, options=options)
        adapter = get_adapter(eval_env.adapter)
    adapter = with_action_map(adapter, args.action_map, eval_env.single_action_space())
    policy = VectorPolicy(pipeline, adapter=adapter,
                          n_action_steps=args.n_action_steps, seed=args.seed,
                          stochastic=not args.deterministic,
                          num_inference_steps=args.num_inference_steps,
                          sampler=args.sampler, noise_level=args.noise_level,
                          sde_steps=args.sde_steps)
    runtime = {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
               "synthetic": args.synthetic, "options": asdict(pipeline.options)}
    out = collect_rollouts(policy, eval_env, args.steps, out, num_envs=args.num_envs,
                           async_envs=args.async_envs, seed=args.seed,
                           shard_steps=args.shard_steps, progress=not args.no_progress,
                           overlap=getattr(args, "overlap", False),
                           provenance={"command": command, "checkpoint": args.checkpoint,
                                       "runtime": runtime})
    if getattr(args, "format", "npz") == "lerobot":
        from cosmos3_gym.integrations.lerobot_dataset import write_lerobot_dataset

        envs = eval_env.make(1, False)
        fps = float(envs.metadata.get("render_fps") or 20)
        envs.close()
        write_lerobot_dataset(out, out / "lerobot", fps=fps)
    print(summary_line(out))
    return out


def summary_line(out: Path) -> str:
    """What a rollout folder holds, in one line."""
    data = load_rollouts(out)
    finished = int(data["episode_finished"].sum()) if "episode_finished" in data else 0
    successes = int((data["episode_success"] & data["episode_finished"]).sum()) \
        if "episode_success" in data else 0
    steps, envs = data["actions"].shape[:2]
    return (f"{out}: {steps} steps x {envs} envs in {len(data['meta']['shards'])} shards, "
            f"{len(data['chunk_env'])} chunks, {finished} finished episodes "
            f"({successes} successes), {len(data['meta']['parts'])} part(s); see {META}")
