"""The action pipeline's stages: each takes the request batch, does one job, and returns it.

admission -> preprocess -> prompt -> encode -> noise -> denoise -> decode

Admission runs once per call over all B items; the other stages run per micro-batch (items that
share one canvas, at most ``max_batch_size`` of them). Every stage checks what it receives.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.model import Cosmos3Transformer, GenLayout, TextKVCache
from cosmos3_gym.model.cuda_graphs import GenGraphs
from cosmos3_gym.model.fp8 import check_fp8_device
from cosmos3_gym.model.kernels import TORCH_OPS, TorchGenOps, TritonGenOps
from cosmos3_gym.model.wan_frame_encoder import WanFrameEncoder
from cosmos3_gym.pipeline.normalization import denormalize_actions
from cosmos3_gym.pipeline.options import InferenceOptions
from cosmos3_gym.pipeline.preprocess import CanvasPlan, crop_latent_to_content, preprocess
from cosmos3_gym.pipeline.prompt import (
    build_action_caption,
    build_lerobot_caption,
    tokenize_captions,
)
from cosmos3_gym.pipeline.prompt_cache import PromptCache
from cosmos3_gym.pipeline.scheduler import DiffusersFlowScheduler, FlowUniPCScheduler
from cosmos3_gym.pipeline.sde import StochasticActionSampler, StochasticSampling
from cosmos3_gym.pipeline.vae import decode_latents, encode_conditioning_frames
from cosmos3_gym.progress import progress
from cosmos3_gym.seeding import check_noise

logger = logging.getLogger(__name__)

# Options that need more than torch (Triton's compiler, CUDA graph capture, FP8 tensor cores) and
# so may fail on a user's device; DenoiseStage switches one off when it raises there.
FALLIBLE_OPTIONS = ("cuda_graphs", "triton_kernels", "fp8")


@dataclass
class SamplingParams:
    num_inference_steps: int
    guidance_scale: float
    flow_shift: float
    progress: bool
    # Stochastic action steps (RL, pipeline/sde.py); None: FlowUniPC throughout.
    stochastic: StochasticSampling | None = None
    # Guidance only on the steps whose model timestep t has lo < t < hi; None: every step.
    guidance_interval: tuple[float, float] | None = None
    # A diffusers UniPCMultistepScheduler config to denoise with (PolicyConfig.scheduler_config);
    # None: the official FlowUniPC.
    scheduler_config: dict[str, Any] | None = None

    def scheduler(self, device: torch.device | str = "cpu"
                  ) -> FlowUniPCScheduler | DiffusersFlowScheduler:
        """A fresh scheduler for one denoising loop under these settings."""
        if self.scheduler_config is None:
            return FlowUniPCScheduler(self.num_inference_steps, self.flow_shift)
        return DiffusersFlowScheduler(self.scheduler_config, self.num_inference_steps,
                                      self.flow_shift, device=device)

    def guided_steps(self) -> tuple[bool, ...]:
        """Per denoising step, whether it applies classifier-free guidance (and so runs the
        unconditional rows): ``guidance_scale != 1`` and, with an interval, the step's model
        timestep strictly inside it, as cosmos-framework's ``generate_samples_from_batch``
        decides.

        >>> SamplingParams(4, 3.0, 5.0, False, guidance_interval=(960, 1001)).guided_steps()
        (True, False, False, False)
        """
        if self.guidance_scale == 1.0:
            return (False,) * self.num_inference_steps
        if self.guidance_interval is None:
            return (True,) * self.num_inference_steps
        lo, hi = self.guidance_interval
        timesteps = self.scheduler().timesteps
        return tuple(bool(lo < float(t) < hi) for t in timesteps)


@dataclass
class CommittedRows:
    """Real-time chunking's clean action rows: per item, the first ``C_i`` of its H action rows
    are actions the env executes while the chunk is computed (``C_i`` may be 0). They are
    conditioning, as the state rows are (clean, no time embedding, re-imposed every step), and
    the chunk returns them exactly as given (``raw``)."""

    values: torch.Tensor  # [b, H, 64] float32, normalised like the actions (zero off the mask)
    mask: torch.Tensor  # [b, H] bool: True on each item's first C_i rows
    raw: np.ndarray  # [b, H, D] float32, the rows as given (zero off the mask)

    def rows(self, rows: Any) -> CommittedRows:
        return CommittedRows(self.values[rows], self.mask[rows], self.raw[rows])


@dataclass
class MicroBatch:
    """One micro-batch as it moves through the stages (fields filled stage by stage)."""

    indices: list[int]  # positions in the caller's batch
    images: list[np.ndarray]  # uint8 [H, W, 3] each, one shared canvas plan
    prompts: list[str]
    seeds: list[int]
    plan: CanvasPlan
    # Per item, the seed of its stochastic steps' Gaussian draws where the caller set it apart
    # from the item's seed (which still draws the start noise and picks the steps); None: the
    # item's seed draws them too.
    step_noise_seeds: list[int] | None = None
    action_noise: torch.Tensor | None = None  # caller-supplied [b, H, 64] float32
    video_noise: torch.Tensor | None = None  # caller-supplied [b, 48, T, h, w] float32
    # The clean leading action rows of a state-conditioned head: [b, S, 64] float32, normalised
    # like the actions, zero beyond raw_action_dim; None when the head takes no state.
    state: torch.Tensor | None = None
    # Real-time chunking's committed rows (clean, after any state rows); None: none.
    committed: CommittedRows | None = None
    # Per item, when the call asks for video: decode its predicted future clip (the VAE
    # decoder runs for these rows only); empty when no video is asked for.
    video_rows: list[bool] = field(default_factory=list)
    pixels: torch.Tensor | None = None  # [b, 3, Hc, Wc] in [-1, 1]
    # Token rows: the b conditional prompts, then (with CFG on some step) b negative prompts;
    # right-padded.
    text_inputs: tuple[torch.Tensor, torch.Tensor] | None = None  # ids, mask [b or 2b, L]
    text: TextKVCache | None = None  # the UND pathway's K/V over text_inputs
    cond_latent: torch.Tensor | None = None  # [b, 48, 1, h, w] normalised
    vision: torch.Tensor | None = None  # [b, 48, T, h, w] float32 sampler state
    actions: torch.Tensor | None = None  # [b, S + H, 64] float32 sampler state
    initial_action_noise: torch.Tensor | None = None
    stochastic: dict[str, np.ndarray] | None = None  # sde_* arrays of the stochastic steps
    result: dict[str, Any] = field(default_factory=dict)  # arrays; "video" a list of clips

    @property
    def size(self) -> int:
        return len(self.indices)

    def split(self, size: int) -> list[MicroBatch]:
        """This batch's inputs as micro-batches of at most ``size`` items, in order; fresh (no
        stage has run on them), whatever has run on this one."""
        parts = []
        for start in range(0, self.size, size):
            rows = slice(start, start + size)
            parts.append(MicroBatch(
                indices=self.indices[rows], images=self.images[rows], prompts=self.prompts[rows],
                seeds=self.seeds[rows], plan=self.plan,
                step_noise_seeds=(None if self.step_noise_seeds is None
                                  else self.step_noise_seeds[rows]),
                action_noise=None if self.action_noise is None else self.action_noise[rows],
                video_noise=None if self.video_noise is None else self.video_noise[rows],
                state=None if self.state is None else self.state[rows],
                committed=None if self.committed is None else self.committed.rows(rows),
                video_rows=self.video_rows[rows],
            ))
        return parts


class Stage:
    """One job of the pipeline: ``stage(batch, params) -> batch``."""

    name = "stage"

    def __call__(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        raise NotImplementedError


class PreprocessStage(Stage):
    """Official resolution tier: aspect-preserving resize without upscaling, reflect-pad (the
    resize rounded back to uint8, or kept in float: ``PolicyConfig.resize``)."""

    name = "preprocess"

    def __init__(self, device: torch.device, dtype: torch.dtype, round_resized: bool = True
                 ) -> None:
        self.device, self.dtype, self.round_resized = device, dtype, round_resized

    def __call__(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        batch.pixels = preprocess(batch.images, batch.plan, device=self.device, dtype=self.dtype,
                                  round_resized=self.round_resized)
        return batch


class PromptStage(Stage):
    """The caption per item (the structured JSON one, or LeRobot's plain text:
    ``PolicyConfig.caption_format``), chat template, UND pathway once per request (once per
    distinct prompt across calls, with a :class:`~cosmos3_gym.pipeline.prompt_cache.PromptCache`).
    """

    name = "prompt"

    def __init__(
        self, model: Cosmos3Transformer, tokenizer: Any, policy: PolicyConfig,
        cache: PromptCache | None = None,
    ) -> None:
        self.model, self.tokenizer, self.policy = model, tokenizer, policy
        self.cache = cache

    def __call__(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        ids, mask = self.tokenize(batch, params)
        device = self.model.device
        batch.text_inputs = ids.to(device), mask.to(device)
        if self.cache is not None:
            batch.text = self.cache.encode(ids, mask)
        else:
            batch.text = self.model.encode_text(*batch.text_inputs)
        return batch

    def tokenize(
        self, batch: MicroBatch, params: SamplingParams
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and mask ``[b or 2b, L]`` of the batch's captions, on the host."""
        p = self.policy
        canvas = {"canvas_h": batch.plan.target_h, "canvas_w": batch.plan.target_w}
        if p.caption_format == "lerobot":
            captions = [
                build_lerobot_caption(prompt, view_point=p.view_point, num_frames=p.num_frames,
                                      fps=p.fps, view_description=p.view_description, **canvas)
                for prompt in batch.prompts
            ]
        else:
            captions = [
                build_action_caption(
                    prompt, view_point=p.view_point, num_frames=p.num_frames, fps=p.fps,
                    with_idle_frame=p.idle_frame, view_description=p.view_description, **canvas,
                )
                for prompt in batch.prompts
            ]
        guided = any(params.guided_steps())
        if guided:
            # The unconditional rows use the raw negative prompt (chat-templated, no JSON
            # caption), as diffusers does; both halves run through UND in one batch.
            captions += [p.negative_prompt] * batch.size
        tokens = tokenize_captions(
            self.tokenizer, captions, max_sequence_length=p.max_sequence_length,
            allow_empty=guided, eos_token_id=p.eos_token_id,
            vision_start_token_id=p.vision_start_token_id,
        )
        return tokens.input_ids, tokens.attention_mask


class EncodeStage(Stage):
    """Wan2.2 VAE encode of the conditioning frame, cropped back to the content region."""

    name = "encode"

    def __init__(self, vae: Any, use_frame_encoder: bool = True) -> None:
        self.vae = vae
        self.spatial_factor = int(getattr(vae.config, "scale_factor_spatial", 16))
        # The single-frame encode as 2-D convolutions, sharing the VAE's parameters; False
        # runs diffusers' causal 3-D encode instead (InferenceOptions.frame_encoder), as does a
        # VAE layout the 2-D form does not cover.
        self.frame_encoder = None
        if use_frame_encoder:
            try:
                self.frame_encoder = WanFrameEncoder(vae)
            except ValueError as error:
                logger.info("single-frame encoder not available for this VAE layout (%s); "
                            "encoding with diffusers' AutoencoderKLWan.encode", error)
        self.use_frame_encoder = self.frame_encoder is not None

    def __call__(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        latent = encode_conditioning_frames(  # [b, C, 1, Hc/f, Wc/f]
            self.vae, batch.pixels, frame_encoder=self.frame_encoder
        )
        batch.cond_latent = crop_latent_to_content(latent, batch.plan, self.spatial_factor)
        batch.pixels = None  # no longer needed; free it before the denoising loop
        return batch


def _item_noise(seed: int, shape: tuple[int, ...]) -> torch.Tensor:
    """Standard normal fp32 noise for one item, from its own seed alone.

    The official framework's architecture-invariant draw: a fresh
    ``numpy.random.RandomState(seed)`` per item and modality, ``standard_normal`` cast to fp32,
    on the host, so CPU and GPU runs (and our runs and the official ones, for seeds below 2**32)
    start from the same numbers. Seeds of 2**32 and more are passed as two 32-bit words.
    """
    seed = int(seed)
    state = seed if seed < 2**32 else [seed & 0xFFFFFFFF, seed >> 32]
    noise = np.random.RandomState(state).standard_normal(shape).astype(np.float32)
    return torch.from_numpy(noise)


class NoiseStage(Stage):
    """Per-item initial noise: item i's noise depends only on its own seed.

    A state-conditioned head's action sequence is S clean state rows, then the H noisy
    actions; as in cosmos-framework the seeded draw covers all S + H rows and the state
    replaces the first S (so the actions start from the draw's rows S..). Caller noise and the
    returned ``action_noise`` are the H predicted rows'.
    """

    name = "noise"

    def __init__(
        self, policy: PolicyConfig, device: torch.device, action_dim: int, temporal_factor: int
    ) -> None:
        self.policy, self.device = policy, device
        # Width of the (zero-padded) action tokens and the VAE's temporal compression, from
        # the checkpoint's transformer and VAE configs.
        self.action_dim, self.temporal_factor = action_dim, temporal_factor

    @property
    def num_latent_frames(self) -> int:
        """T: the conditioning frame's latent, then the future frames' (temporally compressed)."""
        return (self.policy.num_frames - 1) // self.temporal_factor + 1

    def __call__(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        p = self.policy
        rows = p.history_length
        _, c, _, h, w = batch.cond_latent.shape
        vision_shape = (c, self.num_latent_frames, h, w)
        action_shape = (p.action_horizon, self.action_dim)
        if batch.video_noise is not None:
            check_noise(batch.video_noise.cpu().numpy(), "video_noise", batch.size, vision_shape)
            vision = batch.video_noise.float().clone()
        else:
            vision = torch.stack([_item_noise(s, vision_shape) for s in batch.seeds])
        if batch.action_noise is not None:
            check_noise(batch.action_noise.cpu().numpy(), "action_noise", batch.size, action_shape)
            actions = torch.cat([
                torch.zeros(batch.size, rows, self.action_dim), batch.action_noise.float()
            ], dim=1)
        else:
            sequence = (rows + p.action_horizon, self.action_dim)
            actions = torch.stack([_item_noise(s, sequence) for s in batch.seeds])
        actions[..., p.raw_action_dim :] = 0.0  # padding channels carry nothing
        batch.initial_action_noise = actions[:, rows:].clone()
        if rows:
            if batch.state is None or tuple(batch.state.shape) != (batch.size, rows,
                                                                   self.action_dim):
                found = None if batch.state is None else list(batch.state.shape)
                raise ValueError(
                    f"state: expected [{batch.size}, {rows}, {self.action_dim}] rows for a head "
                    f"with history_length {rows}; found {found}"
                )
            actions[:, :rows] = batch.state.float()
        if batch.committed is not None:  # replaces the draw's rows as the state does
            clean = batch.committed.mask[..., None]
            actions[:, rows:] = torch.where(clean, batch.committed.values, actions[:, rows:])
        vision = vision.to(self.device)
        vision[:, :, :1] = batch.cond_latent  # latent frame 0 is the clean observation
        batch.vision = vision
        batch.actions = actions.to(self.device)
        return batch


class DenoiseStage(Stage):
    """FlowUniPC over the joint [future video | action] state; frame 0 and padding re-imposed."""

    name = "denoise"

    def __init__(
        self, model: Cosmos3Transformer, policy: PolicyConfig, options: InferenceOptions
    ) -> None:
        self.model, self.policy = model, policy
        # Options that failed on this device and were switched off: name -> the error.
        self.disabled: dict[str, str] = {}
        self.configure(options)

    def configure(self, options: InferenceOptions) -> None:
        """Set how the steps run: InferenceOptions.text_cache and .kv_buffers (the text K/V
        once per request, GEN K/V written into buffers holding the text prefix), the step's
        elementwise work (eager, or fused Triton kernels) and the step as CUDA graphs
        (captured per shape, replayed every step) or eagerly."""
        if options.cuda_graphs and self.model.device.type != "cuda":
            raise ValueError(
                f"cuda_graphs needs the model on a CUDA device; found {self.model.device}"
            )
        self.options = options
        self.text_cache = options.text_cache
        self.preallocate_kv = options.kv_buffers
        self.ops, self.graphs = TORCH_OPS, None
        try:
            if options.triton_kernels:
                self.ops = TritonGenOps()
        except Exception as error:  # noqa: BLE001 - no Triton here: the eager ops instead
            self.switch_off("triton_kernels", error)
            return
        if options.cuda_graphs:
            self.graphs = GenGraphs(self.model, max_graphs=options.max_cuda_graphs, ops=self.ops)
        self.fp8_ops, self.fp8_graphs = None, None
        if options.fp8:
            try:
                check_fp8_device(self.model.device, self.model.dtype)
                if not self.model.fp8_ready:
                    self.model.quantize_gen_fp8()
                self.fp8_ops = TritonGenOps(fp8=True) if options.triton_kernels else TorchGenOps(
                    fp8=True)
            except Exception as error:  # noqa: BLE001 - no FP8 here: the model's dtype instead
                self.switch_off("fp8", error)
                return
            if options.cuda_graphs:  # FP8 steps replay graphs of their own
                self.fp8_graphs = GenGraphs(self.model, max_graphs=options.max_cuda_graphs,
                                            ops=self.fp8_ops)

    def switch_off(self, name: str, error: BaseException) -> None:
        """Turn fallible option ``name`` off after it failed here: one warning, the error kept
        in :attr:`disabled`, and the steps set up again without it."""
        detail = f"{type(error).__name__}: {error}".splitlines()[0][:300]
        logger.warning("%s failed on %s and is switched off for this pipeline (%s); the "
                       "denoising steps run without it", name, self.model.device, detail)
        self.disabled[name] = detail
        self.configure(replace(self.options, **{name: False}))

    def __call__(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        """The denoising loop. Where it raises with a fallible option on, that option is
        switched off and the loop runs again from the same state (it never modifies its
        inputs): the CUDA graphs if a replay raised, else the fused kernels. (A shape whose
        capture fails already runs eagerly: :class:`~cosmos3_gym.model.cuda_graphs.GenGraphs`.)
        """
        while True:
            self._replaying = False
            try:
                return self._denoise(batch, params)
            except torch.cuda.OutOfMemoryError:
                raise  # the pipeline splits the batch; no option is to blame
            except Exception as error:
                blamed = "cuda_graphs" if self._replaying else "triton_kernels"
                if not self._replaying and not self.options.triton_kernels:
                    blamed = "fp8"
                if not getattr(self.options, blamed):
                    raise
                self.switch_off(blamed, error)

    def _denoise(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        model, p = self.model, self.policy
        b, s = batch.size, p.history_length
        device, dtype = model.device, model.dtype
        vision, actions = batch.vision, batch.actions
        cond = batch.cond_latent.to(device)
        state = actions[:, :s].clone()  # [b, S, 64] the clean state rows, re-imposed every step
        committed = None  # [b, H, 1] mask and [b, H, 64] values: RTC's rows, re-imposed too
        if batch.committed is not None:
            committed = (batch.committed.mask[..., None].to(device),
                         batch.committed.values.to(device))
        scheduler = params.scheduler(device)
        if params.stochastic is not None:  # the action tokens' Gaussian steps (pipeline/sde.py)
            scheduler = StochasticActionSampler(
                scheduler, params.stochastic, batch.seeds, horizon=p.action_horizon,
                action_dim=actions.shape[-1], raw_action_dim=p.raw_action_dim,
                noise_seeds=batch.step_noise_seeds,
            )
        # Steps with classifier-free guidance run the [cond; uncond] rows of batch.text, the
        # others the b conditional rows alone: one forward layout per row set in use.
        guided = params.guided_steps()
        forwards: dict[bool, _RowForward] = {}
        for with_cfg in sorted(set(guided)):
            forwards[with_cfg] = self._row_forward(batch, with_cfg, vision, actions, params)
        self._replaying = any(f.graphed is not None or f.fp8_graphed is not None
                              for f in forwards.values())

        timesteps = scheduler.timesteps.to(device=device, dtype=torch.float32)
        raw = p.raw_action_dim
        for i in progress(range(params.num_inference_steps), enabled=params.progress,
                          desc="denoise", leave=False):
            step = forwards[guided[i]]
            text = step.text
            if not self.text_cache:
                text = model.encode_text(*batch.text_inputs)
                if step.text_rows is not None:
                    text = text.rows(step.text_rows)
            model_vision, model_actions = vision.to(dtype), actions.to(dtype)
            if step.rows != b:  # the unconditional rows see the same latents
                model_vision = model_vision.repeat(2, 1, 1, 1, 1)
                model_actions = model_actions.repeat(2, 1, 1)
            step_t = timesteps[i].expand(step.rows)
            fp8 = i in step.fp8_steps
            step_graph = step.fp8_graphed if fp8 else step.graphed
            if step_graph is not None:
                v_vision, v_action = step_graph(model_vision, model_actions, step_t)
            else:
                v_vision, v_action = model.forward_gen(
                    text, step.layout, model_vision, step.vision_noisy, model_actions,
                    step.action_noisy, step.domain_ids, step_t,
                    ops=self.fp8_ops if fp8 else self.ops,
                )
            v_vision, v_action = v_vision.float(), v_action.float()
            if guided[i]:
                g = params.guidance_scale
                v_vision = v_vision[b:] + g * (v_vision[:b] - v_vision[b:])
                v_action = v_action[b:] + g * (v_action[:b] - v_action[b:])
            v_action[..., raw:] = 0.0
            vision, actions = scheduler.step((v_vision, v_action), i, (vision, actions))
            vision[:, :, :1] = cond
            actions[:, :s] = state
            if committed is not None:
                actions[:, s:] = torch.where(committed[0], committed[1], actions[:, s:])
            actions[..., raw:] = 0.0
        batch.vision, batch.actions = vision, actions
        if params.stochastic is not None:
            batch.stochastic = scheduler.record([image.shape[:2] for image in batch.images])
        return batch

    def _row_forward(
        self, batch: MicroBatch, with_cfg: bool, vision: torch.Tensor, actions: torch.Tensor,
        params: SamplingParams,
    ) -> _RowForward:
        """The fixed inputs of the GEN forward over ``2b`` rows ([cond; uncond] prompts, for
        guided steps: one forward, prompts of different lengths sharing it since padded text
        keys are masked) or the ``b`` conditional rows: masks, domain ids, RoPE layout, K/V
        buffers, and the step bound to a CUDA graph (eager where it cannot be)."""
        model, p = self.model, self.policy
        b, s = batch.size, p.history_length
        device = model.device
        rows = 2 * b if with_cfg else b
        text, text_rows = batch.text, None
        if not with_cfg and text.keys[0].shape[0] != b:  # the conditional half of the prompts
            text_rows = torch.arange(b, device=text.lengths.device)
            text = text.rows(text_rows)
        t = vision.shape[2]
        vision_noisy = (torch.arange(t, device=device) > 0)[None].expand(rows, t)
        action_noisy = torch.ones(rows, s + p.action_horizon, dtype=torch.bool, device=device)
        action_noisy[:, :s] = False  # the state rows are clean conditioning
        if batch.committed is not None:  # and so are real-time chunking's committed rows
            action_noisy[:, s:] &= ~batch.committed.mask.to(device).repeat(rows // b, 1)
        domain_ids = torch.full((rows,), p.domain_id, dtype=torch.long, device=device)

        def layout_for(preallocate_kv: bool) -> GenLayout:
            return model.gen_layout(
                text, latent_shape=tuple(vision.shape[2:]), num_actions=s + p.action_horizon,
                fps=p.fps, action_fps=p.action_fps, action_start=1 - s,
                preallocate_kv=preallocate_kv,
            )

        # With fp8, the steps in fp8_steps run the FP8 ops (and their own graphs).
        fp8_steps = range(0)
        if self.fp8_ops is not None:
            patch = model.config.latent_patch_size
            tokens = t * -(-vision.shape[3] // patch) * -(-vision.shape[4] // patch)
            gen_tokens = rows * (tokens + s + p.action_horizon)
            fp8_steps = self.options.fp8_steps(params.num_inference_steps, gen_tokens)
        graphed = fp8_graphed = None
        if self.graphs is not None:  # the graph owns its K/V buffers
            layout = layout_for(preallocate_kv=False)
            repeat = rows // b
            model_vision = vision.to(model.dtype).repeat(repeat, 1, 1, 1, 1)
            model_actions = actions.to(model.dtype).repeat(repeat, 1, 1)
            graphed = self.graphs.bind(text, layout, model_vision, vision_noisy, model_actions,
                                       action_noisy, domain_ids)
            if self.fp8_graphs is not None and fp8_steps:
                fp8_graphed = self.fp8_graphs.bind(text, layout, model_vision, vision_noisy,
                                                   model_actions, action_noisy, domain_ids)
        if graphed is None or (fp8_steps and fp8_graphed is None):
            # eager steps (also where a shape could not be captured)
            layout = layout_for(preallocate_kv=self.preallocate_kv)
        return _RowForward(rows, text, text_rows, layout, vision_noisy, action_noisy, domain_ids,
                           fp8_steps, graphed, fp8_graphed)


@dataclass
class _RowForward:
    """What every denoising step over one row set shares (see ``DenoiseStage._row_forward``)."""

    rows: int  # b, or 2b with the unconditional rows
    text: TextKVCache  # the text K/V of those rows
    text_rows: torch.Tensor | None  # rows of batch.text they are; None: all of them
    layout: GenLayout
    vision_noisy: torch.Tensor  # [rows, T] bool
    action_noisy: torch.Tensor  # [rows, S + H] bool, False on the state rows
    domain_ids: torch.Tensor  # [rows]
    fp8_steps: range
    graphed: Any = None  # the step replayed from a CUDA graph, or None (eager)
    fp8_graphed: Any = None


class DecodeStage(Stage):
    """Raw action width of the 64 channels, un-normalised with the checkpoint's statistics;
    on request, the predicted future video through the VAE decoder."""

    name = "decode"

    def __init__(self, policy: PolicyConfig, stats: Any, vae: Any) -> None:
        if stats is not None:  # statistics the mode cannot use: refused now, not at a call
            stats.block_for(policy.normalization)
        self.policy, self.stats, self.vae = policy, stats, vae

    def __call__(self, batch: MicroBatch, params: SamplingParams) -> MicroBatch:
        p = self.policy
        # The H predicted rows; the state rows that led them are the caller's own input.
        predicted = batch.actions[:, p.history_length :, : p.raw_action_dim]
        normalized = predicted.float().cpu().numpy()
        actions = normalized.copy()
        if p.clip_actions:  # the range the head was trained in (PolicyConfig.clip_actions)
            np.clip(actions, -1.0, 1.0, out=actions)
        if p.invert_gripper:  # the model's 1 - g back to g, before un-normalisation (LeRobot)
            actions[..., -1] = 1.0 - actions[..., -1]
        if self.stats is not None:  # else the normalised actions themselves
            actions = denormalize_actions(actions, self.stats, p.normalization)
        if batch.committed is not None:  # exactly as given, not through a normalisation trip
            mask = batch.committed.mask.cpu().numpy()
            actions = np.where(mask[..., None], batch.committed.raw, actions)
        batch.result = {
            "actions": np.asarray(actions, dtype=np.float32),
            "normalized_actions": normalized.astype(np.float32),
            "action_noise": batch.initial_action_noise.cpu().numpy().astype(np.float32),
            **(batch.stochastic or {}),
        }
        if batch.video_rows:  # the call asked for video: one clip or None per row
            rows = [k for k, wanted in enumerate(batch.video_rows) if wanted]
            clips: list[np.ndarray | None] = [None] * batch.size
            if rows:
                clip = decode_latents(self.vae, batch.vision[rows])  # [r, 3, H + 1, h, w]
                clip = ((clip + 1.0) * 127.5).round_().clamp_(0, 255).to(torch.uint8)
                frames = clip.permute(0, 2, 3, 4, 1).cpu().numpy()  # [r, H + 1, h, w, 3]
                for k, item in zip(rows, frames, strict=True):
                    clips[k] = item
            batch.result["video"] = clips
        batch.vision = batch.actions = None
        return batch
