"""``cosmos3-gym rollout``: RL rollouts of a checkpoint into a folder of ``.npz`` shards.

The collection, its format and its resume are the library's
(:func:`cosmos3_gym.runner.collect_rollouts`, :mod:`cosmos3_gym.runner.rollouts`); this module
turns the command's settings (:class:`RolloutConfig`) into the env, the pipeline and the policy,
checks them before the model loads, and prints what was written.
"""

from __future__ import annotations

import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cosmos3_gym.jsonio import read_json_object
from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.runner import RunFolder, RunMismatch, load_rollouts
from cosmos3_gym.runner.folder import identity_differences
from cosmos3_gym.runner.rollouts import META, PROGRESS, read_state
from cosmos3_gym.settings import (
    EnvSettings,
    ModelSettings,
    RuntimeSettings,
    positive_int,
    setting,
    stored_model_source,
)

# Settings that do not change which rollouts a folder holds (where and how fast the model
# and the envs run, how the run shows its progress).
RUN_ONLY = ("device", "progress", "overlap", "env_timeout", "async_envs")


@dataclass
class RolloutConfig(ModelSettings, RuntimeSettings, EnvSettings):
    """Every knob of ``cosmos3-gym rollout`` (its options are generated from these fields)."""

    env_steps: int = setting(
        256, "vector env steps to collect; every slot takes this many steps", group="rollout",
        parse=positive_int)
    shard_steps: int = setting(256, "steps per .npz shard", group="rollout", parse=positive_int)
    seed: int = setting(
        0, "the run's root seed; the episodes' env seeds and the chunks' noise derive from it",
        group="rollout", parse=int)
    n_action_steps: int | None = setting(
        None, "actions executed per chunk before replanning; default: the whole chunk (a "
        "stochastic sampler's log-probability covers these)", group="rollout",
        parse=positive_int)
    format: str = setting(
        "npz", "what is written: npz shards, or lerobot: the shards and, in OUT/lerobot, their "
        "finished episodes as a LeRobot dataset (needs LeRobot)", group="rollout",
        choices=("npz", "lerobot"))
    sampling: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)

    def __post_init__(self) -> None:
        self.check_model_source()
        if isinstance(self.sampling, dict):  # a config file's nested block
            self.sampling = SamplerConfig(**self.sampling)
        if self.sampling.noise is None:
            self.sampling = self.sampling.with_changes(noise="per_chunk")
        for name in ("env_steps", "shard_steps", "num_envs"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer of at least 1; found {value!r}")
        self.check_runtime()

    def identity(self) -> dict[str, Any]:
        """The settings that decide the rollouts (the folder's ``rollout.json`` keeps them)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in (*RUN_ONLY, "sampling")}
        return {**flat, **dataclasses.asdict(self.sampling)}


def check_rollout_folder(out: Path, command: dict[str, Any]) -> None:
    """Before anything loads: refuse a folder that holds another command's rollouts, or
    rollouts this command did not write (a rerun of the same command resumes or, complete,
    runs nothing), or one another run holds. Nothing is written (the folder is not even
    made): :func:`~cosmos3_gym.runner.collect_rollouts` takes its lock and checks again."""
    RunFolder(out, kind="rollouts").check_free()
    if not out.is_dir():
        return
    state = read_state(out)
    if not state.shards:
        return
    stored = read_json_object(out / PROGRESS, what="rollout progress file")
    diff = identity_differences(
        stored_model_source(stored.get("identity", {}).get("command") or {}), command)
    if diff:
        raise RunMismatch(f"{out} holds rollouts of another command; refusing to mix them. "
                          f"Differences: {diff}. Use a new --out, or rerun with the stored "
                          "settings")


def run_rollout_command(config: RolloutConfig, out: str | Path) -> Path:
    """``cosmos3-gym rollout``: the env, the policy, then :func:`collect_rollouts`."""
    from cosmos3_gym.synthetic import view_size

    cfg, out = config, Path(out)
    # The run's identity; checked against the folder before the env and the model load.
    command = cfg.identity()
    if cfg.synthetic is None:
        from cosmos3_gym.checkpoint import (
            check_action_stats,
            check_files,
            checkpoint_policy,
            resolve_checkpoint,
        )

        check_files(resolve_checkpoint(cfg.checkpoint), vae=cfg.vae, tokenizer=cfg.tokenizer)
        # The head's statistics (the checkpoint's own, or --action-stats) for its mode.
        head = checkpoint_policy(cfg.checkpoint, **cfg.checkpoint_options())
        if head is not None and head.denormalizes:
            check_action_stats(head.stats, head,
                               f"--checkpoint {cfg.checkpoint}'s action statistics")
    check_rollout_folder(out, command)
    if cfg.format == "lerobot":
        from cosmos3_gym.integrations.lerobot_dataset import check_lerobot_dataset

        check_lerobot_dataset()
    image_size = view_size(cfg.env, cfg.synthetic, cfg.image_size)
    eval_env = cfg.make_env(image_size=image_size)
    # The env's own checks (a gym:ID env is built and reset once here), before the model loads.
    space = eval_env.single_action_space()
    eval_env.check_success()
    # Every check above needs no model: torch loads from here on.
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline, InferenceOptions
    from cosmos3_gym.policy import VectorPolicy, get_adapter
    from cosmos3_gym.policy.adapters import action_map_of, adapter_for_contract, with_action_map
    from cosmos3_gym.runner import collect_rollouts
    from cosmos3_gym.synthetic import synthetic_adapter, synthetic_pipeline

    device, dtype, fp8 = cfg.resolve_runtime()
    options = InferenceOptions(fp8=fp8)
    if cfg.synthetic is not None:
        pipeline = synthetic_pipeline(cfg.synthetic, device=device, dtype=dtype, options=options,
                                      eval_env=eval_env)
        adapter = synthetic_adapter(eval_env)
    else:
        pipeline = Cosmos3ActionPipeline.from_pretrained(
            cfg.checkpoint, **cfg.checkpoint_options(), device=device, dtype=dtype,
            options=options)
        contract = pipeline.contract  # the checkpoint's declared conventions, else the env's
        adapter = (adapter_for_contract(contract, eval_env.adapter_options)
                   if contract is not None
                   else get_adapter(eval_env.adapter, **eval_env.adapter_options))
    adapter = with_action_map(adapter, action_map_of(cfg.action_map, eval_env), space)
    policy = VectorPolicy(pipeline, adapter=adapter, n_action_steps=cfg.n_action_steps,
                          seed=cfg.seed, sampling=cfg.sampling)
    runtime = {"device": str(device), "dtype": str(dtype).removeprefix("torch."),
               "synthetic": cfg.synthetic, "options": asdict(pipeline.options)}
    out = collect_rollouts(policy, eval_env, cfg.env_steps, out, num_envs=cfg.num_envs,
                           async_envs=cfg.async_envs, seed=cfg.seed,
                           shard_steps=cfg.shard_steps, progress=cfg.progress,
                           overlap=cfg.overlap, env_timeout=cfg.env_timeout,
                           provenance={"command": command, "checkpoint": cfg.checkpoint,
                                       "runtime": runtime},
                           session=asdict(cfg))
    if cfg.format == "lerobot":
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
