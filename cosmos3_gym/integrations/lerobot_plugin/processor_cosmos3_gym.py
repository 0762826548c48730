"""The ``cosmos3_gym`` policy's LeRobot processors, found by LeRobot's
``make_pre_post_processors(config)`` under the name ``make_cosmos3_gym_pre_post_processors``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lerobot.processor import PolicyProcessorPipeline
from lerobot.processor.converters import policy_action_to_transition, transition_to_policy_action

if TYPE_CHECKING:
    from .configuration_cosmos3_gym import Cosmos3GymConfig

PREPROCESSOR_NAME = "cosmos3_gym_preprocessor"
POSTPROCESSOR_NAME = "cosmos3_gym_postprocessor"


def make_cosmos3_gym_pre_post_processors(
    config: Cosmos3GymConfig, dataset_stats: dict[str, Any] | None = None
) -> tuple[PolicyProcessorPipeline, PolicyProcessorPipeline]:
    """Two pipelines with no steps, and why: cosmos3-gym's adapter is the policy's input
    processor (it turns the env's exact uint8 frames into model inputs: views, rotation,
    resizing, prompt augmentation), and the pipeline un-normalises the actions with the
    checkpoint's own statistics. A normalising LeRobot step would change the frames the
    adapter must see byte for byte (the policy refuses frames that are not k/255), and
    LeRobot's dataset statistics are not the checkpoint's, so ``dataset_stats`` is refused.
    """
    del config
    if dataset_stats:
        raise ValueError(
            "the cosmos3_gym policy un-normalises actions with its checkpoint's own statistics; "
            f"dataset statistics for {sorted(dataset_stats)} would not be used. Give statistics "
            "to the checkpoint instead (--policy.action_stats)"
        )
    preprocessor = PolicyProcessorPipeline(steps=[], name=PREPROCESSOR_NAME)
    postprocessor = PolicyProcessorPipeline(
        steps=[], name=POSTPROCESSOR_NAME,
        to_transition=policy_action_to_transition, to_output=transition_to_policy_action,
    )
    return preprocessor, postprocessor
