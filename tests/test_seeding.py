"""One seed rule and one noise check, whichever layer receives them."""

from __future__ import annotations

import numpy as np
import pytest
from test_policy_standins import StandInPipeline

from cosmos3_gym import VectorPolicy, seeding
from cosmos3_gym.eval.evaluate import EvalConfig


@pytest.mark.parametrize("seed", [-1, 2**64, 1.0, True])
def test_policy_and_evaluation_refuse_the_seeds_the_pipeline_refuses(seed) -> None:
    message = r"seed: expected an int in \[0, 2\*\*64\), got"
    with pytest.raises(ValueError, match=message):
        VectorPolicy(StandInPipeline(), seed=seed)
    with pytest.raises(ValueError, match=message):
        EvalConfig(seed=seed)
    with pytest.raises(ValueError, match=message):
        VectorPolicy(StandInPipeline()).reset(seed=seed)


def test_the_largest_seed_is_accepted_everywhere() -> None:
    assert seeding.check_seed(np.uint64(2**64 - 1)) == 2**64 - 1
    assert VectorPolicy(StandInPipeline(), seed=2**64 - 1).config.seed == 2**64 - 1


@pytest.mark.parametrize(
    "noise, message",
    [
        (np.zeros((2, 4, 64), np.float32), r"\[B=3, 4, 64\]; found \[2, 4, 64\]: .*axis of 3"),
        (np.zeros((3, 5, 64), np.float32), r"\[B=3, 4, 64\]; found \[3, 5, 64\]$"),
        (np.zeros((3, 4, 64), np.int64), "floating-point"),
        (np.full((3, 4, 64), np.nan, np.float32), "NaN or infinite"),
    ],
)
def test_noise_check_names_what_it_expected_and_found(noise, message) -> None:
    with pytest.raises(ValueError, match=message):
        seeding.check_noise(noise, "action_noise", 3, (4, 64))
