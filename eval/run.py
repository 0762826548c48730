"""A run, resolved once: the command line, a config file and the Python API all come here.

:func:`resolve` takes a command's settings (:class:`~cosmos3_gym.eval.evaluate.EvalConfig`,
:class:`~cosmos3_gym.eval.rollout.RolloutConfig`, :class:`~cosmos3_gym.train.config.GRPOConfig`)
and returns a :class:`Run`: the settings with their defaults filled in, the model
(:class:`~cosmos3_gym.source.ModelSource`: its checkpoint folder read once), the env family, the
adapter the policy drives it with, the run folder and this rank, and the device and precision
on this machine. Every check that needs no model runs here, each once, in this order, before the
model stack loads and before anything is written:

1. the settings' own rules (their ``__post_init__``) and their defaults (``resolved()``);
2. the run folder: free, and holding no other kind of run (nothing is written);
3. the env family (a ``gym:`` id is built and probed here);
4. the checkpoint folder (format, configs, headers, statistics) and the head the run uses;
5. the checkpoint's actions against the env's action space, and their units;
6. the latency: each value in env steps (the env's control rate), RTC against the head, a
   replay's recorded delays (:func:`~cosmos3_gym.eval.latency.realtime_for`);
7. the command's own rules (``check_run``: the success signal, ranks, ...);
8. the device and precision (torch loads here).

Commands, the runner and the trainer take the :class:`Run`; nothing after it reads the
checkpoint folder again or repeats a check. Its JSON form (:meth:`Run.identity`) is what a run
folder's identity file holds.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosmos3_gym.eval.distributed import RankInfo
from cosmos3_gym.runner.folder import RunFolder
from cosmos3_gym.source import ModelSource, pipeline_source, read_model_source

if TYPE_CHECKING:
    from cosmos3_gym.envs import EvalEnv
    from cosmos3_gym.pipeline import InferenceOptions
    from cosmos3_gym.policy.adapters import Adapter
    from cosmos3_gym.policy.realtime import RealTime


@dataclass(frozen=True)
class Runtime:
    """Where this rank's model runs: the torch device, its dtype, and whether the generation
    tower's GEMMs run in FP8 (all None for a stand-in pipeline without a transformer)."""

    device: Any
    dtype: Any
    fp8: bool = False

    def record(self) -> dict[str, Any]:
        """The identity's ``precision`` (fp32, bf16 or fp8) and ``dtype``."""
        from cosmos3_gym.devices import dtype_name, precision_name

        if self.dtype is None:
            return {"precision": None, "dtype": None}
        return {"precision": precision_name(self.dtype, self.fp8),
                "dtype": dtype_name(self.dtype)}


@dataclass(frozen=True)
class Run:
    """One run of a command, resolved (see the module notes).

    Attributes:
        kind: the run folder's kind (:data:`~cosmos3_gym.runner.folder.RUN_KINDS`).
        settings: the command's settings with their defaults filled in.
        model: the model, its checkpoint folder read once.
        env: the env family the episodes come from.
        adapter: how the policy turns the env's observations into the model's and its actions
            into the env's (the checkpoint's declared conventions, else the env family's; the
            action map over it).
        out: the run folder.
        rank: this process's rank of a torchrun launch.
        runtime: the device and precision the model runs in on this machine.
        env_given: the env family was handed in (the Python API), not named by the settings:
            the identity records the env itself.
        adapter_given: the adapter was handed in (a ``VectorPolicy``'s, through the Python
            API), not the one the model and env imply: the identity records it.
        realtime: the real-time execution the policy runs under (None: synchronous; a
            latency sweep's arms each have their own: :meth:`derive`).
    """

    kind: str
    settings: Any
    model: ModelSource
    env: EvalEnv
    adapter: Adapter
    out: Path
    rank: RankInfo
    runtime: Runtime
    env_given: bool = False
    adapter_given: bool = False
    realtime: RealTime | None = None

    def identity(self, weights: str | None = None) -> dict[str, Any]:
        """What decides the run's records, as its folder's identity file holds it: the settings'
        (``settings.identity()``), the precision resolved here, the simulation, the env handed
        in, the checkpoint's revision and its weights' fingerprint (``weights``: computed by the
        caller once per run; :meth:`~cosmos3_gym.source.ModelSource.fingerprint`)."""
        identity = {**self.settings.identity(), **self.runtime.record()}
        if self.env.simulation is not None:
            identity["simulation"] = self.env.simulation
        if self.env_given:
            identity["eval_env"] = self.env.identity()
        if self.adapter_given:
            identity["adapter"] = repr(self.adapter)
        if self.model.revision is not None:
            identity["checkpoint_revision"] = self.model.revision
        if weights is not None:
            identity["weights"] = weights
        return identity

    def load(self, *, trainable: bool = False, options: InferenceOptions | None = None) -> Any:
        """The model's pipeline on this rank's device (:func:`~cosmos3_gym.source.load_policy`
        builds the adapter the same way: :attr:`adapter` is it)."""
        from cosmos3_gym.pipeline import InferenceOptions

        options = options or InferenceOptions(fp8=self.runtime.fp8)
        return self.model.load(self.env, device=self.runtime.device, dtype=self.runtime.dtype,
                               options=options, trainable=trainable)

    def derive(self, kind: str, settings: Any, out: str | Path, *, pipeline: Any = None,
               env: EvalEnv | None = None) -> Run:
        """Another run on this one's model, adapter and device (GRPO's held-out evaluations,
        the arms of an evaluation): ``settings`` resolved, nothing read or checked again.
        ``pipeline``: the model as it is in memory now (loaded once for several runs, or its
        weights being trained); ``env``: another env family of the same kind (a perturbed
        suite of the same benchmark: the adapter is the same)."""
        from cosmos3_gym.eval.latency import realtime_for

        model = self.model if pipeline is None else dataclasses.replace(
            self.model, pipeline=pipeline)
        settings, env = settings.resolved(), self.env if env is None else env
        return dataclasses.replace(self, kind=kind, settings=settings, model=model, env=env,
                                   out=Path(out), realtime=realtime_for(settings, env, model))

    def folder(self) -> RunFolder:
        """This rank's handle on the run folder (:meth:`RunFolder.open` takes its lock)."""
        return RunFolder(self.out, kind=self.kind, rank=self.rank.rank,
                         world_size=self.rank.world_size)


def resolve(settings: Any, out: str | Path, *, kind: str, pipeline: Any = None,
            eval_env: EvalEnv | None = None, adapter: Adapter | None = None,
            rank: RankInfo | None = None) -> Run:
    """``settings`` resolved into a :class:`Run` writing into ``out`` (the module notes give
    the order of the checks). ``pipeline``: a model already in memory instead of the one the
    settings name (its own device and precision; where the settings name no checkpoint, the
    run names the pipeline's own: :func:`~cosmos3_gym.source.pipeline_checkpoint`, never the
    default); ``eval_env``: an env family instead of the one they name; ``adapter``: the
    adapter to drive it with instead of the one the model and env imply (still checked
    against the env's action space)."""
    named = getattr(settings, "checkpoint", None) is not None or getattr(
        settings, "synthetic", None) is not None
    settings = settings.resolved()
    rank = rank or RankInfo.from_env()
    RunFolder(out, kind=kind, rank=rank.rank, world_size=rank.world_size).check_free()
    env = eval_env if eval_env is not None else settings.make_env()
    # The env's own checks first (a gym:ID env is built and reset here), then the model's.
    space = env.single_action_space()
    model = pipeline_source(pipeline) if pipeline is not None else read_model_source(
        settings, env)
    if pipeline is not None and not named:
        settings = dataclasses.replace(settings, checkpoint=model.checkpoint)
    given = adapter is not None
    adapter = adapter if given else model.adapter(env, settings.action_map)
    check_action_fit(settings, model, env, adapter, space)
    from cosmos3_gym.eval.latency import realtime_for

    realtime = realtime_for(settings, env, model)
    check_run = getattr(settings, "check_run", None)
    if check_run is not None:
        check_run(model, env, rank)
    runtime = _runtime(settings, pipeline)
    return Run(kind=kind, settings=settings, model=model, env=env, adapter=adapter, out=Path(out),
               rank=rank, runtime=runtime, env_given=eval_env is not None, adapter_given=given,
               realtime=realtime)


def _runtime(settings: Any, pipeline: Any) -> Runtime:
    """The device and precision: a pipeline given runs where it is; else the settings'
    ``--device`` and ``--precision`` on this machine (a device that is not there is an error
    now, before anything is written)."""
    if pipeline is not None:
        transformer = getattr(pipeline, "transformer", None)
        if transformer is None:
            return Runtime(None, None)
        options = getattr(pipeline, "options", None)
        return Runtime(transformer.device, transformer.dtype, bool(getattr(options, "fp8",
                                                                           False)))
    device, dtype, fp8 = settings.resolve_runtime()
    return Runtime(device, dtype, fp8)


def check_action_fit(settings: Any, model: ModelSource, env: EvalEnv, adapter: Adapter,
                     space: Any) -> None:
    """Refuse a model whose actions, through ``adapter``, do not fit the env's action space
    (:func:`~cosmos3_gym.policy.check_action_fit`), or whose chunks are shorter than
    ``n_action_steps``; builds no simulator and calls no model. A stand-in pipeline whose head
    is not known passes."""
    from cosmos3_gym.envs import EVAL_ENVS
    from cosmos3_gym.policy import check_action_fit as fits

    head = model.action_head
    if head is None:
        return
    horizon, steps = model.action_horizon, settings.n_action_steps
    if horizon is not None and steps is not None and steps > horizon:
        raise ValueError(f"--n-action-steps {steps}: {model.label} plans chunks of "
                         f"{horizon} actions; expected at most {horizon}")
    raw_dim, domain = head
    name, own = settings.env, env.domain
    homes = [n for n, cls in EVAL_ENVS.items() if domain and cls.domain == domain]
    hint = f"evaluate it with --env {homes[0]}, " if homes and homes[0] != name else ""
    fix = (f"Fix: {hint + 'or ' if hint else ''}pass a --checkpoint trained for --env {name}"
           + (f" (domain {own!r})." if own else "."))
    if getattr(env, "sizes_synthetic_head", False) and getattr(space, "shape", None):
        width = int(space.shape[-1])  # --env gym:ID: foreign envs rarely have a checkpoint
        fix += (f" A head of width {width} for plumbing (random weights): --synthetic tiny "
                "(sized to the env), or a folder written by cosmos3_gym.tiny."
                f"write_tiny_checkpoint(DIR, policy_overrides={{'raw_action_dim': {width}}}).")
    fits(adapter, raw_dim, domain, space, checkpoint=model.label, env_label=f"--env {name}'s",
         fix=fix)


def check_action_units(settings: Any, model: ModelSource, env: EvalEnv) -> None:
    """Refuse a model whose actions would stay in its normalised space (a checkpoint without
    statistics, none given) in an env that takes real units, unless the settings'
    ``allow_normalized_actions``."""
    head = model.head
    if head is None:
        return
    normalised = head.normalization != "none" and head.stats is None
    if normalised and env.real_action_units and not settings.allow_normalized_actions:
        raise ValueError(
            f"{model.label} has no action statistics ({head.domain_name!r} head, "
            f"normalization {head.normalization!r}), so its actions would stay in the model's "
            f"normalised space, which --env {settings.env} would take as real units; pass "
            "--action-stats FILE (the statistics JSON of the checkpoint's training data, see "
            "docs/libero.md), or --allow-normalized-actions to run anyway")
