"""``cosmos3-gym rl grpo``: GRPO fine-tuning of a Cosmos3 policy on any env family.

One iteration, as :func:`_run` reads:

1. **Collect.** ``groups`` groups of ``group_size`` episodes, each group from one start state
   (the family's task and trial: a LIBERO init state, a gym seed), rolled with a stochastic
   sampler (:func:`~cosmos3_gym.runner.collect_on_policy` over
   :class:`~cosmos3_gym.runner.GroupEpisodes`): every chunk records its log-probability.
   Under ``--replay-groups`` some groups rerun start states whose latest group disagreed
   (:func:`iteration_starts`).
2. **Advantages.** Each episode's reward (its success, its return, or both) against its
   group's (:func:`batch_signal`): the advantage of every chunk it executed.
3. **Update.** PPO's clipped surrogate on :func:`~cosmos3_gym.pipeline.chunk_log_prob`
   (:func:`update`), optionally with a KL term to the start policy and a trust region on the
   iteration's ``approx_kl``, updates what ``--train`` names
   (:mod:`~cosmos3_gym.train.trainable`).
4. **Measure.** Held-out success (:func:`held_out`) is an evaluation of the deterministic
   sampler on the family's own episodes, before, every ``eval_every`` iterations and at the end.

Beside it, each in its own module: the run's saved states, resume and the fine-tuned checkpoint
(:mod:`~cosmos3_gym.train.grpo_state`), torchrun's data parallelism
(:mod:`~cosmos3_gym.train.data_parallel`), the memory estimate
(:mod:`~cosmos3_gym.train.memory`), and the curve and summary it writes
(:mod:`~cosmos3_gym.train.grpo_report`). Every random draw of an iteration (its episodes,
their noise, the minibatch order) derives from the run's seed and the iteration, so a resumed
run repeats the uninterrupted one. Docs: docs/rl.md, "GRPO".
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos3_gym.settings import EnvSettings, stored_model_source
from cosmos3_gym.train import grpo_report, grpo_state
from cosmos3_gym.train.config import (  # noqa: F401  (GRPOConfig's home; re-exported here)
    ADVANTAGES,
    CURVE_FILE,
    DEFAULT_RETURN_WEIGHT,
    EVALS,
    IDENTITY_FILE,
    LOSS_NORMS,
    REWARDS,
    RUN_ONLY,
    STATE_PREFIX,
    TEST_PREFIX,
    GRPOConfig,
)
from cosmos3_gym.train.data_parallel import DataParallel

# ---------------------------------------------------------------------- advantages


def group_advantages(returns: torch.Tensor, groups: torch.Tensor,
                     scale: str = "group") -> torch.Tensor:
    """Each episode's return minus its group's mean; ``scale="group"`` divides by the group's
    standard deviation (+1e-6), ``"mean"`` leaves the difference as it is. 0 in groups of equal
    returns.

    >>> adv = group_advantages(torch.tensor([1., 0., 1., 1.]), torch.tensor([0, 0, 1, 1]))
    >>> [round(a, 4) for a in adv.tolist()]
    [1.0, -1.0, 0.0, 0.0]
    >>> group_advantages(torch.tensor([1., 0., 0., 0.]), torch.zeros(4), "mean").tolist()
    [0.75, -0.25, -0.25, -0.25]
    """
    adv = torch.zeros_like(returns)
    for g in torch.unique(groups):
        members = groups == g
        r = returns[members]
        adv[members] = r - r.mean()
        if scale == "group":
            adv[members] /= r.std(unbiased=False) + 1e-6
    return adv


def surrogate(ratio: torch.Tensor, adv: torch.Tensor, clip: float,
              dual_clip: float | None) -> torch.Tensor:
    """PPO's clipped surrogate per chunk, ``min(r·A, clip(r, 1 − clip, 1 + clip)·A)``; with
    ``dual_clip`` c, a negative advantage's term is at least ``c·A`` (dual-clip PPO): a chunk
    the update made far likelier than it was sampled stops pushing, as the first clip already
    stops a chunk of positive advantage. Ratios ``[n, K]``, one per stochastic step of each
    chunk (``--ratio step``): each step's term as above, the chunk's objective their mean.

    >>> r, a = torch.tensor([0.5, 1.5, 5.0, 5.0]), torch.tensor([1.0, 1.0, 1.0, -1.0])
    >>> surrogate(r, a, 0.25, None).tolist(), surrogate(r, a, 0.25, 3.0).tolist()
    ([0.5, 1.25, 1.25, -5.0], [0.5, 1.25, 1.25, -3.0])
    >>> surrogate(torch.tensor([[1.1, 1.1], [1.5, 1.0]]), torch.ones(2), 0.25, None).tolist()
    [1.100000023841858, 1.125]
    """
    per_step = ratio.ndim == 2
    adv = adv[:, None] if per_step else adv
    objective = torch.minimum(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    if dual_clip is not None:
        objective = torch.where(adv < 0, torch.maximum(objective, dual_clip * adv), objective)
    return objective.mean(1) if per_step else objective


def iteration_seed(seed: int, iteration: int, stream: int) -> int:
    """A 63-bit seed for one random stream of one iteration (0: the minibatch order)."""
    state = np.random.SeedSequence([int(seed), int(iteration), int(stream)]).generate_state(
        1, dtype=np.uint64)
    return int(state[0] >> np.uint64(1))


@dataclass
class Signal:
    """The chunks of a rank's batch that carry an advantage, and what the update needs of
    them."""

    rows: np.ndarray  # rows of the batch's chunk arrays
    keys: np.ndarray  # int64 [N, 2]: (run-wide episode id, chunk index), the run-wide order
    advantages: torch.Tensor  # [N]
    weights: torch.Tensor  # [N]: each chunk's share of the loss (1 per chunk on average)
    old_log_prob: torch.Tensor  # [N]
    stats: dict[str, float]
    disagreed: list[int]  # the complete groups whose episodes disagree (their chunks are here)
    # What every minibatch's mean over its chunks is multiplied by: 1, or under --loss-norm
    # collected the share of the iteration's units (every rank's) that carry a signal.
    loss_scale: float = 1.0


def episode_advantages(rewards: torch.Tensor, groups: torch.Tensor, complete: torch.Tensor,
                       advantages: str, dp: DataParallel) -> torch.Tensor:
    """One reward's advantage per episode: 0 outside the complete groups, else the reward
    against its group's (:func:`group_advantages`, ``"group"`` or ``"mean"``); ``"batch"``
    divides the differences from the group means by their root mean square over every rank's
    episodes of groups that disagree."""
    adv = torch.zeros_like(rewards)
    if complete.any():
        adv[complete] = group_advantages(rewards[complete], groups[complete],
                                         "group" if advantages == "group" else "mean")
    if advantages == "batch":
        informative = torch.zeros_like(complete)
        for g in torch.unique(groups[complete]):
            members = groups == g
            informative |= members & bool((adv[members] != 0).any())
        totals = dp.all_sum(
            {"square": float((adv[informative] ** 2).sum()),
             "count": float(informative.sum())})
        if totals["count"]:
            adv = adv / (math.sqrt(totals["square"] / totals["count"]) + 1e-6)
    return adv


def batch_signal(batch: dict[str, Any], group_size: int, reward: str, advantages: str = "group",
                 dp: DataParallel | None = None, aggregate: str = "episode",
                 return_weight: float = DEFAULT_RETURN_WEIGHT, negatives: str = "keep",
                 loss_norm: str = "signal") -> Signal:
    """Group-relative advantages of the complete groups (every member finished) of a batch, and
    the chunks that carry a non-zero one (:func:`episode_advantages`). ``reward`` is
    ``"success"``, ``"return"`` or ``"success+return"``: success's advantage plus
    ``return_weight`` times the return's, each computed on its own, so success decides where a
    group's episodes differ in it and the return orders them where they do not.
    ``negatives="drop"`` sets the negative advantages to 0, so only the better episodes of a
    group carry a signal (a group still counts as disagreeing). ``aggregate`` weighs the chunks
    in the loss (:func:`chunk_weights`). ``loss_norm="collected"`` scales the loss by the share
    of the complete groups' units (episodes, or chunks under ``aggregate="chunk"``) that carry
    a signal, over every rank: the loss becomes a mean over everything collected, a silent
    group's units counting as zeros (:func:`collected_share`)."""
    if loss_norm not in LOSS_NORMS:
        raise ValueError(f"loss_norm must be one of {LOSS_NORMS}; found {loss_norm!r}")
    dp = dp or DataParallel(0, 1)
    finished = batch["episode_finished"]
    groups = batch["episode_group"]
    complete = torch.zeros_like(finished)
    for g in torch.unique(groups):
        members = groups == g
        if finished[members].all() and int(members.sum()) == group_size:
            complete |= members
    success = batch["episode_success"].float()
    returns = batch["episode_return"].float()
    if reward == "success":
        adv_ep = episode_advantages(success, groups, complete, advantages, dp)
    elif reward == "return":
        adv_ep = episode_advantages(returns, groups, complete, advantages, dp)
    else:
        adv_ep = episode_advantages(success, groups, complete, advantages, dp) + \
            return_weight * episode_advantages(returns, groups, complete, advantages, dp)
    finished_groups = torch.unique(groups[complete]).tolist()
    disagreed = [int(g) for g in finished_groups if (adv_ep[groups == g] != 0).any()]
    if negatives == "drop":
        adv_ep = adv_ep.clamp(min=0.0)
    chunk_episode = batch["chunk_episode"]  # run-wide ids; episode_id maps rows to them
    row_of = {int(e): i for i, e in enumerate(batch["episode_id"].tolist())}
    chunk_ep_row = torch.tensor([row_of[int(e)] for e in chunk_episode.tolist()],
                                dtype=torch.long)
    keep = complete[chunk_ep_row] & (adv_ep[chunk_ep_row] != 0)
    rows = torch.nonzero(keep).flatten().numpy()
    keys = np.stack([chunk_episode.numpy()[rows], batch["chunk_index"].numpy()[rows]], axis=1) \
        if rows.size else np.zeros((0, 2), np.int64)
    stats = {
        "episodes": float(complete.sum()), "successes": float(
            batch["episode_success"][complete].float().sum()),
        "return_sum": float(batch["episode_return"][complete].float().sum()),
        "groups": float(len(finished_groups)),
        "silent_groups": float(len(finished_groups) - len(disagreed)),
        "chunks_with_signal": float(rows.size),
    }
    weights = chunk_weights(chunk_episode[rows], aggregate, dp)
    scale = 1.0 if loss_norm == "signal" else collected_share(
        chunk_episode[rows], chunk_episode[complete[chunk_ep_row]], aggregate, dp)
    return Signal(rows, keys.astype(np.int64), adv_ep[chunk_ep_row][rows], weights,
                  batch["chunk_log_prob"][rows], stats, disagreed, scale)


def collected_share(signal: torch.Tensor, collected: torch.Tensor, aggregate: str,
                    dp: DataParallel | None = None) -> float:
    """The share of the collected units that carry a signal, over every rank: episodes under
    ``aggregate="episode"``, chunks under ``"chunk"``. ``signal`` and ``collected`` are the
    run-wide episode ids of the chunks with an advantage and of every chunk of a complete
    group. The loss over the signal's chunks times this share is the mean over everything
    collected: an iteration whose groups mostly agreed takes a proportionally smaller step.

    >>> collected_share(torch.tensor([3, 3, 4]), torch.tensor([1, 2, 2, 3, 3, 4]), "episode")
    0.5
    >>> collected_share(torch.tensor([3, 3, 4]), torch.tensor([1, 2, 2, 3, 3, 4]), "chunk")
    0.5
    >>> collected_share(torch.tensor([], dtype=torch.long), torch.tensor([1]), "episode")
    0.0
    """
    def count(ids: torch.Tensor) -> float:
        return float(ids.numel() if aggregate == "chunk" else torch.unique(ids).numel())

    totals = (dp or DataParallel(0, 1)).all_sum({"signal": count(signal),
                                                 "collected": count(collected)})
    return totals["signal"] / totals["collected"] if totals["collected"] else 0.0


def replay_candidates(curve: list[dict[str, Any]]) -> dict[int, int]:
    """The start states ``--replay-groups`` may rerun, each with the last iteration that ran
    it: those whose latest group disagreed. Read from the curve's records of each iteration's
    groups (``group_starts``: the start state of each, by the group that first ran it;
    ``group_signal``: 1 where its episodes disagreed), so a resumed run, whose curve is
    restored, reruns what the uninterrupted one would.

    >>> replay_candidates([{"iteration": 1, "group_starts": [0, 1], "group_signal": [1, 1]},
    ...                    {"iteration": 2, "group_starts": [1, 3], "group_signal": [0, 1]}])
    {0: 1, 3: 2}
    """
    candidates: dict[int, int] = {}
    for point in curve:
        for start, signal in zip(point.get("group_starts", ()), point.get("group_signal", ()),
                                 strict=True):
            if signal:
                candidates[int(start)] = int(point["iteration"])
            else:
                candidates.pop(int(start), None)
    return candidates


def iteration_starts(ids: list[int], replay_groups: int, curve: list[dict[str, Any]]
                     ) -> list[int]:
    """The start state of each of an iteration's groups ``ids``: the first ``replay_groups``
    rerun the :func:`replay_candidates` least recently run (the lower start first in a tie),
    as many as there are; every other group starts at its own start state.

    >>> curve = [{"iteration": 1, "group_starts": [0, 1], "group_signal": [1, 1]},
    ...          {"iteration": 2, "group_starts": [1, 3], "group_signal": [1, 0]}]
    >>> iteration_starts([4, 5], 1, curve), iteration_starts([4, 5, 6], 2, curve)
    ([0, 5], [0, 1, 6])
    >>> iteration_starts([4, 5], 0, curve), iteration_starts([4, 5], 1, [])
    ([4, 5], [4, 5])
    """
    candidates = replay_candidates(curve) if replay_groups else {}
    again = sorted(candidates, key=lambda s: (candidates[s], s))[:replay_groups]
    return again + list(ids[len(again):])


def chunk_weights(episodes: torch.Tensor, aggregate: str, dp: DataParallel | None = None
                  ) -> torch.Tensor:
    """Each chunk's weight in the loss, from the episode each belongs to (run-wide ids).
    ``chunk``: 1 each, so an episode weighs as many chunks as it ran. ``episode``: an episode's
    chunks share one weight, equal for every episode (GRPO's mean over a sequence's tokens, then
    over sequences), scaled so the weights still average 1 over every rank's chunks: a failure
    that runs to the time limit no longer outweighs a success that ended early.

    >>> [round(w, 4) for w in chunk_weights(torch.tensor([7, 7, 7, 9]), "episode").tolist()]
    [0.6667, 0.6667, 0.6667, 2.0]
    >>> chunk_weights(torch.tensor([7, 7, 7, 9]), "chunk").tolist()
    [1.0, 1.0, 1.0, 1.0]
    """
    if aggregate == "chunk" or episodes.numel() == 0:
        return torch.ones(episodes.numel())
    ids, index, counts = torch.unique(episodes, return_inverse=True, return_counts=True)
    totals = (dp or DataParallel(0, 1)).all_sum(
        {"chunks": float(episodes.numel()), "episodes": float(ids.numel())})
    return (totals["chunks"] / totals["episodes"]) / counts[index].float()


def minibatches(order: np.ndarray, cfg: GRPOConfig) -> list[np.ndarray]:
    """One pass's minibatches of an iteration's shuffled chunks: ``--minibatches`` parts whose
    sizes differ by one at most (fewer when there are fewer chunks), else parts of
    ``--minibatch`` chunks, the last one shorter."""
    if cfg.minibatches is not None:
        return np.array_split(order, min(cfg.minibatches, len(order)))
    size = cfg.minibatch_size(len(order))
    return [order[start : start + size] for start in range(0, len(order), size)]


def update(learner: Learner, batch: dict[str, Any], signal: Signal, iteration: int,
           cfg: GRPOConfig, dp: DataParallel) -> dict[str, float]:
    """One GRPO update from a collected batch (this rank's share); the iteration's statistics
    summed over the ranks where they add up."""
    from cosmos3_gym.pipeline import chunk_log_prob
    from cosmos3_gym.runner import stochastic_record

    keys, owners = dp.all_keys(signal.keys)
    total = len(keys)
    local_pos = {tuple(k): i for i, k in enumerate(signal.keys.tolist())}
    sums = {"loss": 0.0, "clipped": 0.0, "approx_kl": 0.0, "kl_ref": 0.0, "scored": 0.0,
            "steps": 0.0, "grad_norm": 0.0, "kl_stop": 0.0}
    if total == 0:
        return sums
    generator = torch.Generator().manual_seed(iteration_seed(cfg.seed, iteration, 0))
    microbatch = cfg.microbatch or cfg.minibatch_size(total)
    prompts = batch["chunk_prompts"]
    params = learner.masters.params

    per_step = cfg.ratio == "step"

    def score(idx: np.ndarray, steps: bool = per_step) -> torch.Tensor:
        """[n] chunk log-probabilities, or with ``steps`` [n, K], one per stochastic step."""
        rows = signal.rows[idx]
        return chunk_log_prob(learner.pipe, stochastic_record(batch, rows),
                              [prompts[r] for r in rows], model=learner.model, per_step=steps)

    def score_all(steps: bool) -> torch.Tensor:
        """Every signal chunk of this rank, without gradients, a microbatch at a time."""
        n = len(signal.rows)
        with torch.no_grad():
            return torch.cat([score(np.arange(m, min(m + microbatch, n)), steps)
                              for m in range(0, n, microbatch)]) if n else torch.zeros(0)

    ref = None
    if cfg.kl_coef > 0:  # the reference does not move: scored once per iteration, per chunk
        with learner.reference():
            ref = score_all(steps=False)
    # The record keeps each chunk's log-probability, not its steps': --ratio step scores the
    # steps once under the weights that sampled them (an update has not moved them yet).
    old_all = score_all(steps=True) if per_step else signal.old_log_prob
    for _ in range(cfg.epochs):
        order = torch.randperm(total, generator=generator).numpy()
        for part in minibatches(order, cfg):
            size = len(part)
            mine = [local_pos[tuple(keys[j].tolist())] for j in part if owners[j] == dp.rank]
            learner.masters.zero_grad()
            part_sums = {"loss": 0.0, "clipped": 0.0, "approx_kl": 0.0, "kl_ref": 0.0,
                         "scored": 0.0}
            for m in range(0, len(mine), microbatch):
                idx = np.asarray(mine[m : m + microbatch], np.int64)
                new = score(idx)  # [n], or [n, K] under --ratio step
                old, adv = old_all[idx], signal.advantages[idx]
                weight = signal.weights[idx]
                log_ratio = (new - old).clamp(-20.0, 20.0)
                ratio = torch.exp(log_ratio)
                objective = surrogate(ratio, adv, cfg.clip, cfg.dual_clip)
                if ref is not None:
                    # k3: exp(ref − new) − (ref − new) − 1 >= 0, unbiased under the new policy.
                    d = (ref[idx] - (new.sum(1) if per_step else new)).clamp(-20.0, 20.0)
                    kl = torch.exp(d) - d - 1
                    objective = objective - cfg.kl_coef * kl
                    part_sums["kl_ref"] += float(kl.detach().sum())
                loss = -(weight * objective).sum() / size * signal.loss_scale
                loss.backward()
                with torch.no_grad():
                    part_sums["loss"] += float(loss.detach())
                    # Per chunk: the share of its ratios clipped; k3 of the sampling policy
                    # against the current one (PPO's diagnostic), summed over a chunk's steps.
                    clipped = ((ratio - 1).abs() > cfg.clip).float()
                    part_sums["clipped"] += float(clipped.mean(1).sum() if per_step
                                                  else clipped.sum())
                    part_sums["approx_kl"] += float((torch.exp(-log_ratio) + log_ratio - 1).sum())
                    part_sums["scored"] += len(idx)
            if cfg.target_kl is not None:
                seen = dp.all_sum({"kl": part_sums["approx_kl"], "n": part_sums["scored"]})
                if seen["kl"] > cfg.target_kl * seen["n"]:
                    # The policy has left the trust region: this minibatch's step is not taken.
                    learner.masters.zero_grad()
                    sums["kl_stop"] = 1.0 / dp.world_size
                    for k in ("approx_kl", "clipped", "scored"):
                        sums[k] += part_sums[k]
                    return sums
            for k, v in part_sums.items():
                sums[k] += v
            dp.reduce_gradients(params)
            norm = learner.step()
            # Every rank counts each step once (the sums are added over the ranks).
            sums["steps"] += 1.0 / dp.world_size
            sums["grad_norm"] += norm / dp.world_size
    return sums


# ---------------------------------------------------------------------- the learner


class Learner:
    """The pipeline, what trains, its fp32 masters and the optimiser."""

    def __init__(self, pipe: Any, cfg: GRPOConfig) -> None:
        from cosmos3_gym.train.trainable import MasterWeights, make_trainable

        self.pipe, self.cfg = pipe, cfg
        self.model = pipe.transformer
        # LoRA's initialisation is the run's first random draw: the same on every rank.
        torch.manual_seed(cfg.seed)
        self.trainable = make_trainable(self.model, cfg.train, lora_rank=cfg.lora_rank,
                                        lora_alpha=cfg.lora_alpha)
        self.model.train()
        self.model.gradient_checkpointing = cfg.gradient_checkpointing
        self.masters = MasterWeights(self.trainable.named_parameters())
        self.optimizer = torch.optim.AdamW(self.masters.masters, lr=cfg.lr, weight_decay=0.0)
        self.frozen = self.trainable.frozen_copy() if cfg.kl_coef > 0 else None
        self.average: list[torch.Tensor] | None = None
        self.reset_average()
        # --keep best or --rollback: the measured weights of the best held-out measurement so
        # far, in host memory, with that measurement's iteration and success.
        self.kept: dict[str, Any] | None = None

    def reset_average(self) -> None:
        """``--ema``: the average starts at the trained weights as they are (fp32)."""
        self.average = None if self.cfg.ema is None else [
            m.detach().clone() for m in self.masters.masters]

    def update_average(self) -> None:
        """After an iteration: the average moves by ``1 - ema`` towards the trained weights."""
        if self.average is None:
            return
        with torch.no_grad():
            for a, m in zip(self.average, self.masters.masters, strict=True):
                a.lerp_(m.detach(), 1.0 - self.cfg.ema)

    @contextlib.contextmanager
    def averaged(self) -> Any:
        """The model acts with the averaged weights for the duration (``--ema``; without it,
        with the trained weights as they are); the trained weights come back after."""
        if self.average is None:
            yield
            return
        params = self.masters.params
        kept = [p.detach().clone() for p in params]
        with torch.no_grad():
            for p, a in zip(params, self.average, strict=True):
                p.copy_(a)
        try:
            yield
        finally:
            with torch.no_grad():
                for p, k in zip(params, kept, strict=True):
                    p.copy_(k)

    def settle(self) -> None:
        """After the last iteration: the run's result becomes the trained weights, the kept
        ones under ``--keep best`` (which are the average's under ``--ema``), else the average
        under ``--ema``; the average is dropped (the weights measured from now on are these)."""
        best = self.cfg.keep == "best" and self.kept is not None
        result = self.kept["weights"] if best else self.average
        if result is not None:
            self.masters.load_state_dict(dict(zip(self.masters.names, result, strict=True)))
        self.average = None

    def consider_keeping(self, iteration: int, success: float) -> bool:
        """``--keep best`` or ``--rollback``: keep the weights just measured (the average under
        ``--ema``) when their held-out ``success`` beats every earlier measurement's (the
        earliest wins a tie: the fewer updates). Every rank must pass the same ``success``.
        True when kept."""
        if not self.keeps_best() or (self.kept is not None
                                     and success <= self.kept["success"]):
            return False
        measured = self.average if self.average is not None else self.masters.masters
        self.kept = {"iteration": int(iteration), "success": float(success),
                     "weights": [w.detach().to("cpu", torch.float32, copy=True)
                                 for w in measured]}
        return True

    def keeps_best(self) -> bool:
        """Whether the run holds the best measurement's weights: its result (``--keep best``)
        or where ``--rollback`` goes back to."""
        return self.cfg.keep == "best" or self.cfg.rollback is not None

    def roll_back(self) -> None:
        """``--rollback``: training goes on from the kept weights (the trained weights and,
        under ``--ema``, the average become them) with a fresh optimiser: AdamW's moments
        pointed where the run drifted, and its step count restarts the warmup."""
        self.masters.load_state_dict(dict(zip(self.masters.names, self.kept["weights"],
                                              strict=True)))
        self.optimizer.state.clear()
        self.reset_average()

    def learning_rate(self) -> float:
        """``lr`` for the next step: a linear warmup over the first ``lr_warmup`` steps, then
        constant, or halving every ``lr_half_life`` steps after the warmup."""
        done, cfg = self.steps_taken(), self.cfg
        if cfg.lr_warmup > 0 and done < cfg.lr_warmup:
            return cfg.lr * (done + 1) / cfg.lr_warmup
        if cfg.lr_half_life is not None:
            return cfg.lr * 0.5 ** ((done - cfg.lr_warmup) / cfg.lr_half_life)
        return cfg.lr

    def steps_taken(self) -> int:
        """Optimiser steps taken so far in the run (AdamW's own count, saved with its state)."""
        state = self.optimizer.state.get(self.masters.masters[0], {})
        return int(state["step"]) if "step" in state else 0

    def step(self) -> float:
        """One optimiser step on the gradients the microbatches left (clipped to norm
        ``max_grad_norm``); returns their norm before the clip."""
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate()
        self.masters.grads_to_master()
        norm = torch.nn.utils.clip_grad_norm_(self.masters.masters, self.cfg.max_grad_norm)
        self.optimizer.step()
        self.masters.master_to_model()
        self.masters.zero_grad()
        return float(norm)

    def reference(self) -> contextlib.AbstractContextManager:
        return self.trainable.reference(self.frozen)

    # -------------------------------------------------------------- state

    def state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """``(trained masters by name, the rest)``: optimiser state and RNG states."""
        rng: dict[str, Any] = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available() and self.model.device.type == "cuda":
            rng["cuda"] = torch.cuda.get_rng_state(self.model.device)
        rest: dict[str, Any] = {"optimizer": self.optimizer.state_dict(), "rng": rng}
        if self.average is not None:
            rest["average"] = {n: a.detach().contiguous().cpu()
                               for n, a in zip(self.masters.names, self.average, strict=True)}
        if self.kept is not None:
            rest["kept"] = {"iteration": self.kept["iteration"],
                            "success": self.kept["success"],
                            "weights": dict(zip(self.masters.names, self.kept["weights"],
                                                strict=True))}
        return self.masters.state_dict(), rest

    def restore(self, masters: dict[str, torch.Tensor], rest: dict[str, Any]) -> None:
        self.masters.load_state_dict(masters)
        self.optimizer.load_state_dict(rest["optimizer"])
        if self.average is not None:
            saved = rest["average"]  # a KeyError names what the state lacks
            self.average = [saved[n].to(m.device, torch.float32).clone()
                            for n, m in zip(self.masters.names, self.masters.masters,
                                            strict=True)]
        if self.keeps_best():
            kept = rest["kept"]  # every state of such a run has one (iteration 0's on)
            self.kept = {"iteration": int(kept["iteration"]), "success": float(kept["success"]),
                         "weights": [kept["weights"][n].to(torch.float32).clone()
                                     for n in self.masters.names]}
        torch.set_rng_state(rest["rng"]["torch"])
        if "cuda" in rest["rng"] and self.model.device.type == "cuda":
            torch.cuda.set_rng_state(rest["rng"]["cuda"], self.model.device)


# ---------------------------------------------------------------------- measure


def eval_config(cfg: GRPOConfig, test: bool = False, **changes: Any) -> Any:
    """The held-out evaluation's settings: the run's model and env, ``eval_trials`` per task
    under ``eval_seed`` (``test``: under ``test_seed``, the episodes ``--keep best`` measures
    its result on), the deterministic sampler at the run's step count."""
    from cosmos3_gym.eval.evaluate import EvalConfig
    from cosmos3_gym.pipeline.sampling import SamplerConfig

    model = {"synthetic": cfg.synthetic} if cfg.synthetic is not None else {
        "checkpoint": cfg.checkpoint, "domain": cfg.domain, "recipe": cfg.recipe,
        "action_stats": cfg.action_stats}
    env = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(EnvSettings)}
    return EvalConfig(**model, **env, trials=cfg.eval_trials,
                      seed=cfg.test_seed if test else cfg.eval_seed,
                      n_action_steps=cfg.n_action_steps, device=cfg.device,
                      precision=cfg.precision, progress=False,
                      sampling=SamplerConfig(num_inference_steps=cfg.num_inference_steps),
                      **changes)


def held_out(learner: Learner, run: Any, iteration: int, test: bool = False
             ) -> dict[str, Any] | None:
    """Success on the held-out episodes as ``cosmos3-gym eval`` records them, into
    ``evals/iter-{iteration:06d}/`` (resumable); rank 0 gets the summary. The evaluation is
    derived from the GRPO run (:meth:`~cosmos3_gym.eval.run.Run.derive`): the same env and the
    same adapter as the training episodes, the weights as they are now (their average under
    ``--ema``). ``test``: the same on the test episodes (``--test-seed``), into
    ``evals/test-iter-{iteration:06d}/``, the keys ``test_*``; ``iteration`` is then the one
    whose weights these are (``--keep best``: the start, and the kept weights)."""
    from cosmos3_gym.eval.evaluate import Evaluator

    name = f"{TEST_PREFIX if test else ''}iter-{iteration:06d}"
    was = learner.model.training
    learner.model.eval()
    try:
        with learner.averaged():
            results = Evaluator(run.derive("evaluation", eval_config(run.settings, test),
                                           run.out / EVALS / name,
                                           pipeline=learner.pipe)).run()
    finally:
        learner.model.train(was)
    if results is None:
        return None
    low, high = results["interval"]
    key = "test" if test else "held_out"
    return {f"{key}_success": results["success_rate"], f"{key}_successes":
            results["successes"], f"{key}_episodes": results["episodes"],
            f"{key}_interval": [low, high]}


def measure(learner: Learner, run: Any, iteration: int, dp: DataParallel) -> dict[str, Any]:
    """An iteration's held-out measurement (``{}`` on ranks other than 0), and under ``--keep
    best`` the weights kept when it is the best so far; at iteration 0 (the start) also their
    measurement on the test episodes, the start ``--keep best``'s result is compared with.
    Under ``--rollback`` a measurement that far below the best puts the kept weights back."""
    point = held_out(learner, run, iteration) or {}
    # Every rank keeps the same weights: rank 0's measurement decides.
    success = dp.all_sum({"s": point.get("held_out_success", 0.0)})["s"]
    learner.consider_keeping(iteration, success)
    rollback = run.settings.rollback
    if rollback is not None and success < learner.kept["success"] - rollback:
        learner.roll_back()
        point["rolled_back_to"] = learner.kept["iteration"]
    if iteration == 0 and run.settings.keep == "best":
        point.update(held_out(learner, run, 0, test=True) or {})
    return point


# ---------------------------------------------------------------------- the run


def run_grpo(cfg: GRPOConfig, progress: bool = True, run: Any = None
             ) -> dict[str, Any] | None:
    """Run (or resume) ``cfg`` into ``cfg.out``; rank 0 returns the run's summary (the curve,
    before and after) and prints the command that evaluates the result. ``run``: the run
    :meth:`~cosmos3_gym.train.config.GRPOConfig.preflight` resolved (resolved here if not
    given)."""
    from cosmos3_gym.eval.distributed import destroy_process_group, init_process_group

    run = run if run is not None else cfg.preflight()
    cfg, rank, device = run.settings, run.rank, run.runtime.device
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    budget = episode_steps(run.env)
    with run.folder() as folder:
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        owns_group = init_process_group(rank, backend)
        try:
            return _run(run, progress, budget, folder)
        finally:
            if owns_group:
                destroy_process_group(rank)


def _run(run: Any, progress: bool, budget: int, folder: Any) -> dict[str, Any] | None:
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.progress import progress_bar
    from cosmos3_gym.runner import GroupEpisodes, collect_on_policy
    from cosmos3_gym.train.memory import run_estimate

    cfg, rank, eval_env, out = run.settings, run.rank, run.env, run.out
    device = run.runtime.device
    start = time.perf_counter()
    dp = DataParallel(rank.rank, rank.world_size)
    learner, adapter, first, curve = _start(run, folder, dp)
    groups_local = len(dp.groups_of(list(range(cfg.groups))))
    envs = eval_env.make(groups_local * cfg.group_size, cfg.async_envs)
    estimate = run_estimate(learner, cfg, eval_env, envs, adapter, device,
                            groups_local * cfg.group_size, most_chunks(cfg, budget))
    if rank.is_main:
        print(f"training {cfg.train}: {learner.trainable.count:,} of "
              f"{sum(p.numel() for p in learner.model.parameters()):,} parameters; memory "
              f"estimate per device: {estimate.table()}", flush=True)
    sampling, seed_rule = training_noise(cfg)
    bar = progress_bar(enabled=progress and rank.is_main, total=cfg.iterations,
                       initial=first - 1, desc="grpo", unit="it")
    try:
        if not curve:
            curve.append({"iteration": 0, "wall_s": 0.0, **measure(learner, run, 0, dp)})
            if rank.is_main:
                grpo_report.report_held_out(curve[-1])
                grpo_report.write_curve(out, cfg, curve)
        for it in range(first, cfg.iterations + 1):
            t0 = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            # 1. Collect: this rank's share of the iteration's groups, numbered run-wide.
            ids = list(range((it - 1) * cfg.groups, it * cfg.groups))
            starts = iteration_starts(ids, cfg.replay_groups, curve)
            schedule = GroupEpisodes(eval_env, cfg.seed, dp.groups_of(ids), cfg.group_size,
                                     starts=dp.groups_of(starts))
            policy = VectorPolicy(learner.pipe, adapter=adapter,
                                  n_action_steps=cfg.n_action_steps, sampling=sampling,
                                  seed_rule=seed_rule)
            batch = collect_on_policy(policy, envs, budget, eval_env=eval_env,
                                      schedule=schedule, env_timeout=cfg.env_timeout)
            # 2. Advantages.
            signal = batch_signal(batch, cfg.group_size, cfg.reward, cfg.advantages, dp,
                                  cfg.aggregate, cfg.return_weight, cfg.negatives,
                                  cfg.loss_norm)
            t1 = time.perf_counter()
            # 3. Update.
            lr = learner.learning_rate()
            sums = update(learner, batch, signal, it, cfg, dp)
            learner.update_average()
            t2 = time.perf_counter()
            point = grpo_report.curve_point(it, dp.all_sum(signal.stats), dp.all_sum(sums),
                                            t1 - t0, t2 - t1, device, lr)
            # Each group's start state and whether it disagreed, over every rank's groups:
            # what --replay-groups reruns (iteration_starts reads it back from the curve).
            disagreed = dp.all_sum({str(g): float(g in signal.disagreed) for g in ids})
            point["group_starts"] = starts
            point["group_signal"] = [int(disagreed[str(g)]) for g in ids]
            # 4. Measure.
            over = bool(cfg.time_budget_s) and dp.any(
                time.perf_counter() - start > cfg.time_budget_s)
            if it % cfg.eval_every == 0 or it == cfg.iterations or over:
                t3 = time.perf_counter()
                point.update(measure(learner, run, it, dp))
                point["eval_s"] = round(time.perf_counter() - t3, 2)
            point["wall_s"] = round(time.perf_counter() - start, 1)
            curve.append(point)
            if rank.is_main:
                if it % cfg.save_every == 0 or "eval_s" in point:
                    grpo_state.save_state(out, it, *learner.state(), curve)
                grpo_report.write_curve(out, cfg, curve)
                grpo_report.report_held_out(point)
                bar.set_postfix(grpo_report.postfix(point), refresh=False)
                bar.update(1)
            if over:
                break
    finally:
        bar.close()
        envs.close()
    # The result: the kept weights (--keep best), else the average (--ema), else the trained
    # weights; --keep best measures it on the test episodes, beside the start's measurement.
    learner.settle()
    kept = None
    if cfg.keep == "best":
        kept = {"iteration": learner.kept["iteration"], "held_out_success":
                learner.kept["success"],
                **(held_out(learner, run, learner.kept["iteration"], test=True) or {})}
    if not rank.is_main:
        return None
    return _finish(cfg, learner, curve, out, time.perf_counter() - start, kept)


def _start(run: Any, folder: Any, dp: DataParallel
           ) -> tuple[Learner, Any, int, list[dict[str, Any]]]:
    """Bind the folder, build the learner, and restore the newest saved state if there is one:
    ``(learner, adapter, first iteration to run, curve so far)``. The pipeline trained and the
    adapter of every episode (training and held-out) are the run's: one way for both."""
    from cosmos3_gym.devices import dtype_name

    cfg, rank, out = run.settings, run.rank, run.out
    if rank.is_main:  # what a killed run was writing (the folder is ours: we hold its lock)
        grpo_state.remove_partial_writes(out)
    states = grpo_state.state_dirs(out)
    evals = out / EVALS
    recorded = bool(states) or (evals.is_dir() and any(evals.iterdir()))
    restart = grpo_state.restart_note(out)
    identity = {**cfg.identity(), "dtype": dtype_name(run.runtime.dtype)}
    if run.model.revision is not None:
        identity["checkpoint_revision"] = run.model.revision
    weights = run.model.fingerprint()  # the starting checkpoint's
    if weights is not None:
        identity["weights"] = weights
    folder.bind(IDENTITY_FILE, identity, bound=recorded, extra={"session": asdict(cfg)},
                what="a different GRPO run",
                upgrade=lambda stored: _upgrade_identity(stored, identity))
    saved = grpo_state.load_state(states[-1]) if states else None  # checked before the load
    pipe, adapter = run.load(trainable=True), run.adapter
    learner = Learner(pipe, cfg)
    dp.broadcast_parameters(learner.masters.params)
    learner.masters.sync_from_model()
    learner.reset_average()
    if saved is None:
        if restart is not None and rank.is_main:
            print(restart, flush=True)
        return learner, adapter, 1, []
    iteration, curve, masters, rest = saved
    try:
        learner.restore(masters, rest)
    except (KeyError, ValueError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0]
        raise grpo_state.damaged(states[-1], grpo_state.TRAINED,
                                 f"does not fit this run's model ({first})") from None
    if rank.is_main:
        grpo_state.drop_later_evals(out, iteration)
        print(f"resuming {out} after iteration {iteration} ({states[-1].name})", flush=True)
    return learner, adapter, iteration + 1, curve


def _finish(cfg: GRPOConfig, learner: Learner, curve: list[dict[str, Any]], out: Path,
            wall: float, kept: dict[str, Any] | None) -> dict[str, Any]:
    done = grpo_report.summary(cfg, curve, wall, kept)
    if cfg.synthetic is None:
        adapter = grpo_state.write_adapter(learner.trainable, out / grpo_state.ADAPTER)
        checkpoint = grpo_state.write_checkpoint(learner.pipe, learner.trainable.merged(),
                                                 out / grpo_state.CHECKPOINT)
        done["checkpoint"] = str(checkpoint)
        done["adapter"] = None if adapter is None else str(adapter)
        done["eval_command"] = grpo_report.eval_command(cfg, checkpoint)
    grpo_report.write_curve(out, cfg, curve, done)
    grpo_report.print_summary(cfg, done)
    return {"curve": curve, **done}


# Settings added since the first GRPO folders, as those runs had them.
_ADDED_SETTINGS = {"lr_warmup": 0, "target_kl": None, "advantages": "group", "aggregate": "chunk",
                   "dual_clip": None, "lr_half_life": None, "sde_steps": "random",
                   "ratio": "chunk", "ema": None, "keep": "last", "test_seed": 2_000_000,
                   "replay_groups": 0, "minibatches": None, "group_noise": "episode",
                   "return_weight": DEFAULT_RETURN_WEIGHT, "negatives": "keep",
                   "rollback": None, "loss_norm": "signal", "max_grad_norm": 1.0}


# ---------------------------------------------------------------------- set-up


def training_noise(cfg: GRPOConfig) -> tuple[Any, Any]:
    """How ``cfg``'s training episodes draw their noise: the sampler settings
    (:class:`~cosmos3_gym.pipeline.sampling.SamplerConfig`) and the seed rule, each episode's
    own noise or, under ``--group-noise shared``, its group's but for the scored draws
    (:func:`~cosmos3_gym.runner.group_seed_rule`)."""
    from cosmos3_gym.pipeline.sampling import SamplerConfig
    from cosmos3_gym.runner import group_seed_rule

    sampling = SamplerConfig(sampler=cfg.sampler, noise_level=cfg.noise_level,
                             sde_steps=cfg.sde_steps, num_inference_steps=cfg.num_inference_steps,
                             noise="per_chunk")
    shared_by = cfg.group_size if cfg.group_noise == "shared" else None
    return sampling, group_seed_rule(cfg.seed, shared_by=shared_by)


def episode_steps(eval_env: Any) -> int:
    """The longest episode the family allows: one iteration's step budget."""
    budget = eval_env.episode_budget()
    if budget is not None:
        return int(max(budget["max_episode_steps"].values()))
    steps = getattr(eval_env, "max_episode_steps", None)
    if steps is None:
        raise ValueError(f"{type(eval_env).__name__} states no episode budget; give "
                         "--max-episode-steps")
    return int(steps)


def most_chunks(cfg: GRPOConfig, budget: int) -> int:
    """An iteration's most chunks: every episode of every group runs the whole budget."""
    return cfg.groups * cfg.group_size * -(-budget // cfg.n_action_steps)


def _upgrade_identity(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """A stored ``grpo.json`` identity in today's terms: a setting added since ran without it
    (``_ADDED_SETTINGS``), a ``--synthetic`` run's checkpoint is unset
    (:func:`~cosmos3_gym.settings.stored_model_source`), and a folder written before the
    starting weights' fingerprint was recorded is taken as this run's."""
    out = {**_ADDED_SETTINGS, **stored_model_source(dict(stored))}
    if "weights" not in out and "weights" in current:
        out["weights"] = current["weights"]
    return out
