"""GRPO (train/grpo.py) and the RL modules' docstring examples."""

from __future__ import annotations

import doctest
import json
from pathlib import Path

import pytest
import torch
from gymnasium.vector import AutoresetMode

from cosmos3_gym.envs import ColorReachEval
from cosmos3_gym.pipeline import Cosmos3ActionPipeline, InferenceOptions, chunk_log_prob, sde
from cosmos3_gym.runner import onpolicy, schedule
from cosmos3_gym.train import grpo


@pytest.mark.parametrize("module", [sde, schedule, grpo], ids=lambda m: m.__name__)
def test_docstring_examples_run(module) -> None:
    result = doctest.testmod(module)
    assert result.failed == 0 and result.attempted > 0


def test_an_update_moves_the_weights_towards_the_better_episodes(checkpoint: Path) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(
        checkpoint, options=InferenceOptions(fuse_projections=False))
    model = pipe.transformer.requires_grad_(True)
    eval_env = ColorReachEval(image_size=32, max_episode_steps=3)
    envs = eval_env.make(4, False, autoreset_mode=AutoresetMode.DISABLED)
    policy = onpolicy_policy(pipe)
    batch = onpolicy.collect_on_policy(policy, envs, 3, eval_env=eval_env, group_size=2)
    envs.close()
    first = batch["episode_group"] < 2
    batch["episode_success"][first] = torch.tensor([True, False, False, True])[
        : int(first.sum())]  # a group with a better and a worse episode
    cfg = grpo.GRPOConfig(group_size=2, groups=2, epochs=1, minibatch=64, lr=1e-3,
                          eval_episodes=4, eval_envs=4)
    before = [p.detach().clone() for p in model.parameters()]
    with torch.no_grad():
        old = chunk_log_prob(pipe, onpolicy.stochastic_record(batch), batch["chunk_prompts"])
    stats = grpo._update(model, pipe, torch.optim.AdamW(model.parameters(), lr=1e-3), batch,
                         cfg, torch.Generator().manual_seed(0), onpolicy.stochastic_record,
                         chunk_log_prob)
    assert stats["chunks_with_signal"] > 0 and stats["groups"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    with torch.no_grad():
        new = chunk_log_prob(pipe, onpolicy.stochastic_record(batch), batch["chunk_prompts"])
    adv = grpo.group_advantages(batch["episode_success"].float(), batch["episode_group"])
    chunk_adv = adv[batch["chunk_episode"]]
    # The chunks of the better episode became likelier relative to the worse one's.
    assert float(((new - old) * chunk_adv).sum()) > 0


def onpolicy_policy(pipe):
    from cosmos3_gym.policy import VectorPolicy

    return VectorPolicy(pipe, seed=0, num_inference_steps=3, sampler="flow_sde")


def test_grpo_command_writes_its_curve_and_checkpoint(checkpoint: Path, tmp_path: Path) -> None:
    from cosmos3_gym.eval.cli import main

    out = tmp_path / "grpo"
    assert main(["rl", "grpo", "--init", str(checkpoint), "--out", str(out), "--iterations",
                 "1", "--groups", "1", "--group-size", "2", "--eval-episodes", "4",
                 "--eval-envs", "4", "--no-progress"]) == 0
    curve = json.loads((out / "curve.json").read_text())
    assert [p["iteration"] for p in curve["curve"]] == [0, 1]
    assert 0.0 <= curve["before"] <= 1.0 and 0.0 <= curve["after"] <= 1.0
    assert (out / "checkpoint" / "transformer").is_dir()
    Cosmos3ActionPipeline.from_pretrained(out / "checkpoint")  # loads strictly


def test_grpo_without_a_starting_checkpoint_says_how_to_make_one(tmp_path: Path) -> None:
    from cosmos3_gym.train.grpo import GRPOConfig, run_grpo

    with pytest.raises(FileNotFoundError, match="cosmos3-gym train --out"):
        run_grpo(GRPOConfig(init=str(tmp_path / "none"), out=str(tmp_path / "o")))
