"""cosmos3-gym: run NVIDIA Cosmos3 action policies batched, in process, inside Gymnasium loops.

The public names are imported lazily, so that ``import cosmos3_gym.envs`` (which must stand alone,
e.g. inside an ``AsyncVectorEnv`` worker) does not pull in torch and the model stack.
``cosmos3_gym.evaluate`` is the evaluation command's one call (:mod:`cosmos3_gym.eval.api`),
named here so a training loop finds it at the top (tests/test_layering.py says why the library
may name it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cosmos3_gym.lazy import exports

__version__ = "0.1.0"

if TYPE_CHECKING:
    from cosmos3_gym.eval.api import EvalResults, evaluate
    from cosmos3_gym.model import Cosmos3Transformer
    from cosmos3_gym.pipeline import ActionOutput, Cosmos3ActionPipeline
    from cosmos3_gym.policy import VectorPolicy


# cosmos3_gym/lazy.py: the same rule as every package here.
__getattr__, __dir__ = exports(__name__, {
    "Cosmos3ActionPipeline": "cosmos3_gym.pipeline",
    "ActionOutput": "cosmos3_gym.pipeline",
    "Cosmos3Transformer": "cosmos3_gym.model",
    "VectorPolicy": "cosmos3_gym.policy",
    "evaluate": "cosmos3_gym.eval.api",
    "EvalResults": "cosmos3_gym.eval.api",
})

__all__ = ["ActionOutput", "Cosmos3ActionPipeline", "Cosmos3Transformer", "EvalResults",
           "VectorPolicy", "evaluate"]
