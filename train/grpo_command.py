"""``cosmos3-gym rl grpo``: every check that needs no model, before the algorithm's module (and
torch) loads, then the run (:func:`cosmos3_gym.train.grpo.run_grpo`)."""

from __future__ import annotations

from cosmos3_gym.train.config import GRPOConfig


def run_grpo_command(config: GRPOConfig) -> None:
    """Check the run (:meth:`GRPOConfig.preflight`: the env, the checkpoint's files, the run
    folder) with no model loaded, then train."""
    eval_env = config.preflight()
    from cosmos3_gym.train.grpo import run_grpo

    run_grpo(config, progress=config.progress, eval_env=eval_env)
