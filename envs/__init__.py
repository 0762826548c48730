"""Environments: LIBERO as Gymnasium vector envs, chunk stepping, and a built-in multi-task env.

Nothing here imports the Cosmos3 model stack; this package is useful on its own.
"""
