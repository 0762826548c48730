"""Training (``cosmos3-gym train``): the tiny ColorReach policy, from expert demos to a checkpoint
folder, deterministically on CPU; see :mod:`~cosmos3_gym.train.trainer` for the recipe."""

from cosmos3_gym.train.trainer import (
    TrainConfig,
    evaluate_success,
    main,
    train,
    transformer_overrides,
)

__all__ = ["TrainConfig", "evaluate_success", "main", "train", "transformer_overrides"]
