"""Which model a run uses, read once, and the one way from it to a policy for an env.

Every command (``eval``, ``rollout``, ``rl grpo``, ``bench``), the Python evaluation call and the
LeRobot plugin start from a :class:`ModelSource`:

- :func:`read_model_source` reads the checkpoint folder once
  (:func:`~cosmos3_gym.formats.read_checkpoint`: configs, safetensors headers, statistics; no
  weight), resolves the action head the run uses (a recipe, an embodiment, the folder's own
  policy, ``--action-stats``; :func:`~cosmos3_gym.checkpoint.resolve_policy`) and keeps the
  observation contract the folder declares. A published shape with random weights
  (``--synthetic``) and a pipeline already in memory are model sources too.
- :meth:`ModelSource.adapter` is the adapter a policy drives an env with: the conventions the
  checkpoint declares (a LeRobot folder's cameras and gripper, a LIBERO export's), else the env
  family's, with the run's action map over it.
- :func:`load_policy` builds the pipeline from the folder already read and returns it with that
  adapter: eval, rollout and GRPO's training and held-out episodes all get theirs here, so they
  cannot disagree.

Everything but :meth:`ModelSource.load` works without torch, so a command checks a run before
the model stack loads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosmos3_gym.checkpoint import (
    PolicyConfig,
    check_action_stats,
    check_statistics_present,
    read_action_stats,
    resolve_policy,
)

if TYPE_CHECKING:
    from cosmos3_gym.envs import EvalEnv
    from cosmos3_gym.formats import CheckpointFolder, ObservationContract
    from cosmos3_gym.pipeline import InferenceOptions
    from cosmos3_gym.policy.adapters import Adapter


@dataclass(frozen=True)
class ModelSource:
    """A run's model, as read once: where it comes from, the head it runs with, and what it
    declares about observations.

    Attributes:
        label: how messages name it (``--checkpoint PATH``, ``--synthetic nano``, ``the pipeline
            given``).
        checkpoint: the checkpoint as the user named it (a folder, a shipped name, a Hugging
            Face repository id); for a pipeline given, the folder it was loaded from or
            ``"in memory"`` (:func:`pipeline_checkpoint`); None for a synthetic model.
        folder: the checkpoint folder as read (None: synthetic, or a pipeline given without one).
        head: how the checkpoint's action head is used in this run (its
            :class:`~cosmos3_gym.checkpoint.PolicyConfig`; None only for a stand-in pipeline
            without one, such as a test's).
        synthetic: the published shape of a random-weight model (``--synthetic``).
        pipeline: a pipeline already in memory (the Python API, a training loop's).
    """

    label: str
    checkpoint: str | None = None
    folder: CheckpointFolder | None = None
    head: PolicyConfig | None = None
    synthetic: str | None = None
    pipeline: Any = None

    @property
    def contract(self) -> ObservationContract | None:
        """The observation contract the checkpoint declares (None: the env's adapter decides)."""
        if self.pipeline is not None:
            return getattr(self.pipeline, "contract", None)
        if self.folder is None or self.head is None:
            return None
        from cosmos3_gym.formats import contract_of

        return contract_of(self.folder, self.head.domain_name)

    @property
    def revision(self) -> str | None:
        """The Hugging Face commit the checkpoint folder is a snapshot of (None: a plain
        folder)."""
        folder = self.folder if self.folder is not None else getattr(
            self.pipeline, "checkpoint", None)
        return getattr(folder, "revision", None)

    @property
    def action_head(self) -> tuple[int, str | None] | None:
        """The head's raw action width and domain, where known without loading weights."""
        if self.pipeline is not None:
            from cosmos3_gym.policy import pipeline_action_head

            return pipeline_action_head(self.pipeline)
        if self.head is None:
            return None
        return self.head.raw_action_dim, self.head.domain_name

    @property
    def action_horizon(self) -> int | None:
        if self.pipeline is not None:
            horizon = getattr(self.pipeline, "action_horizon", None)
            return int(horizon) if isinstance(horizon, int) else None
        return None if self.head is None else self.head.action_horizon

    def adapter(self, eval_env: EvalEnv, action_map: str | None = None) -> Adapter:
        """The adapter a policy of this model drives ``eval_env`` with: a synthetic model's
        (:func:`~cosmos3_gym.synthetic.synthetic_adapter`), the one the checkpoint's contract
        asks for (the env's cameras mapped onto its own), else the env family's (with its
        options); the action map (``action_map``, else the env's own:
        :func:`~cosmos3_gym.policy.adapters.action_map_of`) over it."""
        from cosmos3_gym.policy import get_adapter
        from cosmos3_gym.policy.adapters import (
            action_map_of,
            adapter_for_contract,
            with_action_map,
        )

        if self.synthetic is not None:
            from cosmos3_gym.synthetic import synthetic_adapter

            adapter = synthetic_adapter(eval_env)
        elif self.contract is not None:
            adapter = adapter_for_contract(self.contract, eval_env.adapter_options)
        else:
            adapter = get_adapter(eval_env.adapter, **eval_env.adapter_options)
        chosen = action_map_of(action_map, eval_env)
        if chosen is None:
            return adapter
        return with_action_map(adapter, chosen, eval_env.single_action_space())

    def load(self, eval_env: EvalEnv | None = None, *, device: Any, dtype: Any,
             options: InferenceOptions | None = None, trainable: bool = False) -> Any:
        """The pipeline: the one given, a synthetic model sized for ``eval_env``, or the
        checkpoint folder already read, built on ``device`` in ``dtype`` (``trainable``: for
        fine-tuning, :meth:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline.from_pretrained`)."""
        from dataclasses import replace

        from cosmos3_gym.pipeline import Cosmos3ActionPipeline, InferenceOptions

        if self.pipeline is not None:
            return self.pipeline
        options = options or InferenceOptions()
        if trainable:
            options = replace(options, fuse_projections=False, fp8=False)
        if self.synthetic is not None:
            from cosmos3_gym.synthetic import synthetic_pipeline

            return synthetic_pipeline(self.synthetic, device=device, dtype=dtype,
                                      options=options, eval_env=eval_env)
        return Cosmos3ActionPipeline.from_pretrained(
            self.folder, device=device, dtype=dtype, policy=self.head, options=options,
            trainable=trainable)

    def fingerprint(self) -> str | None:
        """What the weights are, in 16 hex digits: for a folder, a digest of every safetensors
        file's header and of each tensor's first and last bytes (read with the header, once;
        :class:`~cosmos3_gym.formats.base.Headers`) and of the head the run uses; for a pipeline
        in memory, of every transformer weight's bytes (:func:`weights_fingerprint`). None for
        a synthetic model (its weights follow from its shape and seed) or a stand-in without
        weights."""
        if self.pipeline is not None:
            # A pipeline whose weights are still those it loaded is named by its folder, as a
            # command that loads the same folder names it; changed weights by their own bytes.
            current = weights_fingerprint(self.pipeline)
            folder = getattr(self.pipeline, "checkpoint", None)
            if folder is not None and current is not None and current == getattr(
                    self.pipeline, "loaded_weights", None):
                return folder_fingerprint(folder, self.head)
            return current
        if self.folder is None:
            return None
        return folder_fingerprint(self.folder, self.head)


def folder_fingerprint(folder: CheckpointFolder, policy: PolicyConfig | None) -> str:
    """A checkpoint folder's weights and the head it runs with, in 16 hex digits: the digests
    its one read took of each safetensors file (:meth:`~cosmos3_gym.formats.base.Headers.
    digests`) and the head's settings."""
    files = {str(path.relative_to(folder.root)) if path.is_relative_to(folder.root)
             else str(path): digest for path, digest in folder.headers.digests().items()}
    head = None
    if policy is not None:
        head = dataclasses.asdict(policy)
        head.pop("sampler_sources", None)
    blob = json.dumps({"files": files, "head": head}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def weights_fingerprint(pipeline: Any) -> str | None:
    """The digest of a pipeline's transformer weights as they are in memory now
    (:func:`~cosmos3_gym.pipeline.sde.weights_digest`, read afresh); None for a stand-in without
    one. A training loop's evaluation computes it once per call: the weights it names are the
    ones that call evaluated."""
    transformer = getattr(pipeline, "transformer", None)
    if transformer is None or not hasattr(transformer, "named_parameters"):
        return None
    from cosmos3_gym.pipeline.sde import weights_digest

    return weights_digest(transformer, cached=False)


def read_model_source(model: Any, eval_env: EvalEnv | None = None) -> ModelSource:
    """The model a run's settings name (:class:`~cosmos3_gym.settings.ModelSettings`: its
    ``checkpoint``, ``synthetic``, ``domain``, ``recipe``, ``action_stats``, ``vae`` and
    ``tokenizer``), read once: the folder and its checks, the head the run uses (its statistics
    checked against it), no weight loaded. ``eval_env`` sizes a synthetic model's head for a
    foreign env. A head that nothing names (a diffusers folder without ``action_policy.json``
    and no domain or recipe) is an error now, naming the fix."""
    if model.synthetic is not None:
        from cosmos3_gym.synthetic import synthetic_policy

        return ModelSource(label=f"--synthetic {model.synthetic}", synthetic=model.synthetic,
                           head=synthetic_policy(eval_env))
    from cosmos3_gym.formats import read_checkpoint

    checkpoint = model.checkpoint if model.checkpoint is not None else "tiny"
    label = f"--checkpoint {checkpoint}"
    folder = read_checkpoint(checkpoint, vae=model.vae, tokenizer=model.tokenizer)
    policy = read_head(folder, model, label)
    return ModelSource(label=label, checkpoint=str(checkpoint), folder=folder, head=policy)


def read_head(folder: CheckpointFolder, model: Any, label: str) -> PolicyConfig:
    """The head a run of ``folder`` uses under ``model``'s settings (its ``domain``, ``recipe``
    and ``action_stats``), its statistics checked against it: what a run, ``inspect`` and
    ``convert`` all take. A head nothing names is a :class:`FileNotFoundError` naming the fix;
    ``label`` names the checkpoint in errors."""
    policy = resolve_policy(folder.root, domain=model.domain, recipe=model.recipe,
                            declared=folder.policy)
    if model.action_stats is not None:
        stats = read_action_stats(model.action_stats)
        check_action_stats(stats, policy, f"action statistics {model.action_stats}")
        policy = dataclasses.replace(policy, stats=stats)
    elif policy.denormalizes:  # the checkpoint's own statistics, for its head's mode
        check_action_stats(policy.stats, policy, f"{label}'s action statistics")
    check_statistics_present(policy, folder.format, folder.root)
    return policy


# How a run names a pipeline handed in that was not loaded from a checkpoint folder.
IN_MEMORY = "in memory"


def pipeline_checkpoint(pipeline: Any) -> str:
    """How a run names a pipeline handed in: the checkpoint folder it was loaded from (a shipped
    checkpoint by its name, as ``--checkpoint tiny`` names it), else ``"in memory"``. Whether
    its weights are still the folder's is the identity's ``weights`` (:meth:`ModelSource.
    fingerprint`)."""
    folder = getattr(pipeline, "checkpoint", None)
    root = getattr(folder, "root", None)
    if root is None:
        return IN_MEMORY
    from cosmos3_gym.formats import SHIPPED

    root = Path(root)
    return root.name if root.parent == SHIPPED else str(root)


def pipeline_source(pipeline: Any) -> ModelSource:
    """A pipeline already in memory as a model source (its policy and contract its own; its
    name :func:`pipeline_checkpoint`)."""
    return ModelSource(label="the pipeline given", pipeline=pipeline,
                       checkpoint=pipeline_checkpoint(pipeline),
                       folder=getattr(pipeline, "checkpoint", None),
                       head=getattr(pipeline, "policy", None))


def load_policy(source: ModelSource, eval_env: EvalEnv, *, device: Any, dtype: Any,
                options: InferenceOptions | None = None, trainable: bool = False,
                action_map: str | None = None) -> tuple[Any, Adapter]:
    """The one way from a model source to what drives ``eval_env``: its pipeline
    (:meth:`ModelSource.load`) and its adapter (:meth:`ModelSource.adapter`)."""
    adapter = source.adapter(eval_env, action_map)
    pipeline = source.load(eval_env, device=device, dtype=dtype, options=options,
                           trainable=trainable)
    return pipeline, adapter
