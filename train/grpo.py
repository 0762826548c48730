"""``cosmos3-gym rl grpo``: GRPO fine-tuning of a Cosmos3 policy on any env family.

One iteration: every group of ``group_size`` episodes starts from one state (the family's task
and trial: a LIBERO init state, a gym seed) and is rolled with a stochastic sampler
(:func:`~cosmos3_gym.runner.collect_on_policy` over
:class:`~cosmos3_gym.runner.GroupEpisodes`); each episode's reward (its success, or its return)
minus its group's mean, over the group's standard deviation, is the advantage of every chunk it
executed; PPO's clipped surrogate on :func:`~cosmos3_gym.pipeline.chunk_log_prob`, optionally
with a KL term to the base policy, updates what ``--train`` names (every weight, LoRA adapters
or named modules: :mod:`~cosmos3_gym.train.trainable`). Held-out success is an evaluation
(:class:`~cosmos3_gym.eval.evaluate.Evaluator`, the family's own episodes, their records and
Wilson intervals) of the deterministic sampler, before, every ``eval_every`` iterations and at
the end.

The output folder is a run folder (:class:`~cosmos3_gym.runner.RunFolder`: one run, locked,
its identity written first); the run's state (trained parameters' fp32 masters, the optimiser,
RNG states, the curve) is saved every ``save_every`` iterations and at each measurement, each
state written whole before the older one goes, and a rerun of the same command resumes from the
newest. Every random draw of an iteration (its episodes, their noise, the minibatch order)
derives from the run's seed and the iteration, so a resumed run repeats the uninterrupted one.

Under ``torchrun`` rank ``r`` of ``w`` collects groups ``r, r + w, ...`` of each iteration;
chunks keep a run-wide order, every rank takes the same minibatches of it, scores its own
chunks, and the gradients (sums over the minibatch, divided by its size) are all-reduced
before each step, so ``w`` ranks make the update one process makes, to float rounding.

Docs: docs/rl.md, "GRPO" (one command per benchmark, memory, resume, evaluating the result).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import shlex
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos3_gym.settings import EnvSettings, stored_model_source
from cosmos3_gym.train.config import (  # noqa: F401  (GRPOConfig's home; re-exported here)
    CURVE_FILE,
    EVALS,
    IDENTITY_FILE,
    REWARDS,
    RUN_ONLY,
    STATE_PREFIX,
    GRPOConfig,
)

# ---------------------------------------------------------------------- advantages


def group_advantages(returns: torch.Tensor, groups: torch.Tensor) -> torch.Tensor:
    """``(R − mean_group) / (std_group + 1e-6)`` per episode; 0 in groups of equal returns.

    >>> adv = group_advantages(torch.tensor([1., 0., 1., 1.]), torch.tensor([0, 0, 1, 1]))
    >>> [round(a, 4) for a in adv.tolist()]
    [1.0, -1.0, 0.0, 0.0]
    """
    adv = torch.zeros_like(returns)
    for g in torch.unique(groups):
        members = groups == g
        r = returns[members]
        adv[members] = (r - r.mean()) / (r.std(unbiased=False) + 1e-6)
    return adv


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
    old_log_prob: torch.Tensor  # [N]
    stats: dict[str, float]


def batch_signal(batch: dict[str, Any], group_size: int, reward: str) -> Signal:
    """Group-relative advantages of the complete groups (every member finished) of a batch, and
    the chunks that carry a non-zero one."""
    finished = batch["episode_finished"]
    groups = batch["episode_group"]
    returns = (batch["episode_success"].float() if reward == "success"
               else batch["episode_return"].float())
    complete = torch.zeros_like(finished)
    for g in torch.unique(groups):
        members = groups == g
        if finished[members].all() and int(members.sum()) == group_size:
            complete |= members
    adv_ep = torch.zeros_like(returns)
    if complete.any():
        adv_ep[complete] = group_advantages(returns[complete], groups[complete])
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
        "groups": float(torch.unique(groups[complete]).numel()),
        "silent_groups": float(sum(1 for g in torch.unique(groups[complete])
                                   if (adv_ep[groups == g] == 0).all())),
        "chunks_with_signal": float(rows.size),
    }
    return Signal(rows, keys.astype(np.int64), adv_ep[chunk_ep_row][rows],
                  batch["chunk_log_prob"][rows], stats)


# ---------------------------------------------------------------------- data parallel


class DataParallel:
    """The ranks of a launch, as the update sees them (one process: no communication)."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size

    @property
    def active(self) -> bool:
        return self.world_size > 1

    def groups_of(self, groups: list[int]) -> list[int]:
        """This rank's share of an iteration's groups."""
        return groups[self.rank :: self.world_size]

    def all_sum(self, values: dict[str, float]) -> dict[str, float]:
        if not self.active:
            return dict(values)
        import torch.distributed as dist

        keys = sorted(values)
        t = torch.tensor([values[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(t)
        return dict(zip(keys, t.tolist(), strict=True))

    def all_keys(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Every rank's chunk keys, sorted run-wide, and which rank holds each."""
        if not self.active:
            order = np.lexsort((keys[:, 1], keys[:, 0]))
            return keys[order], np.zeros(len(keys), np.int64)
        import torch.distributed as dist

        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, keys)
        owners = np.concatenate([np.full(len(k), r, np.int64) for r, k in enumerate(gathered)])
        stacked = np.concatenate(gathered) if gathered else np.zeros((0, 2), np.int64)
        order = np.lexsort((stacked[:, 1], stacked[:, 0]))
        return stacked[order], owners[order]

    def reduce_gradients(self, params: list[torch.nn.Parameter]) -> None:
        """Sum every trained parameter's gradient over the ranks (a rank with no chunk in the
        minibatch contributes zeros)."""
        if not self.active:
            return
        import torch.distributed as dist
        from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        grads = [p.grad for p in params]
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        for g, reduced in zip(grads, _unflatten_dense_tensors(flat, grads), strict=True):
            g.copy_(reduced)

    def broadcast_parameters(self, params: list[torch.nn.Parameter]) -> None:
        """Rank 0's values everywhere (the ranks start from the same weights)."""
        if not self.active:
            return
        import torch.distributed as dist

        with torch.no_grad():
            for p in params:
                dist.broadcast(p.data, 0)

    def any(self, flag: bool) -> bool:
        if not self.active:
            return flag
        import torch.distributed as dist

        t = torch.tensor([1.0 if flag else 0.0])
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())


# ---------------------------------------------------------------------- the update


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
            "steps": 0.0, "grad_norm": 0.0}
    if total == 0:
        return sums
    generator = torch.Generator().manual_seed(iteration_seed(cfg.seed, iteration, 0))
    microbatch = cfg.microbatch or cfg.minibatch
    prompts = batch["chunk_prompts"]
    params = learner.masters.params
    for _ in range(cfg.epochs):
        order = torch.randperm(total, generator=generator).numpy()
        for start in range(0, total, cfg.minibatch):
            part = order[start : start + cfg.minibatch]
            size = len(part)
            mine = [local_pos[tuple(keys[j].tolist())] for j in part if owners[j] == dp.rank]
            learner.masters.zero_grad()
            for m in range(0, len(mine), microbatch):
                idx = np.asarray(mine[m : m + microbatch], np.int64)
                rows = signal.rows[idx]
                record = stochastic_record(batch, rows)
                chunk_prompts = [prompts[r] for r in rows]
                new = chunk_log_prob(learner.pipe, record, chunk_prompts, model=learner.model)
                old, adv = signal.old_log_prob[idx], signal.advantages[idx]
                log_ratio = (new - old).clamp(-20.0, 20.0)
                ratio = torch.exp(log_ratio)
                surrogate = torch.minimum(ratio * adv,
                                          ratio.clamp(1 - cfg.clip, 1 + cfg.clip) * adv)
                objective = surrogate
                if cfg.kl_coef > 0:
                    with torch.no_grad(), learner.reference():
                        ref = chunk_log_prob(learner.pipe, record, chunk_prompts,
                                             model=learner.model)
                    # k3: exp(ref − new) − (ref − new) − 1 >= 0, unbiased under the new policy.
                    d = (ref - new).clamp(-20.0, 20.0)
                    kl = torch.exp(d) - d - 1
                    objective = objective - cfg.kl_coef * kl
                    sums["kl_ref"] += float(kl.detach().sum())
                loss = -objective.sum() / size
                loss.backward()
                with torch.no_grad():
                    sums["loss"] += float(loss.detach())
                    sums["clipped"] += float(((ratio - 1).abs() > cfg.clip).float().sum())
                    # k3 of the sampling policy against the current one (PPO's diagnostic).
                    sums["approx_kl"] += float((torch.exp(-log_ratio) + log_ratio - 1).sum())
                    sums["scored"] += len(idx)
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

    def step(self) -> float:
        """One optimiser step on the gradients the microbatches left (clipped to norm 1);
        returns their norm before the clip."""
        self.masters.grads_to_master()
        norm = torch.nn.utils.clip_grad_norm_(self.masters.masters, 1.0)
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
        return self.masters.state_dict(), {"optimizer": self.optimizer.state_dict(), "rng": rng}

    def restore(self, masters: dict[str, torch.Tensor], rest: dict[str, Any]) -> None:
        self.masters.load_state_dict(masters)
        self.optimizer.load_state_dict(rest["optimizer"])
        torch.set_rng_state(rest["rng"]["torch"])
        if "cuda" in rest["rng"] and self.model.device.type == "cuda":
            torch.cuda.set_rng_state(rest["rng"]["cuda"], self.model.device)


# ---------------------------------------------------------------------- the run folder


def state_dirs(out: Path) -> list[Path]:
    """The saved states of a run folder, oldest first (only whole ones: each is renamed into
    place after its last file is written)."""
    found = [p for p in out.glob(f"{STATE_PREFIX}*") if p.is_dir()
             and p.name[len(STATE_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(STATE_PREFIX):]))


def save_state(out: Path, iteration: int, learner: Learner, curve: list[dict[str, Any]]) -> Path:
    """Write the run's state after ``iteration`` as ``state-{iteration:06d}/`` (a temporary
    folder renamed into place), then remove the older states."""
    import os

    from safetensors.torch import save_file

    from cosmos3_gym.jsonio import write_json_atomic

    masters, rest = learner.state()
    final = out / f"{STATE_PREFIX}{iteration:06d}"
    tmp = out / f".{final.name}.{os.getpid()}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    save_file(masters, tmp / "trained.safetensors")
    torch.save(rest, tmp / "optimizer.pt")
    write_json_atomic(tmp / "state.json", {"iteration": iteration, "curve": curve})
    for f in tmp.iterdir():  # on disk before the rename makes the state count
        with open(f, "rb") as handle:
            os.fsync(handle.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in state_dirs(out):
        if old != final:
            shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(folder: Path) -> tuple[int, list[dict[str, Any]], dict[str, torch.Tensor],
                                      dict[str, Any]]:
    from safetensors.torch import load_file

    from cosmos3_gym.jsonio import read_json_object

    meta = read_json_object(folder / "state.json", what="GRPO state")
    masters = load_file(folder / "trained.safetensors")
    # weights_only: tensors and plain containers, never code.
    rest = torch.load(folder / "optimizer.pt", weights_only=True)
    return int(meta["iteration"]), list(meta["curve"]), masters, rest


# ---------------------------------------------------------------------- held-out success


def eval_config(cfg: GRPOConfig, **changes: Any) -> Any:
    """The held-out evaluation's settings: the run's model and env, ``eval_trials`` per task
    under ``eval_seed``, the deterministic sampler at the run's step count."""
    from cosmos3_gym.eval.evaluate import EvalConfig
    from cosmos3_gym.pipeline.sampling import SamplerConfig

    model = {"synthetic": cfg.synthetic} if cfg.synthetic is not None else {
        "checkpoint": cfg.checkpoint, "domain": cfg.domain, "recipe": cfg.recipe,
        "action_stats": cfg.action_stats}
    env = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(EnvSettings)}
    return EvalConfig(**model, **env, trials=cfg.eval_trials, seed=cfg.eval_seed,
                      n_action_steps=cfg.n_action_steps, device=cfg.device,
                      precision=cfg.precision, progress=False,
                      sampling=SamplerConfig(num_inference_steps=cfg.num_inference_steps),
                      **changes)


def held_out(learner: Learner, run: Any, iteration: int) -> dict[str, Any] | None:
    """Success on the held-out episodes as ``cosmos3-gym eval`` records them, into
    ``evals/iter-{iteration:06d}/`` (resumable); rank 0 gets the summary. The evaluation is
    derived from the GRPO run (:meth:`~cosmos3_gym.eval.run.Run.derive`): the same env and the
    same adapter as the training episodes, the weights as they are now."""
    from cosmos3_gym.eval.evaluate import Evaluator

    folder = run.out / EVALS / f"iter-{iteration:06d}"
    was = learner.model.training
    learner.model.eval()
    try:
        results = Evaluator(run.derive("evaluation", eval_config(run.settings), folder,
                                       pipeline=learner.pipe)).run()
    finally:
        learner.model.train(was)
    if results is None:
        return None
    low, high = results["interval"]
    return {"held_out_success": results["success_rate"], "held_out_successes":
            results["successes"], "held_out_episodes": results["episodes"],
            "held_out_interval": [low, high]}


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
    from cosmos3_gym.devices import dtype_name
    from cosmos3_gym.pipeline.sampling import SamplerConfig
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.progress import progress_bar
    from cosmos3_gym.runner import GroupEpisodes, collect_on_policy, group_seed_rule

    cfg, rank, eval_env, out = run.settings, run.rank, run.env, run.out
    device, dtype = run.runtime.device, run.runtime.dtype
    start = time.perf_counter()
    dp = DataParallel(rank.rank, rank.world_size)
    if rank.is_main:  # a state a killed run was writing (the folder is ours: we hold its lock)
        for partial in out.glob(f".{STATE_PREFIX}*.tmp"):
            shutil.rmtree(partial, ignore_errors=True)
    states = state_dirs(out)
    evals = out / EVALS
    recorded = bool(states) or (evals.is_dir() and any(evals.iterdir()))
    identity = {**cfg.identity(), "dtype": dtype_name(dtype)}
    if run.model.revision is not None:
        identity["checkpoint_revision"] = run.model.revision
    weights = run.model.fingerprint()  # the starting checkpoint's
    if weights is not None:
        identity["weights"] = weights
    folder.bind(IDENTITY_FILE, identity, bound=recorded, extra={"session": asdict(cfg)},
                what="a different GRPO run",
                upgrade=lambda stored: _upgrade_identity(stored, identity))
    # The pipeline to train and the adapter of the held-out evaluations: one way for both.
    pipe, adapter = run.load(trainable=True), run.adapter
    learner = Learner(pipe, cfg)
    dp.broadcast_parameters(learner.masters.params)
    learner.masters.sync_from_model()
    first, curve = 1, []
    if states:
        iteration, curve, masters, rest = load_state(states[-1])
        learner.restore(masters, rest)
        first = iteration + 1
        if rank.is_main:
            _drop_later_evals(out, iteration)
            print(f"resuming {out} after iteration {iteration} ({states[-1].name})", flush=True)
    groups_local = len(dp.groups_of(list(range(cfg.groups))))
    envs = eval_env.make(groups_local * cfg.group_size, cfg.async_envs)
    estimate = _check_memory(learner, cfg, eval_env, envs, adapter, device,
                             groups_local * cfg.group_size)
    if rank.is_main:
        print(f"training {cfg.train}: {learner.trainable.count:,} of "
              f"{sum(p.numel() for p in learner.model.parameters()):,} parameters; memory "
              f"estimate per device: {estimate.table()}", flush=True)
    sampling = SamplerConfig(sampler=cfg.sampler, noise_level=cfg.noise_level,
                             num_inference_steps=cfg.num_inference_steps, noise="per_chunk")
    bar = progress_bar(enabled=progress and rank.is_main, total=cfg.iterations,
                       initial=first - 1, desc="grpo", unit="it")
    try:
        if not curve:
            point = {"iteration": 0, "wall_s": 0.0}
            point.update(held_out(learner, run, 0) or {})
            curve.append(point)
            if rank.is_main:
                _report_held_out(point)
                _write_curve(out, cfg, curve)
        for it in range(first, cfg.iterations + 1):
            t0 = time.perf_counter()
            if device.type == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            ids = list(range((it - 1) * cfg.groups, it * cfg.groups))
            schedule = GroupEpisodes(eval_env, cfg.seed, dp.groups_of(ids), cfg.group_size)
            policy = VectorPolicy(pipe, adapter=adapter, n_action_steps=cfg.n_action_steps,
                                  sampling=sampling, seed_rule=group_seed_rule(cfg.seed))
            batch = collect_on_policy(policy, envs, budget, eval_env=eval_env,
                                      schedule=schedule, env_timeout=cfg.env_timeout)
            signal = batch_signal(batch, cfg.group_size, cfg.reward)
            t1 = time.perf_counter()
            sums = update(learner, batch, signal, it, cfg, dp)
            t2 = time.perf_counter()
            point = _point(it, dp.all_sum(signal.stats), dp.all_sum(sums), t1 - t0, t2 - t1,
                           device)
            over = bool(cfg.time_budget_s) and dp.any(
                time.perf_counter() - start > cfg.time_budget_s)
            if it % cfg.eval_every == 0 or it == cfg.iterations or over:
                t3 = time.perf_counter()
                point.update(held_out(learner, run, it) or {})
                point["eval_s"] = round(time.perf_counter() - t3, 2)
            point["wall_s"] = round(time.perf_counter() - start, 1)
            curve.append(point)
            saves = it % cfg.save_every == 0 or "eval_s" in point
            if rank.is_main:
                if saves:
                    save_state(out, it, learner, curve)
                _write_curve(out, cfg, curve)
                if "held_out_success" in point:
                    _report_held_out(point)
                bar.set_postfix(_postfix(point), refresh=False)
                bar.update(1)
            if over:
                break
    finally:
        bar.close()
        envs.close()
    if not rank.is_main:
        return None
    return _finish(cfg, learner, curve, out, time.perf_counter() - start)


def _point(it: int, signal: dict[str, float], sums: dict[str, float], collect_s: float,
           update_s: float, device: Any) -> dict[str, Any]:
    episodes = signal["episodes"]
    scored = sums["scored"]
    point: dict[str, Any] = {
        "iteration": it,
        "train_success": signal["successes"] / episodes if episodes else math.nan,
        "train_return": signal["return_sum"] / episodes if episodes else math.nan,
        "groups": int(signal["groups"]), "silent_groups": int(signal["silent_groups"]),
        "chunks_with_signal": int(signal["chunks_with_signal"]),
        "update_steps": int(round(sums["steps"])),
        "loss": sums["loss"] / sums["steps"] if sums["steps"] else 0.0,
        "grad_norm": sums["grad_norm"] / sums["steps"] if sums["steps"] else 0.0,
        "clip_frac": sums["clipped"] / scored if scored else 0.0,
        "approx_kl": sums["approx_kl"] / scored if scored else 0.0,
        "collect_s": round(collect_s, 2), "update_s": round(update_s, 2),
    }
    if sums["kl_ref"]:
        point["kl_ref"] = sums["kl_ref"] / scored
    if device.type == "cuda":
        point["peak_memory_gib"] = round(torch.cuda.max_memory_allocated(device) / 2**30, 2)
    return point


def _postfix(point: dict[str, Any]) -> dict[str, str]:
    shown = {"success": f"{point['train_success']:.0%}", "return":
             f"{point['train_return']:.2f}", "kl": f"{point['approx_kl']:.2g}",
             "s/it": f"{point['collect_s'] + point['update_s']:.1f}"}
    if "held_out_success" in point:
        shown["held_out"] = f"{point['held_out_success']:.0%}"
    return shown


def _report_held_out(point: dict[str, Any]) -> None:
    if "held_out_success" not in point:
        return
    low, high = point["held_out_interval"]
    print(f"iteration {point['iteration']}: held-out success {point['held_out_success']:.1%} "
          f"({point['held_out_successes']}/{point['held_out_episodes']}, Wilson 95% "
          f"[{low:.1%}, {high:.1%}])", flush=True)


def _drop_later_evals(out: Path, iteration: int) -> None:
    """Held-out evaluations of iterations after the restored state measured weights that are
    gone: remove them (the resumed run measures its own)."""
    for folder in sorted((out / EVALS).glob("iter-*")):
        suffix = folder.name.removeprefix("iter-")
        if suffix.isdigit() and int(suffix) > iteration:
            shutil.rmtree(folder)


def _finish(cfg: GRPOConfig, learner: Learner, curve: list[dict[str, Any]], out: Path,
            wall: float) -> dict[str, Any]:
    import os

    measured = [p for p in curve if "held_out_success" in p]
    before, after = measured[0], measured[-1]
    summary = {"config": asdict(cfg), "before": before.get("held_out_success"),
               "after": after.get("held_out_success"),
               "before_interval": before.get("held_out_interval"),
               "after_interval": after.get("held_out_interval"),
               "iterations_run": curve[-1]["iteration"], "wall_s": round(wall, 1),
               "load_average": os.getloadavg(), "torch": torch.__version__}
    if cfg.synthetic is None:
        adapter = learner.trainable.save_adapter(out / "adapter")
        checkpoint = write_checkpoint(learner, out / "checkpoint")
        summary["checkpoint"] = str(checkpoint)
        summary["adapter"] = None if adapter is None else str(adapter)
        summary["eval_command"] = eval_command(cfg, checkpoint)
    _write_curve(out, cfg, curve, summary)
    print(f"held-out success after {after['iteration']} iterations: "
          f"{after.get('held_out_success', math.nan):.1%}; before "
          f"{before.get('held_out_success', math.nan):.1%}; {wall / 60:.1f} min "
          f"(this session); load average {os.getloadavg()[0]:.1f}", flush=True)
    if cfg.synthetic is None:
        print(f"the fine-tuned checkpoint: {summary['checkpoint']}; evaluate it with\n  "
              f"{summary['eval_command']}", flush=True)
    else:
        print(f"--synthetic {cfg.synthetic}: random weights, so no checkpoint is written",
              flush=True)
    return {"curve": curve, **summary}


def write_checkpoint(learner: Learner, folder: Path) -> Path:
    """The fine-tuned policy as a checkpoint folder ``eval`` loads: the transformer with any
    adapters merged, the pipeline's VAE and tokenizer, and its action head's settings (domain,
    statistics, sampler: the ones this run used, so the folder needs no flags). Written into a
    temporary folder renamed into place."""
    import os

    from cosmos3_gym.checkpoint import POLICY_CONFIG, TEXT_TOKENIZER, TRANSFORMER, VAE
    from cosmos3_gym.model.weights import save_transformer

    pipe = learner.pipe
    model = learner.trainable.merged()
    pipe.transformer = model
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    was = model.training
    save_transformer(model.eval(), tmp / TRANSFORMER)
    model.train(was)
    pipe.vae.save_pretrained(tmp / VAE, safe_serialization=True)
    pipe.tokenizer.save_pretrained(tmp / TEXT_TOKENIZER)
    pipe.policy.save(tmp / POLICY_CONFIG)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def eval_command(cfg: GRPOConfig, checkpoint: Path) -> str:
    """The ``cosmos3-gym eval`` command that measures the fine-tuned checkpoint on the run's
    held-out episodes (more trials: raise ``--trials``)."""
    args = ["cosmos3-gym", "eval", "--checkpoint", str(checkpoint), "--env", cfg.env]
    for name, flag in (("suite", "--suite"), ("tasks", "--tasks"),
                       ("image_size", "--image-size"),
                       ("max_episode_steps", "--max-episode-steps"),
                       ("step_budget", "--step-budget"), ("import_modules", "--import"),
                       ("success_key", "--success-key"), ("action_map", "--action-map")):
        value = getattr(cfg, name)
        if value is not None:
            args += [flag, ",".join(value) if isinstance(value, (list, tuple)) else str(value)]
    import json

    for name, flag in (("prompt", "--prompt"), ("env_kwargs", "--env-kwargs")):
        value = getattr(cfg, name)
        if value is not None:
            args += [flag, value if isinstance(value, str) else json.dumps(value)]
    if cfg.num_inference_steps is not None:
        args += ["--denoising-steps", str(cfg.num_inference_steps)]
    args += ["--trials", str(cfg.eval_trials), "--seed", str(cfg.eval_seed), "--n-action-steps",
             str(cfg.n_action_steps), "--num-envs", str(cfg.num_envs), "--out",
             str(Path(cfg.out) / "eval")]
    return " ".join(shlex.quote(a) for a in args)


# ---------------------------------------------------------------------- set-up


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


def _upgrade_identity(stored: dict[str, Any], current: dict[str, Any]) -> dict[str, Any]:
    """A stored ``grpo.json`` identity in today's terms: a ``--synthetic`` run's unset
    checkpoint (:func:`~cosmos3_gym.settings.stored_model_source`); a folder written before the
    starting weights' fingerprint was recorded is taken as this run's."""
    out = stored_model_source(dict(stored))
    if "weights" not in out and "weights" in current:
        out["weights"] = current["weights"]
    return out


def _check_memory(learner: Learner, cfg: GRPOConfig, eval_env: Any, envs: Any, adapter: Any,
                  device: Any, rollout_batch: int) -> Any:
    """Print-ready estimate of this rank's training memory; refuses one that cannot fit."""
    from cosmos3_gym.train.memory import (
        ChunkTokens,
        check_fits,
        chunk_tokens,
        device_memory_bytes,
        training_memory,
    )

    pipe = learner.pipe
    hw = _image_hw(envs, adapter)
    tokens = chunk_tokens(pipe, hw, eval_env.task_prompt(0)) if hw is not None else ChunkTokens(
        text=128, vision=pipe.noise.num_latent_frames * (pipe.policy.resolution_tier // 32) ** 2,
        action=pipe.history_length + pipe.action_horizon)
    weight_bytes = sum(t.numel() * t.element_size() for module in (pipe.transformer, pipe.vae)
                       for t in (*module.parameters(), *module.buffers()))
    trained = learner.trainable
    steps = 1
    estimate = training_memory(
        pipe.transformer.config, weight_bytes=weight_bytes, trained_params=trained.count,
        trained_in_fp32=not learner.masters.copies and all(
            p.dtype == torch.float32 for p in trained.parameters()),
        dtype_bytes=pipe.transformer.dtype.itemsize, tokens=tokens,
        microbatch=cfg.microbatch or cfg.minibatch, stochastic_steps=steps,
        rollout_batch=rollout_batch, lora_rank=cfg.lora_rank if cfg.train == "lora" else 0,
        checkpointing=cfg.gradient_checkpointing,
        kl_reference_params=trained.fully_trained_count if cfg.kl_coef > 0 else 0,
        text_trains=cfg.train == "full")
    check_fits(estimate, device_memory_bytes(device), train=cfg.train,
               checkpointing=cfg.gradient_checkpointing, microbatch=cfg.microbatch or
               cfg.minibatch, kl=cfg.kl_coef > 0)
    return estimate


def _image_hw(envs: Any, adapter: Any) -> tuple[int, int] | None:
    """The model image's height and width for this env, from an empty observation of its space
    (None where the adapter cannot read one: the image is then known at the first chunk)."""
    from gymnasium.vector.utils import create_empty_array

    try:
        probe = create_empty_array(envs.single_observation_space, n=1)
        images = np.asarray(adapter.images(probe))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return (int(images.shape[1]), int(images.shape[2])) if images.ndim == 4 else None


def _write_curve(out: Path, cfg: GRPOConfig, curve: list[dict[str, Any]],
                 summary: dict[str, Any] | None = None) -> None:
    from cosmos3_gym.jsonio import write_json_atomic

    write_json_atomic(out / CURVE_FILE, {"curve": curve, **(summary or {})})
    try:
        from cosmos3_gym.plotting import PlottingUnavailable, new_figure, save_figure
    except ImportError:
        return
    try:
        fig = new_figure(6.0, 3.6)
    except PlottingUnavailable:
        return
    ax = fig.add_subplot(1, 1, 1)
    held = [(p["iteration"], p["held_out_success"]) for p in curve if "held_out_success" in p]
    train = [(p["iteration"], p["train_success"]) for p in curve
             if not math.isnan(p.get("train_success", math.nan))]
    if train:
        ax.plot(*zip(*train, strict=True), color="0.7", lw=1,
                label=f"training episodes ({cfg.sampler})")
    if held:
        iters, rates = zip(*held, strict=True)
        intervals = [p["held_out_interval"] for p in curve if "held_out_success" in p]
        ax.fill_between(iters, [lo for lo, _ in intervals], [hi for _, hi in intervals],
                        color="C0", alpha=0.15, lw=0)
        ax.plot(iters, rates, "o-", color="C0",
                label=f"held-out ({cfg.eval_trials} per task, deterministic; Wilson 95%)")
    ax.set_xlabel("GRPO iteration")
    ax.set_ylabel("success rate")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    model = f"--synthetic {cfg.synthetic}" if cfg.synthetic else cfg.checkpoint
    ax.set_title(f"GRPO on {cfg.env}, {model} ({cfg.train})")
    save_figure(fig, out / "curve")
