"""Evaluation, rollout collection and benchmarks (the ``cosmos3-gym`` console script)."""
