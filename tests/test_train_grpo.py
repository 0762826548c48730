"""GRPO (train/grpo.py): the update, the command and its run folder (resume), torchrun's
data-parallel update, what trains (train/trainable.py), and the memory estimate
(train/memory.py)."""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode

from cosmos3_gym.envs import ColorReachEval
from cosmos3_gym.pipeline import Cosmos3ActionPipeline, InferenceOptions, chunk_log_prob, sde
from cosmos3_gym.runner import GroupEpisodes, onpolicy, schedule
from cosmos3_gym.train import grpo, grpo_state, memory, trainable
from cosmos3_gym.train.data_parallel import DataParallel

# A short run on the shipped tiny policy in the harder ColorReach, small enough for the CPU
# suite: at 3 denoising steps its groups agree unless the stochastic step is wide (noise level
# 2: most groups then carry signal).
SHORT = ["--env-kwargs", '{"max_speed": 0.28}', "--max-episode-steps", "10",
         "--denoising-steps", "3", "--noise-level", "2.0", "--n-action-steps", "2",
         "--groups", "2", "--group-size", "3", "--minibatch", "8", "--epochs", "1",
         "--lr", "1e-3", "--eval-trials", "1", "--num-envs", "4", "--eval-every", "2",
         "--save-every", "1", "--no-progress"]
# What differs between two runs of the same computation: the clock.
TIMES = ("collect_s", "update_s", "eval_s", "wall_s")


def _grpo(*args: str) -> int:
    from cosmos3_gym.eval.cli import main

    return main(["rl", "grpo", *args])


def _curve(out: Path) -> list[dict]:
    points = json.loads((out / "curve.json").read_text())["curve"]
    return [{k: v for k, v in p.items() if k not in TIMES} for p in points]


def _masters(out: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(grpo_state.state_dirs(out)[-1] / "trained.safetensors")


def _iteration(pipe: Cosmos3ActionPipeline, sde_steps: str = "random",
               shared_by: int | None = None) -> dict:
    """Two groups of two 3-step episodes; in each group one episode is the better one (a random
    policy rarely succeeds by itself)."""
    from cosmos3_gym.policy import VectorPolicy

    eval_env = ColorReachEval(image_size=32, max_episode_steps=3)
    envs = eval_env.make(4, False, autoreset_mode=AutoresetMode.DISABLED)
    policy = VectorPolicy(pipe, num_inference_steps=3, sampler="flow_sde", sde_steps=sde_steps,
                          seed_rule=schedule.group_seed_rule(0, shared_by=shared_by))
    batch = onpolicy.collect_on_policy(policy, envs, 3, eval_env=eval_env,
                                       schedule=GroupEpisodes(eval_env, 0, [0, 1], 2))
    envs.close()
    batch["episode_success"] = torch.tensor([True, False, False, True])
    batch["episode_finished"][:] = True
    return batch


def test_an_update_moves_the_weights_towards_the_better_episodes(checkpoint: Path) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), group_size=2, groups=2, epochs=1,
                          minibatch=64, lr=1e-3, lr_warmup=0)
    learner = grpo.Learner(pipe, cfg)
    batch = _iteration(pipe)
    signal = grpo.batch_signal(batch, 2, "success")
    assert signal.stats["groups"] == 2 and len(signal.rows) > 0
    before = [p.detach().clone() for p in learner.masters.params]
    with torch.no_grad():
        old = chunk_log_prob(pipe, onpolicy.stochastic_record(batch), batch["chunk_prompts"])
    sums = grpo.update(learner, batch, signal, 1, cfg, DataParallel(0, 1))
    assert sums["steps"] == 1 and sums["scored"] == len(signal.rows)
    assert any(not torch.equal(a, b) for a, b in zip(before, learner.masters.params,
                                                      strict=True))
    with torch.no_grad():
        new = chunk_log_prob(pipe, onpolicy.stochastic_record(batch), batch["chunk_prompts"])
    adv = grpo.group_advantages(batch["episode_success"].float(), batch["episode_group"])
    chunk_adv = adv[batch["chunk_episode"] - int(batch["episode_id"].min())]
    # The chunks of the better episodes became likelier relative to the worse ones'.
    assert float(((new - old) * chunk_adv).sum()) > 0


def test_shared_group_noise_leaves_episodes_only_their_scored_draws(checkpoint: Path) -> None:
    """--group-noise shared: a group's episodes start each chunk from the same noise and the same
    stochastic step, and differ in the Gaussian draw alone (its seed the episode's own, as
    without sharing); other groups draw other noise."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    own = _iteration(pipe)
    batch = _iteration(pipe, shared_by=2)
    first = np.flatnonzero(batch["chunk_index"].numpy() == 0)
    episode = batch["chunk_episode"].numpy()[first]
    assert sorted(episode.tolist()) == [0, 1, 2, 3]
    row = {int(e): int(r) for e, r in zip(episode, first, strict=True)}
    noise, steps = batch["chunk_noise"].numpy(), batch["chunk_sde_steps"].numpy()
    before = batch["chunk_sde_actions_before"].numpy()
    after = batch["chunk_sde_actions_after"].numpy()
    for a, b in ((0, 1), (2, 3)):  # the two members of each group
        np.testing.assert_array_equal(noise[row[a]], noise[row[b]])
        np.testing.assert_array_equal(steps[row[a]], steps[row[b]])
        np.testing.assert_array_equal(before[row[a]], before[row[b]])
        assert not np.array_equal(after[row[a]], after[row[b]])
    assert not np.array_equal(noise[row[0]], noise[row[2]])
    # The draws' seeds are the episodes' own seeds without sharing; the start noise is not.
    own_first = np.flatnonzero(own["chunk_index"].numpy() == 0)
    own_seed = dict(zip(own["chunk_episode"].numpy()[own_first].tolist(),
                        own["chunk_seed"].numpy()[own_first].tolist(), strict=True))
    shared_seed = batch["chunk_step_noise_seed"].numpy()
    assert {e: int(shared_seed[r]) for e, r in row.items()} == own_seed
    assert "chunk_step_noise_seed" not in own
    assert int(batch["chunk_seed"][row[0]]) not in own_seed.values()


def test_per_step_ratios_move_the_weights_towards_the_better_episodes(checkpoint: Path) -> None:
    """--ratio step on chunks whose every step is stochastic: each step's log-probability is
    scored on its own, and the update makes the better episodes' chunks likelier."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), group_size=2, groups=2, epochs=1,
                          minibatch=64, lr=1e-3, lr_warmup=0, sde_steps="all", ratio="step")
    learner = grpo.Learner(pipe, cfg)
    batch = _iteration(pipe, sde_steps="all")
    record = onpolicy.stochastic_record(batch)
    assert record.steps.shape[1] == 3
    signal = grpo.batch_signal(batch, 2, "success")
    with torch.no_grad():
        old = chunk_log_prob(pipe, record, batch["chunk_prompts"], per_step=True)
    sums = grpo.update(learner, batch, signal, 1, cfg, DataParallel(0, 1))
    assert sums["steps"] == 1 and sums["scored"] == len(signal.rows)
    with torch.no_grad():
        new = chunk_log_prob(pipe, record, batch["chunk_prompts"], per_step=True)
    adv = grpo.group_advantages(batch["episode_success"].float(), batch["episode_group"])
    chunk_adv = adv[batch["chunk_episode"] - int(batch["episode_id"].min())]
    assert float(((new - old).sum(1) * chunk_adv).sum()) > 0


def test_one_stochastic_step_makes_per_step_and_chunk_ratios_one_update(checkpoint: Path
                                                                       ) -> None:
    """Under --sde-steps random a chunk has one stochastic step: its ratio is the chunk's, and
    --ratio step takes the step --ratio chunk takes (the per-step scores start from the
    weights' own scoring, the chunk's from the record: equal to rounding)."""
    masters = {}
    for ratio in ("chunk", "step"):
        pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
        cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), group_size=2, groups=2, epochs=2,
                              minibatch=64, lr=1e-3, lr_warmup=0, ratio=ratio)
        learner = grpo.Learner(pipe, cfg)
        batch = _iteration(pipe)
        grpo.update(learner, batch, grpo.batch_signal(batch, 2, "success"), 1, cfg,
                    DataParallel(0, 1))
        masters[ratio] = [p.detach().clone() for p in learner.masters.params]
    for a, b in zip(masters["chunk"], masters["step"], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)


def test_per_step_clipping_keeps_the_steps_a_chunk_clip_would_stop() -> None:
    """Eight steps each made 1.05 times likelier: the chunk's ratio 1.48 is past a 0.2 clip (no
    gradient), each step's is inside it (each pushes, an eighth of the chunk's objective)."""
    log_ratio = torch.full((1, 8), math.log(1.05), requires_grad=True)
    grpo.surrogate(torch.exp(log_ratio.sum(1)), torch.ones(1), 0.2, None).sum().backward()
    assert float(log_ratio.grad.abs().sum()) == 0.0
    log_ratio.grad = None
    objective = grpo.surrogate(torch.exp(log_ratio), torch.ones(1), 0.2, None)
    objective.sum().backward()
    assert objective.tolist() == pytest.approx([1.05])
    assert log_ratio.grad.flatten().tolist() == pytest.approx([1.05 / 8] * 8)


def test_the_average_follows_the_trained_weights_and_stands_in_for_them_on_request(
        checkpoint: Path) -> None:
    """--ema D: after each iteration the average moves by 1 - D towards the trained weights;
    inside ``averaged()`` the model holds the average, after it its own weights, bit for bit;
    ``settle()`` makes the average the trained weights (the run's result)."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    learner = grpo.Learner(pipe, grpo.GRPOConfig(checkpoint=str(checkpoint), ema=0.75))
    start = [p.detach().clone() for p in learner.masters.params]
    with torch.no_grad():
        for p in learner.masters.params:
            p.add_(1.0)
    learner.update_average()  # start + 0.25 x 1
    trained = [p.detach().clone() for p in learner.masters.params]
    with learner.averaged():
        for p, s0 in zip(learner.masters.params, start, strict=True):
            torch.testing.assert_close(p, s0 + 0.25)
    for p, t in zip(learner.masters.params, trained, strict=True):
        assert torch.equal(p, t)
    learner.update_average()  # 0.75 x 0.25 + 0.25 x 1 = 0.4375
    learner.settle()
    for p, s0 in zip(learner.masters.params, start, strict=True):
        torch.testing.assert_close(p, s0 + 0.4375)
    # Off: nothing is averaged, and averaged() leaves the trained weights in place.
    plain = grpo.Learner(pipe, grpo.GRPOConfig(checkpoint=str(checkpoint)))
    plain.update_average()
    with plain.averaged():
        for p, t in zip(plain.masters.params, learner.masters.params, strict=True):
            assert torch.equal(p, t)


def test_keep_best_keeps_the_measured_weights_of_a_strictly_better_measurement(
        checkpoint: Path) -> None:
    """--keep best: a measurement better than every earlier one keeps the weights it measured
    (the average under --ema), a tie or a worse one keeps the earlier weights; the kept
    weights travel with the state and become the result at the end, over the average."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), ema=0.5, keep="best")
    learner = grpo.Learner(pipe, cfg)
    start = [m.detach().clone() for m in learner.masters.masters]
    assert learner.consider_keeping(0, 0.5)
    with torch.no_grad():
        for p in learner.masters.params:
            p.add_(1.0)
    learner.masters.sync_from_model()
    learner.update_average()  # start + 0.5
    assert not learner.consider_keeping(1, 0.5)  # a tie: the earlier weights stay
    assert learner.kept["iteration"] == 0
    assert learner.consider_keeping(2, 0.75)  # better: the average it measured is kept
    assert learner.kept["iteration"] == 2 and learner.kept["success"] == 0.75
    for k, s0 in zip(learner.kept["weights"], start, strict=True):
        assert k.device.type == "cpu" and k.dtype == torch.float32
        torch.testing.assert_close(k, s0.float() + 0.5)
    assert not learner.consider_keeping(3, 0.25)
    masters, rest = learner.state()
    resumed = grpo.Learner(Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True),
                           cfg)
    resumed.restore(masters, rest)
    assert resumed.kept["iteration"] == 2 and resumed.kept["success"] == 0.75
    for a, b in zip(resumed.kept["weights"], learner.kept["weights"], strict=True):
        assert torch.equal(a, b)
    learner.settle()  # the kept weights, not the trained ones nor the average
    assert learner.average is None
    for p, s0 in zip(learner.masters.params, start, strict=True):
        torch.testing.assert_close(p.float(), s0.float() + 0.5)
    # --keep last keeps nothing.
    last = grpo.Learner(pipe, grpo.GRPOConfig(checkpoint=str(checkpoint), keep="last"))
    assert not last.consider_keeping(0, 1.0) and last.kept is None


def test_rollback_goes_back_to_the_kept_weights_with_a_fresh_optimiser(
        checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--rollback 0.1: a measurement within 10 points of the best changes nothing; one more
    than 10 below it puts the kept weights back, empties AdamW's state (the warmup starts
    again) and records where it went; under --keep last it goes back all the same, and the
    result stays the last weights."""
    from types import SimpleNamespace

    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), rollback=0.1, lr_warmup=4)
    learner = grpo.Learner(pipe, cfg)
    start = [m.detach().clone() for m in learner.masters.masters]
    successes = iter([0.5, 0.45, 0.35])
    monkeypatch.setattr(grpo, "held_out", lambda *a, test=False: {"test_success": 0.5} if test
                        else {"held_out_success": next(successes)})
    run, dp = SimpleNamespace(settings=cfg), DataParallel(0, 1)
    assert "rolled_back_to" not in grpo.measure(learner, run, 0, dp)

    def step() -> None:
        for p in learner.masters.params:
            p.grad = torch.ones_like(p)
        learner.step()

    step()
    step()
    assert learner.steps_taken() == 2
    moved = [m.detach().clone() for m in learner.masters.masters]
    assert any(not torch.equal(a, b) for a, b in zip(moved, start, strict=True))
    assert "rolled_back_to" not in grpo.measure(learner, run, 15, dp)  # 5 points below: kept on
    for m, w in zip(learner.masters.masters, moved, strict=True):
        assert torch.equal(m, w)
    point = grpo.measure(learner, run, 30, dp)  # 15 points below the best: back to iteration 0
    assert point["rolled_back_to"] == 0 and learner.kept["iteration"] == 0
    for m, p, w in zip(learner.masters.masters, learner.masters.params, start, strict=True):
        assert torch.equal(m, w) and torch.equal(p.detach().float(), w.float())
    assert learner.steps_taken() == 0 and learner.learning_rate() == pytest.approx(cfg.lr / 4)
    step()
    learner.settle()  # --keep best: the kept weights are the result
    for m, w in zip(learner.masters.masters, start, strict=True):
        assert torch.equal(m, w)

    cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), rollback=0.1, keep="last")
    learner = grpo.Learner(Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True),
                           cfg)
    successes = iter([0.5, 0.3])
    run = SimpleNamespace(settings=cfg)
    grpo.measure(learner, run, 0, dp)
    step()
    assert grpo.measure(learner, run, 15, dp)["rolled_back_to"] == 0
    for m, w in zip(learner.masters.masters, start, strict=True):
        assert torch.equal(m, w)
    step()
    last = [m.detach().clone() for m in learner.masters.masters]
    learner.settle()  # --keep last: the last weights are the result
    for m, w in zip(learner.masters.masters, last, strict=True):
        assert torch.equal(m, w)


def test_the_trust_region_ends_the_update_once_the_policy_has_moved(checkpoint: Path) -> None:
    """The first minibatch of an iteration is on-policy (approx_kl 0): its step is taken; the
    second epoch finds the moved policy past a tiny target_kl and takes no step."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    batch = _iteration(pipe)
    signal = grpo.batch_signal(batch, 2, "success")
    for target, steps in ((None, 3), (1e-9, 1)):
        cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), group_size=2, groups=2, epochs=3,
                              minibatch=64, lr=1e-3, lr_warmup=0, target_kl=target)
        sums = grpo.update(grpo.Learner(pipe, cfg), batch, signal, 1, cfg, DataParallel(0, 1))
        assert sums["steps"] == steps and bool(sums["kl_stop"]) == (target is not None)
        pipe.transformer.load_state_dict(Cosmos3ActionPipeline.from_pretrained(
            checkpoint, trainable=True).transformer.state_dict())


def test_minibatches_fix_the_steps_a_pass_takes_at_any_number_of_chunks() -> None:
    """--minibatch counts chunks, so a pass over 608 chunks takes 10 steps and over 5 chunks
    one; --minibatches 2 takes two at both, of sizes that differ by one at most, and never an
    empty one."""
    def sizes(chunks: int, **settings) -> list[int]:
        order = np.random.default_rng(0).permutation(chunks)
        parts = grpo.minibatches(order, grpo.GRPOConfig(**settings))
        assert sorted(np.concatenate(parts).tolist()) == list(range(chunks))  # each chunk once
        return [len(p) for p in parts]

    assert sizes(608) == [64] * 9 + [32] and sizes(5) == [5]
    assert sizes(608, minibatch=320) == [320, 288]
    assert sizes(608, minibatches=2) == [304, 304] and sizes(73, minibatches=2) == [37, 36]
    assert sizes(5, minibatches=3) == [2, 2, 1] and sizes(1, minibatches=3) == [1]
    cfg = grpo.GRPOConfig(minibatches=2)
    assert cfg.minibatch_size(608) == 304 and cfg.minibatch_size(73) == 37
    assert grpo.GRPOConfig().minibatch_size(608) == 64


def test_minibatches_is_stored_apart_from_the_default_minibatch() -> None:
    """The default --minibatch resolves to 64 (what a folder written before --minibatches
    stored, so it resumes); --minibatches leaves it unset."""
    assert grpo.GRPOConfig(synthetic="tiny").resolved().identity()["minibatch"] == 64
    identity = grpo.GRPOConfig(synthetic="tiny", minibatches=2).resolved().identity()
    assert identity["minibatch"] is None and identity["minibatches"] == 2
    assert grpo.GRPOConfig(minibatches=2, microbatch=500).microbatch == 500


def test_an_update_takes_minibatches_steps_a_pass(checkpoint: Path) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    batch = _iteration(pipe)
    signal = grpo.batch_signal(batch, 2, "success")
    assert len(signal.rows) >= 3
    for settings, steps in (({}, 2), ({"minibatches": 3}, 6), ({"minibatches": 3,
                                                                 "microbatch": 1}, 6)):
        cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), group_size=2, groups=2, epochs=2,
                              lr=1e-3, lr_warmup=0, **settings)
        sums = grpo.update(grpo.Learner(pipe, cfg), batch, signal, 1, cfg, DataParallel(0, 1))
        assert sums["steps"] == steps and sums["scored"] == 2 * len(signal.rows)


def test_the_collected_loss_norm_scales_an_update_by_the_share_with_a_signal(
        checkpoint: Path) -> None:
    """--loss-norm collected: with one group of two silent, half the iteration's episodes carry
    a signal, so the gradient is half the one the mean over the signal's chunks gives, on the
    same chunks in the same order; --max-grad-norm is the clip AdamW's first moment sees."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    batch = _iteration(pipe)
    batch["episode_success"] = torch.tensor([True, False, True, True])  # group 1 agrees
    norms, moments = {}, {}
    for loss_norm, clip in (("signal", 1e9), ("collected", 1e9), ("collected", 1e-3)):
        cfg = grpo.GRPOConfig(checkpoint=str(checkpoint), group_size=2, groups=2, epochs=1,
                              minibatch=64, lr=1e-3, lr_warmup=0, loss_norm=loss_norm,
                              max_grad_norm=clip)
        learner = grpo.Learner(pipe, cfg)
        signal = grpo.batch_signal(batch, 2, "success", loss_norm=loss_norm)
        assert signal.loss_scale == (1.0 if loss_norm == "signal" else 0.5)
        before = [p.detach().clone() for p in learner.masters.params]
        sums = grpo.update(learner, batch, signal, 1, cfg, DataParallel(0, 1))
        assert sums["steps"] == 1
        norms[loss_norm, clip] = sums["grad_norm"]
        # AdamW's first moment after one step is (1 - beta1) times the clipped gradient.
        # (weights outside the scored graph have no gradient and no state)
        moments[loss_norm, clip] = math.sqrt(sum(
            float(state["exp_avg"].pow(2).sum()) for state in learner.optimizer.state.values()
            if "exp_avg" in state)) / 0.1
        with torch.no_grad():  # the next variant starts from the same weights
            for p, b in zip(learner.masters.params, before, strict=True):
                p.copy_(b)
    assert norms["signal", 1e9] > 0
    assert norms["collected", 1e9] == pytest.approx(0.5 * norms["signal", 1e9], rel=1e-4)
    assert norms["collected", 1e-3] == pytest.approx(norms["collected", 1e9], rel=1e-6)
    assert moments["collected", 1e9] == pytest.approx(norms["collected", 1e9], rel=1e-4)
    assert moments["collected", 1e-3] == pytest.approx(1e-3, rel=1e-4)


def test_the_loss_norm_and_the_gradient_clip_refuse_what_they_cannot_be() -> None:
    with pytest.raises(ValueError, match="loss_norm"):
        grpo.GRPOConfig(loss_norm="tokens")
    with pytest.raises(ValueError, match="max_grad_norm"):
        grpo.GRPOConfig(max_grad_norm=0.0)
    batch = {"episode_finished": torch.ones(2, dtype=torch.bool),
             "episode_group": torch.zeros(2, dtype=torch.long),
             "episode_success": torch.tensor([True, False]), "episode_return": torch.zeros(2),
             "episode_id": torch.arange(2), "chunk_episode": torch.tensor([0, 1]),
             "chunk_index": torch.zeros(2, dtype=torch.long), "chunk_log_prob": torch.zeros(2)}
    with pytest.raises(ValueError, match="loss_norm must be one of"):
        grpo.batch_signal(batch, 2, "success", loss_norm="tokens")
    assert grpo.batch_signal(batch, 2, "success", loss_norm="collected").loss_scale == 1.0


def _learning_rates(checkpoint: Path, steps: int, **settings) -> list[float]:
    """The learning rate of each of ``steps`` optimiser steps (on zero gradients)."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    learner = grpo.Learner(pipe, grpo.GRPOConfig(checkpoint=str(checkpoint), **settings))
    seen = []
    for _ in range(steps):
        seen.append(learner.learning_rate())
        for p in learner.masters.params:
            p.grad = torch.zeros_like(p)
        learner.step()
    return seen


def test_the_learning_rate_warms_up_over_the_first_steps(checkpoint: Path) -> None:
    assert _learning_rates(checkpoint, 6, lr=1e-4, lr_warmup=4) == pytest.approx(
        [2.5e-5, 5e-5, 7.5e-5, 1e-4, 1e-4, 1e-4])


def test_the_learning_rate_halves_every_half_life_after_the_warmup(checkpoint: Path) -> None:
    assert _learning_rates(checkpoint, 7, lr=1e-4, lr_warmup=2, lr_half_life=2) == \
        pytest.approx([5e-5, 1e-4, 1e-4, 1e-4 / 2 ** 0.5, 5e-5, 5e-5 / 2 ** 0.5, 2.5e-5])


def test_batch_advantages_share_one_scale_across_the_groups() -> None:
    """``batch``: each group's differences from its mean, over their root mean square across the
    iteration's groups that disagree; ``mean``: the differences alone."""
    batch = {"episode_finished": torch.ones(6, dtype=torch.bool),
             "episode_group": torch.tensor([0, 0, 1, 1, 2, 2]),
             "episode_success": torch.tensor([True, False, True, True, True, False]),
             "episode_return": torch.tensor([1.0, 0.0, 1.0, 1.0, 1.0, 0.0]),
             "episode_id": torch.arange(6), "chunk_episode": torch.arange(6),
             "chunk_index": torch.zeros(6, dtype=torch.long),
             "chunk_log_prob": torch.zeros(6)}
    mean = grpo.batch_signal(batch, 2, "success", "mean")
    assert mean.advantages.tolist() == [0.5, -0.5, 0.5, -0.5]
    scaled = grpo.batch_signal(batch, 2, "success", "batch")
    assert scaled.advantages.tolist() == pytest.approx([1.0, -1.0, 1.0, -1.0], abs=1e-5)
    assert scaled.rows.tolist() == [0, 1, 4, 5] and scaled.stats["silent_groups"] == 1


def test_success_and_return_success_decides_and_the_return_breaks_ties() -> None:
    """``success+return``: success's advantage plus the weight times the return's, each against
    its own group. A group that agrees on success learns from its returns alone, at the
    weight's scale; where success differs it decides, even against the return (the success
    with the lower return keeps a positive advantage)."""
    batch = {"episode_finished": torch.ones(8, dtype=torch.bool),
             "episode_group": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
             "episode_success": torch.tensor([False] * 4 + [True, True, False, False]),
             "episode_return": torch.tensor([1.0, 2.0, 4.0, 6.0, 5.0, 1.0, 9.0, 1.0]),
             "episode_id": torch.arange(8), "chunk_episode": torch.arange(8),
             "chunk_index": torch.zeros(8, dtype=torch.long),
             "chunk_log_prob": torch.zeros(8)}

    def z(values: list[float]) -> torch.Tensor:  # the group's differences over its std
        v = torch.tensor(values, dtype=torch.float32)
        return (v - v.mean()) / v.std(unbiased=False)

    both = grpo.batch_signal(batch, 4, "success+return", return_weight=0.1)
    expected = torch.cat([0.1 * z([1, 2, 4, 6]), torch.tensor([1.0, 1, -1, -1])
                          + 0.1 * z([5, 1, 9, 1])])
    assert both.advantages.tolist() == pytest.approx(expected.tolist(), abs=1e-5)
    assert both.stats["silent_groups"] == 0 and both.rows.tolist() == list(range(8))
    assert float(both.advantages[5]) > 0 > float(both.advantages[6])  # success over return
    # The success reward leaves group 0 silent; the return alone ranks episode 6 first.
    assert grpo.batch_signal(batch, 4, "success").rows.tolist() == [4, 5, 6, 7]
    assert int(grpo.batch_signal(batch, 4, "return").advantages.argmax()) == 6
    # Each part as --advantages says: under batch, each over its own root mean square.
    scaled = grpo.batch_signal(batch, 4, "success+return", "batch", return_weight=0.5)
    success = grpo.batch_signal(batch, 4, "success", "batch").advantages
    returns = grpo.batch_signal(batch, 4, "return", "batch").advantages
    assert scaled.advantages.tolist() == pytest.approx(
        (torch.cat([torch.zeros(4), success]) + 0.5 * returns).tolist(), abs=1e-5)


def test_dropping_negatives_keeps_only_the_better_episodes_chunks() -> None:
    """``--negatives drop``: the negative advantages become 0, so the failures' chunks leave the
    update, the successes keep their advantages exactly, and a group that disagreed still counts
    as one (it is not silent)."""
    batch = {"episode_finished": torch.ones(8, dtype=torch.bool),
             "episode_group": torch.tensor([0, 0, 0, 0, 1, 1, 1, 1]),
             "episode_success": torch.tensor([True, False, False, False] + [True] * 4),
             "episode_return": torch.zeros(8),
             "episode_id": torch.arange(8), "chunk_episode": torch.tensor([0, 0, 1, 2, 3, 4]),
             "chunk_index": torch.tensor([0, 1, 0, 0, 0, 0]),
             "chunk_log_prob": torch.arange(6.0)}
    kept = grpo.batch_signal(batch, 4, "success")
    dropped = grpo.batch_signal(batch, 4, "success", negatives="drop")
    assert kept.rows.tolist() == [0, 1, 2, 3, 4] and kept.advantages[2] < 0
    assert dropped.rows.tolist() == [0, 1]  # episode 0's two chunks, the group's one success
    assert dropped.advantages.tolist() == pytest.approx(kept.advantages[:2].tolist())
    assert dropped.old_log_prob.tolist() == [0.0, 1.0]
    assert dropped.disagreed == kept.disagreed == [0]
    assert dropped.stats["silent_groups"] == kept.stats["silent_groups"] == 1
    with pytest.raises(ValueError, match="negatives"):
        grpo.GRPOConfig(negatives="clip")


def test_the_return_weight_is_a_positive_setting() -> None:
    assert grpo.GRPOConfig().return_weight == 0.1
    with pytest.raises(ValueError, match="return_weight"):
        grpo.GRPOConfig(reward="success+return", return_weight=0.0)


def test_episode_aggregation_weighs_every_episode_as_much_as_any_other() -> None:
    """A failure that ran to the time limit (4 chunks) and a success that ended early (1 chunk):
    ``chunk`` counts the failure 4 times as much, ``episode`` gives each episode's chunks one
    share, equal for the two episodes, the weights still averaging 1 over the chunks."""
    batch = {"episode_finished": torch.ones(4, dtype=torch.bool),
             "episode_group": torch.tensor([0, 0, 1, 1]),
             "episode_success": torch.tensor([True, False, True, False]),
             "episode_return": torch.tensor([1.0, 0.0, 1.0, 0.0]),
             "episode_id": torch.arange(4),
             "chunk_episode": torch.tensor([0, 1, 1, 1, 1, 2, 2, 3, 3]),
             "chunk_index": torch.tensor([0, 0, 1, 2, 3, 0, 1, 0, 1]),
             "chunk_log_prob": torch.zeros(9)}
    chunk = grpo.batch_signal(batch, 2, "success", aggregate="chunk")
    assert chunk.weights.tolist() == [1.0] * 9
    episode = grpo.batch_signal(batch, 2, "success", aggregate="episode")
    per_episode = torch.zeros(4).index_add_(0, batch["chunk_episode"], episode.weights)
    assert per_episode.tolist() == pytest.approx([9 / 4] * 4)
    assert float(episode.weights.mean()) == pytest.approx(1.0)
    # What the loss adds up over the group of the early success and the long failure: chunk
    # weighting pushes the failure down 4 times as hard as it pulls the success up.
    signed = (chunk.advantages * chunk.weights)[:5].sum()
    assert float(signed) == pytest.approx(1.0 - 4.0, abs=1e-4)
    assert float((episode.advantages * episode.weights)[:5].sum()) == pytest.approx(0.0, abs=1e-4)


@pytest.mark.parametrize(("dual_clip", "grads"), [(None, [-1.0, -1.0, 0.0]),
                                                  (3.0, [0.0, -1.0, 0.0])])
def test_the_dual_clip_stops_a_bad_chunk_the_update_made_far_likelier(dual_clip, grads) -> None:
    """Negative advantages at ratios 5, 2 and 0.5: PPO's clip stops the chunk already made
    unlikely (0.5 < 0.8) but not the one made 5 times likelier, whose term -5 grows without
    bound; the dual clip holds it at 3 x A, without gradient, and leaves the ratio 2 alone."""
    ratio = torch.tensor([5.0, 2.0, 0.5], requires_grad=True)
    objective = grpo.surrogate(ratio, torch.tensor([-1.0, -1.0, -1.0]), 0.2, dual_clip)
    objective.sum().backward()
    assert ratio.grad.tolist() == grads
    assert objective.tolist()[0] == (-5.0 if dual_clip is None else -3.0)


@pytest.mark.parametrize("starts", [None, [1, 0, 6, 7]], ids=["fresh", "replayed"])
def test_groups_split_over_ranks_are_the_episodes_of_the_whole_iteration(starts) -> None:
    """Two ranks' schedules together hand out exactly one process's episodes (same ids, seeds
    and reset options), so the collection does not depend on the launch; also where groups
    rerun earlier groups' start states (--replay-groups)."""
    env = ColorReachEval()
    whole = GroupEpisodes(env, 7, range(4, 8), 3, starts=starts)
    one = [whole.next(s) for s in range(12)]
    dp = [DataParallel(r, 2) for r in range(2)]
    shares = [GroupEpisodes(env, 7, d.groups_of(list(range(4, 8))), 3,
                            starts=None if starts is None else d.groups_of(starts)) for d in dp]
    split = [spec for share in shares for spec in (share.next(s) for s in range(6))]
    assert sorted((s.id, s.seed, str(s.reset_options)) for s in split) == sorted(
        (s.id, s.seed, str(s.reset_options)) for s in one)


@pytest.mark.parametrize("ema", [["--keep", "last"], ["--keep", "last", "--ema", "0.5"]],
                         ids=["trained", "ema"])
def test_the_command_writes_its_run_folder_and_the_eval_command_repeats_its_measure(
        tmp_path: Path, capsys: pytest.CaptureFixture, ema: list[str]) -> None:
    """--keep last: the printed command measures what the last held-out measurement measured;
    under --ema the measurements and the checkpoint are the averaged weights."""
    out = tmp_path / "grpo"
    assert _grpo("--out", str(out), "--iterations", "2", *SHORT, *ema) == 0
    printed = capsys.readouterr().out
    curve = json.loads((out / "curve.json").read_text())
    assert [p["iteration"] for p in curve["curve"]] == [0, 1, 2]
    assert "held_out_success" in curve["curve"][0] and "held_out_success" in curve["curve"][2]
    assert sum(p.get("chunks_with_signal", 0) for p in curve["curve"]) > 0
    assert all(len(p["held_out_interval"]) == 2 for p in curve["curve"]
               if "held_out_success" in p)
    assert (out / "grpo.json").exists() and [p.name for p in grpo_state.state_dirs(out)] == [
        "state-000001", "state-000002"]  # the newest two
    results = json.loads((out / "evals" / "iter-000002" / "results.json").read_text())
    assert results["complete"] and results["episodes"] == 4
    command = curve["eval_command"]
    assert command in printed and "--checkpoint" in command
    # The printed command, run as printed, measures the fine-tuned checkpoint on the same
    # episodes as the last held-out measurement and gets the same outcome, episode by episode.
    from cosmos3_gym.eval.cli import main

    assert main([*shlex.split(command)[1:], "--no-progress"]) == 0
    assert _outcomes(out / "eval") == _outcomes(out / "evals" / "iter-000002")
    if "--ema" in ema:  # the checkpoint: the average the last state saved, not the trained weights
        state = grpo_state.state_dirs(out)[-1]
        average = torch.load(state / grpo_state.OPTIMIZER, weights_only=True)["average"]
        written = _written(out / "checkpoint")
        trained = _masters(out)
        assert any(not torch.equal(average[k], trained[k]) for k in average)
        for name, value in average.items():
            torch.testing.assert_close(written[name].float(), value, rtol=0, atol=0)


def _outcomes(folder: Path) -> list[tuple]:
    """An evaluation's episodes, each by its task, trial, first observation and outcome."""
    from cosmos3_gym.eval.results import read_episode_records

    return sorted((r["task"], r["trial"], r["obs_sha256"], r["success"])
                  for r in read_episode_records(folder))


def _written(checkpoint: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    written = {}
    for f in sorted((checkpoint / "transformer").glob("*.safetensors")):
        written.update(load_file(f))
    return written


def test_keep_best_writes_the_best_measured_weights_and_measures_them_on_test_episodes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    """--keep best (the default) with the held-out successes scripted (25%, 75%, 50% at
    iterations 0, 2, 4): the checkpoint is iteration 2's weights, bit for bit those a --keep
    last run of 2 iterations ends with (what is kept does not change the training); the start
    and the kept weights are measured on the test episodes, and the printed command repeats
    the kept weights' measurement episode by episode."""
    scripted = {0: 0.25, 2: 0.75, 4: 0.5}
    real = grpo.held_out

    def scripted_held_out(learner, run, iteration, test=False):
        point = real(learner, run, iteration, test)
        return point if test or point is None else {**point,
                                                    "held_out_success": scripted[iteration]}

    monkeypatch.setattr(grpo, "held_out", scripted_held_out)
    best, last = tmp_path / "best", tmp_path / "last"
    assert _grpo("--out", str(best), "--iterations", "4", *SHORT) == 0  # the default
    printed = capsys.readouterr().out
    monkeypatch.setattr(grpo, "held_out", real)
    assert _grpo("--out", str(last), "--iterations", "2", *SHORT, "--keep", "last") == 0
    kept, trained = _written(best / "checkpoint"), _written(last / "checkpoint")
    assert kept.keys() == trained.keys() and all(torch.equal(kept[k], trained[k]) for k in kept)
    done = json.loads((best / "curve.json").read_text())
    assert done["kept"]["iteration"] == 2 and done["kept"]["held_out_success"] == 0.75
    assert done["kept"]["test_episodes"] == 4 and done["test_before"] is not None
    assert sorted(p.name for p in (best / "evals").iterdir()) == [
        "iter-000000", "iter-000002", "iter-000004", "test-iter-000000", "test-iter-000002"]
    assert "kept: the weights of iteration 2" in printed and "--seed 2000000" in printed
    from cosmos3_gym.eval.cli import main

    assert main([*shlex.split(done["eval_command"])[1:], "--no-progress"]) == 0
    assert _outcomes(best / "eval") == _outcomes(best / "evals" / "test-iter-000002")
    assert _outcomes(best / "eval") != _outcomes(best / "evals" / "iter-000002")  # other seeds


def test_a_resume_drops_the_measurements_of_weights_it_no_longer_has(tmp_path: Path) -> None:
    """Resumed from iteration 4's state: later held-out and test measurements go; the test
    measurement of weights kept at iteration 4 or before stays (the state keeps them)."""
    names = ["iter-000000", "iter-000004", "iter-000006", "test-iter-000000",
             "test-iter-000004", "test-iter-000006"]
    for name in names:
        (tmp_path / "evals" / name).mkdir(parents=True)
    grpo_state.drop_later_evals(tmp_path, 4)
    assert sorted(p.name for p in (tmp_path / "evals").iterdir()) == [
        "iter-000000", "iter-000004", "test-iter-000000", "test-iter-000004"]


def test_init_is_refused_with_the_new_name(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as stop:
        _grpo("--init", "tiny", "--out", "x")
    assert stop.value.code == 2
    assert "--init is now --checkpoint" in capsys.readouterr().err


def test_a_missing_checkpoint_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="cosmos3-gym train --out"):
        grpo.run_grpo(grpo.GRPOConfig(checkpoint=str(tmp_path / "none"),
                                      out=str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("ema", [["--keep", "last"], ["--keep", "last", "--ema", "0.5"], [],
                                 ["--replay-groups", "1"]],
                         ids=["trained", "ema", "keep-best", "replay"])
def test_a_killed_run_resumes_to_the_uninterrupted_curve(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch,
                                                         ema: list[str]) -> None:
    """The saved state holds all a run goes on from: under --ema, the average too (the later
    measurements are of it); under --keep best, the kept weights (the result); under
    --replay-groups, the start states to rerun (read from the restored curve)."""
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    short = [*SHORT, *ema]
    assert _grpo("--out", str(whole), "--iterations", "4", *short) == 0

    # Killed in iteration 3, after its episodes were collected: the newest state is
    # iteration 2's; the resumed run collects iteration 3 again and goes on.
    calls = {"n": 0}
    real = grpo.update

    def dies_in_the_third(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(grpo, "update", dies_in_the_third)
    with pytest.raises(SystemExit):
        _grpo("--out", str(cut), "--iterations", "4", *short)
    assert [p.name for p in grpo_state.state_dirs(cut)] == ["state-000001", "state-000002"]
    monkeypatch.setattr(grpo, "update", real)
    assert _grpo("--out", str(cut), "--iterations", "4", *short) == 0
    assert _curve(cut) == _curve(whole)
    a, b = _masters(whole), _masters(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    a, b = _written(whole / "checkpoint"), _written(cut / "checkpoint")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_replayed_groups_rerun_the_start_states_whose_groups_disagreed(tmp_path: Path) -> None:
    """Each iteration's first group reruns the least recently run start state whose latest
    group disagreed, with its own episode ids (fresh noise); the second starts fresh. The
    records in curve.json say which start each group ran and whether it disagreed."""
    out = tmp_path / "grpo"
    assert _grpo("--out", str(out), "--iterations", "4", *SHORT, "--replay-groups", "1") == 0
    points = [p for p in _curve(out) if p["iteration"] > 0]
    candidates: dict[int, int] = {}  # start state -> the last iteration that ran it
    replayed = 0
    for p in points:
        fresh = [2 * (p["iteration"] - 1), 2 * p["iteration"] - 1]
        again = min(candidates, key=lambda s: (candidates[s], s)) if candidates else None
        assert p["group_starts"] == [fresh[0] if again is None else again, fresh[1]]
        replayed += again is not None
        assert sum(p["group_signal"]) == p["groups"] - p["silent_groups"]
        for start, signal in zip(p["group_starts"], p["group_signal"], strict=True):
            if signal:
                candidates[start] = p["iteration"]
            else:
                candidates.pop(start, None)
    assert replayed >= 1  # at noise level 2 most groups disagree: the test reruns some


def test_a_run_folder_refuses_another_runs_settings(tmp_path: Path) -> None:
    out = tmp_path / "grpo"
    assert _grpo("--out", str(out), "--iterations", "1", *SHORT) == 0
    with pytest.raises(SystemExit) as stop:
        _grpo("--out", str(out), "--iterations", "2", *SHORT, "--lr", "3e-4")
    assert stop.value.code == 2


@pytest.mark.slow
def test_a_short_run_of_the_documented_command_raises_held_out_success(tmp_path: Path) -> None:
    """The documented ColorReach command (every algorithm setting at its default), cut to 15
    iterations and 80 held-out episodes: the held-out success rises (measured with the
    episode-weighted loss: 42.5% -> 50.0%, seed 0; 1.7 min on the 2-core CPU beside two other
    runs). A sign error, a broken ratio or a step that wrecks the policy ends below the start."""
    out = tmp_path / "grpo"
    assert _grpo("--env-kwargs", '{"max_speed": 0.28}', "--iterations", "15",
                 "--eval-trials", "20", "--no-progress", "--out", str(out)) == 0
    held = [p["held_out_success"] for p in _curve(out) if "held_out_success" in p]
    assert len(held) == 2 and held[1] >= held[0] + 0.05, held


# ---------------------------------------------------------------------- the folder's files


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished two-iteration run (states after iterations 1 and 2), copied by each test."""
    out = tmp_path_factory.mktemp("grpo") / "run"
    assert _grpo("--out", str(out), "--iterations", "2", *SHORT) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    import shutil

    return Path(shutil.copytree(run, tmp_path / "run"))


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _pickled(path: Path) -> None:
    torch.save({"optimizer": {}, "rng": {}, "where": Path("/tmp")}, path)  # a class: code


@pytest.mark.parametrize(("name", "damage", "says"), [
    ("trained.safetensors", _cut, "not a complete safetensors file"),
    ("state.json", lambda p: p.write_text("[2]"), "expected a GRPO state holding a JSON object"),
    ("state.json", lambda p: p.write_text('{"iteration": "2", "curve": []}'),
     'expected "iteration": 2; found \'2\''),
    ("optimizer.pt", _pickled, "it holds objects other than tensors and plain containers"),
    ("optimizer.pt", _cut, "not a readable torch file"),
])
def test_a_damaged_state_file_is_one_line_naming_it_and_the_state_to_go_on_from(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture, name, damage,
        says) -> None:
    out = _copy(finished, tmp_path)
    damage(out / "state-000002" / name)
    def files() -> list[tuple[Path, int]]:
        # The lock is taken by every run, and grpo.json records the latest session beside the
        # run's identity (this copy's path): neither is the run's state.
        return sorted((p.relative_to(out), p.stat().st_mtime_ns) for p in out.rglob("*")
                      if not p.name.startswith(".lock") and p.name != "grpo.json")

    before = files()
    with pytest.raises(SystemExit) as stop:
        _grpo("--out", str(out), "--iterations", "2", *SHORT)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1, err
    assert f"{out / 'state-000002' / name}: {says}" in err[0], err[0]
    assert f"remove {out / 'state-000002'} to resume from state-000001" in err[0]
    assert "weights_only" not in err[0]
    assert files() == before


def test_following_the_damaged_state_advice_resumes_from_the_state_before(
        finished: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    import shutil

    out = _copy(finished, tmp_path)
    _cut(out / "state-000002" / "trained.safetensors")
    shutil.rmtree(out / "state-000002")
    assert _grpo("--out", str(out), "--iterations", "2", *SHORT) == 0
    assert f"resuming {out} after iteration 1" in capsys.readouterr().out
    assert _curve(out) == _curve(finished)
    a, b = _masters(out), _masters(finished)
    assert all(torch.equal(a[k], b[k]) for k in a)


def _full_at(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The disk fills up when ``name`` (a file of ``state-000002``) is written."""
    real = grpo_state.os.fsync

    def fsync(fd: int) -> None:
        path = os.readlink(f"/proc/self/fd/{fd}")
        if "state-000002" in path and name in path:
            raise OSError(28, "No space left on device")
        real(fd)

    monkeypatch.setattr(grpo_state.os, "fsync", fsync)


@pytest.mark.parametrize("name", ["optimizer.pt", "state.json"])
def test_a_full_disk_at_a_state_save_is_one_line_naming_the_file(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch,
        name: str) -> None:
    out = tmp_path / "run"
    _full_at(name, monkeypatch)
    with pytest.raises(SystemExit) as stop:
        _grpo("--out", str(out), "--iterations", "2", *SHORT)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 1 and len(err) == 1, err
    assert f"error: No space left on device: {out / 'state-000002' / name} (OSError, errno 28)" \
        in err[0], err[0]
    assert [p.name for p in grpo_state.state_dirs(out)] == ["state-000001"]
    assert not list(out.glob(".*.tmp"))
    monkeypatch.undo()
    assert _grpo("--out", str(out), "--iterations", "2", *SHORT) == 0
    assert [p.name for p in grpo_state.state_dirs(out)] == ["state-000001", "state-000002"]


def test_what_a_killed_result_write_left_is_removed_by_the_rerun(finished: Path,
                                                                 tmp_path: Path) -> None:
    out = _copy(finished, tmp_path)
    for partial in (".checkpoint.4242.tmp/transformer", ".adapter.4242.tmp",
                    ".state-000003.4242.tmp"):
        (out / partial).mkdir(parents=True)
    assert _grpo("--out", str(out), "--iterations", "2", *SHORT) == 0
    assert not list(out.glob(".*.tmp")) and (out / "checkpoint" / "transformer").is_dir()


def test_an_interrupt_before_the_first_save_says_so_and_the_rerun_starts_over(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(grpo, "update", interrupted)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as stop:
        _grpo("--out", str(out), "--iterations", "1", *SHORT)
    err = capsys.readouterr().err
    assert stop.value.code == 130
    assert f"{out} holds no saved state yet" in err and "start again from iteration 0" in err
    monkeypatch.undo()
    assert _grpo("--out", str(out), "--iterations", "1", *SHORT) == 0
    assert f"{out} holds no saved state yet: the run starts from iteration 0" in \
        capsys.readouterr().out


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_two_torchrun_ranks_make_the_update_one_process_makes(tmp_path: Path) -> None:
    """gloo on the CPU: each rank collects one of the two groups, the gradients are summed over
    the ranks: the same episodes, losses and gradients as one process, to fp32 rounding.

    The weights are held to a looser bound: AdamW's first steps move each weight by about
    ``lr · g / (|g| + eps)``, which turns the rounding of gradients near ``eps`` into steps of a
    few percent of ``lr``; a wrong reduction (a missing, doubled or averaged rank) moves them by
    the order of ``lr``."""
    args = ["rl", "grpo", "--iterations", "2", "--eval-every", "100", *SHORT]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    single, multi = tmp_path / "single", tmp_path / "multi"
    subprocess.run([sys.executable, "-m", "cosmos3_gym.eval.cli", *args, "--out", str(single)],
                   check=True, env=env, capture_output=True)
    run = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         "--master_addr", "127.0.0.1", "--master_port", str(_free_loopback_port()),
         "-m", "cosmos3_gym.eval.cli", *args, "--out", str(multi)],
        env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    one, two = _curve(single), _curve(multi)
    for a, b in zip(one, two, strict=True):
        for key in ("train_success", "groups", "chunks_with_signal", "update_steps",
                    "held_out_success"):
            assert a.get(key) == b.get(key), key
        for key in ("loss", "grad_norm", "approx_kl"):
            assert a.get(key, 0.0) == pytest.approx(b.get(key, 0.0), rel=1e-4, abs=1e-6), key
    steps = sum(p.get("update_steps", 0) for p in one)
    assert steps > 0 and all(p["grad_norm"] > 0 for p in one[1:] if p["update_steps"])
    a, b = _masters(single), _masters(multi)
    apart = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert apart <= 0.1 * 1e-3 * steps, apart  # lr 1e-3


# ---------------------------------------------------------------------- what trains


def _learner(checkpoint: Path, train: str, **kw) -> grpo.Learner:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    return grpo.Learner(pipe, grpo.GRPOConfig(checkpoint=str(checkpoint), train=train, **kw))


def _chunks(pipe: Cosmos3ActionPipeline) -> tuple[sde.StochasticRecord, list[str]]:
    from cosmos3_gym.envs import make_color_reach_vector_env

    envs = make_color_reach_vector_env(2, image_size=32)
    obs, _ = envs.reset(seed=0)
    prompts = list(envs.call("task_description"))
    envs.close()
    with torch.inference_mode():
        out = pipe(obs, prompts, seed=[1, 2], sampler="flow_sde", num_inference_steps=3,
                   progress=False)
    return out.stochastic, prompts


def test_lora_trains_adapters_and_heads_and_turned_off_is_the_base(checkpoint: Path) -> None:
    learner = _learner(checkpoint, "lora", lora_rank=4, kl_coef=0.1)
    names = [n for n, _ in learner.trainable.named_parameters()]
    assert names and all(".lora_" in n or ".modules_to_save." in n for n in names)
    assert not any(n.startswith("embed_tokens") or ".mlp." in n for n in names)
    assert learner.trainable.count < sum(p.numel() for p in learner.model.parameters())
    adapters = learner.trainable.count - learner.trainable.fully_trained_count
    assert adapters == memory.lora_parameter_count(learner.model.config, 4)
    record, prompts = _chunks(learner.pipe)
    base = chunk_log_prob(learner.pipe, record, prompts).detach()
    # LoRA's B starts at zero: the adapted policy is the base until it trains.
    np.testing.assert_allclose(base.numpy(), record.log_prob, atol=1e-5)
    with torch.no_grad():
        for p in learner.trainable.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = chunk_log_prob(learner.pipe, record, prompts).detach()
    assert float((moved - base).abs().max()) > 1e-3
    with torch.no_grad(), learner.reference():
        reference = chunk_log_prob(learner.pipe, record, prompts)
    assert torch.equal(reference, base)


def test_the_merged_lora_checkpoint_acts_as_the_adapted_policy(checkpoint: Path,
                                                               tmp_path: Path) -> None:
    learner = _learner(checkpoint, "lora", lora_rank=4)
    with torch.no_grad():
        for p in learner.trainable.parameters():
            p.add_(0.05 * torch.randn_like(p))
    record, prompts = _chunks(learner.pipe)
    adapted = chunk_log_prob(learner.pipe, record, prompts).detach()
    assert learner.trainable.save_adapter(tmp_path / "adapter") is not None
    assert {p.name for p in (tmp_path / "adapter").iterdir()} == {
        "adapter_config.json", "adapter_model.safetensors"}
    folder = grpo_state.write_checkpoint(learner.pipe, learner.trainable.merged(),
                                         tmp_path / "ckpt")
    loaded = Cosmos3ActionPipeline.from_pretrained(folder, trainable=True)
    np.testing.assert_allclose(chunk_log_prob(loaded, record, prompts).detach().numpy(),
                               adapted.numpy(), atol=1e-4)


def test_named_modules_train_alone_and_unknown_names_are_refused(checkpoint: Path) -> None:
    learner = _learner(checkpoint, "modules:action_proj_out,layers.1.mlp_moe_gen")
    names = {n for n, _ in learner.trainable.named_parameters()}
    assert names and all(n.startswith(("action_proj_out.", "layers.1.mlp_moe_gen."))
                         for n in names)
    with pytest.raises(ValueError, match="no module named"):
        _learner(checkpoint, "modules:action_head")
    with pytest.raises(ValueError, match="expected full, lora or modules"):
        grpo.GRPOConfig(train="heads")


def test_full_training_keeps_a_frozen_reference_for_the_kl_term(checkpoint: Path) -> None:
    learner = _learner(checkpoint, "full", kl_coef=0.1)
    record, prompts = _chunks(learner.pipe)
    base = chunk_log_prob(learner.pipe, record, prompts).detach()
    with torch.no_grad():
        for p in learner.trainable.parameters():
            p.add_(0.01 * torch.randn_like(p))
    with torch.no_grad(), learner.reference():
        assert torch.equal(chunk_log_prob(learner.pipe, record, prompts), base)
    assert not torch.equal(chunk_log_prob(learner.pipe, record, prompts).detach(), base)


def test_bf16_trained_parameters_keep_fp32_masters() -> None:
    layer = torch.nn.Linear(4, 4).to(torch.bfloat16)
    masters = trainable.MasterWeights(list(layer.named_parameters()))
    assert masters.copies and all(m.dtype == torch.float32 for m in masters.masters)
    opt = torch.optim.SGD(masters.masters, lr=1e-4)
    start = masters.masters[0].detach().clone()
    for _ in range(3):  # steps far below bf16's resolution accumulate in the fp32 master
        layer.weight.grad = torch.ones_like(layer.weight)
        masters.grads_to_master()
        opt.step()
        masters.master_to_model()
    assert torch.allclose(masters.masters[0], start - 3e-4, atol=1e-7)


def test_gradient_checkpointing_gives_the_same_gradients(checkpoint: Path) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    record, prompts = _chunks(pipe)
    grads = []
    for on in (False, True):
        pipe.transformer.gradient_checkpointing = on
        pipe.transformer.zero_grad(set_to_none=True)
        chunk_log_prob(pipe, record, prompts).sum().backward()
        grads.append([p.grad.clone() for p in pipe.transformer.parameters()
                      if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


# ---------------------------------------------------------------------- memory


def _saved_bytes(pipe, record, prompts) -> int:
    """The bytes autograd saves in one scoring forward for its backward (distinct storages,
    the parameters themselves not counted)."""
    params = {p.untyped_storage().data_ptr() for p in pipe.transformer.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if t.untyped_storage().data_ptr() not in params:
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        chunk_log_prob(pipe, record, prompts)
    return sum(seen.values())


def test_the_estimate_counts_every_step_the_update_scores() -> None:
    """--sde-steps all scores every denoising step of a chunk with gradients: the activation
    estimate grows with them (one step for random, the listed ones otherwise)."""
    from cosmos3_gym.train.config import GRPOConfig

    assert memory.stochastic_steps(GRPOConfig(), 8) == 1
    assert memory.stochastic_steps(GRPOConfig(sde_steps="random-but-last"), 8) == 1
    assert memory.stochastic_steps(GRPOConfig(sde_steps="all"), 8) == 8
    assert memory.stochastic_steps(GRPOConfig(sde_steps="all", num_inference_steps=4), 8) == 4
    assert memory.stochastic_steps(GRPOConfig(sde_steps="all", sampler="flow_cps"), 8) == 7
    assert memory.stochastic_steps(GRPOConfig(sde_steps=(1, 3)), 8) == 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("train", ["full", "lora"])
def test_the_activation_estimate_is_what_autograd_keeps(train: str, dtype) -> None:
    """One chunk at LIBERO's input on the tiny shape: the estimated activation bytes are within
    30% of what autograd saves (the estimate sizes GPUs: tens of percent matter, not bytes);
    with gradient checkpointing the forward keeps less, and the estimate (which adds the one
    layer alive in the recompute) bounds it from above."""
    from cosmos3_gym.checkpoint import PolicyConfig

    policy = PolicyConfig.for_domain("libero", normalization="none")
    prompt = "put the bowl on the plate"
    counts = []
    for checkpointing in (False, True):
        pipe = Cosmos3ActionPipeline.from_preset(
            "tiny", policy, device="cpu", dtype=dtype,
            options=InferenceOptions(fuse_projections=False))
        learner = grpo.Learner(pipe, grpo.GRPOConfig(
            synthetic="tiny", train=train, lora_rank=8, gradient_checkpointing=checkpointing))
        with torch.inference_mode():
            out = pipe(np.zeros((1, 256, 512, 3), np.uint8), [prompt], seed=[1],
                       sampler="flow_sde", num_inference_steps=2, progress=False)
        measured = _saved_bytes(pipe, out.stochastic, [prompt])
        estimated = memory.activation_bytes_per_chunk(
            pipe.transformer.config, memory.chunk_tokens(pipe, (256, 512), prompt),
            dtype_bytes=dtype.itemsize, lora_rank=8 if train == "lora" else 0,
            checkpointing=checkpointing, text_trains=train == "full")
        assert learner.trainable.count > 0
        counts.append((measured, estimated))
    (plain, plain_estimate), (kept, kept_estimate) = counts
    assert 0.7 * plain <= plain_estimate <= 1.3 * plain, counts
    assert kept < plain and kept <= kept_estimate < plain_estimate, counts


def test_a_setting_that_cannot_fit_is_refused_naming_the_knob() -> None:
    from cosmos3_gym.model.presets import preset_config

    nano = preset_config("nano")
    tokens = memory.ChunkTokens(text=120, vision=256, action=16)
    common = dict(weight_bytes=30 * memory.GIB, dtype_bytes=2, tokens=tokens, microbatch=64,
                  stochastic_steps=1, rollout_batch=16)
    full = memory.training_memory(nano, trained_params=14_550_000_000, trained_in_fp32=False,
                                  **common)
    with pytest.raises(ValueError, match="--train lora"):
        memory.check_fits(full, 139 * memory.GIB, train="full", checkpointing=True,
                          microbatch=64, kl=False)
    lora = memory.lora_parameter_count(nano, 16) + 17_000_000
    wide = memory.training_memory(nano, trained_params=lora, trained_in_fp32=False,
                                  lora_rank=16, **common)
    with pytest.raises(ValueError, match="--gradient-checkpointing"):
        memory.check_fits(wide, 80 * memory.GIB, train="lora", checkpointing=False,
                          microbatch=64, kl=False)
    slim = memory.training_memory(nano, trained_params=lora, trained_in_fp32=False,
                                  lora_rank=16, checkpointing=True, **common)
    memory.check_fits(slim, 139 * memory.GIB, train="lora", checkpointing=True, microbatch=64,
                      kl=False)
    assert slim.total < 60 * memory.GIB < wide.total
    # --ema keeps an fp32 average of every trained parameter.
    averaged = memory.training_memory(nano, trained_params=lora, trained_in_fp32=False,
                                      lora_rank=16, checkpointing=True, averaged=True, **common)
    assert averaged.average == lora * 4 and averaged.total == slim.total + lora * 4


def test_color_reach_takes_its_speed_from_env_kwargs_and_other_keys_are_refused() -> None:
    from cosmos3_gym.envs import make_eval_env

    assert make_eval_env("color_reach", env_kwargs={"max_speed": 0.28}).max_speed == 0.28
    with pytest.raises(ValueError, match=r"takes \['max_speed'\] only"):
        make_eval_env("color_reach", env_kwargs={"speed": 0.28})
    with pytest.raises(ValueError, match="positive number"):
        make_eval_env("color_reach", env_kwargs={"max_speed": -1})
    with pytest.raises(ValueError, match="apply to --env gym:ID and the benchmark presets only"):
        make_eval_env("libero", env_kwargs={"max_speed": 0.28})
    with pytest.raises(ValueError, match=r"takes \['shadows', 'terminate_on_success'\] only"):
        make_eval_env("metaworld", env_kwargs={"max_speed": 0.28})


@pytest.mark.parametrize("settings, message", [
    ({"eval_seed": 0}, "must differ from seed"),
    ({"precision": "fp8"}, "for inference"),
    ({"group_size": 1}, "GRPO compares a group"),
    ({"microbatch": 65}, r"between 1 and minibatch \(64\)"),
    ({"minibatch": 8, "microbatch": 9}, r"between 1 and minibatch \(8\)"),
    ({"minibatch": 64, "minibatches": 2}, "not both; found 64 and 2"),
    ({"minibatches": 0}, "minibatches"),
    ({"sampler": "flow_unipc"}, r"sampler must be one of \['flow_sde', 'flow_cps'\]"),
    ({"synthetic": "tiny", "checkpoint": "tiny"}, "random weights"),
    ({"keep": "best", "test_seed": 1_000_000}, "test_seed .* must differ from seed"),
    ({"keep": "best", "test_seed": 0}, "neither training nor the selection saw"),
    ({"groups": 2, "replay_groups": 2}, r"replay_groups must be below groups \(2\)"),
])
def test_bad_settings_are_refused_before_anything_runs(settings, message) -> None:
    with pytest.raises(ValueError, match=message):
        grpo.GRPOConfig(**settings)


def test_more_ranks_than_groups_is_refused(monkeypatch: pytest.MonkeyPatch,
                                           tmp_path: Path) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(ValueError, match="each of the 4 ranks needs at least one group"):
        grpo.run_grpo(grpo.GRPOConfig(groups=2, out=str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("given", "message"), [
    ({"lr_warmup": -1}, "lr_warmup must be an integer >= 0; found -1"),
    ({"target_kl": 0.0}, "target_kl must be"),
    ({"advantages": "median"}, "advantages must be one of"),
    ({"aggregate": "token"}, "aggregate must be one of"),
    ({"ratio": "token"}, "ratio must be one of"),
    ({"ema": 1.0}, "ema must be a number between 0 and 1"),
    ({"ema": 0}, "ema must be a number between 0 and 1"),
    ({"dual_clip": 1.0}, "dual_clip must be a finite number > 1"),
    ({"lr_half_life": 0}, "lr_half_life must be an integer >= 1"),
    ({"keep": "first"}, "keep must be one of"),
])
def test_the_update_knobs_are_refused_where_every_setting_is(given, message) -> None:
    """The settings' own declarations hold the knobs' rules (check_settings, as for every
    setting), for the Python API and the command line alike."""
    from cosmos3_gym.train.config import GRPOConfig

    with pytest.raises(ValueError, match=message):
        GRPOConfig(**given)


def test_a_negative_warmup_is_one_error_line_before_anything_runs(tmp_path: Path,
                                                                  capsys) -> None:
    from cosmos3_gym.eval.cli import main

    out = tmp_path / "grpo"
    with pytest.raises(SystemExit) as stop:
        main(["rl", "grpo", "--lr-warmup", "-1", "--out", str(out)])
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert "error:" in lines[-1] and "--lr-warmup" in lines[-1] and ">= 0" in lines[-1], lines
    assert not out.exists()
