"""Rollouts as a LeRobot dataset: the npz shards of ``cosmos3-gym rollout``, one LeRobot episode
per finished env episode, written by LeRobot's own ``LeRobotDataset`` (its v3 layout), so it
needs LeRobot installed (docs/lerobot.md, "Install").

Each frame holds the camera image(s) the action was chosen from, ``observation.state``, the
``action`` the env received and ``next.reward`` / ``next.done`` / ``next.success`` after it;
steps of no finished episode are left out. Details: docs/lerobot.md, "Rollouts as a LeRobot
dataset".
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from cosmos3_gym.integrations.lerobot import INSTALL_HINT

STATE_KEY = "state"
ARRAY_CAMERA = "image"  # the camera name of an array (image-only) observation


@dataclass(frozen=True)
class RolloutEpisode:
    """One finished episode of one env: its rows ``steps`` (time indices) in the rollout."""

    env: int
    steps: np.ndarray  # int [T_episode]
    task: str


def finished_episodes(rollouts: dict[str, Any]) -> Iterator[RolloutEpisode]:
    """The finished episodes of :func:`~cosmos3_gym.runner.load_rollouts`'s arrays, env
    by env, in time order. An episode ends at a terminated or truncated step; the steps it
    spans are the valid ones since the previous end."""
    done = np.logical_or(rollouts["terminations"], rollouts["truncations"])  # [T, B]
    valid = rollouts["valid"]
    num_steps, num_envs = done.shape
    for env in range(num_envs):
        start: list[int] = []
        for t in range(num_steps):
            if not valid[t, env]:
                continue
            start.append(t)
            if done[t, env]:
                steps = np.asarray(start)
                yield RolloutEpisode(env, steps, str(rollouts["prompts"][steps[0], env]))
                start = []


def _cameras(rollouts: dict[str, Any]) -> dict[str, str]:
    """Rollout array key -> camera name, for every uint8 image observation."""
    cameras = {}
    for key, value in rollouts.items():
        if key == "obs" or key.startswith("obs."):
            if value.dtype == np.uint8 and value.ndim == 5:  # [T, B, H, W, C]
                cameras[key] = ARRAY_CAMERA if key == "obs" else key[len("obs."):]
    if not cameras:
        raise ValueError("the rollouts hold no uint8 [T, B, H, W, C] image observation; a "
                         "LeRobot dataset needs at least one camera")
    return cameras


def lerobot_features(rollouts: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The LeRobot ``features`` of the dataset made of ``rollouts``."""
    features: dict[str, dict[str, Any]] = {}
    for key, camera in _cameras(rollouts).items():
        height, width, channels = rollouts[key].shape[2:]
        features[f"observation.images.{camera}"] = {
            "dtype": "video", "shape": (height, width, channels),
            "names": ["height", "width", "channels"],
        }
    if f"obs.{STATE_KEY}" in rollouts:
        dim = rollouts[f"obs.{STATE_KEY}"].shape[-1]
        features["observation.state"] = {"dtype": "float32", "shape": (dim,), "names": None}
    features["action"] = {"dtype": "float32", "shape": (rollouts["actions"].shape[-1],),
                          "names": None}
    for name, dtype in (("next.reward", "float32"), ("next.done", "bool"),
                        ("next.success", "bool")):
        features[name] = {"dtype": dtype, "shape": (1,), "names": None}
    return features


def check_lerobot_dataset() -> None:
    """Before ``rollout --format lerobot`` runs: a ``ValueError`` that names the fix where
    LeRobot's dataset writer cannot be imported (the rollout would run to its end first)."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset  # noqa: F401
    except ImportError as error:
        raise ValueError(
            f"--format lerobot writes a LeRobot dataset, and {INSTALL_HINT} ({error}); or "
            "collect with --format npz and write the dataset later with write_lerobot_dataset "
            "(docs/lerobot.md)") from None


def write_lerobot_dataset(
    rollout_dir: str | Path,
    root: str | Path,
    *,
    fps: float,
    repo_id: str = "cosmos3_gym/rollouts",
    robot_type: str | None = None,
) -> Any:
    """Write the rollouts in ``rollout_dir`` (npz shards) as a LeRobot dataset in ``root`` (a
    new folder); returns the ``LeRobotDataset``. ``fps`` is the env's control rate."""
    from cosmos3_gym.runner import load_rollouts

    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError as error:
        raise ImportError(f"{INSTALL_HINT} ({error})") from error

    root = Path(root)
    if root.exists():
        raise FileExistsError(f"{root} exists; a LeRobot dataset is written to a new folder")
    rollouts = load_rollouts(rollout_dir)
    cameras = _cameras(rollouts)
    episodes = list(finished_episodes(rollouts))
    if not episodes:
        raise ValueError(f"the rollouts in {rollout_dir} hold no finished episode; collect more "
                         "steps (or shorten the episodes) to write a LeRobot dataset")
    features = lerobot_features(rollouts)
    dataset = LeRobotDataset.create(repo_id, fps=int(round(fps)), root=root, features=features,
                                    robot_type=robot_type, use_videos=True)
    has_state = f"obs.{STATE_KEY}" in rollouts
    for episode in episodes:
        b = episode.env
        for t in episode.steps:
            frame: dict[str, Any] = {
                f"observation.images.{camera}": rollouts[key][t, b]
                for key, camera in cameras.items()
            }
            if has_state:
                frame["observation.state"] = rollouts[f"obs.{STATE_KEY}"][t, b].astype(np.float32)
            frame["action"] = rollouts["actions"][t, b].astype(np.float32)
            terminated = bool(rollouts["terminations"][t, b])
            frame["next.reward"] = np.array([rollouts["rewards"][t, b]], np.float32)
            frame["next.done"] = np.array([terminated or bool(rollouts["truncations"][t, b])])
            frame["next.success"] = np.array([terminated])
            frame["task"] = str(rollouts["prompts"][t, b])
            dataset.add_frame(frame)
        _scalar_columns(dataset, features)
        dataset.save_episode()
    dataset.finalize()
    return dataset


def _scalar_columns(dataset: Any, features: dict[str, dict[str, Any]]) -> None:
    """LeRobot 0.4.4 checks a ``(1,)`` feature's frames as shape-``(1,)`` arrays, but stores the
    feature as a scalar column, which a stack of ``(1,)`` arrays does not fill: hand the episode
    buffer the scalars. LeRobot 0.6 stores them itself (its episode buffer lives in its writer,
    and the dataset has no ``episode_buffer``)."""
    if not hasattr(dataset, "episode_buffer"):
        return
    for key, feature in features.items():
        if tuple(feature["shape"]) == (1,) and feature["dtype"] not in ("image", "video"):
            dataset.episode_buffer[key] = [value.reshape(()) for value in
                                           dataset.episode_buffer[key]]
