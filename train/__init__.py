"""Training (``cosmos3-gym train``): the tiny ColorReach policy, from expert demos to a checkpoint
folder, deterministically on CPU; see :mod:`~cosmos3_gym.train.trainer` for the recipe.

``config`` (every knob), ``demos`` (expert rollouts through the pipeline's stages), ``trainer``
(the flow-matching loss and the loop), ``commands`` (the ``train`` and ``rl grpo`` commands'
checks before torch loads). A checkpoint's success rate is an evaluation like any other:
:func:`cosmos3_gym.evaluate`.
"""

from typing import TYPE_CHECKING

from cosmos3_gym.lazy import exports

if TYPE_CHECKING:
    from cosmos3_gym.train.commands import run_train_command
    from cosmos3_gym.train.config import TrainConfig, transformer_overrides
    from cosmos3_gym.train.trainer import train

# Loaded on first use (cosmos3_gym/lazy.py): importing one light submodule does not import
# the heavy ones.
__getattr__, __dir__ = exports(__name__, {
    "TrainConfig": "config",
    "transformer_overrides": "config",
    "run_train_command": "commands",
    "train": "trainer",
})

__all__ = ["TrainConfig", "run_train_command", "train", "transformer_overrides"]
