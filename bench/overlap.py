"""Overlap inference with env stepping: double-buffered chunk rollouts over two env groups.

With one vector env, the loop alternates: the policy plans while every env waits, then every env
executes its chunk while the policy waits. Splitting the envs into two groups (A, B), each its
own chunk-stepping vector env, lets them take turns: while group A executes its chunk (in its
worker processes, or a helper thread), the policy plans group B's next chunk, and vice versa.
Each group's sequence of observations and chunks is exactly what it would be without overlap;
only the waiting disappears.

    runner = DoubleBufferedRollout(plan_a, envs_a, plan_b, envs_b)
    stats = runner.run(num_rounds=20)      # overlapped
    stats = runner.run(num_rounds=20, overlap=False)   # the same work, one after the other

``plan_x(obs) -> [b, H, D]`` is any chunk planner, e.g. ``VectorPolicy.predict_action_chunk``
of a policy attached to that group's env (one policy per group: its per-env state is the
group's). ``envs_x`` step ``[b, H, D]`` chunks (``cosmos3_gym.envs.ChunkedActionWrapper``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Planner = Callable[[Any], np.ndarray]


@dataclass
class RolloutStats:
    """What a run did and how fast: env steps, finished episodes, chunks, wall time."""

    env_steps: int = 0
    episodes: int = 0
    successes: int = 0
    chunks: int = 0
    wall_s: float = 0.0
    plan_s: float = 0.0  # main-thread time spent planning
    trace: list[tuple[int, np.ndarray]] = field(default_factory=list)  # (group, chunk) in order

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.wall_s if self.wall_s else 0.0

    @property
    def episodes_per_s(self) -> float:
        return self.episodes / self.wall_s if self.wall_s else 0.0


class DoubleBufferedRollout:
    """Two env groups take turns: one executes a chunk while the other's chunk is planned."""

    def __init__(self, plan_a: Planner, envs_a: Any, plan_b: Planner, envs_b: Any) -> None:
        self.groups = ((plan_a, envs_a), (plan_b, envs_b))

    def run(self, num_rounds: int, *, seed: int = 0, overlap: bool = True,
            keep_trace: bool = False) -> RolloutStats:
        """Reset both groups, then run ``num_rounds`` chunks per group."""
        if num_rounds < 1:
            raise ValueError(f"num_rounds must be >= 1, got {num_rounds}")
        stats = RolloutStats()
        start = time.perf_counter()
        obs = [envs.reset(seed=seed + 1000 * g)[0] for g, (_, envs) in enumerate(self.groups)]
        with ThreadPoolExecutor(max_workers=1) as pool:
            pending: Future | None = None
            for _ in range(num_rounds):
                for g, (plan, envs) in enumerate(self.groups):
                    chunk = self._plan(plan, obs[g], stats, g, keep_trace)
                    if pending is not None:  # the other group's chunk, started last turn
                        other, future = pending
                        obs[other] = self._finish(future.result(), stats)
                        pending = None
                    if overlap:
                        pending = (g, pool.submit(envs.step, chunk))
                    else:
                        obs[g] = self._finish(envs.step(chunk), stats)
            if pending is not None:
                obs[pending[0]] = self._finish(pending[1].result(), stats)
        stats.wall_s = time.perf_counter() - start
        return stats

    @staticmethod
    def _plan(plan: Planner, obs: Any, stats: RolloutStats, group: int, keep: bool) -> np.ndarray:
        t0 = time.perf_counter()
        chunk = np.asarray(plan(obs))
        stats.plan_s += time.perf_counter() - t0
        stats.chunks += chunk.shape[0]
        if keep:
            stats.trace.append((group, chunk.copy()))
        return chunk

    @staticmethod
    def _finish(result: tuple, stats: RolloutStats) -> Any:
        obs, _, terminated, truncated, infos = result
        done = np.asarray(terminated) | np.asarray(truncated)
        stats.env_steps += int(np.sum(infos["steps_executed"]))
        stats.episodes += int(done.sum())
        stats.successes += int(np.sum(np.asarray(terminated)))
        return obs


def measure_overlap(
    pipeline: Any,
    *,
    env: str = "color_reach",
    num_envs: int = 4,
    num_rounds: int = 4,
    adapter: str | None = None,
    suite: str | None = None,
    image_size: int | None = None,
    num_inference_steps: int | None = None,
) -> dict[str, float]:
    """Env steps/s and episodes/s of the same rollout with and without overlap.

    ``env`` is a name of the evaluation's env table (``EVAL_ENVS``), with all the tasks of
    ``suite`` (default: the env's ``bench_suite``, e.g. ``libero_spatial``). ``num_envs`` envs
    are split into two async groups (SAME_STEP autoreset, chunk stepping); each group gets its
    own ``VectorPolicy`` over the one shared ``pipeline``, with the env's adapter unless
    ``adapter`` names another.
    """
    from gymnasium.vector import AutoresetMode

    from cosmos3_gym import VectorPolicy
    from cosmos3_gym.envs import ChunkedActionWrapper
    from cosmos3_gym.eval.tasks import EVAL_ENVS, EvalEnv, make_eval_env

    if num_envs < 2 or num_envs % 2:
        raise ValueError(f"num_envs must be an even number >= 2, got {num_envs}")
    half = num_envs // 2
    suite = suite or EVAL_ENVS.get(env, EvalEnv).bench_suite
    eval_env = make_eval_env(env, suite=suite, image_size=image_size)

    def group(index: int) -> tuple[Planner, Any]:
        vec = eval_env.make(half, True, autoreset_mode=AutoresetMode.SAME_STEP)
        policy = VectorPolicy(
            pipeline, adapter=adapter or eval_env.adapter, seed=index,
            num_inference_steps=num_inference_steps,
        )
        envs = policy.attach(ChunkedActionWrapper(vec))
        return policy.predict_action_chunk, envs

    (plan_a, envs_a), (plan_b, envs_b) = group(0), group(1)
    try:
        runner = DoubleBufferedRollout(plan_a, envs_a, plan_b, envs_b)
        runner.run(1)  # warm-up: worker start, first render, first pipeline call
        sequential = runner.run(num_rounds, overlap=False)
        overlapped = runner.run(num_rounds, overlap=True)
    finally:
        envs_a.close()
        envs_b.close()
    return {
        "env": env,
        "num_envs": num_envs,
        "rounds": num_rounds,
        "sequential_steps_per_s": sequential.steps_per_s,
        "overlapped_steps_per_s": overlapped.steps_per_s,
        "overlap_speedup": overlapped.steps_per_s / sequential.steps_per_s,
        "sequential_wall_s": sequential.wall_s,
        "overlapped_wall_s": overlapped.wall_s,
        "plan_share_sequential": sequential.plan_s / sequential.wall_s,
    }
