"""The batched action pipeline: uint8 images + prompts in, ``[B, H, D]`` action chunks out.

Stages (one module each): admission -> preprocess -> prompt -> encode -> noise -> denoise ->
decode, assembled and timed by ``Cosmos3ActionPipeline``; ``InferenceOptions`` fixes how it
computes when it is built; ``SamplerConfig`` how each call samples.
"""

# First, before diffusers or Triton load: Triton's library must keep its own LLVM.
from cosmos3_gym import native_libs  # noqa: F401  (see cosmos3_gym/native_libs.py)

# isort: split

from typing import TYPE_CHECKING

from cosmos3_gym.lazy import exports

if TYPE_CHECKING:
    from cosmos3_gym.pipeline.options import InferenceOptions
    from cosmos3_gym.pipeline.output import ActionOutput
    from cosmos3_gym.pipeline.pipeline import Cosmos3ActionPipeline
    from cosmos3_gym.pipeline.sampling import SamplerConfig
    from cosmos3_gym.pipeline.sde import StochasticRecord, StochasticSampling, chunk_log_prob

# Loaded on first use (cosmos3_gym/lazy.py): importing one light submodule does not import
# the heavy ones.
__getattr__, __dir__ = exports(__name__, {
    "InferenceOptions": "options",
    "ActionOutput": "output",
    "Cosmos3ActionPipeline": "pipeline",
    "SamplerConfig": "sampling",
    "StochasticRecord": "sde",
    "StochasticSampling": "sde",
    "chunk_log_prob": "sde",
})

__all__ = ["ActionOutput", "Cosmos3ActionPipeline", "InferenceOptions", "SamplerConfig",
           "StochasticRecord", "StochasticSampling", "chunk_log_prob"]
