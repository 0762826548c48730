"""``Cosmos3ActionPipeline``: uint8 images and prompts in, ``[B, H, D]`` action chunks out."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos3_gym import checkpoint as layout
from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.formats import (
    CheckpointFolder,
    ObservationContract,
    contract_of,
    resolve_checkpoint,
)
from cosmos3_gym.model import Cosmos3Transformer
from cosmos3_gym.pipeline.admission import admit, nonfinite
from cosmos3_gym.pipeline.normalization import ActionStats, normalize_actions
from cosmos3_gym.pipeline.options import InferenceOptions
from cosmos3_gym.pipeline.output import ActionOutput
from cosmos3_gym.pipeline.preprocess import plan_canvas
from cosmos3_gym.pipeline.prompt import load_tokenizer
from cosmos3_gym.pipeline.prompt_cache import PromptCache
from cosmos3_gym.pipeline.sampling import DETERMINISTIC_SAMPLER, unscorable
from cosmos3_gym.pipeline.sde import (
    StochasticRecord,
    stochastic_sampling,
    weights_digest,
)
from cosmos3_gym.pipeline.stages import (
    CommittedRows,
    DecodeStage,
    DenoiseStage,
    EncodeStage,
    MicroBatch,
    NoiseStage,
    PreprocessStage,
    PromptStage,
    SamplingParams,
)
from cosmos3_gym.seeding import check_noise, check_seed
from cosmos3_gym.timing import StageTimer

DEFAULT_SEED = 0  # the official LIBERO server's seed

logger = logging.getLogger(__name__)


class Cosmos3ActionPipeline:
    """The batched Cosmos3 policy stack in one process.

    ``pipe(images, prompts)`` runs admission once, then per micro-batch preprocess -> prompt ->
    encode -> noise -> denoise -> decode, each timed by one ``StageTimer``. Items of one call
    that need different canvases, or more than ``max_batch_size`` items, run as micro-batches;
    results come back in the caller's order and do not depend on the split.

    Example::

        # a post-trained folder with its action_policy.json (domain, statistics, ...)
        pipe = Cosmos3ActionPipeline.from_pretrained("/models/my-cosmos3-libero", device="cuda")
        # a published diffusers folder has none: name its embodiment
        # Cosmos3ActionPipeline.from_pretrained("/models/Cosmos3-Nano", domain="droid_lerobot")
        out = pipe(images_uint8_bhwc, ["put the bowl on the plate"] * len(images_uint8_bhwc))
        out.actions            # float32 [B, 16, 10]
        out.timings            # {"denoise_s": ..., "total_s": ...}
    """

    def __init__(
        self,
        transformer: Cosmos3Transformer,
        vae: Any,
        tokenizer: Any,
        policy: PolicyConfig,
        *,
        max_batch_size: int | None = None,
        options: InferenceOptions | None = None,
        contract: ObservationContract | None = None,
        checkpoint: CheckpointFolder | None = None,
    ) -> None:
        """Assemble the stages around loaded components (:meth:`from_pretrained` loads them and
        prepares the transformer as ``options`` asks; the stages read the other options).
        ``contract`` is the observation contract the checkpoint declares (the policy's default
        adapter follows it), ``checkpoint`` what was read from disk."""
        if not transformer.config.action_gen:
            raise ValueError("this transformer has no action heads (action_gen is false)")
        if max_batch_size is not None and max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1 or None, got {max_batch_size}")
        if policy.domain_id >= transformer.config.num_embodiment_domains:
            raise ValueError(
                f"domain_id {policy.domain_id} is outside the checkpoint's "
                f"{transformer.config.num_embodiment_domains} embodiment domains"
            )
        self.transformer, self.vae, self.tokenizer = transformer, vae, tokenizer
        self.policy = policy
        # The transformer's weights digest when it was loaded from ``checkpoint``
        # (from_pretrained sets it): None, or for a pipeline made otherwise.
        self.loaded_weights: str | None = None
        self.contract = contract
        self.checkpoint = checkpoint
        self.max_batch_size = max_batch_size
        # The largest micro-batch that fit in device memory after an out-of-memory error
        # (None until one happens); later calls split by it too.
        self.memory_batch_limit: int | None = None
        self.device = transformer.device
        options = (options or InferenceOptions()).resolve(self.device.type)
        stats = ActionStats.from_dict(policy.stats) if policy.denormalizes else None
        self.state_stats = None
        if policy.history_length and policy.state_stats is not None:
            self.state_stats = ActionStats.from_dict(policy.state_stats)
        if policy.normalization != "none" and policy.stats is None:
            logger.warning(
                "no action statistics for domain %r (normalization %r): actions are returned in "
                "the model's normalised space; give PolicyConfig(stats=...) (command line: "
                "--action-stats FILE) for actions in the domain's units",
                policy.domain_name, policy.normalization,
            )
        self.preprocess = PreprocessStage(self.device, next(vae.parameters()).dtype,
                                          round_resized=policy.resize == "uint8")
        cache = None
        if options.prompt_cache:
            cache = PromptCache(transformer, max_bytes=options.prompt_cache_mb * 2**20)
        self.prompt = PromptStage(transformer, tokenizer, policy, cache)
        self.encode = EncodeStage(vae, use_frame_encoder=options.frame_encoder)
        self.noise = NoiseStage(
            policy, self.device, action_dim=transformer.config.action_dim,
            temporal_factor=int(vae.config.scale_factor_temporal),
        )
        self.denoise = DenoiseStage(transformer, policy, options)
        self.decode = DecodeStage(policy, stats, vae)
        self.stages = (
            self.preprocess, self.prompt, self.encode, self.noise, self.denoise, self.decode
        )

    @property
    def options(self) -> InferenceOptions:
        """How this pipeline computes: the options it was built with, auto switches decided for
        its device, less any fallible option that failed here (:attr:`disabled_options`)."""
        return self.denoise.options

    @property
    def disabled_options(self) -> dict[str, str]:
        """Options switched off because they failed on this device: name -> the error."""
        return dict(self.denoise.disabled)

    @property
    def action_horizon(self) -> int:
        return self.policy.action_horizon

    # Takes committed_actions: real-time chunking's clean leading rows (the policy's --rtc).
    takes_committed_actions = True

    @property
    def history_length(self) -> int:
        """S, the clean state rows each call takes (``state=[B, S, D]``); 0: no state input."""
        return self.policy.history_length

    @property
    def recipe(self) -> str | None:
        """The recipe (:mod:`cosmos3_gym.recipes`) the sampler settings come from, if any."""
        return self.policy.recipe

    @property
    def sampler_source(self) -> dict[str, str]:
        """Where each sampler default in force came from: ``{"num_inference_steps": "recipe
        nano-policy-droid", "flow_shift": "scheduler/scheduler_config.json", ...}`` (the order
        is in docs/recipes.md)."""
        return {name: s["source"] for name, s in self.policy.sampler.items()}

    @property
    def sampler_record(self) -> dict[str, Any]:
        """The sampler defaults for a run's record (``results.json``): the recipe, each
        setting's value and source, and the scheduler."""
        return {"recipe": self.recipe, **self.policy.sampler, "scheduler": self.policy.scheduler}

    def describe_sampler(self) -> str:
        """One summary line: the sampler defaults and where they came from."""
        line = self.policy.describe_sampler()
        return line if self.recipe is None else f"recipe {self.recipe}: {line}"

    @property
    def action_dim(self) -> int:
        return self.policy.raw_action_dim

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path | CheckpointFolder,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_size: int | None = None,
        *,
        policy: PolicyConfig | None = None,
        domain: str | None = None,
        action_stats: str | Path | dict[str, Any] | None = None,
        recipe: str | None = None,
        options: InferenceOptions | None = None,
        trainable: bool = False,
        vae: str | Path | None = None,
        tokenizer: str | Path | None = None,
    ) -> Cosmos3ActionPipeline:
        """Load a Cosmos3 checkpoint: a folder as downloaded, the name of a shipped checkpoint, a
        Hugging Face repository id (``org/name[@revision]``, from the local cache first), or a
        folder already read (:func:`cosmos3_gym.formats.read_checkpoint`), which is not read
        again.

        The format is told from the files (:mod:`cosmos3_gym.formats`): a diffusers folder
        (``transformer/``, ``vae/``, ``text_tokenizer/``), a LeRobot policy folder
        (``config.json`` + ``model.safetensors`` + processors), or a cosmos-framework export
        (``config.json`` with a ``"model"`` section + ``model-*.safetensors``). Every tensor is
        loaded strictly: a missing, extra or mis-shaped one is an error naming it. ``vae`` is
        the VAE of an export (which holds none): a diffusers ``AutoencoderKLWan`` folder, or a
        Cosmos3 diffusers checkpoint whose ``vae/`` is used; ``tokenizer`` replaces the
        tokenizer a LeRobot folder names.

        ``device`` is a device or ``"auto"`` (:func:`cosmos3_gym.devices.resolve_device`: the GPU
        where there is one); ``dtype`` defaults to bfloat16 on CUDA and float32 on CPU. How the
        action head is used comes from, in order: ``policy``; a ``recipe``
        (:data:`~cosmos3_gym.recipes.RECIPES`), over the folder's own policy where it has one;
        ``domain``, an embodiment of :data:`~cosmos3_gym.checkpoint.DOMAINS` (``"libero"`` is
        the official LIBERO recipe) for folders that declare none (a published diffusers
        folder, an export); the policy the folder declares (a LeRobot folder's ``config.json``
        and processors: its caption, sampler, scheduler, statistics and gripper convention; a
        diffusers folder's ``action_policy.json``). Sampler defaults that none of these states
        come from the folder's ``scheduler/scheduler_config.json`` (its flow shift), else
        :class:`PolicyConfig`'s; :attr:`sampler_source` says which, and docs/recipes.md gives
        the whole order. ``action_stats`` (a statistics JSON file, or its parsed dict) replaces
        the head's statistics, checked against it; without statistics the actions stay
        normalised (one warning), except for an export, which is refused without them.
        ``options`` (:class:`InferenceOptions`, default: as shipped) says how to compute: the
        transformer is fused, folded and compiled here as they ask, the stages get the rest.

        ``trainable=True`` gives a pipeline to fine-tune with: the transformer's projections
        stay unfused (autograd reaches every weight; fused copies are plain tensors), it is in
        train mode with ``requires_grad=True`` on every parameter, and sampling and
        :func:`~cosmos3_gym.pipeline.chunk_log_prob` run on those same weights.
        """
        from cosmos3_gym.devices import resolve_device, resolve_dtype
        from cosmos3_gym.formats import check_loads, read_checkpoint
        from cosmos3_gym.model.weights import TensorFiles, build_transformer, build_vae

        # Everything that can be known without the weights, checked first: configs, files
        # complete, every tensor name accounted for, the policy and its statistics.
        if isinstance(path, CheckpointFolder):
            if vae is not None or tokenizer is not None:
                raise ValueError("vae= and tokenizer= are read with the folder: pass them to "
                                 "read_checkpoint, not with a folder already read")
            folder = path
        else:
            folder = read_checkpoint(path, vae=vae, tokenizer=tokenizer)
        check_loads(folder)  # what inspect and convert check: tokenizer files, tensor headers
        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        options = options or InferenceOptions()
        if trainable:
            # Fused (and FP8) weights are copies autograd does not reach.
            options = replace(options, fuse_projections=False, fp8=False)
        options = options.resolve(device.type)
        policy = layout.resolve_policy(folder.root, policy, domain, recipe=recipe,
                                       declared=folder.policy)
        if action_stats is not None:
            source = "action statistics"
            if not isinstance(action_stats, dict):
                source = f"action statistics {action_stats}"
                action_stats = layout.read_action_stats(action_stats)
            layout.check_action_stats(action_stats, policy, source)
            policy = replace(policy, stats=action_stats)
        layout.check_statistics_present(policy, folder.format, folder.root)
        text_tokenizer = load_tokenizer(folder.tokenizer)
        with TensorFiles(device) as files:  # a file two components share is opened once
            transformer = build_transformer(Cosmos3Transformer, folder.transformer,
                                            folder.transformer_weights, device=device,
                                            dtype=dtype, files=files)
            vae_model = build_vae(folder.vae_config, folder.vae_weights, device=device,
                                  files=files)
        _prepare_transformer(transformer, options)
        if trainable:
            transformer.train().requires_grad_(True)
        contract = contract_of(folder, policy.domain_name)
        pipe = cls(
            transformer, vae_model, text_tokenizer, policy, max_batch_size=max_batch_size,
            options=options, contract=contract, checkpoint=folder,
        )
        # The weights as loaded: while the transformer still holds them, a run names this
        # pipeline's weights by its folder (cosmos3_gym.source.ModelSource.fingerprint).
        pipe.loaded_weights = weights_digest(transformer)
        return pipe

    @classmethod
    def from_preset(
        cls,
        preset: str,
        policy: PolicyConfig,
        *,
        device: str | torch.device = "auto",
        dtype: torch.dtype | None = None,
        max_batch_size: int | None = None,
        options: InferenceOptions | None = None,
        seed: int = 0,
    ) -> Cosmos3ActionPipeline:
        """A pipeline of a published model shape with random weights, built on the device:
        :mod:`~cosmos3_gym.model.presets` ``nano``, ``super``, ``edge`` (``tiny`` for a CPU),
        the Wan2.2 VAE at its real widths, the shipped tiny checkpoint's tokenizer (Qwen's
        chat template and special tokens).

        It computes exactly what a real checkpoint of that shape computes, on the same shapes,
        so its timings and memory are the real model's; its actions mean nothing. For sizing
        hardware and measuring a whole evaluation loop before the weights are at hand.
        """
        from cosmos3_gym.devices import resolve_device, resolve_dtype
        from cosmos3_gym.model.presets import random_transformer, random_vae, vae_preset

        device = resolve_device(device)
        dtype = resolve_dtype(dtype, device)
        options = (options or InferenceOptions()).resolve(device.type)
        transformer = random_transformer(preset, device=device, dtype=dtype, seed=seed)
        _prepare_transformer(transformer, options)
        vae = random_vae(vae_preset(preset), device=device, seed=seed + 1)
        tokenizer = load_tokenizer(resolve_checkpoint("tiny") / layout.TEXT_TOKENIZER)
        return cls(
            transformer, vae, tokenizer, policy, max_batch_size=max_batch_size, options=options
        )

    @torch.inference_mode()
    def __call__(
        self,
        images: Any,
        prompts: str | Sequence[str],
        *,
        seed: int | Sequence[int] | None = None,
        num_inference_steps: int | None = None,
        guidance_scale: float | None = None,
        guidance_interval: tuple[float, float] | None = None,
        flow_shift: float | None = None,
        state: np.ndarray | torch.Tensor | None = None,
        committed_actions: Sequence[np.ndarray | None] | None = None,
        action_noise: torch.Tensor | np.ndarray | None = None,
        video_noise: torch.Tensor | np.ndarray | None = None,
        progress: bool = True,
        return_video: bool | Sequence[bool] = False,
        sampler: str = DETERMINISTIC_SAMPLER,
        noise_level: float = 0.5,
        sde_steps: str | Sequence[int] = "random",
        executed_actions: int | None = None,
        step_noise_seed: Sequence[int] | None = None,
    ) -> ActionOutput:
        """Predict one action chunk per image.

        Args:
            images: uint8 ``[B, H, W, C]``, a list of uint8 ``[H, W, C]``/``[H, W]`` arrays or PIL
                images, a single image, or a dict observation (``image`` / ``image_path`` /
                ``input_reference`` / single-entry ``images``).
            prompts: one task per image, or one string for all.
            seed: one int for every item, or one per item (default 0). Item i's noise depends
                only on its own seed.
            num_inference_steps: this call's denoising steps (None, as for the next three: the
                checkpoint's, :attr:`sampler_source`).
            guidance_scale: this call's classifier-free guidance scale (1: off).
            guidance_interval: ``(lo, hi)`` applies guidance only on the steps whose model
                timestep t has ``lo < t < hi``; the other steps run the conditional rows alone.
            flow_shift: this call's flow shift of the sigma schedule.
            state: for a state-conditioned head (``history_length`` S > 0): ``[B, S, D]`` float
                robot state rows in the action representation and units (``D =
                raw_action_dim``), normalised here like the actions and fed as clean leading
                action rows; the returned chunks are the H predicted rows only.
            committed_actions: real-time chunking: per item, ``[C, D]`` float raw actions (``D =
                raw_action_dim``, ``0 <= C < H``; ``None`` for none) that the env executes
                while this chunk is computed. They are the chunk's first C rows, conditioning
                as the state rows are (clean, after them), so the chunk goes on from what is
                executing; the returned chunk holds them exactly as given.
            action_noise: ``[B, H, 64]`` float noise that replaces the seeded draw of the
                action tokens (RL replay, parity tests).
            video_noise: ``[B, 48, T, h, w]`` float noise that replaces the seeded draw of the
                predicted video's latents.
            progress: show the denoising progress bar (rank 0 only).
            return_video: also decode the predicted future frames (``out.video``): True for
                every item, or one bool per item (e.g. only the envs that record a video; the
                others get ``None``). Policy serving never needs them, so the VAE decoder runs
                only for the items asked; the actions are the same either way.
            sampler: ``"flow_unipc"`` (default, deterministic given the noise), or for RL
                ``"flow_sde"`` / ``"flow_cps"``: Gaussian action steps with a log-probability
                (:mod:`cosmos3_gym.pipeline.sde`; ``out.stochastic`` records them).
            noise_level: the stochastic steps' noise level.
            sde_steps: which steps are stochastic (``"random"``: one per chunk, from the item's
                seed; ``"random-but-last"``: the same, never the last step; ``"all"``; or step
                indices).
            executed_actions: how many leading actions of a chunk the env executes: the rows
                the log-probability sums over (default: all H).
            step_noise_seed: with a stochastic sampler, one int per item: the seed of its
                stochastic steps' Gaussian draws, the noise the log-probability scores (default:
                the item's ``seed``, which in any case draws the start noise and picks the
                steps). Items that share a seed and differ here differ only in scored noise (GRPO's
                ``--group-noise shared``).
        """
        timer = StageTimer(self.device)
        with timer.stage("admission"):
            admitted = admit(images, prompts)
            count = admitted.batch_size
            seeds = _seeds(seed, count)
            noise_seeds = None
            if step_noise_seed is not None:
                if sampler == DETERMINISTIC_SAMPLER:
                    raise ValueError(
                        f"step_noise_seed: only a stochastic sampler draws step noise; found "
                        f"sampler {sampler!r}")
                if isinstance(step_noise_seed, (int, np.integer)):
                    raise ValueError(f"step_noise_seed: expected one int per item ({count}); "
                                     f"found one int, {step_noise_seed!r}")
                noise_seeds = _seeds(step_noise_seed, count, "step_noise_seed")
            action_noise = self._action_noise(action_noise, count)
            video_noise = _noise_tensor("video_noise", video_noise, count, ("C", "T", "h", "w"))
            state_rows = self._state_rows(state, count)
            committed = self._committed_rows(committed_actions, count)
            interval = self.policy.guidance_interval if guidance_interval is None else (
                layout.check_guidance_interval(guidance_interval))
            if sampler != DETERMINISTIC_SAMPLER:
                cannot = unscorable(
                    self.policy, state_rows=state_rows is not None,
                    committed_actions=committed is not None, guidance_interval=interval,
                    guidance_scale=(self.policy.guidance_scale if guidance_scale is None
                                    else guidance_scale))
                if cannot:
                    raise ValueError(
                        f"sampler {sampler!r} does not take {' and '.join(cannot)} yet; use the "
                        f"deterministic {DETERMINISTIC_SAMPLER!r}")
            params = SamplingParams(
                num_inference_steps=_positive_int(
                    "num_inference_steps", num_inference_steps, self.policy.num_inference_steps
                ),
                guidance_scale=float(
                    self.policy.guidance_scale if guidance_scale is None else guidance_scale
                ),
                flow_shift=float(self.policy.flow_shift if flow_shift is None else flow_shift),
                progress=progress,
                stochastic=stochastic_sampling(sampler, noise_level, sde_steps, executed_actions),
                guidance_interval=interval,
                scheduler_config=self.policy.scheduler_config,
            )
            if params.stochastic is not None:  # refuse step indices outside the schedule now
                params.stochastic.steps_for(0, params.num_inference_steps)
            video_rows = _video_rows(return_video, count)
            batches = self._micro_batches(admitted.images, admitted.prompts, seeds)
            for mb in batches:
                if noise_seeds is not None:
                    mb.step_noise_seeds = [noise_seeds[i] for i in mb.indices]
                if any(video_rows):
                    mb.video_rows = [video_rows[i] for i in mb.indices]
                if action_noise is not None:
                    mb.action_noise = action_noise[mb.indices]
                if video_noise is not None:
                    mb.video_noise = video_noise[mb.indices]
                if state_rows is not None:
                    mb.state = state_rows[mb.indices]
                if committed is not None:
                    mb.committed = committed.rows(mb.indices)

        cache = self.prompt.cache
        hits, misses = (cache.hits, cache.misses) if cache is not None else (0, 0)
        results = self._run(batches, params, timer)
        if cache is not None:
            timer.count("prompt_cache_hits", cache.hits - hits)
            timer.count("prompt_cache_misses", cache.misses - misses)

        def gather(key: str) -> np.ndarray:
            return np.stack(_in_caller_order(results, key, count))

        return ActionOutput(
            actions=gather("actions"),
            normalized_actions=gather("normalized_actions"),
            action_noise=gather("action_noise"),
            # Seeds stay meaningful unless the caller replaced both noises.
            seeds=[None if action_noise is not None and video_noise is not None else s
                   for s in seeds],
            timings=timer.as_dict(),
            # Clips stay a list: micro-batches of other canvases give other frame sizes.
            video=_in_caller_order(results, "video", count) if any(video_rows) else None,
            stochastic=None if params.stochastic is None else StochasticRecord(
                **{k: gather("sde_" + k) for k in StochasticRecord.ARRAYS},
                settings={**params.stochastic.as_dict(),
                          "num_inference_steps": params.num_inference_steps,
                          "flow_shift": params.flow_shift,
                          "guidance_scale": params.guidance_scale},
                weights=weights_digest(self.transformer),
            ),
        )

    def _action_noise(self, noise: Any, count: int) -> torch.Tensor | None:
        """Caller action noise as ``[B, H, 64]``: the H predicted rows (this pipeline's layout),
        or ``[B, S + H, 64]`` with the S state rows first (LeRobot's draw, whose first S rows
        the state replaces: they are dropped)."""
        rows, horizon = self.history_length, self.policy.action_horizon
        if noise is not None and rows:
            shape = tuple(torch.as_tensor(noise).shape)
            if len(shape) == 3 and shape[1] == rows + horizon:
                noise = torch.as_tensor(noise)[:, rows:]
        return _noise_tensor("action_noise", noise, count, (horizon, self.noise.action_dim))

    def _state_rows(self, state: Any, count: int) -> torch.Tensor | None:
        """The call's state as the head's clean leading action rows: ``[B, S, 64]`` float32,
        normalised like the actions with the head's statistics, or with statistics of its own
        (``PolicyConfig.state_stats``), taken as given without either (the actions then come
        back normalised), zero beyond the state's width, the gripper (the last of the raw
        width) turned to ``1 - g`` where the head inverts it."""
        rows, raw = self.history_length, self.policy.raw_action_dim
        if rows == 0:
            if state is not None:
                raise ValueError(
                    f"state: this {self.policy.domain_name!r} head takes no state "
                    "(history_length 0); found a state input"
                )
            return None
        own = self.state_stats
        width = own.raw_action_dim if own is not None else raw
        if state is None:
            raise ValueError(
                f"state: this {self.policy.domain_name!r} head is conditioned on the robot state "
                f"(history_length {rows}); pass state=[{count}, {rows}, {width}] rows"
            )
        if isinstance(state, torch.Tensor):
            state = state.detach().cpu().numpy()
        array = np.asarray(state)
        if array.dtype.kind != "f" or array.shape != (count, rows, width):
            raise ValueError(
                f"state: expected finite float [{count}, {rows}, {width}] (B, history_length, "
                f"state width); found {array.dtype} {list(array.shape)}"
            )
        if not np.isfinite(array).all():
            raise ValueError(f"state: expected finite numbers; found {nonfinite(array)}")
        array = array.astype(np.float32)
        mode = self.policy.state_normalization
        if mode is None and self.decode.stats is not None:  # like the actions
            array = normalize_actions(array, self.decode.stats, self.policy.normalization)
        elif mode not in (None, "none"):
            array = normalize_actions(array, own, mode)
        padded = torch.zeros(count, rows, self.noise.action_dim)
        padded[..., :width] = torch.from_numpy(np.asarray(array, dtype=np.float32))
        if self.policy.invert_gripper:
            padded[..., raw - 1] = 1.0 - padded[..., raw - 1]
        return padded

    def _committed_rows(self, committed: Any, count: int) -> CommittedRows | None:
        """Real-time chunking's rows (``committed_actions``) checked and laid out over the H
        action rows: normalised like the actions (as :meth:`_state_rows` does the state), the
        gripper turned to ``1 - g`` where the head inverts it; None where no item has any."""
        if committed is None:
            return None
        horizon, raw, width = self.policy.action_horizon, self.policy.raw_action_dim, \
            self.noise.action_dim
        items = list(committed)
        if len(items) != count:
            raise ValueError(f"committed_actions: expected one entry per item ({count}); found "
                             f"{len(items)}")
        values = np.zeros((count, horizon, raw), np.float32)
        mask = np.zeros((count, horizon), bool)
        for k, rows in enumerate(items):
            if rows is None:
                continue
            array = np.asarray(rows)
            if (array.dtype.kind != "f" or array.ndim != 2 or array.shape[1] != raw
                    or not array.shape[0] < horizon or not np.isfinite(array).all()):
                raise ValueError(
                    f"committed_actions[{k}]: expected finite float [C, {raw}] with C < "
                    f"H={horizon} (the actions executed while the chunk is computed); found "
                    f"{array.dtype} {list(array.shape)}")
            values[k, :len(array)] = array
            mask[k, :len(array)] = True
        if not mask.any():
            return None
        normalized = values
        if self.decode.stats is not None:
            normalized = normalize_actions(values, self.decode.stats, self.policy.normalization)
        padded = torch.zeros(count, horizon, width)
        padded[..., :raw] = torch.from_numpy(np.asarray(normalized, dtype=np.float32))
        if self.policy.invert_gripper:
            padded[..., raw - 1] = 1.0 - padded[..., raw - 1]
        padded[~torch.from_numpy(mask)] = 0.0
        return CommittedRows(padded, torch.from_numpy(mask), values)

    def _run(
        self, batches: list[MicroBatch], params: SamplingParams, timer: StageTimer
    ) -> list[MicroBatch]:
        """Every micro-batch through the stages. One that runs out of device memory is split
        in two and run again from its inputs (nothing is lost: each item's result depends on
        its own inputs only; one warning per call); the size that fits is kept in
        :attr:`memory_batch_limit` for later calls. A single item that does not fit raises."""
        pending, results = deque(batches), []
        too_large: list[int] = []  # sizes that ran out of memory in this call
        while pending:
            mb = out = pending.popleft()
            parts = None
            try:
                for stage in self.stages:
                    with timer.stage(stage.name):
                        out = stage(out, params)
            except torch.cuda.OutOfMemoryError:
                if mb.size == 1:
                    raise
                half = (mb.size + 1) // 2
                too_large.append(mb.size)
                self.memory_batch_limit = min(half, self.memory_batch_limit or half)
                parts = mb.split(half)  # fresh from the inputs: no stage has run on them
            if parts is None:
                results.append(out)
                continue
            del mb, out  # this attempt's tensors go before the retry allocates
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            pending.extendleft(reversed(parts))
        if too_large:
            logger.warning(
                "out of device memory with micro-batches of %s items; ran them as micro-batches "
                "of at most %d (later calls too), with the same results",
                ", ".join(map(str, too_large)), self.memory_batch_limit,
            )
        return results

    def _micro_batches(
        self, images: list[np.ndarray], prompts: list[str], seeds: list[int]
    ) -> list[MicroBatch]:
        """Group items by canvas, in first-seen order, then split by ``max_batch_size`` (and
        :attr:`memory_batch_limit`)."""
        groups: dict[Any, list[int]] = {}
        for i, image in enumerate(images):
            plan = plan_canvas(image.shape[0], image.shape[1], self.policy.resolution_tier,
                               bins=self.policy.canvas_bins)
            groups.setdefault(plan, []).append(i)
        limits = [n for n in (self.max_batch_size, self.memory_batch_limit) if n is not None]
        limit = min(limits, default=len(images))
        batches = []
        for plan, members in groups.items():
            whole = MicroBatch(
                indices=members, images=[images[i] for i in members],
                prompts=[prompts[i] for i in members], seeds=[seeds[i] for i in members],
                plan=plan,
            )
            batches += whole.split(limit)
        return batches


def _prepare_transformer(transformer: Cosmos3Transformer, options: InferenceOptions) -> None:
    """Apply the transformer's own options (:data:`~cosmos3_gym.pipeline.options.
    TRANSFORMER_OPTIONS`) to a freshly built transformer."""
    if options.fuse_projections:
        transformer.fuse_gen_projections()
    for layer in transformer.layers:
        layer.self_attn.fold_query_groups = options.fold_query_groups
    if options.compile_gen:
        transformer.compile_gen_layers()


def _in_caller_order(results: list[MicroBatch], key: str, count: int) -> list[np.ndarray]:
    """Item rows of every micro-batch's ``result[key]``, back in the caller's order."""
    rows: list[np.ndarray | None] = [None] * count
    for mb in results:
        for row, index in enumerate(mb.indices):
            rows[index] = mb.result[key][row]
    return rows


def _video_rows(return_video: bool | Sequence[bool], count: int) -> list[bool]:
    if isinstance(return_video, (bool, np.bool_)):
        return [bool(return_video)] * count
    rows = list(return_video)
    if len(rows) != count or not all(isinstance(r, (bool, np.bool_)) for r in rows):
        raise ValueError(
            f"return_video: expected a bool or {count} bools (one per image), got {rows!r}"
        )
    return [bool(r) for r in rows]


def _seeds(seed: int | Sequence[int] | None, count: int, name: str = "seed") -> list[int]:
    if seed is None:
        return [DEFAULT_SEED] * count
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool):
        return [check_seed(seed, name)] * count
    seeds = list(seed)
    if len(seeds) != count:
        raise ValueError(
            f"{name}: expected one int or {count} ints (one per image), got {len(seeds)}"
        )
    return [check_seed(s, f"{name}[{i}]") for i, s in enumerate(seeds)]


def _noise_tensor(
    name: str, noise: Any, count: int, item_shape: tuple[int | str, ...]
) -> torch.Tensor | None:
    """Caller noise as a CPU float32 tensor, checked by :func:`~cosmos3_gym.seeding.check_noise`
    (the sampler's draw happens on the host too, so both start from the same place)."""
    if noise is None:
        return None
    tensor = torch.as_tensor(noise).detach()
    if tensor.is_floating_point():
        tensor = tensor.to("cpu", torch.float32)
    array = tensor.cpu().numpy()
    check_noise(array, name, count, item_shape)
    return torch.from_numpy(array)


def _positive_int(name: str, value: int | None, default: int) -> int:
    if value is None:
        return default
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: expected an int >= 1, got {value!r}")
    return int(value)
