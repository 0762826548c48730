"""``InferenceOptions``: how the pipeline computes, fixed when it is built.

Every switch here leaves the actions equal (bit for bit, or within the float rounding its line
states); each exists so that ``cosmos3-gym bench`` can measure what it saves by turning it off.
A new execution strategy of the same kind joins as one more field, off or on by default as its
tests allow.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

# The fields that from_pretrained applies to the transformer as it loads it; changing one needs a
# freshly loaded transformer. The other fields configure the stages around a shared one.
TRANSFORMER_OPTIONS = ("fuse_projections", "fold_query_groups", "compile_gen")
# What an option needs switched on (the checks of InferenceOptions.__post_init__).
REQUIRES: dict[str, tuple[str, ...]] = {
    "triton_kernels": ("fuse_projections", "kv_buffers"),
    "cuda_graphs": ("text_cache",),
    "fp8": ("fuse_projections",),
}


@dataclass(frozen=True)
class InferenceOptions:
    """Every execution switch of :class:`~cosmos3_gym.pipeline.Cosmos3ActionPipeline`, with its
    default (what production runs) and why it exists.

    >>> from cosmos3_gym.pipeline import InferenceOptions
    >>> InferenceOptions(text_cache=False).kv_buffers  # one switch off, the others as shipped
    True
    """

    # The text (UND) pathway runs once per request and its K/V is reused at every denoising
    # step; False recomputes it every step, as diffusers' reference does (fp32 rounding: 1.4e-6
    # on an AMD EPYC, bit for bit on other CPUs).
    text_cache: bool = True
    # Each step's GEN K/V is written into per-layer buffers that hold the text prefix, instead
    # of concatenating [text ; gen] per layer and step (same values; actions to fp32 rounding).
    kv_buffers: bool = True
    # Each GEN layer's Q/K/V and gate/up matmuls fused into one at load time (same outputs).
    fuse_projections: bool = True
    # GEN attention folds each group of query heads into one K/V head's query length instead of
    # passing the K/V heads to SDPA with enable_gqa (bit-identical).
    fold_query_groups: bool = True
    # The conditioning frame encoded by the 2-D WanFrameEncoder; False runs diffusers' causal
    # 3-D encode (same latents up to float summation order, ~1e-5).
    frame_encoder: bool = True
    # The GEN layers run through torch.compile: the first call per shape compiles, and fused
    # kernels round differently from eager mode.
    compile_gen: bool = False
    # The GEN step's norms, RoPE, K/V writes and MLP activation as fused Triton kernels
    # (cosmos3_gym.model.kernels): within 1e-5 of eager in fp32, at most one bf16 rounding step
    # in bf16. Needs fused projections and K/V buffers. None (default): on for CUDA, where they
    # make a call faster (docs/benchmarks.md, "Each option flipped"), off on the CPU (which runs
    # them only in Triton's interpreter, for the tests).
    triton_kernels: bool | None = None
    # Every denoising step's GEN forward replayed from a CUDA graph captured once per shape
    # (cosmos3_gym.model.cuda_graphs): the same kernels with one launch, bit-identical. CUDA
    # only; needs the text cache. None (default): on for CUDA (faster where a step is host-bound:
    # docs/benchmarks.md, "Each option flipped"), off elsewhere.
    cuda_graphs: bool | None = None
    # Captured shapes (batch, prompt length, latent grid) kept; the least recently used is
    # dropped beyond this.
    max_cuda_graphs: int = 8
    # Text keys/values kept across calls per distinct token sequence (pipeline.prompt_cache): an
    # episode's prompt runs through the text pathway once, not at every replan. The same
    # keys/values, computed when the prompt was first seen (the same batch gives the same bits;
    # another batch composition rounds as per-item batch invariance allows). Least recently used
    # prompts leave beyond prompt_cache_mb (a Cosmos3-Nano prompt of ~120 tokens holds ~18 MB).
    prompt_cache: bool = True
    prompt_cache_mb: int = 1024
    # The GEN tower's four GEMM groups (Q/K/V, attention output, gate/up, down) in FP8 e4m3:
    # per-output-channel weights quantised once, per-token activation scales made by the kernel
    # that produces each GEMM's input (cosmos3_gym.model.fp8). NOT the same actions: the
    # accuracy it costs is measured by `python -m cosmos3_gym.bench.fp8_gate`
    # (docs/benchmarks.md, docs/pipeline.md). Needs
    # compute capability >= 8.9 on CUDA (switched off with one warning below that); on the CPU
    # torch emulates the FP8 products (the tests and the closed-loop gate run that way). Off by
    # default until a real checkpoint's closed-loop result says otherwise.
    fp8: bool = False
    # With fp8: the first and the last this many denoising steps stay in the model's dtype
    # (as NVIDIA's FP8 Cosmos3 checkpoints run them); the steps between run in FP8.
    fp8_bf16_steps: int = 3
    # With fp8: a micro-batch of fewer GEN tokens than this (B x N; 2B x N with CFG) runs every
    # step in the model's dtype: row-scaled FP8 GEMMs gain nothing over bf16 at LIBERO B=1 (266
    # tokens) and pay from DROID B=1 (1982) and LIBERO B=8 (2128) on (docs/benchmarks.md, "FP8
    # GEMM probe"). 0: FP8 at every size.
    fp8_min_tokens: int = 1024

    def __post_init__(self) -> None:
        if self.triton_kernels and not (self.fuse_projections and self.kv_buffers):
            raise ValueError(
                "triton_kernels needs fuse_projections=True and kv_buffers=True; found "
                f"fuse_projections={self.fuse_projections}, kv_buffers={self.kv_buffers}"
            )
        if self.cuda_graphs and not self.text_cache:
            raise ValueError("cuda_graphs needs text_cache=True (a graph holds one request's "
                             "text K/V); found text_cache=False")
        if self.fp8 and not self.fuse_projections:
            raise ValueError("fp8 needs fuse_projections=True (the fused Q/K/V norm and RoPE); "
                             "found fuse_projections=False")
        for name in ("fp8_bf16_steps", "fp8_min_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an int >= 0; found {value!r}")
        for name in ("max_cuda_graphs", "prompt_cache_mb"):
            limit = getattr(self, name)
            if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
                raise ValueError(f"{name} must be an int >= 1; found {limit!r}")

    @property
    def resolved(self) -> bool:
        """Whether every switch is set (no ``None`` left for :meth:`resolve` to decide)."""
        return None not in (self.triton_kernels, self.cuda_graphs)

    def resolve(self, device_type: str) -> InferenceOptions:
        """These options with each ``None`` (auto) switch decided for a device type: the
        fused kernels and CUDA graphs on for ``"cuda"`` (where the switches they need are on),
        off elsewhere. Set switches stay as they are.

        >>> from cosmos3_gym.pipeline import InferenceOptions
        >>> auto = InferenceOptions()
        >>> auto.resolve("cuda").cuda_graphs, auto.resolve("cpu").cuda_graphs
        (True, False)
        >>> InferenceOptions(kv_buffers=False).resolve("cuda").triton_kernels  # it needs them
        False
        """
        cuda = device_type == "cuda"
        auto = {
            "triton_kernels": cuda and self.fuse_projections and self.kv_buffers,
            "cuda_graphs": cuda and self.text_cache,
        }
        return replace(self, **{k: v for k, v in auto.items() if getattr(self, k) is None})

    def flip(self, name: str) -> tuple[InferenceOptions, tuple[str, ...]]:
        """These options with switch ``name`` turned over, and the other switches that had to
        turn with it (:data:`REQUIRES`): on, it brings what it needs on; off, it takes what
        needs it off.

        >>> from cosmos3_gym.pipeline import InferenceOptions
        >>> InferenceOptions(triton_kernels=True).flip("kv_buffers")[1]
        ('triton_kernels',)
        """
        value = not getattr(self, name)  # an auto (None) switch counts as off
        if value:
            also = {need: True for need in REQUIRES.get(name, ())}
        else:
            also = {user: False for user, needs in REQUIRES.items() if name in needs}
        also = {k: v for k, v in also.items() if getattr(self, k) != v}
        return replace(self, **{name: value}, **also), tuple(also)

    def fp8_steps(self, num_steps: int, gen_tokens: int) -> range:
        """The denoising step indices that run in FP8 for a micro-batch of ``gen_tokens`` GEN
        tokens (none without ``fp8``, or below ``fp8_min_tokens``).

        >>> from cosmos3_gym.pipeline import InferenceOptions
        >>> InferenceOptions(fp8=True).fp8_steps(30, gen_tokens=1982)  # DROID B=1
        range(3, 27)
        >>> len(InferenceOptions(fp8=True).fp8_steps(30, gen_tokens=266))  # LIBERO B=1
        0
        """
        if not self.fp8 or gen_tokens < self.fp8_min_tokens:
            return range(0)
        first = self.fp8_bf16_steps
        return range(first, max(first, num_steps - first))
