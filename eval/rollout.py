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
    LatencySettings,
    ModelSettings,
    RuntimeSettings,
    check_settings,
    latency_values,
    positive_int,
    seed_value,
    setting,
    stored_latency,
    stored_model_source,
)

# Settings that do not change which rollouts a folder holds (where and how fast the model
# and the envs run, how the run shows its progress).
RUN_ONLY = ("device", "progress", "overlap", "env_timeout", "async_envs")


@dataclass
class RolloutConfig(LatencySettings, ModelSettings, RuntimeSettings, EnvSettings):
    """Every knob of ``cosmos3-gym rollout`` (its options are generated from these fields)."""

    env_steps: int = setting(
        256, "vector env steps to collect; every slot takes this many steps", group="rollout",
        parse=positive_int)
    shard_steps: int = setting(256, "steps per .npz shard", group="rollout", parse=positive_int)
    seed: int = setting(
        0, "the run's root seed; the episodes' env seeds and the chunks' noise derive from it",
        group="rollout", parse=seed_value)
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
        """Each setting against its declared rule; nothing rewritten (:meth:`resolved`)."""
        check_settings(self)
        self.check_model_source()
        self.check_latency()
        values = self.latencies()
        if len(values) > 1:
            raise ValueError(f"--latency {self.latency}: a rollout runs one latency (a sweep's "
                             "arms are evaluations: cosmos3-gym eval); give one value")
        if values[0].kind == "replay":
            raise ValueError(f"--latency {self.latency}: a replay reads an evaluation's episode "
                             "records; a rollout takes 0, a duration, steps or measured")
        if not isinstance(self.sampling, SamplerConfig):
            raise ValueError(f"sampling must be a SamplerConfig; found "
                             f"{type(self.sampling).__name__}")

    def resolved(self) -> RolloutConfig:
        """These settings with the run's defaults filled in (once, by
        :func:`~cosmos3_gym.eval.run.resolve`): the shipped checkpoint where none is named,
        fresh noise per chunk, the env's image size for a synthetic model."""
        from cosmos3_gym.synthetic import view_size

        changes: dict[str, Any] = {
            **self.model_defaults(),
            "image_size": view_size(self.env, self.synthetic, self.image_size),
            "latency": latency_values(self.latency)}
        if self.sampling.noise is None:
            changes["sampling"] = self.sampling.with_changes(noise="per_chunk")
        return dataclasses.replace(self, **changes)

    def check_run(self, model: Any, env: Any, rank: Any) -> None:
        """Rollouts' own checks of a resolved run: the success signal the env must report, and
        LeRobot where the rollouts are to become a LeRobot dataset."""
        if self.format == "lerobot":
            from cosmos3_gym.integrations.lerobot_dataset import check_lerobot_dataset

            check_lerobot_dataset()
        env.check_success()

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
        stored_latency(stored_model_source(stored.get("identity", {}).get("command") or {})),
        command)
    if diff:
        raise RunMismatch(f"{out} holds rollouts of another command; refusing to mix them. "
                          f"Differences: {diff}. Use a new --out, or rerun with the stored "
                          "settings")


def run_rollout_command(config: RolloutConfig, out: str | Path) -> Path:
    """``cosmos3-gym rollout``: the run resolved (every check before the model loads), the
    folder checked against the stored command, then :func:`collect_rollouts`."""
    from cosmos3_gym.eval.run import resolve

    out = Path(out)
    run = resolve(config, out, kind="rollouts")
    cfg = run.settings
    command = cfg.identity()
    if run.model.revision is not None:  # the weights themselves: the identity's weights hash
        command["checkpoint_revision"] = run.model.revision
    check_rollout_folder(out, command)
    # Every check above needs no model: torch loads from here on.
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.runner import collect_rollouts

    pipeline = run.load()
    policy = VectorPolicy(pipeline, adapter=run.adapter, n_action_steps=cfg.n_action_steps,
                          seed=cfg.seed, sampling=cfg.sampling, realtime=run.realtime)
    runtime = {"device": str(run.runtime.device), "dtype": run.runtime.record()["dtype"],
               "synthetic": cfg.synthetic, "options": asdict(pipeline.options)}
    out = collect_rollouts(policy, run.env, cfg.env_steps, out, num_envs=cfg.num_envs,
                           async_envs=cfg.async_envs, seed=cfg.seed,
                           shard_steps=cfg.shard_steps, progress=cfg.progress,
                           overlap=cfg.overlap, env_timeout=cfg.env_timeout,
                           provenance={"command": command, "checkpoint": cfg.checkpoint,
                                       "runtime": runtime},
                           session=asdict(cfg))
    if cfg.format == "lerobot":
        from cosmos3_gym.integrations.lerobot_dataset import write_lerobot_dataset

        envs = run.env.make(1, False)
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
