"""The success rate a trained checkpoint reaches on a fixed set of ColorReach episodes."""

from __future__ import annotations

from typing import Any

import numpy as np


def evaluate_success(
    pipe: Any, *, episodes: int = 40, num_envs: int = 8, seed: int = 10_000,
    prompts: str = "right", n_action_steps: int | None = None, image_size: int = 128,
    env_kwargs: dict[str, Any] | None = None, **policy_kwargs: Any,
) -> dict[str, Any]:
    """Success rate of ``pipe`` on a fixed set of ColorReach episodes.

    Episodes run in rounds of ``num_envs``: round ``r`` resets the vector env with seed
    ``seed + r * num_envs`` (env ``i`` gets ``seed + r * num_envs + i``), and each env's first
    episode of the round counts. ``prompts="right"`` gives every env its own task;
    ``"shuffled"`` gives env ``i`` the task of env ``(i + 1) % num_envs`` (another env's target,
    which names the same colour about a quarter of the time, so chance is ~0.25).
    ``env_kwargs`` go to every ``ColorReachEnv`` (a harder setting, e.g. ``max_speed``).
    """
    from cosmos3_gym.envs import make_color_reach_vector_env
    from cosmos3_gym.policy import VectorPolicy

    if prompts not in ("right", "shuffled"):
        raise ValueError(f"prompts must be 'right' or 'shuffled', got {prompts!r}")
    if episodes % num_envs:
        raise ValueError(f"episodes ({episodes}) must be a multiple of num_envs ({num_envs})")
    envs = make_color_reach_vector_env(num_envs, image_size=image_size, **(env_kwargs or {}))
    policy = VectorPolicy(
        pipe, adapter="generic", n_action_steps=n_action_steps, seed=seed, **policy_kwargs
    )
    max_steps = envs.get_attr("max_episode_steps")[0]
    outcomes: list[bool] = []
    try:
        for round_index in range(episodes // num_envs):
            obs, _ = envs.reset(seed=seed + round_index * num_envs)
            tasks = list(envs.call("task_description"))
            if prompts == "shuffled":
                tasks = tasks[1:] + tasks[:1]
            policy.reset()
            done = np.zeros(num_envs, bool)
            success = np.zeros(num_envs, bool)
            for _ in range(max_steps):
                obs, _, terminated, truncated, infos = envs.step(policy.select_action(obs, tasks))
                ended = (terminated | truncated) & ~done
                success |= ended & np.asarray(infos["is_success"], bool)
                done |= ended
                if done.all():
                    break
            outcomes.extend(success.tolist())
    finally:
        envs.close()
    return {"episodes": episodes, "num_envs": num_envs, "seed": seed, "prompts": prompts,
            "success_rate": float(np.mean(outcomes)), "successes": int(np.sum(outcomes))}
