"""``cosmos3-gym train`` and ``cosmos3-gym rl grpo``: every check that needs no model, before
torch loads, then the command's work (:mod:`cosmos3_gym.train.trainer`,
:func:`cosmos3_gym.train.grpo.run_grpo`)."""

from __future__ import annotations

from cosmos3_gym.train.config import GRPOConfig, TrainConfig


def run_train_command(config: TrainConfig, progress: bool = True) -> int:
    """Refuse a folder that holds another kind of run (before torch loads), then train and say
    what was written."""
    from cosmos3_gym.runner.folder import RunFolder

    RunFolder(config.out, kind="checkpoint").check_free()
    from cosmos3_gym.train.trainer import train

    log = train(config, progress=progress)
    print(f"wrote {config.out}: {log['num_samples']} samples, {config.steps} steps, final loss "
          f"{log['final_loss']:.4f}, {log['wall_s']:.0f}s")
    return 0


def run_grpo_command(config: GRPOConfig) -> None:
    """Resolve the run (:meth:`GRPOConfig.preflight`: the folder, the env, the checkpoint read
    once, the head's sampler) with no model loaded, then train."""
    run = config.preflight()
    from cosmos3_gym.train.grpo import run_grpo

    run_grpo(config, progress=config.progress, run=run)
