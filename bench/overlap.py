"""Inference overlapped with env stepping: the episode runner with and without ``overlap``.

With one group of env slots the loop alternates: the policy plans while every env waits, then
the envs step while the policy waits. With ``overlap`` (:class:`~cosmos3_gym.runner.RunnerOptions`)
the slots form two groups that take turns: while one group executes its actions (its sub-envs
in their worker processes), the other group's chunks are planned. :func:`measure_overlap` runs
the same episodes both ways and reports the two throughputs and whether every episode was the
same (its observation hash, steps and outcome): a group plans half the slots per call, which
moves the actions by float rounding, so ColorReach's episodes match and LIBERO's frames may not
(docs/benchmarks.md, "Overlap"). The gain is largest where an env's chunk
takes about as long as the model's call (LIBERO's software rendering on a GPU box: up to 2x).
"""

from __future__ import annotations

import time
from typing import Any


def measure_overlap(
    pipeline: Any,
    *,
    env: str = "color_reach",
    num_envs: int = 4,
    trials: int = 2,
    adapter: str | None = None,
    suite: str | None = None,
    tasks: list[str] | None = None,
    image_size: int | None = None,
    sampling: Any = None,
    async_envs: bool = True,
    seed: int = 0,
) -> dict[str, Any]:
    """Episodes per second and env steps per second of the same episodes with and without
    overlap, and whether they were the same episodes.

    ``env`` is a name of the env table (``EVAL_ENVS``), with ``tasks`` (default: all) of
    ``suite`` (default: the env's ``bench_suite``, e.g. ``libero_spatial``), ``trials`` per
    task; ``num_envs`` slots (two groups of half with overlap), async sub-envs unless
    ``async_envs=False``; the env's adapter unless ``adapter`` names another; chunks sampled as
    ``sampling`` (a :class:`~cosmos3_gym.pipeline.SamplerConfig`) says.
    """
    from cosmos3_gym.envs import EVAL_ENVS, EvalEnv, make_eval_env
    from cosmos3_gym.policy import VectorPolicy, get_adapter
    from cosmos3_gym.runner import (
        EndedEpisodes,
        EpisodeList,
        EpisodeRunner,
        RunnerOptions,
        episode_seed_rule,
        episode_specs,
    )

    if num_envs < 2:
        raise ValueError(f"num_envs must be >= 2 (two groups), got {num_envs}")
    suite = suite or EVAL_ENVS.get(env, EvalEnv).bench_suite
    eval_env = make_eval_env(env, suite=suite, tasks=tasks, image_size=image_size)
    episodes = eval_env.episodes(trials, seed)

    def run(overlap: bool) -> tuple[float, Any, dict[int, Any]]:
        policy = VectorPolicy(pipeline, adapter=get_adapter(adapter or eval_env.adapter),
                              sampling=sampling,
                              seed_rule=episode_seed_rule(seed, episodes.__getitem__))
        ended = EndedEpisodes()
        runner = EpisodeRunner(policy, lambda n: eval_env.make(n, async_envs),
                               EpisodeList(episode_specs(eval_env, episodes)),
                               RunnerOptions(num_envs=num_envs, async_envs=async_envs,
                                             overlap=overlap), ended)
        start = time.perf_counter()
        runner.run()
        seen = {k: (r.obs_sha256, r.steps, r.success) for k, r in ended.results.items()}
        return time.perf_counter() - start, runner, seen

    run(False)  # warm-up: worker start, first render, first pipeline calls
    sequential_s, sequential, seen_sequential = run(False)
    overlapped_s, overlapped, seen_overlapped = run(True)
    steps = sequential.env_steps
    return {
        "env": env,
        "suite": suite,
        "num_envs": num_envs,
        "episodes": len(episodes),
        "async_envs": async_envs,
        "env_steps": steps,
        "identical_episodes": seen_sequential == seen_overlapped,
        "sequential_wall_s": sequential_s,
        "overlapped_wall_s": overlapped_s,
        "sequential_steps_per_s": steps / sequential_s,
        "overlapped_steps_per_s": overlapped.env_steps / overlapped_s,
        "overlap_speedup": sequential_s / overlapped_s,
        "sequential_pipeline_s": sequential.pipeline_s,
        "sequential_env_s": sequential.env_s,
        "plan_share_sequential": sequential.pipeline_s / sequential_s,
    }
