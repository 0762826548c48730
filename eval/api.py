"""Evaluation as one call: ``cosmos3_gym.evaluate(policy, env, ...)``, from a training loop too.

The call builds the run's settings (:class:`~cosmos3_gym.eval.evaluate.EvalConfig`) from its
keywords and resolves them (:func:`~cosmos3_gym.eval.run.resolve`), as the command line does;
the episodes are those ``cosmos3-gym eval`` runs with the same settings. A model in memory is
evaluated as it is, with its weights as they are now: nothing is copied or loaded, its modules
are in eval mode and autograd is off while the episodes run, and the caller's train/eval
modes, ``requires_grad`` flags and random number generators (torch's, CUDA's, numpy's and
Python's) are as they were after the call (:func:`caller_state`).

``out=None`` runs in a temporary folder removed after the call (the records are kept in the
returned :class:`EvalResults`): one code path, the run folder's, for every evaluation, at the
cost of a few small files written and read (milliseconds an episode). With ``videos=`` the
folder is kept (``EvalResults.out``), since the videos live in it. ``out=DIR`` is a run folder
like the command line's: resumable, and bound to the run's identity, which holds the weights'
fingerprint, so a folder never answers for other weights (it refuses them with one line
listing ``weights``; give each evaluation of a changing model its own folder).

Under torchrun each rank runs its share of the episodes and every rank returns the whole run's
results (the ranks hand each other their records at the end).

Design: docs/evaluation.md, "In a training loop".
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import os
import random
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosmos3_gym.eval.evaluate import EvalConfig, Evaluator
from cosmos3_gym.eval.results import format_table, read_episode_records
from cosmos3_gym.eval.run import Run, resolve
from cosmos3_gym.settings import EnvSettings, ModelSettings

if TYPE_CHECKING:
    from cosmos3_gym.envs import EvalEnv

@dataclass(frozen=True)
class EvalResults:
    """What an evaluation measured: the run's ``results.json`` document and its episodes.

    Attributes:
        document: the ``results.json`` document (docs/evaluation.md, "What the run folder
            holds"); :meth:`to_dict` returns a copy.
        episodes: every episode's record (the lines of ``episodes.jsonl``), in the run's order
            (task by task, trial by trial).
        out: the run folder (None: the call ran in a temporary folder, removed).
    """

    document: dict[str, Any]
    episodes: list[dict[str, Any]]
    out: Path | None = None

    @property
    def success_rate(self) -> float | None:
        """Successes over episodes (None: the env's success rule is ``none``)."""
        return self.document["success_rate"]

    @property
    def interval(self) -> tuple[float | None, float | None]:
        """The success rate's Wilson 95% interval."""
        low, high = self.document["interval"]
        return low, high

    @property
    def successes(self) -> int | None:
        return self.document["successes"]

    @property
    def per_task(self) -> dict[str, dict[str, Any]]:
        """Task name -> ``{success_rate, successes, episodes, interval, mean_return,
        mean_length}``, tasks in the run's order."""
        return self.document["per_task"]

    @property
    def returns(self) -> list[float]:
        """Each episode's sum of rewards, in the run's order."""
        return [r["return"] for r in self.episodes]

    @property
    def mean_return(self) -> float | None:
        return self.document["mean_return"]

    @property
    def complete(self) -> bool:
        """Every episode of the run (or of its shard) is recorded."""
        return self.document["complete"]

    def table(self) -> str:
        """The summary table ``cosmos3-gym eval`` prints."""
        return format_table(self.document)

    def to_dict(self) -> dict[str, Any]:
        """The ``results.json`` document (a copy)."""
        return copy.deepcopy(self.document)

    def __repr__(self) -> str:
        rate, (low, high) = self.success_rate, self.interval
        shown = "-" if rate is None else (f"{rate:.3f} [{low:.3f}, {high:.3f}]")
        return (f"EvalResults(success_rate={shown}, episodes={len(self.episodes)}, "
                f"out={None if self.out is None else str(self.out)!r})")


def evaluate(policy: Any, env: str | EvalEnv, *, trials: int | None = None, seed: int = 0,
             num_envs: int = 4, out: str | os.PathLike[str] | None = None,
             progress: bool = False, **protocol: Any) -> EvalResults:
    """Evaluate ``policy`` on ``env``: every task, ``trials`` episodes each, in ``num_envs``
    env slots; returns the :class:`EvalResults` (the module notes say what the call keeps and
    restores).

    Args:
        policy: a :class:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline` (or any callable with
            its signature), used as it is in memory; a :class:`~cosmos3_gym.policy.
            VectorPolicy`, whose pipeline, adapter, ``n_action_steps`` and sampler settings
            are used; or a checkpoint (a folder, a shipped name, a Hugging Face id), loaded
            for the call.
        env: a name ``cosmos3-gym eval --env`` takes (``"color_reach"``, ``"libero"``,
            ``"gym:ID"``, a preset such as ``"metaworld:mt10"``), ``"libero:SUITE"`` for
            ``env="libero", suite=SUITE``; or an :class:`~cosmos3_gym.envs.EvalEnv`.
        trials: episodes per task (default: the protocol's, 10).
        seed: the run's root seed; every episode's env and noise seeds derive from it.
        num_envs: env slots stepped together.
        out: a run folder (resumable, kept), or None (a temporary folder, removed).
        progress: a progress bar.
        **protocol: any other :class:`~cosmos3_gym.eval.evaluate.EvalConfig` setting
            (``tasks``, ``n_action_steps``, ``protocol``, ``shuffle_prompts``, ``videos``,
            ``image_size``, ``shard``, ...) and any sampler setting
            (:class:`~cosmos3_gym.pipeline.SamplerConfig`: ``num_inference_steps``,
            ``noise``, ...); with a checkpoint, the model settings (``domain``, ``recipe``,
            ``action_stats``, ``device``, ``precision``).

    A bad value is one ``ValueError`` (``TypeError`` for a wrong kind of argument) before
    anything runs or is written.
    """
    settings, pipeline, adapter, eval_env = _settings(policy, env, trials=trials, seed=seed,
                                                      num_envs=num_envs, progress=progress,
                                                      given=protocol)
    keep = out is not None or settings.videos is not None
    folder = Path(out) if out is not None else Path(tempfile.mkdtemp(prefix="cosmos3-gym-eval-"))
    try:
        results = evaluate_run(resolve(settings, folder, kind="evaluation", pipeline=pipeline,
                                       eval_env=eval_env, adapter=adapter))
    finally:
        if not keep:
            shutil.rmtree(folder, ignore_errors=True)
    return dataclasses.replace(results, out=folder if keep else None)


def evaluate_run(run: Run) -> EvalResults:
    """A resolved evaluation (:func:`~cosmos3_gym.eval.run.resolve`, or a run derived from
    another: :meth:`~cosmos3_gym.eval.run.Run.derive`) run into its folder under
    :func:`caller_state`, its results on every rank."""
    with caller_state(run.model.pipeline):
        document = Evaluator(run).run()
    return EvalResults(document, read_episode_records(run.out), run.out)


@contextlib.contextmanager
def caller_state(pipeline: Any) -> Iterator[None]:
    """Inside: ``pipeline``'s modules (its ``torch.nn.Module`` attributes) in eval mode,
    autograd off. After, whatever happened inside: every submodule's train/eval mode, every
    parameter's ``requires_grad``, and the random number generators of torch (CPU, and CUDA
    where it is initialised), numpy and Python as they were before."""
    import numpy as np
    import torch

    modules = [m for m in vars(pipeline).values() if isinstance(m, torch.nn.Module)] if (
        hasattr(pipeline, "__dict__")) else []
    modes = [(m, m.training) for top in modules for m in top.modules()]
    grads = [(p, p.requires_grad) for top in modules for p in top.parameters()]
    cuda = torch.cuda.is_initialized()
    states = (random.getstate(), np.random.get_state(), torch.get_rng_state(),
              torch.cuda.get_rng_state_all() if cuda else None)
    try:
        for module in modules:
            module.eval()
        with torch.no_grad():
            yield
    finally:
        for module, training in modes:
            module.training = training
        for param, flag in grads:
            param.requires_grad_(flag)
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda:
            torch.cuda.set_rng_state_all(states[3])


def _settings(policy: Any, env: Any, *, trials: int | None, seed: int, num_envs: int,
              progress: bool, given: dict[str, Any]) -> tuple[EvalConfig, Any, Any, Any]:
    """The call's arguments as ``(settings, pipeline, adapter, eval_env)`` for
    :func:`~cosmos3_gym.eval.run.resolve`; one error for anything it cannot take."""
    from cosmos3_gym.envs import EvalEnv
    from cosmos3_gym.pipeline.sampling import SamplerConfig
    from cosmos3_gym.policy import VectorPolicy

    given = dict(given)
    sampler_names = {f.name for f in dataclasses.fields(SamplerConfig)}
    flat_sampler = {k: given.pop(k) for k in sorted(set(given) & sampler_names)}
    known = {f.name for f in dataclasses.fields(EvalConfig)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise TypeError(f"evaluate(): unknown settings {unknown}; it takes EvalConfig's "
                        f"settings and SamplerConfig's (docs/settings.md)")
    if flat_sampler:
        sampling = given.get("sampling", SamplerConfig())
        if not isinstance(sampling, SamplerConfig):
            raise TypeError(f"sampling must be a SamplerConfig; found {type(sampling).__name__}")
        given["sampling"] = dataclasses.replace(sampling, **flat_sampler)

    pipeline = adapter = None
    model_names = [f.name for f in dataclasses.fields(ModelSettings)]
    if isinstance(policy, VectorPolicy):
        held = [k for k in ("n_action_steps", "sampling") if k in given]
        if held:
            raise ValueError(f"evaluate(): the VectorPolicy given holds its own {held}; give "
                             "its pipeline instead to set them here")
        pipeline, adapter = policy.pipeline, policy.adapter
        given.update(n_action_steps=policy.config.n_action_steps, sampling=policy.sampling)
    elif isinstance(policy, (str, os.PathLike)):
        if given.get("synthetic") is not None or given.get("checkpoint") is not None:
            raise ValueError(f"evaluate(): the policy is the checkpoint {str(policy)!r}; "
                             "drop checkpoint= and synthetic=")
        given["checkpoint"] = str(policy)
    elif callable(policy):
        pipeline = policy
    else:
        raise TypeError(f"evaluate(): policy must be a Cosmos3ActionPipeline, a VectorPolicy or "
                        f"a checkpoint path; found {type(policy).__name__}")
    if pipeline is not None:
        named = [k for k in (*model_names, "device", "precision") if given.get(k) is not None]
        if named:
            raise ValueError(f"evaluate(): {named} choose a model or where it runs, but the "
                             "policy given is one in memory (evaluated as it is, where it is); "
                             "drop them")

    eval_env = None
    if isinstance(env, EvalEnv):
        env_names = [f.name for f in dataclasses.fields(EnvSettings)
                     if f.name not in ("num_envs", "async_envs", "env_timeout", "overlap")]
        named = [k for k in env_names if given.get(k) is not None]
        if named:
            raise ValueError(f"evaluate(): {named} configure an env by name, but the env given "
                             f"is built already ({type(env).__name__}); drop them")
        eval_env = env
    elif isinstance(env, str):
        family, colon, suite = env.partition(":")
        if family == "libero" and colon:
            if given.get("suite") not in (None, suite):
                raise ValueError(f"evaluate(): env {env!r} names suite {suite!r}, and "
                                 f"suite={given['suite']!r} another; give one")
            env, given["suite"] = family, suite
        given["env"] = env
    else:
        raise TypeError(f"evaluate(): env must be an env name (as --env takes it) or an "
                        f"EvalEnv; found {type(env).__name__}")
    settings = EvalConfig(trials=trials, seed=seed, num_envs=num_envs, progress=progress,
                          **given)
    arms = settings.arm_flags()
    if arms:
        named = " and ".join(a.lstrip("-") for a in arms)
        raise ValueError(f"evaluate(): {named} would run arms (several evaluations in one "
                         "folder), and this call runs one; call it once per arm, or run the arms "
                         "with cosmos3_gym.eval.evaluate.evaluate(EvalConfig(...), out_dir) or "
                         "`cosmos3-gym eval`")
    return settings, pipeline, adapter, eval_env
