"""Success-rate evaluation: a pool of env slots over the run's episodes, resumable, fault tolerant.

Scheduling. The vector env's sub-envs are slots. A slot whose episode ends is at once handed the
next pending ``(task, trial)`` through a masked ``reset(options=...)`` of that sub-env alone, so
tasks mix freely in one batch and no slot idles while others finish. Autoreset is disabled and
each sub-env's :class:`~cosmos3_gym.envs.EpisodeEndHold` is armed: a finished sub-env stands
still (no simulator step) until it is handed its next episode.

Policy. Chunks come from the policy's :class:`~cosmos3_gym.policy.ChunkPlanner` with the
evaluation's seed rule (:func:`~cosmos3_gym.eval.tasks.episode_seed_rule`): chunk ``c`` of
episode ``(task, trial)`` is seeded with ``derive_seed(seed, task, trial, chunk=c)``, not by the
env slot as ``VectorPolicy`` seeds. Each slot has an :class:`~cosmos3_gym.policy.ActionQueues`
queue; the slots whose queue is empty are replanned together in one pipeline call. The pipeline
makes item ``i`` depend only on its own seed, image and prompt, so an episode's result does not
depend on its slot, its batch mates or the rank running it: one process and a torchrun launch
record the same episodes.

Actions. Before every step each env action is checked against the env's action space. A
non-finite action ends its episode as a failure (``invalid_action`` says why) and is never sent
to the env. An action outside the space's bounds is counted (``out_of_range_steps``,
``max_action_excess``) and then, with ``out_of_range="report"`` (default), sent unchanged: the
env applies its own documented handling (both built-in envs clip to the box). With
``out_of_range="fail"`` the episode ends as a failure instead. Nothing is clipped here.

Checks first. Before anything is loaded, built or written, the checkpoint's action width (from
its ``action_policy.json`` or ``--domain``, or the pipeline passed in) is checked through the
env's adapter against the env's action space
(:meth:`~cosmos3_gym.eval.tasks.EvalEnv.single_action_space`, which builds no simulator), so a
checkpoint made for another env fails in seconds with one error.

Records. Each finished episode is one record (:mod:`cosmos3_gym.eval.results`) holding what
replays it, ``seed`` and ``reset_options`` (a sub-env's ``reset(seed=..., options=...)`` that
starts it again: the task, and LIBERO's init state), and ``obs_sha256``, a SHA-256 over every
observation of the episode exactly as the env returned it (the reset observation, then one per
step; each array by sorted key path, with its dtype and shape, then its bytes). Hashing the raw
observations rather than the policy's resized model images or ``render()`` covers everything
the env produced (both cameras and the state) before any adapter touches it, so two runs that
record the same hash saw the same episode, frame for frame.

Resume. ``config.json`` stores the run's identity; once the folder holds an episode, a rerun
into it with another identity is refused. Before that there is nothing to mix, so a run that
failed before its first episode (a bad checkpoint, a wrong env) does not block the corrected
command: it takes the folder over. The JSONL logs (:mod:`cosmos3_gym.eval.results`) are read
first and every finished ``(task, trial)`` is skipped, so a rerun after a crash or Ctrl-C
finishes the run and never repeats or loses an episode; a rerun of a complete folder runs
nothing and keeps its stored throughput.

Faults. A sub-env that raises, dies (a simulator segfault kills its worker) or does not answer a
step or reset within ``env_timeout`` seconds (async envs) is a fault: the vector env is thrown
away (its workers killed) and rebuilt, every episode in flight is re-run from its start (same
seed and init state, so the same episode), and an incident is recorded. An episode interrupted
more than ``max_episode_restarts`` times is recorded as a failure with its ``error``; more than
``max_consecutive_faults`` faults with no episode finishing in between abort the run.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.spaces import Box
from gymnasium.vector import AsyncVectorEnv, VectorEnv

from cosmos3_gym.eval import protocol as protocols
from cosmos3_gym.eval import results as results_io
from cosmos3_gym.eval.distributed import (
    RankInfo,
    barrier,
    destroy_process_group,
    init_process_group,
)
from cosmos3_gym.eval.report import ResultsPlot
from cosmos3_gym.eval.tasks import (
    EVAL_ENVS,
    Episode,
    EvalEnv,
    canonical_suites,
    episode_seed_rule,
    make_eval_env,
)
from cosmos3_gym.eval.videos import (
    ImaginedChunk,
    episode_video_stem,
    imagined_errors,
    imagined_frames,
    mp4_available,
    unused_path,
    write_video,
)
from cosmos3_gym.policy import (
    ActionQueues,
    Adapter,
    ChunkPlanner,
    check_action_fit,
    get_adapter,
    pipeline_action_head,
    take_envs,
)
from cosmos3_gym.policy.adapters import with_action_map
from cosmos3_gym.progress import progress_bar
from cosmos3_gym.seeding import check_seed

# The config keys that define which episodes a folder holds and how they were produced; a rerun
# must match them to resume. num_envs, async_envs, timeouts and videos only change how fast or
# how robustly the same episodes are produced, so they may change between sessions.
IDENTITY_KEYS = (
    "checkpoint", "env", "suite", "tasks", "trials", "seed", "image_size", "max_episode_steps",
    "step_budget", "num_inference_steps", "n_action_steps", "out_of_range", "shuffle_prompts",
    "domain", "action_stats", "protocol", "synthetic", "precision",
    # --env gym:ID (GymEval) and --action-map; None in folders written before them.
    "prompt", "import_modules", "env_kwargs", "success_key", "action_map",
)
# Beside IDENTITY_KEYS, the identity holds the model's precision as resolved on the machine
# ("dtype": bf16 and fp32 runs of one checkpoint are different evaluations). Folders written
# before it was recorded ran on the CPU in float32, which is what a missing key reads as.
LEGACY_IDENTITY = {"dtype": "float32"}
# --videos: the env's frames, or the model's input and predicted future beside them.
VIDEO_KINDS = ("env", "imagined")


@dataclass
class EvalConfig:
    """Every knob of an evaluation, with its default and why."""

    # A checkpoint folder, or the name of one shipped in the package ("tiny").
    checkpoint: str = "tiny"
    # The checkpoint's embodiment (cosmos3_gym.checkpoint.DOMAINS) when its folder has no
    # action_policy.json (a diffusers folder); None = the folder's action_policy.json.
    domain: str | None = None
    # An action statistics JSON for checkpoints without their own; None = the checkpoint's.
    action_stats: str | None = None
    # "color_reach" (built in, runs anywhere) or "libero".
    env: str = "color_reach"
    # LIBERO suite (libero_10, libero_spatial, ...), several comma-separated, or a group
    # ("libero_4": the four standard suites, stored expanded); None for color_reach.
    suite: str | None = None
    # Task names (color_reach: colours) or LIBERO task ids; None = all of the env's tasks.
    tasks: list[str] | None = None
    # Episodes per task; None = the protocol's (10, or 50 under the official protocol).
    trials: int | None = None
    # Root of every episode's env seed and noise seeds.
    seed: int = 0
    num_envs: int = 4
    # Sub-envs in worker processes: needed for crash and hang recovery of real simulators.
    async_envs: bool = False
    # None = the env's default (color_reach 128, LIBERO 256).
    image_size: int | None = None
    max_episode_steps: int | None = None
    # LIBERO's episode budget: "cosmos3" (the official Cosmos3 client's, the default when None)
    # or "openpi" (settle steps on top); see docs/libero.md.
    step_budget: str | None = None
    # None = the checkpoint's defaults.
    num_inference_steps: int | None = None
    # Actions executed per chunk before replanning; None = the whole chunk.
    n_action_steps: int | None = None
    out_of_range: str = "report"
    # Seconds a step or reset of an async env may take before its worker counts as hung.
    env_timeout: float = 300.0
    max_episode_restarts: int = 2
    max_consecutive_faults: int = 5
    # One video per episode under videos/: "env" (a GIF of the env's frames) or "imagined"
    # (eval/videos.py: the model's input, its predicted future and the env's frames side by
    # side, MP4 or GIF); None writes none. True means "env" (the flag without a value).
    videos: str | None = None
    # Videos only for trials 0..video_trials-1 of each task (None: every trial). Imagined
    # videos decode the predicted future, which costs a VAE decode per chunk of those episodes.
    video_trials: int | None = None
    # Diagnostic: give every episode another task's prompt. A policy that reads its prompt
    # should then fail (near chance); one that ignores it keeps its success rate.
    shuffle_prompts: bool = False
    progress: bool = True
    # Where the model runs: "auto" (cuda:LOCAL_RANK where there is a GPU, else the CPU), "cpu",
    # "cuda" or "cuda:N" (cosmos3_gym.devices). Not part of the identity: any GPU gives the
    # same run, but its precision is (below).
    device: str = "auto"
    # "auto" (bfloat16 on CUDA, float32 on the CPU), "bfloat16" or "float32".
    dtype: str = "auto"
    # A published model shape with random weights instead of a checkpoint (eval/synthetic.py):
    # "nano", "super", "edge" or "tiny". Its success rates mean nothing; its timings are real.
    synthetic: str | None = None
    # None: this project's protocol; "official": the rules behind NVIDIA's published LIBERO
    # numbers (cosmos3_gym.eval.protocol: 50 trials, every chunk from seed 0, ...).
    protocol: str | None = None
    # Run a checkpoint whose actions stay in the model's normalised space (no statistics) in an
    # env that takes real units; refused by default, since every success rate would be noise.
    allow_normalized_actions: bool = False
    # "fp8": the generation tower's GEMMs in FP8 (InferenceOptions.fp8); None: all in dtype.
    # Part of the identity: FP8 and bf16 runs are different evaluations.
    precision: str | None = None
    # --env gym:ID only (eval/tasks.py GymEval): the instruction (or {task: instruction}), the
    # modules that register the id, the env's kwargs, and the info key success is read from
    # (None: "auto", is_success else success).
    prompt: str | dict[str, str] | None = None
    import_modules: list[str] | None = None
    env_kwargs: dict[str, Any] | None = None
    success_key: str | None = None
    # How the adapter's actions are mapped onto the env's Box (policy/adapters.py
    # with_action_map): "box" (affine from [-1, 1] onto its bounds) or None (unchanged).
    action_map: str | None = None

    def __post_init__(self) -> None:
        if self.protocol == "default":
            self.protocol = None
        self.suite = canonical_suites(self.suite)
        if self.trials is None:
            self.trials = protocols.default_trials(self.protocol)
        if self.out_of_range not in ("report", "fail"):
            raise ValueError(
                f"out_of_range must be 'report' or 'fail'; found {self.out_of_range!r}"
            )
        for name in ("trials", "num_envs"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1; found {getattr(self, name)}")
        for name in ("image_size", "max_episode_steps", "num_inference_steps", "n_action_steps"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} must be None or at least 1; found {value}")
        check_seed(self.seed)
        if self.precision not in (None, "fp8"):
            raise ValueError(f"precision must be None or 'fp8'; found {self.precision!r}")
        if isinstance(self.videos, bool):
            self.videos = "env" if self.videos else None
        if self.videos not in (None, *VIDEO_KINDS):
            raise ValueError(f"videos must be one of {VIDEO_KINDS} or None; found {self.videos!r}")
        if self.video_trials is not None and self.video_trials < 0:
            raise ValueError(f"video_trials must be at least 0; found {self.video_trials}")
        from cosmos3_gym.eval.synthetic import PRESETS, view_size

        if self.synthetic is not None and self.synthetic not in PRESETS:
            raise ValueError(f"synthetic must be one of {PRESETS} or None; found "
                             f"{self.synthetic!r}")
        self.image_size = view_size(self.env, self.synthetic, self.image_size)
        protocols.check(self)

    def identity(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in IDENTITY_KEYS}


class EnvFault(RuntimeError):
    """A sub-env crashed, raised or hung; the vector env must be rebuilt."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


@dataclass
class _Slot:
    """One sub-env's episode in flight."""

    episode: Episode | None = None
    chunks: int = 0
    steps: int = 0
    started: float = 0.0
    out_of_range_steps: int = 0
    max_excess: float = 0.0
    restarts: int = 0
    needs_reset: bool = False
    # Whether this episode writes a video (--videos, within --video-trials).
    records_video: bool = False
    frames: list[np.ndarray] = field(default_factory=list)
    imagined: list[ImaginedChunk] = field(default_factory=list)
    # SHA-256 of the episode's observations so far (see the module notes).
    obs_digest: Any = field(default_factory=hashlib.sha256)

    def start(self, episode: Episode, restarts: int = 0, records_video: bool = False) -> None:
        self.episode, self.restarts, self.needs_reset = episode, restarts, True
        self.chunks = self.steps = self.out_of_range_steps = 0
        self.max_excess = 0.0
        self.started = time.perf_counter()
        self.records_video = records_video
        self.frames = []
        self.imagined = []
        self.obs_digest = hashlib.sha256()


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
        array = np.ascontiguousarray(np.asarray(obs)[env])
        digest.update(f"{path}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())


def checkpoint_action_head(
    checkpoint: str, domain: str | None = None
) -> tuple[int, str] | None:
    """``(raw action width, domain)`` of a checkpoint folder's policy (``domain`` where given,
    else its ``action_policy.json``), read without loading any weights; ``None`` where neither
    says, or the folder is not found (loading reports that)."""
    policy = checkpoint_policy(checkpoint, domain)
    return None if policy is None else (policy.raw_action_dim, policy.domain_name)


def checkpoint_policy(checkpoint: str, domain: str | None = None) -> Any:
    """A checkpoint folder's ``PolicyConfig`` (``domain`` where given, else its
    ``action_policy.json``), read without loading any weights; ``None`` where neither says, or
    the folder is not found (loading reports that)."""
    from cosmos3_gym.checkpoint import resolve_checkpoint, resolve_policy

    try:
        return resolve_policy(resolve_checkpoint(checkpoint), domain=domain)
    except (FileNotFoundError, ValueError):
        return None


def check_action_stats(stats: dict[str, Any], policy: Any, source: str) -> None:
    """Refuse statistics that the policy head cannot use: the block its normalisation reads
    (``global_raw`` for ``quantile_rot``, else ``global``) must exist and be as wide as its raw
    actions."""
    from cosmos3_gym.pipeline.normalization import ActionStats

    if policy.normalization == "none":
        return
    parsed = ActionStats.from_dict(stats, source=source)
    try:
        parsed.block_for(policy.normalization)
    except ValueError as err:
        raise ValueError(f"{source}: {err} (the checkpoint's {policy.domain_name!r} head)") \
            from None
    if parsed.raw_action_dim != policy.raw_action_dim:
        raise ValueError(
            f"{source} holds {parsed.raw_action_dim}-D statistics; the checkpoint's "
            f"{policy.domain_name!r} head makes {policy.raw_action_dim}-D actions"
        )


def load_pipeline(
    checkpoint: str, domain: str | None = None, action_stats: str | None = None, **kwargs: Any
) -> Any:
    """``Cosmos3ActionPipeline`` for a folder or a shipped name, with a clear error if absent.

    ``domain`` names the embodiment of a folder without ``action_policy.json``; ``action_stats``
    is a statistics JSON that replaces the policy's (see :mod:`cosmos3_gym.checkpoint`);
    ``kwargs`` go to ``from_pretrained`` (``device``, ``options``).
    """
    from dataclasses import replace

    from cosmos3_gym.checkpoint import read_action_stats, resolve_checkpoint, resolve_policy
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    try:
        path = resolve_checkpoint(checkpoint)
    except FileNotFoundError as err:
        hint = ""
        if checkpoint == "tiny":
            hint = (
                "; the tiny checkpoint is not shipped with this install (expected "
                "cosmos3_gym/checkpoints/tiny/): pass --checkpoint PATH, e.g. a folder written by "
                "cosmos3_gym.tiny.write_tiny_checkpoint"
            )
        raise FileNotFoundError(f"{err}{hint}") from None
    policy = None
    if domain is not None or action_stats is not None:
        policy = resolve_policy(path, domain=domain)
        if action_stats is not None:
            policy = replace(policy, stats=read_action_stats(action_stats))
    return Cosmos3ActionPipeline.from_pretrained(path, policy=policy, **kwargs)


def check_config_file(
    out_dir: Path, config: EvalConfig, recorded: bool, precision: str | None = None
) -> None:
    """Write ``config.json``, or refuse to continue a folder that holds another run.

    The stored identity binds once the folder holds an episode (``recorded``). Until then the
    command's identity replaces it, and the files of the attempt that recorded nothing (its
    incidents and throughput) go with it. ``precision`` is the model's dtype as this run
    resolved it (``None`` for a pipeline without one, such as a test stand-in).
    """
    path = out_dir / "config.json"
    identity = {**config.identity(), "dtype": precision}
    if path.exists():
        found = _read_json(path)
        stored = {**LEGACY_IDENTITY, **found.get("identity", {})}
        # A key the stored identity lacks (a folder older than the key) reads as None, its default.
        diff = {
            k: {"expected (stored)": stored.get(k), "found (this command)": identity.get(k)}
            for k in sorted(set(stored) | set(identity))
            if stored.get(k) != identity.get(k)
        }
        if not diff:
            return
        if recorded:
            raise ValueError(
                f"{out_dir} holds a different evaluation; refusing to mix results. "
                f"Differences: {diff}. Use another --out folder, or rerun with the stored settings."
            )
        for stale in [*out_dir.glob("incidents*.jsonl"), *out_dir.glob("throughput*.json")]:
            stale.unlink(missing_ok=True)  # torchrun: every rank clears the same files
    results_io.write_json_atomic(path, {"identity": identity, "session": asdict(config)})


def _read_json(path: Path) -> dict[str, Any]:
    import json

    return json.loads(path.read_text(encoding="utf-8"))


class Evaluator:
    """Runs this process's share of an evaluation into ``out_dir``; see the module notes."""

    def __init__(
        self,
        config: EvalConfig,
        out_dir: str | Path,
        *,
        pipeline: Any = None,
        eval_env: EvalEnv | None = None,
        rank: RankInfo | None = None,
    ) -> None:
        self.config = config
        self.out_dir = Path(out_dir)
        self.rank = rank or RankInfo.from_env()
        self.eval_env = eval_env or make_eval_env(
            config.env,
            suite=config.suite,
            tasks=config.tasks,
            image_size=config.image_size,
            max_episode_steps=config.max_episode_steps,
            step_budget=config.step_budget,
            prompt=config.prompt, import_modules=config.import_modules,
            env_kwargs=config.env_kwargs, success_key=config.success_key,
        )
        if config.synthetic is not None:
            from cosmos3_gym.eval.synthetic import synthetic_adapter

            self.adapter: Adapter = synthetic_adapter(self.eval_env)
        else:
            self.adapter = get_adapter(self.eval_env.adapter)
        if config.action_map is not None:
            self.adapter = with_action_map(self.adapter, config.action_map,
                                           self.eval_env.single_action_space())
        self.pipeline = pipeline
        self.all_episodes = self.eval_env.episodes(config.trials, config.seed)
        self.episode_index = {e.key: k for k, e in enumerate(self.all_episodes)}
        self.episode_log = self.out_dir / results_io.episode_log_name(
            self.rank.rank, self.rank.world_size
        )
        self.incident_log = self.out_dir / results_io.incident_log_name(
            self.rank.rank, self.rank.world_size
        )
        self.envs: VectorEnv | None = None
        self.queues = ActionQueues(0)  # one queue per env slot, sized by _run_pool
        self.obs: Any = None
        self.env_steps = 0
        self.chunks = 0
        self.finished = 0
        # Seconds of this session in pipeline calls (chunk planning) and in the env (builds,
        # resets, steps: simulation and rendering); the rest of the wall time is the loop's.
        self.pipeline_s = 0.0
        self.env_s = 0.0
        # Whether the folder held every episode before this run (then it runs nothing).
        self.already_complete = False
        self.plot = ResultsPlot(self.out_dir)
        # The checkpoint's PolicyConfig as the run uses it (results.json records its sampler);
        # None until known (check_action_units reads it without loading any weights).
        self.policy: Any = None

    # ------------------------------------------------------------------ run

    def run(self) -> dict[str, Any] | None:
        """Run the pending episodes of this rank; on rank 0 return (and write) the results."""
        cfg = self.config
        # Before the folder is written: a refused checkpoint leaves nothing to clash with the
        # corrected rerun.
        checked = self.check_action_fit()
        units_checked = self.check_action_units()
        device, dtype = self._device()  # a device that is not there fails here, before writing
        self.out_dir.mkdir(parents=True, exist_ok=True)
        init_process_group(self.rank)
        try:
            finished = results_io.read_episode_records(self.out_dir)
            check_config_file(self.out_dir, cfg, recorded=bool(finished),
                              precision=self._precision(dtype))
            done = {(r["task"], int(r["trial"])) for r in finished}
            self.already_complete = all(e.key in done for e in self.all_episodes)
            mine = self.rank.shard(self.all_episodes)
            pending = deque(e for e in mine if e.key not in done)
            if pending and self.pipeline is None:
                self.pipeline = self._load(device, dtype)
                if not checked:  # its width is known only now it is loaded
                    self.check_action_fit()
                if not units_checked:
                    self.check_action_units()
            start = time.perf_counter()
            if pending:
                self._run_pool(pending, already_done=len(mine) - len(pending))
            wall = time.perf_counter() - start
            if not self.already_complete:  # a complete folder keeps its last session's figures
                results_io.write_json_atomic(
                    self.out_dir / self._throughput_name(),
                    {"episodes": self.finished, "env_steps": self.env_steps,
                     "chunks": self.chunks, "wall_s": wall, "pipeline_s": self.pipeline_s,
                     "env_s": self.env_s, **self._runtime()},
                )
            barrier(self.rank)
            if not self.rank.is_main:
                return None
            return self.write_results(final=True)
        finally:
            self._discard_envs()
            destroy_process_group(self.rank)

    def _device(self) -> tuple[Any, Any]:
        """The torch device and dtype this rank's model runs on (a pipeline passed in: its
        own; ``None`` for a stand-in without a transformer)."""
        from cosmos3_gym.devices import resolve_device, resolve_dtype

        if self.pipeline is not None:
            transformer = getattr(self.pipeline, "transformer", None)
            if transformer is None:
                return None, None
            return transformer.device, transformer.dtype
        device = resolve_device(self.config.device)
        return device, resolve_dtype(self.config.dtype, device)

    @staticmethod
    def _precision(dtype: Any) -> str | None:
        from cosmos3_gym.devices import dtype_name

        return None if dtype is None else dtype_name(dtype)

    def _load(self, device: Any, dtype: Any) -> Any:
        from cosmos3_gym.pipeline import InferenceOptions

        cfg = self.config
        options = InferenceOptions(fp8=cfg.precision == "fp8")
        if cfg.synthetic is not None:
            from cosmos3_gym.eval.synthetic import synthetic_pipeline

            return synthetic_pipeline(cfg.synthetic, device=device, dtype=dtype, options=options,
                                      eval_env=self.eval_env)
        return load_pipeline(cfg.checkpoint, cfg.domain, cfg.action_stats, device=device,
                             dtype=dtype, options=options)

    def _runtime(self) -> dict[str, Any]:
        """Where and how this session's model ran, for throughput*.json and the summary."""
        device, dtype = self._device()
        options = getattr(self.pipeline, "options", None)
        gpu = None
        if device is not None and device.type == "cuda":
            import torch

            gpu = torch.cuda.get_device_name(device)
        return {
            "device": None if device is None else str(device), "gpu": gpu,
            "dtype": self._precision(dtype), "synthetic": self.config.synthetic,
            "options": None if options is None else asdict(options),
            "disabled_options": dict(getattr(self.pipeline, "disabled_options", {}) or {}),
        }

    def check_action_fit(self) -> bool:
        """Refuse a checkpoint whose actions, through the env's adapter, do not fit the env's
        action space; builds no simulator and calls no model. False where the checkpoint's width
        is not known without loading it (no ``action_policy.json``, no pipeline given)."""
        if self.pipeline is not None:
            head, source = pipeline_action_head(self.pipeline), "the pipeline's checkpoint"
        elif self.config.synthetic is not None:
            from cosmos3_gym.eval.synthetic import synthetic_policy

            policy = synthetic_policy(self.eval_env)
            head = policy.raw_action_dim, policy.domain_name
            source = f"--synthetic {self.config.synthetic}"
        else:
            head = checkpoint_action_head(self.config.checkpoint, self.config.domain)
            source = f"--checkpoint {self.config.checkpoint}"
        if head is None:
            return False
        raw_dim, domain = head
        env, own = self.config.env, self.eval_env.domain
        homes = [name for name, cls in EVAL_ENVS.items() if domain and cls.domain == domain]
        hint = f"evaluate it with --env {homes[0]}, " if homes and homes[0] != env else ""
        space = self.eval_env.single_action_space()
        fix = (f"Fix: {hint}or pass a --checkpoint trained for --env {env}"
               + (f" (domain {own!r})." if own else "."))
        if getattr(self.eval_env, "sizes_synthetic_head", False) and getattr(space, "shape", None):
            width = int(space.shape[-1])  # --env gym:ID: foreign envs rarely have a checkpoint
            fix += (f" A head of width {width} for plumbing (random weights): --synthetic tiny "
                    "(sized to the env), or a folder written by cosmos3_gym.tiny."
                    f"write_tiny_checkpoint(DIR, policy_overrides={{'raw_action_dim': {width}}}).")
        check_action_fit(
            self.adapter, raw_dim, domain, space, checkpoint=source, env_label=f"--env {env}'s",
            fix=fix,
        )
        return True

    def check_action_units(self) -> bool:
        """Refuse a run whose actions would stay in the model's normalised space (a checkpoint
        without statistics, no ``action_stats`` given) in an env that takes real units, unless
        ``allow_normalized_actions``; check an ``action_stats`` file against the checkpoint's
        head. Reads no weights; False where the checkpoint's policy is not known without loading
        it."""
        cfg = self.config
        if self.pipeline is not None:  # load_pipeline has applied action_stats to it
            policy, source = getattr(self.pipeline, "policy", None), "the pipeline's checkpoint"
        elif cfg.synthetic is not None:  # un-normalised by construction
            from cosmos3_gym.eval.synthetic import synthetic_policy

            policy, source = synthetic_policy(self.eval_env), f"--synthetic {cfg.synthetic}"
        else:
            policy = checkpoint_policy(cfg.checkpoint, cfg.domain)
            source = f"--checkpoint {cfg.checkpoint}"
            if policy is not None and cfg.action_stats is not None:
                from dataclasses import replace

                from cosmos3_gym.checkpoint import read_action_stats

                stats = read_action_stats(cfg.action_stats)
                check_action_stats(stats, policy, f"--action-stats {cfg.action_stats}")
                policy = replace(policy, stats=stats)
        if policy is None:
            return False
        self.policy = policy
        normalised = policy.normalization != "none" and policy.stats is None
        if normalised and self.eval_env.real_action_units and not cfg.allow_normalized_actions:
            raise ValueError(
                f"{source} has no action statistics ({policy.domain_name!r} head, normalization "
                f"{policy.normalization!r}), so its actions would stay in the model's normalised "
                f"space, which --env {cfg.env} would take as real units; pass --action-stats "
                "FILE (the statistics JSON of the checkpoint's training data, see "
                "docs/libero.md), or --allow-normalized-actions to run anyway"
            )
        return True

    def _throughput_name(self) -> str:
        ws = self.rank.world_size
        return "throughput.json" if ws == 1 else f"throughput.rank{self.rank.rank}.json"

    def write_results(self, final: bool = False) -> dict[str, Any]:
        """Recompute results.json from every log in the folder and replace it atomically."""
        records = results_io.read_episode_records(self.out_dir)
        throughput = None
        if final:
            parts = [_read_json(p) for p in sorted(self.out_dir.glob("throughput*.json"))]
            throughput = results_io.merge_throughput(parts)
        results = results_io.summarize(
            records,
            config=self.config.identity(),
            task_names=self.eval_env.tasks,
            expected_episodes=len(self.all_episodes),
            incidents=results_io.read_incidents(self.out_dir),
            throughput=throughput,
            episode_budget=self.eval_env.episode_budget(),
            protocol=protocols.record(self.config, self.eval_env.init_state_rule, self.policy),
        )
        results_io.write_json_atomic(self.out_dir / "results.json", results)
        self.plot.update(results, final=final)
        return results

    def _run_pool(self, pending: deque[Episode], already_done: int) -> None:
        cfg = self.config
        num_slots = min(cfg.num_envs, len(pending))
        slots = [_Slot() for _ in range(num_slots)]
        self.queues = ActionQueues(num_slots)
        planner = ChunkPlanner(
            self.pipeline, self.adapter,
            episode_seed_rule(cfg.seed, self.all_episodes, stochastic=cfg.protocol != "official"),
            num_inference_steps=cfg.num_inference_steps,
        )
        successes = 0
        bar = progress_bar(
            enabled=cfg.progress, total=already_done + len(pending), initial=already_done,
            desc="eval", unit="ep", dynamic_ncols=True,
        )
        consecutive_faults = 0
        self._build_envs(num_slots)
        try:
            while True:
                for i, slot in enumerate(slots):
                    if slot.episode is None and pending:
                        self._start(slots, i, pending.popleft())
                active = [i for i, s in enumerate(slots) if s.episode is not None]
                if not active:
                    break
                try:
                    self._reset_slots(slots)
                    ended = self._plan(planner, slots)
                    if not ended:
                        ended = self._step(slots)
                except EnvFault as fault:
                    consecutive_faults += 1
                    if consecutive_faults > cfg.max_consecutive_faults:
                        raise RuntimeError(
                            f"{consecutive_faults} env faults in a row with no episode finishing; "
                            f"last: {fault}. Giving up (see {self.incident_log})"
                        ) from fault
                    ended = self._recover(slots, fault)
                for i, success, reason in ended:
                    self._finish(slots[i], i, success, reason)
                    consecutive_faults = 0
                    successes += bool(success)
                    done_now = self.finished
                    bar.update(1)
                    bar.set_postfix(success=f"{successes / done_now:.1%} ({successes}/{done_now})")
        finally:
            bar.close()

    # ------------------------------------------------------------------ envs

    def _build_envs(self, num_slots: int) -> None:
        start = time.perf_counter()
        try:
            self._make_envs(num_slots)
        finally:
            self.env_s += time.perf_counter() - start

    def _make_envs(self, num_slots: int) -> None:
        envs = self.eval_env.make(num_slots, self.config.async_envs)
        self.envs = envs
        if not isinstance(envs.single_action_space, Box):
            raise TypeError(
                f"evaluation needs a Box action space; found {envs.single_action_space}"
            )
        held = np.array(envs.call("has_wrapper_attr", "chunk_hold_armed"), dtype=bool)
        if not held.all():
            raise TypeError(
                "every sub-env must be wrapped (outermost) in EpisodeEndHold; sub-envs without it: "
                f"{np.flatnonzero(~held).tolist()}"
            )
        envs.set_attr("chunk_hold_armed", True)
        self._reset_all()

    def _discard_envs(self) -> None:
        envs, self.envs = self.envs, None
        if envs is None:
            return
        try:
            envs.close(terminate=True) if isinstance(envs, AsyncVectorEnv) else envs.close()
        except Exception:  # a dead worker's pipe can make close itself fail; kill what is left
            for process in getattr(envs, "processes", []):
                if process.is_alive():
                    process.kill()
                process.join(timeout=5)
            envs.closed = True  # keep __del__ from closing the broken pipes a second time

    def _guard(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except multiprocessing.TimeoutError as err:
            raise EnvFault("hang", f"{what} took longer than {self.config.env_timeout} s") from err
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as err:
            raise EnvFault("crash", f"{what} failed: {type(err).__name__}: {err}") from err

    def _reset_slots(self, slots: list[_Slot]) -> None:
        envs = self.envs
        assert envs is not None
        for i, slot in enumerate(slots):
            if not slot.needs_reset:
                continue
            ep = slot.episode
            assert ep is not None
            mask = np.zeros(envs.num_envs, bool)
            mask[i] = True
            seeds = [ep.seed if j == i else None for j in range(envs.num_envs)]
            options = {"reset_mask": mask, **self.eval_env.reset_options(ep)}
            start = time.perf_counter()
            if isinstance(envs, AsyncVectorEnv):
                self._guard(f"reset of env {i}", envs.reset_async, seed=seeds, options=options)
                obs, _ = self._guard(
                    f"reset of env {i}", envs.reset_wait, timeout=self.config.env_timeout
                )
            else:
                obs, _ = self._guard(f"reset of env {i}", envs.reset, seed=seeds, options=options)
            self.env_s += time.perf_counter() - start
            self.obs = obs
            slot.needs_reset = False
            hash_observation(slot.obs_digest, obs, i)
            if slot.records_video:
                slot.frames.append(self.adapter.images(take_envs(obs, i))[0])

    # ------------------------------------------------------------------ planning and stepping

    def _start(self, slots: list[_Slot], i: int, episode: Episode, restarts: int = 0) -> None:
        cfg = self.config
        records_video = cfg.videos is not None and (
            cfg.video_trials is None or episode.trial < cfg.video_trials
        )
        slots[i].start(episode, restarts, records_video)
        self.queues.clear(i)

    def _plan(
        self, planner: ChunkPlanner, slots: list[_Slot]
    ) -> list[tuple[int, bool, str | None]]:
        """Replan every active slot with an empty queue; returns episodes ended by bad actions."""
        cfg = self.config
        empty = self.queues.lengths() == 0
        need = [i for i, s in enumerate(slots) if s.episode is not None and empty[i]]
        if not need:
            return []
        idx = np.array(need)
        if cfg.shuffle_prompts:
            tasks = [self.eval_env.shuffled_prompt(slots[i].episode.task_index) for i in need]
        else:
            tasks = self._tasks(idx)
        # Only the episodes that write an imagined video pay for decoding the predicted future.
        imagine = [cfg.videos == "imagined" and slots[i].records_video for i in need]
        start = time.perf_counter()
        record = planner.plan(
            self.obs, idx, tasks,
            episodes=[self.episode_index[slots[i].episode.key] for i in need],
            chunks=[slots[i].chunks for i in need],
            video=imagine,
        )
        self.pipeline_s += time.perf_counter() - start
        steps = cfg.n_action_steps or None  # None: the whole chunk
        self.queues.fill(record, steps)
        self.chunks += len(need)
        ended = []
        for row, i in enumerate(need):
            slot = slots[i]
            slot.chunks += 1
            if imagine[row]:
                slot.imagined.append(ImaginedChunk(
                    start=slot.steps, prompt=record.prompts[row], predicted=record.video[row]
                ))
            queued = record.actions[row, :steps]
            bad = ~np.isfinite(queued).all(axis=-1)
            if bad.any():
                k = int(np.argmax(bad))
                ended.append((i, False, f"non-finite action at step {slot.steps + k}: "
                                        f"{queued[k].tolist()}"))
        return ended

    def _tasks(self, idx: np.ndarray) -> list[str]:
        values = self._guard("task_description", self.envs.call, "task_description")
        return [values[i] for i in idx]

    def _step(self, slots: list[_Slot]) -> list[tuple[int, bool, str | None]]:
        envs = self.envs
        assert envs is not None
        space = envs.single_action_space
        actions = np.zeros((envs.num_envs, *space.shape), dtype=np.float32)
        ended: list[tuple[int, bool, str | None]] = []
        active = []
        for i, slot in enumerate(slots):
            if slot.episode is None:
                continue
            action = self.queues.peek(i)
            excess = float(np.max(np.maximum(action - space.high, space.low - action)))
            if excess > 0:
                slot.out_of_range_steps += 1
                slot.max_excess = max(slot.max_excess, excess)
                if self.config.out_of_range == "fail":
                    ended.append((i, False, f"action out of range at step {slot.steps}: "
                                            f"{action.tolist()} (exceeds the box by {excess:.3g})"))
                    continue
            actions[i] = action
            active.append(i)
        if ended:  # settle the failed episodes first; nobody steps with an unchecked action
            return ended
        for i in active:
            self.queues.pop(i)
        start = time.perf_counter()
        if isinstance(envs, AsyncVectorEnv):
            self._guard("step", envs.step_async, actions)
            timeout = self.config.env_timeout
            obs, _, _, _, info = self._guard("step", envs.step_wait, timeout=timeout)
        else:
            obs, _, _, _, info = self._guard("step", envs.step, actions)
        self.env_s += time.perf_counter() - start
        self.obs = obs
        for i in active:
            slot = slots[i]
            slot.steps += 1
            self.env_steps += 1
            hash_observation(slot.obs_digest, obs, i)
            if slot.records_video:
                slot.frames.append(self.adapter.images(take_envs(obs, i))[0])
            terminated = _info_flag(info, "episode_terminated", i)
            truncated = _info_flag(info, "episode_truncated", i)
            if terminated or truncated:
                success = _info_flag(info, "is_success", i) if "is_success" in info else terminated
                ended.append((i, success, None))
        return ended

    # ------------------------------------------------------------------ faults and records

    def _recover(
        self, slots: list[_Slot], fault: EnvFault
    ) -> list[tuple[int, bool, str | None]]:
        """Rebuild the envs and restart every episode in flight; give up on worn-out ones."""
        in_flight = [(i, s.episode) for i, s in enumerate(slots) if s.episode is not None]
        incident = {
            "time": time.time(),
            "kind": fault.kind,
            "detail": fault.detail,
            "rank": self.rank.rank,
            "episodes": [{"task": e.task, "trial": e.trial, "env_slot": i} for i, e in in_flight],
            "action": "rebuilt the vector env; re-running the episodes in flight from their start",
        }
        results_io.append_jsonl(self.incident_log, incident)
        self._discard_envs()
        self._build_envs(len(slots))
        given_up = []
        for i, slot in enumerate(slots):
            if slot.episode is None:
                continue
            if slot.restarts >= self.config.max_episode_restarts:
                given_up.append((i, False, f"abandoned after {slot.restarts + 1} env faults; "
                                           f"last: {fault}"))
                slot.restarts += 1
            else:
                self._start(slots, i, slot.episode, restarts=slot.restarts + 1)
        return given_up

    def _reset_all(self) -> None:
        """Give a freshly built vector env a valid state in every sub-env (idle ones too)."""
        envs = self.envs
        assert envs is not None
        seeds = [0] * envs.num_envs
        if isinstance(envs, AsyncVectorEnv):
            self._guard("reset", envs.reset_async, seed=seeds)
            self.obs, _ = self._guard("reset", envs.reset_wait, timeout=self.config.env_timeout)
        else:
            self.obs, _ = self._guard("reset", envs.reset, seed=seeds)

    def _finish(self, slot: _Slot, index: int, success: bool, reason: str | None) -> None:
        ep = slot.episode
        assert ep is not None
        error = reason if reason and reason.startswith("abandoned") else None
        record = {
            "task": ep.task,
            "task_index": ep.task_index,
            "suite": ep.suite,
            "trial": ep.trial,
            "init_state_id": ep.init_state_id,
            "seed": ep.seed,
            "reset_options": self.eval_env.reset_options(ep),
            "obs_sha256": slot.obs_digest.hexdigest(),
            "steps": slot.steps,
            "chunks": slot.chunks,
            "success": bool(success),
            "wall_time_s": time.perf_counter() - slot.started,
            "invalid_action": None if error else reason,
            "error": error,
            "out_of_range_steps": slot.out_of_range_steps,
            "max_action_excess": slot.max_excess,
            "restarts": slot.restarts,
            "env_slot": index,
            "rank": self.rank.rank,
            "video": self._save_video(slot, ep, success) if slot.records_video else None,
            # Predicted frames against the env's (eval/videos.py imagined_errors).
            "imagined": imagined_errors(slot.imagined, slot.frames) if slot.imagined else None,
        }
        results_io.append_jsonl(self.episode_log, record)
        self.finished += 1
        slot.episode = None
        self.queues.clear(index)
        slot.frames, slot.imagined = [], []
        if self.rank.is_main:
            self.write_results()

    def _save_video(self, slot: _Slot, ep: Episode, success: bool) -> str | None:
        if not slot.frames:
            return None
        folder = self.out_dir / "videos"
        folder.mkdir(exist_ok=True)
        stem = episode_video_stem(ep.task, ep.trial, ep.seed, success)
        if self.config.videos == "imagined" and slot.imagined:
            path = unused_path(folder, stem, ".mp4" if mp4_available() else ".gif")
            footer = (f"{ep.task} · trial {ep.trial} · seed {ep.seed} · "
                      f"{'success' if success else 'failure'}")
            write_video(path, imagined_frames(slot.imagined, slot.frames, footer))
        else:
            path = unused_path(folder, stem, ".gif")
            write_video(path, slot.frames)
        return str(path.relative_to(self.out_dir))


def _info_flag(info: dict[str, Any], key: str, i: int) -> bool:
    if key not in info:
        return False
    mask = info.get(f"_{key}")
    if mask is not None and not bool(mask[i]):
        return False
    return bool(info[key][i])


def evaluate(
    config: EvalConfig,
    out_dir: str | Path,
    *,
    pipeline: Any = None,
    eval_env: EvalEnv | None = None,
) -> dict[str, Any] | None:
    """Run (or resume) an evaluation into ``out_dir``; rank 0 returns the results.json document.

    ``pipeline`` defaults to ``config.checkpoint`` loaded with :func:`load_pipeline` (only if
    episodes remain); ``eval_env`` defaults to the env ``config`` names.
    """
    return Evaluator(config, out_dir, pipeline=pipeline, eval_env=eval_env).run()
