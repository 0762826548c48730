"""The success rate a trained checkpoint reaches on a fixed set of ColorReach episodes."""

from __future__ import annotations

from typing import Any

import numpy as np


def success_episodes(episodes: int, num_envs: int, seed: int, prompts: str,
                     env_kwargs: dict[str, Any]) -> list[Any]:
    """The fixed episode set: episode ``k`` (round ``k // num_envs``, env ``k % num_envs``)
    resets with seed ``seed + k`` (ColorReach draws its target from it); with ``"shuffled"``
    prompts it is given the task of episode ``k + 1`` of its round (cyclically)."""
    from cosmos3_gym.envs import ColorReachEnv
    from cosmos3_gym.runner import EpisodeSpec

    probe = ColorReachEnv(**env_kwargs)
    tasks = []
    for k in range(episodes):
        probe.reset(seed=seed + k)
        tasks.append(probe.task_description)
    specs = []
    for k in range(episodes):
        first = k - k % num_envs
        mate = first + (k - first + 1) % num_envs
        specs.append(EpisodeSpec(id=k, seed=seed + k, rule_episode=k,
                                 prompt=tasks[mate] if prompts == "shuffled" else None))
    return specs


def evaluate_success(
    pipe: Any, *, episodes: int = 40, num_envs: int = 8, seed: int = 10_000,
    prompts: str = "right", n_action_steps: int | None = None, image_size: int = 128,
    env_kwargs: dict[str, Any] | None = None, **policy_kwargs: Any,
) -> dict[str, Any]:
    """Success rate of ``pipe`` on a fixed set of ColorReach episodes.

    Episodes run in rounds of ``num_envs``: episode ``k`` is round ``k // num_envs``, env
    ``k % num_envs``; it resets with seed ``seed + k`` and draws its chunks' noise as a policy
    seeded ``seed`` draws that env's chunks in that round (episode index = round).
    ``prompts="right"`` gives every episode its own task; ``"shuffled"`` gives env ``i`` the
    task of env ``(i + 1) % num_envs`` of its round (another episode's target, which names the
    same colour about a quarter of the time, so chance is ~0.25). ``env_kwargs`` go to every
    ``ColorReachEnv`` (a harder setting, e.g. ``max_speed``). The episodes run on the episode
    runner (:class:`~cosmos3_gym.runner.EpisodeRunner`), any episode in any free slot: each
    one's result depends on its own seeds only.
    """
    from gymnasium.vector import AutoresetMode

    from cosmos3_gym.envs import make_color_reach_vector_env
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.policy.planner import SeedRule, chunk_seed
    from cosmos3_gym.runner import EndedEpisodes, EpisodeList, EpisodeRunner, RunnerOptions

    if prompts not in ("right", "shuffled"):
        raise ValueError(f"prompts must be 'right' or 'shuffled', got {prompts!r}")
    if episodes % num_envs:
        raise ValueError(f"episodes ({episodes}) must be a multiple of num_envs ({num_envs})")
    env_kwargs = {"image_size": image_size, **(env_kwargs or {})}
    if policy_kwargs.get("noise") != "fixed":
        rule = SeedRule(lambda env, k, c: chunk_seed(seed, k % num_envs, k // num_envs, c))
    else:
        rule = SeedRule.fixed(seed)
    policy = VectorPolicy(pipe, adapter="generic", n_action_steps=n_action_steps, seed=seed,
                          seed_rule=rule, **policy_kwargs)
    ended = EndedEpisodes()
    runner = EpisodeRunner(
        policy,
        lambda n: make_color_reach_vector_env(n, autoreset_mode=AutoresetMode.DISABLED,
                                              **env_kwargs),
        EpisodeList(success_episodes(episodes, num_envs, seed, prompts, env_kwargs)),
        RunnerOptions(num_envs=num_envs), ended)
    runner.run()
    outcomes = np.zeros(episodes, bool)
    for k, result in ended.results.items():
        outcomes[k] = result.success
    return {"episodes": episodes, "num_envs": num_envs, "seed": seed, "prompts": prompts,
            "success_rate": float(np.mean(outcomes)), "successes": int(np.sum(outcomes))}
