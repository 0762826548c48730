"""Evaluation and rollout collection, and the ``cosmos3-gym`` console script."""
