"""Success-rate evaluation: a run's episodes over the episode runner, resumable and recorded.

:class:`EvalConfig` holds every setting of ``cosmos3-gym eval``; :func:`evaluate` runs (or
resumes) one into a folder and returns its ``results.json`` document. An episode is
``(task, trial)``, a function of the run's seed, whichever slot or rank runs it; the folder holds
one run's identity, and the same settings resume it.

Design and guarantees: docs/evaluation.md ("Resume, and what a run is", "When an env crashes
or hangs").
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosmos3_gym.envs import Episode, EvalEnv, canonical_suites
from cosmos3_gym.envs.names import upgrade_env_identity
from cosmos3_gym.eval import protocol as protocols
from cosmos3_gym.eval import results as results_io
from cosmos3_gym.eval import robustness
from cosmos3_gym.eval.arms import Arm
from cosmos3_gym.eval.distributed import (
    RankInfo,
    barrier,
    destroy_process_group,
    exchange_files,
    init_process_group,
)
from cosmos3_gym.eval.latency import describe as describe_latency
from cosmos3_gym.eval.latency import latency_arms
from cosmos3_gym.eval.report import ResultsPlot
from cosmos3_gym.eval.run import Run, check_action_units, resolve
from cosmos3_gym.eval.shards import check_shard, parse_shard, shard_episodes
from cosmos3_gym.eval.videos import (
    ImaginedChunk,
    episode_video_stem,
    imagined_errors,
    imagined_frames,
    mp4_available,
    unused_path,
    write_video,
)
from cosmos3_gym.jsonio import append_jsonl, atomic_write, read_json_object, write_json_atomic
from cosmos3_gym.pipeline.sampling import SamplerConfig
from cosmos3_gym.policy import Adapter, VectorPolicy
from cosmos3_gym.progress import progress_bar
from cosmos3_gym.runner import (
    EpisodeList,
    EpisodeResult,
    EpisodeRunner,
    EpisodeSpec,
    PlannedChunks,
    RunFolder,
    RunnerOptions,
    RunObserver,
    StepRow,
    episode_seed_rule,
)
from cosmos3_gym.settings import (
    EnvSettings,
    LatencySettings,
    ModelSettings,
    RuntimeSettings,
    check_settings,
    csv,
    latency_values,
    positive_int,
    seed_value,
    setting,
    shard_spec,
    stored_latency,
    stored_model_source,
)
from cosmos3_gym.source import ModelSource

# What an evaluation adds to the shared settings: these, the model's, the env's and the
# sampler's decide which episodes a folder holds; num_envs, async_envs, overlap, timeouts,
# restart budgets, videos and where the model runs only change how fast or how robustly the
# same episodes are produced, so they may change between sessions.
RUN_ONLY = ("num_envs", "async_envs", "env_timeout", "overlap", "videos", "video_trials",
            "max_episode_restarts", "max_consecutive_faults", "device", "progress", "precision",
            "allow_normalized_actions")
# The settings that make one run several arms (eval/arms.py): an arm's own settings hold none of
# them, so each arm is the evaluation its settings alone would make. (A latency sweep's arms
# each set latency to one of its values: EvalConfig.arm_flags.)
ARM_SETTINGS = ("perturbations", "repeats")
# --videos: the env's frames, or the model's input and predicted future beside them.
VIDEO_KINDS = ("env", "imagined")


@dataclass
class EvalConfig(LatencySettings, ModelSettings, RuntimeSettings, EnvSettings):
    """Every knob of an evaluation, with its default and why (the ``cosmos3-gym eval``
    options are generated from these fields)."""

    trials: int | None = setting(
        None, "episodes per task; 10, or 50 under --protocol official", group="evaluation",
        parse=positive_int)
    seed: int = setting(
        0, "the run's root seed; every episode's env seed and chunk noise seeds derive from it "
        "and its (task, trial)", group="evaluation", parse=seed_value)
    n_action_steps: int | None = setting(
        None, "actions executed per chunk before replanning; default: the whole chunk",
        group="evaluation", parse=positive_int)
    protocol: str | None = setting(
        None, "the evaluation protocol: default (fresh noise per chunk, --trials as given) or "
        "official (the rules behind NVIDIA's published LIBERO numbers: 50 trials per task, init "
        "state t, the client's budget, whole chunks, every chunk from seed 0, the checkpoint's "
        "sampler; docs/libero.md)", group="evaluation", choices=("default", "official"))
    out_of_range: str = setting(
        "report", "actions outside the action space: report (count them; the env applies its "
        "own handling) or fail (the episode fails)", group="evaluation",
        choices=("report", "fail"))
    max_episode_restarts: int = setting(
        2, "times an episode whose own env faulted is re-run before it is recorded as a "
        "failure", group="evaluation", parse=int)
    max_consecutive_faults: int = setting(
        5, "env faults in a row with no episode ending before the run gives up",
        group="evaluation", parse=int)
    videos: str | None = setting(
        None, "a video per episode in OUT/videos: env (the env's frames, GIF) or imagined (the "
        "model's input, its predicted future and the env's frames side by side; decodes the "
        "future, so it costs time)", group="evaluation", choices=VIDEO_KINDS, const="env")
    video_trials: int | None = setting(
        None, "videos for the first N trials of each task only (default: every trial)",
        group="evaluation", parse=int, metavar="N")
    shard: str | None = setting(
        None, "run shard I of N of the run's episodes (I/N, 0 <= I < N) into its own folder: a "
        "balanced share of every task's trials, dealt from the run's seed; `cosmos3-gym merge` "
        "joins the N folders into the one a single run writes", group="evaluation",
        parse=shard_spec, metavar="I/N")
    shuffle_prompts: bool = setting(
        False, "diagnostic: each episode gets another task's prompt; a policy that reads its "
        "prompt should then drop to chance", group="evaluation")
    allow_normalized_actions: bool = setting(
        False, "run a checkpoint without action statistics in an env with real units (LIBERO); "
        "its actions then stay in the model's normalised space", group="evaluation")
    perturbations: tuple[str, ...] | None = setting(
        None, "robustness: LIBERO-PRO's perturbations of --suite, each run as an arm beside the "
        "suite itself (the control) on the same episodes and reported as its paired difference "
        "to it; all, or some of language,task,object,position,distractor (docs/libero.md, "
        "Robustness)", group="evaluation", parse=csv, metavar="DIMS")
    repeats: int | None = setting(
        None, "how many times each measurement runs; here every episode, K >= 2 times, each "
        "time with the same env seed and init state and fresh noise: the noise floor, reported "
        "as test-retest agreement and per-task spread (with --noise fixed agreement must be "
        "100%)", group="evaluation",
        parse=positive_int, metavar="K")
    repeat: int = setting(
        0, "the noise draw of the episodes: chunk noise seeds are mixed with it (0: the run's "
        "own draw; --repeats runs 0..K-1)", group="evaluation", parse=int, cli=False)
    sampling: SamplerConfig = dataclasses.field(default_factory=SamplerConfig)

    def __post_init__(self) -> None:
        """Each setting checked against its declared rule (one place: ``check_settings``), and
        the rules that tie settings together; nothing is rewritten (:meth:`resolved` fills in
        the defaults, once, when the run is resolved)."""
        check_settings(self)
        self.check_model_source()
        self.check_latency()
        self.runner_options()  # the runner's own rules (restarts, timeouts, overlap), its home
        if self.video_trials is not None and self.video_trials < 0:
            raise ValueError(f"video_trials must be an integer >= 0; found {self.video_trials!r}")
        if self.repeat < 0:
            raise ValueError(f"repeat must be an integer >= 0; found {self.repeat!r}")
        robustness.check(self)
        self.check_one_kind_of_arms()
        if not isinstance(self.sampling, SamplerConfig):
            raise ValueError(f"sampling must be a SamplerConfig; found "
                             f"{type(self.sampling).__name__}")
        protocols.check(self)

    def runner_options(self, num_envs: int | None = None) -> RunnerOptions:
        """How the episode runner steps this evaluation's envs (``num_envs``: the slots this
        session runs, at most the setting's). Made when the settings are, so the runner's rules
        refuse a bad value before anything runs."""
        # A session with one slot left to run (a resume's last episode) cannot take turns.
        slots = self.num_envs if num_envs is None else num_envs
        overlap = self.overlap if num_envs is None else self.overlap and slots >= 2
        return RunnerOptions(
            num_envs=slots, async_envs=self.async_envs, env_timeout=self.env_timeout,
            max_episode_restarts=self.max_episode_restarts,
            max_consecutive_faults=self.max_consecutive_faults, out_of_range=self.out_of_range,
            faults="restart", overlap=overlap)

    def resolved(self) -> EvalConfig:
        """These settings with every default the run takes filled in: the shipped checkpoint
        where none is named, the canonical suite names, the protocol's trials and noise rule, the
        env's image size for a synthetic model. Called once, by
        :func:`cosmos3_gym.eval.run.resolve`; a resolved config resolves to itself."""
        from cosmos3_gym.synthetic import view_size

        protocol = None if self.protocol == "default" else self.protocol
        changes: dict[str, Any] = {
            **self.model_defaults(), "protocol": protocol, "suite": canonical_suites(self.suite),
            "trials": self.trials or protocols.default_trials(protocol),
            "image_size": view_size(self.env, self.synthetic, self.image_size),
            "perturbations": robustness.canonical_perturbations(self),
            "latency": latency_values(self.latency)}
        if self.sampling.noise is None:  # the protocol's rule
            changes["sampling"] = self.sampling.with_changes(
                noise="fixed" if protocol == "official" else "per_chunk")
        return dataclasses.replace(self, **changes)

    def for_arm(self, changes: dict[str, Any]) -> EvalConfig:
        """The settings of one arm of this run (:func:`~cosmos3_gym.eval.arms.run_arms`):
        these with ``changes``, without the settings that made the arms (:data:`ARM_SETTINGS`)."""
        return dataclasses.replace(self, **{name: None for name in ARM_SETTINGS}, **changes)

    def arm_flags(self) -> list[str]:
        """The settings of this run that make it several arms, as flags: ``--perturbations``,
        ``--repeats`` (:mod:`~cosmos3_gym.eval.robustness`), ``--latency`` with a comma list
        (a sweep: :func:`~cosmos3_gym.eval.latency.latency_arms`); empty for one evaluation."""
        flags = [f"--{name}" for name in ARM_SETTINGS if getattr(self, name) is not None]
        if len(self.latencies()) > 1:
            flags.append(f"--latency {self.latency}")
        return flags

    def check_one_kind_of_arms(self) -> None:
        """A latency sweep with ``--perturbations`` or ``--repeats`` is refused: a run of arms
        compares each arm with one control on the same episodes, and crossing two kinds of arms
        would need a control per latency (or per suite), which one arms run does not hold. A
        single ``--latency`` value with them is one setting of every arm, and runs."""
        flags = self.arm_flags()
        if len(flags) > 1 and flags[-1].startswith("--latency"):
            raise ValueError(
                f"{flags[-1]} with {' and '.join(flags[:-1])}: one kind of arms at a time (a run "
                "of arms compares each arm with one control, and a sweep crossed with "
                f"{' and '.join(flags[:-1])} would need a control per latency); run "
                f"{' and '.join(flags[:-1])} once per --latency value, or the sweep alone")

    def check_run(self, model: ModelSource, env: EvalEnv, rank: RankInfo) -> None:
        """An evaluation's own checks of a resolved run (:func:`~cosmos3_gym.eval.run.resolve`):
        the actions' units, the success signal the env must report, and a shard's share (one
        run's, never a run of arms)."""
        check_action_units(self, model, env)
        env.check_success()
        check_shard(self.shard, len(env.tasks), self.trials)
        arms = self.arm_flags()
        if self.shard is not None and arms:
            own = " and ".join(f"--{name}" for name in ARM_SETTINGS
                               if getattr(self, name) is not None)
            raise ValueError(f"--shard {self.shard} with {' and '.join(arms)}: a shard is a share "
                             "of one run's episodes, and merge joins single runs, not arms; "
                             "shard each arm's own command instead (the arm's settings"
                             + (f" without {own}" if own else ", one --latency value each")
                             + ")")

    def identity(self) -> dict[str, Any]:
        """The settings that decide which episodes a run folder holds (the model's precision is
        added as resolved on the machine: see :meth:`Evaluator.bind`)."""
        flat = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in (*RUN_ONLY, "sampling")}
        return {**flat, **dataclasses.asdict(self.sampling)}


def upgrade_identity(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """A folder's stored identity in today's terms: keys added since it was written read as
    the values that run had (its dtype float32 on the CPU, its precision from its dtype, the
    protocol's noise rule, the default sampler), so an older folder resumes. A folder written
    before the weights' fingerprint was recorded holds none: it is taken as this run's (the
    folder's checkpoint is named in it all the same)."""
    out = stored_latency(stored_model_source(dict(stored)))
    if "weights" not in out and "weights" in current:
        out["weights"] = current["weights"]
    out.setdefault("dtype", "float32")
    if out.get("precision") is None:
        out["precision"] = {"float32": "fp32", "bfloat16": "bf16"}.get(out["dtype"])
    out.setdefault("noise", "fixed" if out.get("protocol") == "official" else "per_chunk")
    out.setdefault("shard", None)  # before shards: the whole run
    for key, value in (("sampler", "flow_unipc"), ("noise_level", 0.5), ("sde_steps", "random"),
                       ("perturbations", None), ("repeats", None), ("repeat", 0)):
        out.setdefault(key, value)
    if str(out.get("env", "")).startswith("maniskill"):  # before GPU simulation was chosen
        out.setdefault("simulation", {"sim_backend": "physx_cpu", "vector_env": "sub_envs"})
    if isinstance(out.get("eval_env"), dict):  # an env handed to evaluate(..., eval_env=...)
        out["eval_env"] = upgrade_env_identity(out["eval_env"], current.get("eval_env"))
    return out


@dataclass
class _Recorded:
    """What the evaluation keeps of one episode in flight beyond the runner's counters."""

    episode: Episode
    records_video: bool
    frames: list[np.ndarray]
    imagined: list[ImaginedChunk]
    # Under real-time execution, each chunk's timing (ChunkTiming.row, with its chunk index).
    timing: list[dict[str, Any]]


class _Recorder(RunObserver):
    """Writes each finished episode's record (and video) and each incident as they happen."""

    def __init__(self, evaluator: Evaluator, bar: Any) -> None:
        self.evaluator, self.bar = evaluator, bar
        self.in_flight: dict[int, _Recorded] = {}  # by env slot
        self.successes = 0

    def episode_started(self, slot: int, spec: EpisodeSpec, obs: Any, step: int) -> None:
        ev = self.evaluator
        cfg = ev.config
        episode = spec.tag
        records_video = cfg.videos is not None and (
            cfg.video_trials is None or episode.trial < cfg.video_trials)
        kept = _Recorded(episode, records_video, [], [], [])
        if records_video:
            kept.frames.append(_frame(ev.adapter.images(obs)))
        self.in_flight[slot] = kept

    def chunks_planned(self, chunks: PlannedChunks) -> None:
        record = chunks.record
        if record.timing is not None:
            for row, slot in enumerate(chunks.slots.tolist()):
                self.in_flight[slot].timing.append(
                    {"chunk": int(record.chunk_indices[row]), **record.timing.row(row)})
        if record.video is None:
            return
        for row, slot in enumerate(chunks.slots.tolist()):
            if record.video[row] is not None:
                self.in_flight[slot].imagined.append(ImaginedChunk(
                    start=int(chunks.episode_steps[row]), prompt=record.prompts[row],
                    predicted=record.video[row]))

    def stepped(self, row: StepRow) -> None:
        images = self.evaluator.adapter.images
        for local, slot in enumerate(row.slots.tolist()):
            kept = self.in_flight.get(slot)
            if row.valid[local] and kept is not None and kept.records_video:
                kept.frames.append(_frame(images(_take(row.next_obs, local))))

    def episode_ended(self, result: EpisodeResult) -> None:
        kept = self.in_flight.pop(result.slot)
        success = self.evaluator.record_episode(result, kept)
        self.successes += bool(success)
        self.bar.update(1)
        finished = self.evaluator.finished
        if success is not None:
            self.bar.set_postfix(success=f"{self.successes / finished:.1%} "
                                         f"({self.successes}/{finished})")

    def fault(self, incident: dict[str, Any]) -> None:
        ev = self.evaluator
        for entry in incident["episodes"]:
            episode = entry.pop("tag")
            entry.update(task=episode.task, trial=episode.trial)
            kept = self.in_flight.get(entry["env_slot"])
            if kept is not None:  # its re-run starts from its first frame again
                kept.frames, kept.imagined, kept.timing = [], [], []
        append_jsonl(ev.incident_log, {**incident, "rank": ev.rank.rank})


def _members(episodes: Sequence[int]) -> Any:
    """``episodes`` for membership tests: a range as it is (any length, no memory), a shard's
    list as a set."""
    return episodes if isinstance(episodes, range) else frozenset(episodes)


def _frame(images: Any) -> np.ndarray:
    """A video's frame: the first image of a batch of one, on the host (a GPU simulator's
    frames are CUDA tensors)."""
    from cosmos3_gym.policy.observations import to_numpy

    return np.asarray(to_numpy(images[0]))


def _take(obs: Any, env: int) -> Any:
    from cosmos3_gym.policy.observations import take_envs

    return take_envs(obs, env)


class Evaluator:
    """Runs this process's share of an evaluation (a resolved :class:`~cosmos3_gym.eval.run.Run`
    of kind ``evaluation``) into its folder (docs/evaluation.md): the run's episodes, or under
    ``shard`` the shard's (:func:`~cosmos3_gym.eval.shards.shard_episodes`), every
    ``world_size``-th of them on this rank."""

    def __init__(self, run: Run) -> None:
        self.resolved = run
        self.config: EvalConfig = run.settings
        self.out_dir = run.out
        self.rank = run.rank
        self.eval_env = run.env
        self.adapter: Adapter = run.adapter
        self.model = run.model
        self.pipeline = run.model.pipeline
        self.all_episodes = self.eval_env.episodes(self.config.trials, self.config.seed)
        # The episodes this folder holds, by their index in the run (a shard's, or all).
        self.share: Sequence[int] = range(len(self.all_episodes))
        if self.config.shard is not None:
            self.share = shard_episodes(len(self.eval_env.tasks), self.config.trials,
                                        self.config.seed, *parse_shard(self.config.shard))
        self.episode_log = self.out_dir / results_io.episode_log_name(
            self.rank.rank, self.rank.world_size
        )
        self.incident_log = self.out_dir / results_io.incident_log_name(
            self.rank.rank, self.rank.world_size
        )
        self.env_steps = 0
        self.chunks = 0
        self.finished = 0
        self.already_done = 0
        # Seconds of this session in pipeline calls (chunk planning) and in the env (builds,
        # resets, steps: simulation and rendering); the rest of the wall time is the loop's.
        self.pipeline_s = 0.0
        self.env_s = 0.0
        # Whether the folder held every episode before this run (then it runs nothing).
        self.already_complete = False
        self.plot = ResultsPlot(self.out_dir)
        # results.json kept one episode at a time from the folder's logs (every rank's).
        self.tally = results_io.ResultsTally(self.eval_env.tasks, len(self.share))
        # The checkpoint's head as the run uses it (results.json records its sampler).
        self.head: Any = run.model.head

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any]:
        """Run the pending episodes of this rank, then return the run's results on every rank
        (rank 0 writes results.json and the plot). Under torchrun the ranks hand each other
        their logs at the end (:func:`~cosmos3_gym.eval.distributed.exchange_files`), so each
        rank's folder holds every record even where the ranks share no file system."""
        run = self.resolved
        with run.folder() as folder:
            owns_group = init_process_group(self.rank)
            try:
                finished = results_io.read_episode_records(self.out_dir)
                self.bind(folder, recorded=bool(finished))
                done = {self.all_episodes.index_of((r["task"], int(r["trial"])))
                        for r in finished}
                # Counted over what is done, never over the run (it may be of any length).
                share, mine = self.share, self.share[self.rank.rank::self.rank.world_size]
                held, held_here = _members(share), _members(mine)
                self.already_complete = sum(k in held for k in done) >= len(share)
                self.already_done = sum(k in held_here for k in done)
                pending = len(mine) - self.already_done
                if self.rank.is_main and finished and not self.already_complete:
                    print(results_io.resumed_line(self.out_dir, len(done),
                                                  len(self.all_episodes)), flush=True)
                if pending and self.pipeline is None:
                    self.pipeline = run.load()
                start = time.perf_counter()
                if pending:
                    self._run_episodes((k for k in mine if k not in done), len(mine))
                wall = time.perf_counter() - start
                if not self.already_complete:  # a complete folder keeps its last figures
                    write_json_atomic(
                        self.out_dir / self._throughput_name(),
                        {"episodes": self.finished, "env_steps": self.env_steps,
                         "chunks": self.chunks, "wall_s": wall, "pipeline_s": self.pipeline_s,
                         "env_s": self.env_s, **self._runtime()},
                    )
                barrier(self.rank)
                self._exchange_logs()
                if not self.rank.is_main:
                    return self.results(final=True)
                return self.write_results(final=True)
            finally:
                if owns_group:
                    destroy_process_group(self.rank)

    def bind(self, folder: RunFolder, *, recorded: bool) -> None:
        """Write ``config.json``, or refuse a folder that holds another evaluation's episodes
        (docs/evaluation.md, "Resume, and what a run is"). The identity holds the weights'
        fingerprint, computed here once per run: a folder never answers for other weights."""
        identity = self.resolved.identity(weights=self.model.fingerprint())

        def stale() -> list[Path]:
            return [*self.out_dir.glob("incidents*.jsonl"), *self.out_dir.glob("throughput*.json")]

        folder.bind("config.json", identity, bound=recorded,
                    extra={"session": asdict(self.config)}, replaced=stale,
                    what="a different evaluation",
                    upgrade=lambda stored: upgrade_identity(stored, identity))

    def _runtime(self) -> dict[str, Any]:
        """Where and how this session's model ran, for throughput*.json and the summary."""
        runtime = self.resolved.runtime
        options = getattr(self.pipeline, "options", None)
        gpu = None
        if runtime.device is not None and runtime.device.type == "cuda":
            import torch

            gpu = torch.cuda.get_device_name(runtime.device)
        return {
            "device": None if runtime.device is None else str(runtime.device), "gpu": gpu,
            "dtype": runtime.record()["dtype"], "synthetic": self.config.synthetic,
            "options": None if options is None else asdict(options),
            "disabled_options": dict(getattr(self.pipeline, "disabled_options", {}) or {}),
            "overlap": self.config.overlap,
        }

    def _throughput_name(self) -> str:
        ws = self.rank.world_size
        return "throughput.json" if ws == 1 else f"throughput.rank{self.rank.rank}.json"

    def _exchange_logs(self) -> None:
        """Under torchrun: every rank's own logs (episodes, incidents, timings) written into
        the folders of the ranks that lack them (none, where the folder is shared)."""
        if self.rank.world_size == 1:
            return
        own = [self.episode_log, self.incident_log, self.out_dir / self._throughput_name()]
        files = {p.name: p.read_bytes() for p in own if p.is_file()}
        for name, data in exchange_files(self.rank, files).items():
            path = self.out_dir / name
            if not path.exists():
                atomic_write(path, lambda f, data=data: f.write(data))

    def write_results(self, final: bool = False) -> dict[str, Any]:
        """Bring results.json up to date with every log in the folder and replace it
        atomically."""
        results = self.results(final)
        write_json_atomic(self.out_dir / "results.json", results)
        self.plot.update(results, final=final)
        return results

    def results(self, final: bool = False) -> dict[str, Any]:
        """The results.json document of every log in the folder (the lines appended since the
        last call are added to the tally; ``final``: with the sessions' timings)."""
        self.tally.follow(self.out_dir)
        throughput = None
        if final:
            parts = [read_json_object(p, what="throughput file")
                     for p in sorted(self.out_dir.glob("throughput*.json"))]
            throughput = results_io.merge_throughput(parts)
        simulation = self.eval_env.simulation
        return self.tally.results(
            config={**self.config.identity(),
                    **({"simulation": simulation} if simulation is not None else {})},
            incidents=results_io.read_incidents(self.out_dir),
            throughput=throughput,
            episode_budget=self.eval_env.episode_budget(),
            protocol=protocols.record(self.config, self.eval_env.init_state_rule, self.head),
            success_source=self.eval_env.success_rule.record(),
            latency_model=describe_latency(self.resolved.realtime),
        )

    # ------------------------------------------------------------------ the episodes

    def policy_for_run(self) -> VectorPolicy:
        """The policy the runner drives: the env's adapter, the evaluation's seed rule."""
        cfg = self.config
        rule = episode_seed_rule(cfg.seed, self.all_episodes.__getitem__,
                                 fresh=cfg.sampling.fresh_noise, repeat=cfg.repeat)
        return VectorPolicy(self.pipeline, adapter=self.adapter,
                            n_action_steps=cfg.n_action_steps, sampling=cfg.sampling,
                            seed_rule=rule, realtime=self.resolved.realtime)

    def spec(self, k: int) -> EpisodeSpec:
        """Episode ``k`` of the run (its canonical index) as the runner starts it."""
        cfg = self.config
        episode = self.all_episodes[k]
        prompt = (self.eval_env.shuffled_prompt(episode.task_index) if cfg.shuffle_prompts
                  else None)
        video = cfg.videos == "imagined" and (cfg.video_trials is None
                                              or episode.trial < cfg.video_trials)
        return EpisodeSpec(id=k, seed=episode.seed,
                           reset_options=self.eval_env.reset_options(episode), prompt=prompt,
                           video=video, rule_episode=k, tag=episode)

    def _run_episodes(self, pending: Any, total: int) -> None:
        cfg = self.config
        bar = progress_bar(enabled=cfg.progress, total=total, initial=self.already_done,
                           desc="eval", unit="ep", dynamic_ncols=True)
        # Never more slots than episodes to run (a 1-episode resume builds one env).
        queue = list(itertools.islice(pending, cfg.num_envs))
        pending = itertools.chain(queue, pending)
        num_slots = len(queue)
        options = cfg.runner_options(num_slots)
        runner = EpisodeRunner(
            self.policy_for_run(), lambda n: self.eval_env.make(n, cfg.async_envs),
            EpisodeList(self.spec(k) for k in pending), options, _Recorder(self, bar))
        try:
            runner.run()
        finally:
            bar.close()
            self.pipeline_s += runner.pipeline_s
            self.env_s += runner.env_s
            self.chunks += runner.chunks
            self.env_steps += runner.env_steps

    def record_episode(self, result: EpisodeResult, kept: _Recorded) -> bool | None:
        """Append one finished episode's record (and write its video); returns its outcome
        under the env's success rule (``None``: the rule is ``none``)."""
        ep = kept.episode
        error = result.error
        rule = self.eval_env.success_rule
        success = result.success if rule.counts else None
        if rule.counts and success is None:
            raise ValueError(
                f"episode {ep.task!r} trial {ep.trial} ended after {result.steps} steps with no "
                f"info['is_success'] at its last step, but its success is declared as "
                f"{rule.describe()}; nothing is counted that the env did not report: declare "
                "another source with --success (or --success none for returns only)")
        record = {
            "task": ep.task,
            "task_index": ep.task_index,
            "suite": ep.suite,
            "trial": ep.trial,
            "init_state_id": ep.init_state_id,
            "seed": ep.seed,
            "reset_options": self.eval_env.reset_options(ep),
            "prompt": result.prompt,
            "obs_sha256": result.obs_sha256,
            "steps": result.steps,
            "return": result.total_reward,
            "chunks": result.chunks,
            "success": success,
            "wall_time_s": result.wall_time_s,
            "invalid_action": result.invalid_action,
            "error": error,
            "out_of_range_steps": result.out_of_range_steps,
            "max_action_excess": result.max_action_excess,
            "clipped_steps": result.clipped_steps,
            "max_clip": result.max_clip,
            "restarts": result.restarts,
            "stalls": result.stalls,
            "env_slot": result.slot,
            "rank": self.rank.rank,
            "video": self._save_video(kept, bool(success)) if kept.records_video else None,
            # Predicted frames against the env's (eval/videos.py imagined_errors).
            "imagined": imagined_errors(kept.imagined, kept.frames) if kept.imagined else None,
        }
        if self.resolved.realtime is not None:  # each chunk's delay, what a replay reads back
            record["chunk_timing"] = kept.timing
        append_jsonl(self.episode_log, record)
        self.finished += 1
        if self.rank.is_main:
            self.write_results()
        return success

    def _save_video(self, kept: _Recorded, success: bool) -> str | None:
        if not kept.frames:
            return None
        ep = kept.episode
        folder = self.out_dir / "videos"
        folder.mkdir(exist_ok=True)
        stem = episode_video_stem(ep.task, ep.trial, ep.seed, success)
        if self.config.videos == "imagined" and kept.imagined:
            path = unused_path(folder, stem, ".mp4" if mp4_available() else ".gif")
            footer = (f"{ep.task} · trial {ep.trial} · seed {ep.seed} · "
                      f"{'success' if success else 'failure'}")
            write_video(path, imagined_frames(kept.imagined, kept.frames, footer))
        else:
            path = unused_path(folder, stem, ".gif")
            write_video(path, kept.frames)
        return str(path.relative_to(self.out_dir))


def run_eval_command(config: EvalConfig, out: str | Path) -> int:
    """``cosmos3-gym eval``: checks, the evaluation (or its arms), then its summary table."""
    # Every check that needs no model runs first (resolve): the device is resolved, and torch
    # imported, only after them, before anything is written.
    run_resolved(resolve(config, out, kind="evaluation"), summary=True)
    return 0


def arms_of(settings: EvalConfig) -> tuple[list[Arm], str, bool] | None:
    """The arms a resolved evaluation runs, its control arm and whether they measure the noise
    floor: a latency sweep's (:func:`~cosmos3_gym.eval.latency.latency_arms`), or the
    robustness arms (:func:`~cosmos3_gym.eval.robustness.arms_of`; the settings never make
    both: :meth:`EvalConfig.check_one_kind_of_arms`); ``None`` for one evaluation."""
    sweep = latency_arms(settings)
    if sweep is not None:
        arms, control = sweep
        return arms, control, False
    return robustness.arms_of(settings)


def run_resolved(run: Run, *, summary: bool) -> dict[str, Any] | None:
    """Run a resolved evaluation: one, or the arms its settings make (``--perturbations``,
    ``--repeats``: :mod:`~cosmos3_gym.eval.robustness`); rank 0 returns its results.json
    document and, with ``summary``, prints its table."""
    from cosmos3_gym.eval.arms import format_arms_table, run_arms
    from cosmos3_gym.eval.results import format_table

    planned = arms_of(run.settings)
    if planned is not None:
        arms, control, noise_floor = planned
        results = run_arms(run, arms, control=control, noise_floor=noise_floor)
        if summary and run.rank.is_main and results is not None:
            print(format_arms_table(results))
        return results
    evaluator = Evaluator(run)
    results = evaluator.run()
    if summary and run.rank.is_main:
        if evaluator.already_complete:
            print(f"{run.out} is complete: its {results['episodes']} episodes were recorded "
                  "before, nothing to run. Its results:")
        print(format_table(results))
    return results


def evaluate(
    config: EvalConfig,
    out_dir: str | Path,
    *,
    pipeline: Any = None,
    eval_env: EvalEnv | None = None,
    summary: bool = True,
) -> dict[str, Any] | None:
    """Run (or resume) an evaluation into ``out_dir`` and return its results.json document
    (every rank of a torchrun launch); with ``summary`` rank 0 prints its table (the one
    ``cosmos3-gym eval`` prints). Settings that make arms (``perturbations``, ``repeats``, a
    comma list of ``latency`` values: :func:`arms_of`) run them all into ``out_dir``
    (:mod:`~cosmos3_gym.eval.arms`; rank 0 returns their document).
    From a training loop, :func:`cosmos3_gym.evaluate` takes the model and the env themselves
    and keeps the caller's state.

    ``pipeline`` defaults to ``config.checkpoint`` loaded with
    :meth:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline.from_pretrained` (only if episodes
    remain); ``eval_env`` defaults to the env ``config`` names.
    """
    if out_dir is None:
        raise ValueError("out_dir is None: this call records into a run folder; for an "
                         "evaluation that keeps nothing on disk, call "
                         "cosmos3_gym.evaluate(policy, env, out=None)")
    run = resolve(config, out_dir, kind="evaluation", pipeline=pipeline, eval_env=eval_env)
    return run_resolved(run, summary=summary)
