"""Benchmark adapters: the one place that knows a benchmark's image, prompt and action conventions.

The model and the pipeline know nothing of benchmarks. An adapter turns a Gymnasium vector
observation into the uint8 images the pipeline takes, a task string into the prompt the
checkpoint was trained on, and the pipeline's raw actions into the actions the env takes
(:class:`Adapter`: three hooks, and ``state`` for state-conditioned heads); :data:`ADAPTERS`
names the built-in ones.

The built-in adapters and how to write one: docs/your_own_env.md, "Adapters".
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
from gymnasium.spaces import Box
from PIL import Image

from cosmos3_gym.policy.observations import describe, is_tensor, to_numpy
from cosmos3_gym.policy.rotations import rot6d_to_axis_angle


class Adapter:
    """The identity adapter and the base to subclass: three data-to-data methods.

    Override what differs from the identity::

        >>> import numpy as np
        >>> class MyArmAdapter(Adapter):
        ...     name = "my_arm"
        ...     def images(self, obs):                  # dict obs -> uint8 [B, H, W, C]
        ...         return obs["front_rgb"]
        ...     def prompt(self, task):                 # what the checkpoint was trained on
        ...         return f"The robot arm must {task}."
        ...     def actions(self, raw):                 # [B, H, D] -> [B, H, D_env]
        ...         return np.clip(raw[..., :7], -1.0, 1.0)
        >>> MyArmAdapter().prompt("stack the blocks")
        'The robot arm must stack the blocks.'

    Pass the instance as ``VectorPolicy(pipeline, adapter=MyArmAdapter())``. The policy checks
    what an adapter returns (dtype, rank, batch size) and names the adapter in its errors.
    :meth:`state` reads the robot state for heads conditioned on it (``history_length`` > 0): as
    ``[B, S, D]`` rows in the head's action representation, the current state last.

    Attributes:
        name: how errors and records name this adapter.
        domain: the checkpoint domain this benchmark's actions live in (e.g. ``"libero"``), or
            ``None`` where it does not matter; for whoever builds the pipeline.
    """

    name: str = "identity"
    domain: str | None = None

    def images(self, obs: Any) -> np.ndarray:
        """Observation batch -> uint8 ``[B, H, W, C]`` model images."""
        return obs

    def prompt(self, task: str) -> str:
        """Task string -> the prompt the checkpoint expects."""
        return task

    def actions(self, raw: np.ndarray) -> np.ndarray:
        """Raw model actions ``[B, H, D]`` -> env actions ``[B, H, D_env]``."""
        return raw

    def state(self, obs: Any) -> np.ndarray | None:
        """Observation batch -> the robot state as float ``[B, S, D]`` rows in the action
        representation of the checkpoint's head (the current state last), for heads conditioned
        on it; ``None``: this benchmark's observations give no state (the default)."""
        return None

    def env_action_dim(self, raw_action_dim: int) -> int:
        """``D_env``, the width of the env actions :meth:`actions` makes of ``raw_action_dim``-wide
        raw actions; a ``ValueError`` where it cannot take that width.

        The default runs :meth:`actions` on one all-zero ``[1, 1, raw_action_dim]`` chunk, which
        is right for any adapter whose ``actions`` accepts zeros; override it where not.
        """
        out = np.asarray(self.actions(np.zeros((1, 1, raw_action_dim), np.float32)))
        if out.ndim != 3 or out.shape[:2] != (1, 1):
            raise ValueError(
                f"adapter {self!r} returned actions {list(out.shape)} for a "
                f"[1, 1, {raw_action_dim}] chunk; expected [1, 1, D_env]"
            )
        return int(out.shape[2])

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


def _leaves(obs: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in obs.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _leaves(value, prefix=f"{path}/")
        else:
            yield path, value


def is_uint8(value: Any) -> bool:
    """A uint8 numpy array or torch tensor."""
    if is_tensor(value):
        return str(value.dtype) == "torch.uint8"
    return isinstance(value, np.ndarray) and value.dtype == np.uint8


def _is_image_batch(value: Any) -> bool:
    return is_uint8(value) and value.ndim == 4


def _check_image_batch(value: Any, what: str) -> Any:
    """``value`` if it is a uint8 ``[B, H, W, C]`` numpy array or torch tensor (a tensor stays on
    its device), else one ``ValueError`` saying what was found."""
    if not isinstance(value, np.ndarray) and not is_tensor(value):
        raise ValueError(
            f"{what}: expected a uint8 numpy array or torch tensor [B, H, W, C]; found "
            f"{describe(value)}"
        )
    if not is_uint8(value):
        raise ValueError(
            f"{what}: expected uint8 images [B, H, W, C] as Gymnasium returns them; found "
            f"{describe(value)} (convert float images with (x * 255).round().astype(np.uint8))"
        )
    if value.ndim != 4:
        hint = ("; a batch of grayscale images [B, H, W] takes a channel axis: [B, H, W, 1]"
                if value.ndim == 3 else "")
        raise ValueError(
            f"{what}: expected rank 4 [B, H, W, C]; found rank {value.ndim} {list(value.shape)}"
            f"{hint}"
        )
    if value.shape[-1] not in (1, 3, 4):
        shape = list(value.shape)
        hint = (": channels first, [B, C, H, W]; move them last (np.moveaxis(x, 1, -1), or "
                "x.permute(0, 2, 3, 1) for a tensor)" if shape[1] in (1, 3, 4) else "")
        raise ValueError(f"{what}: expected images [B, H, W, C] with C in 1, 3, 4 channels "
                         f"last; found {shape}{hint}")
    return value


def _side_by_side(batches: list[Any], what: str) -> Any:
    """Image batches ``[B, H, W_k, C]`` joined along the width (the first on the left)."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0]
    if any(b.shape[:2] != first.shape[:2] or b.shape[3] != first.shape[3] for b in batches):
        raise ValueError(
            f"{what}: images side by side must share [B, H, :, C]; found "
            f"{[list(b.shape) for b in batches]}"
        )
    if all(is_tensor(b) for b in batches):
        import torch

        return torch.cat(batches, dim=2)
    return np.concatenate([to_numpy(b) for b in batches], axis=2)


class GenericAdapter(Adapter):
    """Images straight from the observation, prompts and actions unchanged.

    An array observation is the image batch. A dict observation (nested dicts allowed) must hold
    exactly one uint8 ``[B, H, W, C]`` array, or name it with ``image_key`` (``"a/b"`` for
    nested; several keys put their images side by side, the first on the left). Images may be
    numpy arrays or torch tensors; a tensor stays on its device (the pipeline takes it there).

    Args:
        image_key: the dict key(s) of the image batch, when the observation has several.
        state_key: the dict key of the robot state (``[B, D]``, or ``[B, S, D]`` with history),
            e.g. ``"state"`` (LeRobot's ``observation.state``, as
            :mod:`cosmos3_gym.integrations.lerobot` hands it over) or ``"agent_pos"`` in a
            gym-style observation; None: no state.
        flip: a benchmark's frame convention undone on every camera before they are joined
            (:data:`FLIPS`): ``"vertical"`` (rows reversed: robosuite's upside-down frames),
            ``"horizontal"``, ``"both"`` (a 180 degree turn); None: as they come.

    >>> obs = {"pixels": np.zeros((2, 8, 8, 3), np.uint8), "agent_pos": np.ones((2, 3))}
    >>> GenericAdapter(state_key="agent_pos").state(obs).shape
    (2, 1, 3)
    >>> frame = np.arange(4, dtype=np.uint8).reshape(1, 2, 2, 1)
    >>> GenericAdapter(flip="vertical").images(frame)[0, :, :, 0].tolist()
    [[2, 3], [0, 1]]
    """

    name = "generic"

    def __init__(self, image_key: str | tuple[str, ...] | None = None,
                 state_key: str | None = None, flip: str | None = None) -> None:
        if flip not in FLIPS:
            raise ValueError(f"generic adapter: flip must be one of {FLIPS}; found {flip!r}")
        self.image_key = image_key
        self.state_key = state_key
        self.flip = flip

    def images(self, obs: Any) -> Any:
        if self.flip is None:
            return self._images(obs)
        if not isinstance(obs, Mapping) or self.image_key is None or isinstance(
                self.image_key, str):
            return flip_images(self._images(obs), self.flip)
        leaves = dict(_leaves(obs))  # several cameras: each flipped, then joined
        flipped = {k: flip_images(leaves[k], self.flip) for k in self.image_key if k in leaves}
        return self._images({**leaves, **flipped})

    def _images(self, obs: Any) -> Any:
        if not isinstance(obs, Mapping):
            return _check_image_batch(obs, "generic adapter, array observation")
        leaves = dict(_leaves(obs))
        if self.image_key is not None:
            keys = (self.image_key,) if isinstance(self.image_key, str) else self.image_key
            missing = [k for k in keys if k not in leaves]
            if missing:
                raise ValueError(
                    f"generic adapter: image_key {', '.join(map(repr, missing))} not in the "
                    f"observation; found keys {sorted(leaves)}"
                )
            batches = [_check_image_batch(leaves[k], f"observation[{k!r}]") for k in keys]
            return _side_by_side(batches, "generic adapter")
        found = {k: describe(v) for k, v in leaves.items()}
        images = [k for k, v in leaves.items() if _is_image_batch(v)]
        if len(images) != 1:
            problem = "no uint8 [B, H, W, C] image" if not images else f"{len(images)} images"
            raise ValueError(
                f"generic adapter: expected exactly one uint8 [B, H, W, C] image in the dict "
                f"observation, found {problem}; keys: {found}. "
                "Name the image with GenericAdapter(image_key=...)."
            )
        return leaves[images[0]]

    def actions(self, raw: np.ndarray) -> np.ndarray:
        return np.array(raw, dtype=np.float32, copy=True)

    def state(self, obs: Any) -> np.ndarray | None:
        if self.state_key is None:
            return None
        leaves = dict(_leaves(obs)) if isinstance(obs, Mapping) else {}
        if self.state_key not in leaves:
            raise ValueError(
                f"generic adapter: state_key {self.state_key!r} not in the observation; found "
                f"keys { {k: describe(v) for k, v in leaves.items()} }"
            )
        return _state_rows(leaves[self.state_key], f"observation[{self.state_key!r}]")


# The frame flips an adapter can undo (GenericAdapter's flip=; --flip on the command line).
FLIPS = (None, "vertical", "horizontal", "both")


def flip_images(batch: Any, flip: str | None) -> Any:
    """``[B, H, W, C]`` images (numpy, or a tensor kept on its device) flipped: ``vertical``
    reverses the rows, ``horizontal`` the columns, ``both`` turns them by 180 degrees."""
    axes = {None: (), "vertical": (1,), "horizontal": (2,), "both": (1, 2)}[flip]
    if not axes:
        return batch
    if is_tensor(batch):
        import torch

        return torch.flip(batch, dims=axes)
    return np.ascontiguousarray(np.flip(np.asarray(batch), axis=axes))


def _state_rows(value: Any, what: str) -> np.ndarray:
    """A state batch ``[B, D]`` (one row: the current state) or ``[B, S, D]`` as float32
    ``[B, S, D]``; a ``ValueError`` naming ``what`` otherwise."""
    array = np.asarray(value)
    if array.dtype.kind not in "fiu" or array.ndim not in (2, 3):
        raise ValueError(f"{what}: expected a numeric state [B, D] or [B, S, D]; found "
                         f"{describe(array)}")
    array = array.astype(np.float32)
    return array[:, None, :] if array.ndim == 2 else array


# The official closed-loop client appends these two sentences to the task (cosmos-framework
# ``closed_loop_eval.py``): the concat_view viewpoint template, then the left/right layout.
LIBERO_VIEW_SENTENCES = (
    "This video contains concatenated views from multiple camera perspectives.",
    "The left half shows the third-person view; the right half shows the wrist-mounted camera.",
)


def _append_sentence(prompt: str, sentence: str) -> str:
    if sentence in prompt:  # already augmented: appending twice would change the prompt
        return prompt
    prompt = prompt.rstrip()
    return prompt + (" " if prompt.endswith(".") else ". ") + sentence


class LiberoAdapter(Adapter):
    """LIBERO conventions for the Cosmos3 LIBERO checkpoints (cosmos-framework's recipe).

    - Images: agentview and wrist frames, each rotated 180 degrees (the simulator renders them
      upside down relative to the training videos), resized to ``view_size`` squares (bilinear,
      as the official client does; 256 is what the recipe trained on) unless already that size,
      side by side with agentview on the left: ``[B, S, S, 3]`` x 2 -> ``[B, 256, 512, 3]``.
    - Prompt: the task plus the two concat-view sentences the checkpoint was trained with.
    - Actions: raw 10-D ``[dpos(3), rot6d(6), gripper(1)]`` -> 7-D ``[dpos, axis-angle, gripper]``;
      rot6d is projected onto SO(3) by SVD; the gripper goes from the data's ``[0, 1]`` to
      LIBERO's ``[-1, 1]`` with -1 = open: ``g' = -clip(2g - 1, -1, 1)``.
    - State: the env's 8-D ``state_key`` (end-effector position, axis-angle, the two gripper
      finger positions: LeRobot's and openpi's LIBERO state) as one ``[B, 1, 8]`` row. The
      official LIBERO recipe takes no state; a head conditioned on it must be 8-D-state trained.

    Args:
        agentview_key: observation key of the third-person camera batch.
        wrist_key: observation key of the wrist camera batch.
        binarize_gripper: send ``sign(g')`` instead of ``g'``; the i4 / cosmos-rl reference does
            this, which is more forgiving of weak checkpoints. The official client does not.
        view_size: side of each camera view fed to the model; ``None`` keeps the rendered size.
    """

    name = "libero"
    domain = "libero"
    raw_action_dim = 10

    def __init__(
        self,
        agentview_key: str = "agentview_image",
        wrist_key: str = "wrist_image",
        binarize_gripper: bool = False,
        view_size: int | None = 256,
        state_key: str = "state",
    ) -> None:
        self.agentview_key = agentview_key
        self.wrist_key = wrist_key
        self.binarize_gripper = binarize_gripper
        self.view_size = view_size
        self.state_key = state_key

    def images(self, obs: Any) -> np.ndarray:
        if not isinstance(obs, Mapping):
            raise ValueError(
                f"libero adapter: expected a dict observation with {self.agentview_key!r} and "
                f"{self.wrist_key!r}; found {describe(obs)}"
            )
        missing = [k for k in (self.agentview_key, self.wrist_key) if k not in obs]
        if missing:
            raise ValueError(
                f"libero adapter: observation lacks {missing}; found keys "
                f"{ {k: describe(v) for k, v in obs.items()} }"
            )
        # The 180-degree rotation and PIL's resize work on host arrays.
        agent = to_numpy(_check_image_batch(obs[self.agentview_key],
                                            f"observation[{self.agentview_key!r}]"))
        wrist = to_numpy(_check_image_batch(obs[self.wrist_key],
                                            f"observation[{self.wrist_key!r}]"))
        if agent.shape[:2] != wrist.shape[:2] or agent.shape[3] != wrist.shape[3]:
            raise ValueError(
                f"libero adapter: agentview and wrist batches must share [B, H, :, C] to sit side "
                f"by side; found {list(agent.shape)} and {list(wrist.shape)}"
            )
        # [B, H, W, C]: reversing H and W is a 180-degree rotation.
        views = [self._resize(agent[:, ::-1, ::-1]), self._resize(wrist[:, ::-1, ::-1])]
        return np.concatenate(views, axis=2)

    def _resize(self, batch: np.ndarray) -> np.ndarray:
        size = self.view_size
        if size is None or batch.shape[1:3] == (size, size):
            return batch
        return np.stack([
            np.asarray(Image.fromarray(np.ascontiguousarray(img)).resize(
                (size, size), Image.Resampling.BILINEAR))
            for img in batch
        ])

    def prompt(self, task: str) -> str:
        for sentence in LIBERO_VIEW_SENTENCES:
            task = _append_sentence(task, sentence)
        return task

    def state(self, obs: Any) -> np.ndarray | None:
        if not isinstance(obs, Mapping) or self.state_key not in obs:
            found = {k: describe(v) for k, v in obs.items()} if isinstance(obs, Mapping) else (
                describe(obs))
            raise ValueError(
                f"libero adapter: expected the state under {self.state_key!r} (render the env "
                f"with its state); found {found}"
            )
        return _state_rows(obs[self.state_key], f"observation[{self.state_key!r}]")

    def actions(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw)
        if raw.ndim != 3 or raw.shape[-1] != self.raw_action_dim:
            raise ValueError(
                f"libero adapter: expected raw actions [B, H, {self.raw_action_dim}] "
                f"(dpos, rot6d, gripper); found {list(raw.shape)}"
            )
        gripper = -np.clip(2.0 * raw[..., 9:10] - 1.0, -1.0, 1.0)
        if self.binarize_gripper:
            gripper = np.sign(gripper)
        out = np.concatenate([raw[..., 0:3], rot6d_to_axis_angle(raw[..., 3:9]), gripper], axis=-1)
        return out.astype(np.float32)


class DroidAdapter(Adapter):
    """The official DROID server's conventions (cosmos-framework
    ``action_policy_server_robolab.py``) for ``nvidia/Cosmos3-{Nano,Edge}-Policy-DROID``
    (``recipe="nano-policy-droid"`` / ``"edge-policy-droid"``), with the RoboArena/openpi DROID
    observation keys.

    - Images: ``observation/image`` if the observation has it, else the wrist camera on top of
      both exterior cameras, each resized (bilinear) to half the wrist image's height and width
      and side by side; then resized to ``image_size`` (540 x 640) where it differs.
    - State: one row ``[joint_position(7), 1 - gripper_position]`` (the last of a history).
    - Actions: raw 8-D ``[7 joint positions, gripper]`` -> the gripper flipped back, ``1 - g``.

    >>> adapter = DroidAdapter()
    >>> float(adapter.actions(np.array([[[0.0] * 7 + [0.25]]], np.float32))[0, 0, -1])
    0.75
    """

    name = "droid"
    domain = "droid_lerobot"
    raw_action_dim = 8
    WRIST, EXTERIOR_1, EXTERIOR_2 = (
        "observation/wrist_image_left", "observation/exterior_image_1_left",
        "observation/exterior_image_2_left",
    )
    IMAGE = "observation/image"
    JOINTS, GRIPPER = "observation/joint_position", "observation/gripper_position"

    def __init__(self, image_size: tuple[int, int] = (540, 640)) -> None:
        self.image_size = image_size

    def images(self, obs: Any) -> np.ndarray:
        if isinstance(obs, Mapping) and self.IMAGE in obs:
            image = _check_image_batch(obs[self.IMAGE], f"observation[{self.IMAGE!r}]")
        else:
            missing = [k for k in (self.WRIST, self.EXTERIOR_1, self.EXTERIOR_2)
                       if not isinstance(obs, Mapping) or k not in obs]
            if missing:
                raise ValueError(
                    f"droid adapter: observation lacks {missing} (or {self.IMAGE!r}); found "
                    f"{describe(obs) if not isinstance(obs, Mapping) else sorted(obs)}"
                )
            wrist = _check_image_batch(obs[self.WRIST], f"observation[{self.WRIST!r}]")
            half = (wrist.shape[1] // 2, wrist.shape[2] // 2)
            exteriors = [_resize_bilinear(_check_image_batch(obs[k], f"observation[{k!r}]"), half)
                         for k in (self.EXTERIOR_1, self.EXTERIOR_2)]
            image = np.concatenate([wrist, np.concatenate(exteriors, axis=2)], axis=1)
        if image.shape[1:3] != tuple(self.image_size):
            image = _resize_bilinear(image, self.image_size)
        return image

    def state(self, obs: Any) -> np.ndarray | None:
        missing = [k for k in (self.JOINTS, self.GRIPPER)
                   if not isinstance(obs, Mapping) or k not in obs]
        if missing:
            raise ValueError(f"droid adapter: observation lacks {missing} for the state row")
        joints = np.asarray(obs[self.JOINTS], dtype=np.float32)
        gripper = np.asarray(obs[self.GRIPPER], dtype=np.float32)
        joints = joints[:, -1] if joints.ndim == 3 else joints  # the last of a history
        gripper = gripper.reshape(gripper.shape[0], -1)[:, -1:]
        if joints.ndim != 2 or joints.shape[1] != 7 or gripper.shape[0] != joints.shape[0]:
            raise ValueError(
                f"droid adapter: expected joint positions [B, 7] and gripper [B] or [B, 1]; "
                f"found {describe(joints)} and {describe(gripper)}"
            )
        return np.concatenate([joints, 1.0 - gripper], axis=1)[:, None, :]

    def actions(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw)
        if raw.ndim != 3 or raw.shape[-1] != self.raw_action_dim:
            raise ValueError(
                f"droid adapter: expected raw actions [B, H, {self.raw_action_dim}] (7 joint "
                f"positions, gripper); found {list(raw.shape)}"
            )
        out = np.array(raw, dtype=np.float32, copy=True)
        out[..., -1] = 1.0 - out[..., -1]
        return out


def _resize_bilinear(batch: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """uint8 ``[B, H, W, C]`` -> ``[B, *size, C]`` as the DROID server resizes: bilinear, no
    corner alignment, values truncated back to uint8."""
    import torch
    import torch.nn.functional as F

    x = torch.from_numpy(np.ascontiguousarray(batch)).permute(0, 3, 1, 2).float()
    x = F.interpolate(x, size=tuple(size), mode="bilinear", align_corners=False)
    return x.permute(0, 2, 3, 1).numpy().astype(np.uint8)


def resize_with_pad(images: np.ndarray, height: int, width: int) -> np.ndarray:
    """uint8 ``[B, h, w, C]`` images fitted into ``height x width`` with their aspect kept: scaled
    by ``1 / max(w / width, h / height)`` (sizes truncated), PIL bilinear, centred on black
    (the offsets truncated too). Images already of that size are returned as they are. This is
    the resize-with-pad of openpi's client that LeRobot's Cosmos3 processor composes views
    with."""
    if images.shape[1:3] == (height, width):
        return images
    out = np.zeros((images.shape[0], height, width, images.shape[3]), np.uint8)
    for k, image in enumerate(images):
        h, w = image.shape[:2]
        ratio = max(w / width, h / height)
        new_h, new_w = int(h / ratio), int(w / ratio)
        plane = np.ascontiguousarray(image[..., 0] if image.shape[-1] == 1 else image)
        resized = np.asarray(Image.fromarray(plane).resize(
            (new_w, new_h), Image.Resampling.BILINEAR)).reshape(new_h, new_w, -1)
        top, left = max(0, int((height - new_h) / 2)), max(0, int((width - new_w) / 2))
        out[k, top : top + new_h, left : left + new_w] = resized
    return out


def compose_views(views: list[np.ndarray], *, num_views: int, primary_height: int,
                  canvas_hw: tuple[int, int]) -> np.ndarray:
    """LeRobot's Cosmos3 canvas of uint8 ``[B, H_k, W_k, 3]`` camera batches: ``views[0]``
    across the top ``primary_height`` rows, the others side by side in the rows below (each
    ``canvas_w // (num_views - 1)`` wide, the row padded with black on the right), each fitted
    with :func:`resize_with_pad`; views missing up to ``num_views`` are black. One view fills the
    whole canvas.

    >>> a, b = np.full((1, 4, 4, 3), 9, np.uint8), np.full((1, 2, 4, 3), 5, np.uint8)
    >>> canvas = compose_views([a, b], num_views=2, primary_height=4, canvas_hw=(6, 4))
    >>> canvas.shape, int(canvas[0, 0, 0, 0]), int(canvas[0, 5, 0, 0])
    ((1, 6, 4, 3), 9, 5)
    """
    height, width = canvas_hw
    views = list(views) + [np.zeros_like(views[0])] * (num_views - len(views))
    if len(views) == 1:
        return resize_with_pad(views[0], height, width)
    top = resize_with_pad(views[0], primary_height, width)
    bottom_h, tile_w = height - primary_height, width // (len(views) - 1)
    bottom = np.concatenate([resize_with_pad(v, bottom_h, tile_w) for v in views[1:]], axis=2)
    if bottom.shape[2] < width:
        bottom = np.pad(bottom, ((0, 0), (0, 0), (0, width - bottom.shape[2]), (0, 0)))
    return np.concatenate([top, bottom], axis=1)


# LeRobot's LIBERO observation keys, and the cameras of this project's LIBERO env they are
# (LeRobot's envs/libero.py camera_name_mapping: agentview_image -> image, the wrist camera ->
# image2); LeRobot's LiberoProcessorStep rotates both 180 degrees (flips H and W).
LEROBOT_LIBERO_VIEWS = {"observation.images.image": "agentview_image",
                        "observation.images.image2": "wrist_image"}
_LEROBOT_IMAGE_PREFIX = "observation.images."


class LeRobotViewsAdapter(Adapter):
    """The observation contract of a LeRobot Cosmos3 folder: its ``image_keys`` composed into
    one canvas as LeRobot's processor does (:func:`compose_views`), the task as the prompt (the
    pipeline writes LeRobot's caption around it), the state from ``observation.state``.

    Each image key is read from the observation under its own name (LeRobot's
    ``observation.images.X``), or as ``X``; for LeRobot's LIBERO keys, a LIBERO observation of
    this project's env (``agentview_image``, ``wrist_image``) is turned into what LeRobot's
    LIBERO env gives its policy: each camera rotated 180 degrees. Actions: a ``libero`` head's
    10-D ``[dpos, rot6d, gripper]`` become LIBERO's 7-D ones as :class:`LiberoAdapter` makes them
    (rot6d to axis-angle, the gripper from ``[0, 1]`` to ``-1`` open / ``+1`` closed); other
    heads' actions pass unchanged.

    Another env's cameras are mapped onto the checkpoint's with ``image_key`` (the command
    line's ``--image-key``): one observation key per checkpoint camera, in the checkpoint's
    order (``cosmos3-gym inspect`` lists them), ``"a/b"`` for a nested key; ``state_key`` names
    the env's state where the head takes one, and ``flip`` undoes the env's frame convention
    (:data:`FLIPS`) on each mapped camera.

    Args:
        contract: the folder's :class:`~cosmos3_gym.formats.ObservationContract`.
        image_key: the env's camera key(s) standing for the checkpoint's image keys, in order.
        state_key: the env's key of the robot state (default: the checkpoint's, or ``state``).
        flip: a flip of each mapped camera's frames.

    >>> from cosmos3_gym.formats import ObservationContract
    >>> contract = ObservationContract("lerobot", ("observation.images.top",), canvas_hw=(4, 4),
    ...                                primary_height=4)
    >>> adapter = LeRobotViewsAdapter(contract, image_key="pixels/top")
    >>> adapter.images({"pixels": {"top": np.full((1, 4, 4, 3), 7, np.uint8)}})[0, 0, 0].tolist()
    [7, 7, 7]
    """

    name = "lerobot"

    def __init__(self, contract: Any, image_key: str | tuple[str, ...] | None = None,
                 state_key: str | None = None, flip: str | None = None) -> None:
        if contract.convention != "lerobot" or contract.canvas_hw is None:
            raise ValueError(f"lerobot adapter: expected a LeRobot folder's contract; found "
                             f"{contract}")
        if flip not in FLIPS:
            raise ValueError(f"lerobot adapter: flip must be one of {FLIPS}; found {flip!r}")
        self.contract = contract
        self.domain = contract.domain
        self.cameras = _camera_map(contract.image_keys, image_key)
        self.state_key = state_key
        self.flip = flip

    def _view(self, obs: Mapping[str, Any], key: str) -> np.ndarray:
        mapped = self.cameras.get(key)
        if mapped is not None:
            leaves = dict(_leaves(obs))
            if mapped not in leaves:
                raise ValueError(f"lerobot adapter: --image-key {mapped!r} (the checkpoint's "
                                 f"{key!r}) is not in the observation; found keys "
                                 f"{sorted(leaves)}")
            image = _check_image_batch(leaves[mapped], f"observation[{mapped!r}]")
            return to_numpy(flip_images(image, self.flip))
        short = key[len(_LEROBOT_IMAGE_PREFIX):] if key.startswith(_LEROBOT_IMAGE_PREFIX) else None
        for name in (key, short):
            if name is not None and name in obs:
                return to_numpy(_check_image_batch(obs[name], f"observation[{name!r}]"))
        libero = LEROBOT_LIBERO_VIEWS.get(key)
        if libero is not None and libero in obs:
            image = to_numpy(_check_image_batch(obs[libero], f"observation[{libero!r}]"))
            return np.ascontiguousarray(image[:, ::-1, ::-1])  # LeRobot's 180-degree rotation
        raise ValueError(
            f"lerobot adapter: the checkpoint's image key {key!r} is not in the observation"
            + (f" (nor {short!r})" if short else "")
            + (f" (nor this project's LIBERO camera {libero!r})" if libero else "")
            + f"; found keys {sorted(obs)}")

    def images(self, obs: Any) -> np.ndarray:
        c = self.contract
        if not isinstance(obs, Mapping):
            if len(c.image_keys) == 1:
                obs = {c.image_keys[0]: obs}
            else:
                raise ValueError(f"lerobot adapter: expected a dict observation with "
                                 f"{list(c.image_keys)}; found {describe(obs)}")
        views = [self._view(obs, key) for key in c.image_keys]
        if len({v.shape[0] for v in views}) != 1:
            raise ValueError(f"lerobot adapter: camera batches of different sizes "
                             f"{[list(v.shape) for v in views]}")
        return compose_views(views, num_views=c.num_views, primary_height=c.primary_height,
                             canvas_hw=c.canvas_hw)

    def state(self, obs: Any) -> np.ndarray | None:
        key = self.contract.state_key
        if key is None:
            return None
        leaves = dict(_leaves(obs)) if isinstance(obs, Mapping) else {}
        names = (self.state_key,) if self.state_key is not None else (key, "state")
        for name in names:
            if name in leaves:
                return _state_rows(leaves[name], f"observation[{name!r}]")
        found = sorted(leaves) if isinstance(obs, Mapping) else describe(obs)
        raise ValueError(f"lerobot adapter: the checkpoint takes the robot state from "
                         f"{names[0]!r}; found {found}")

    def actions(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw, dtype=np.float32)
        if self.domain == "libero" and raw.ndim == 3 and raw.shape[-1] == 10:
            return LiberoAdapter().actions(raw)
        return raw.copy()


def _camera_map(declared: tuple[str, ...], image_key: str | tuple[str, ...] | None
                ) -> dict[str, str]:
    """The checkpoint's camera keys -> the env's (``image_key``, one per camera, in order).

    >>> _camera_map(("observation.images.top", "observation.images.wrist"), ("a", "b/c"))
    {'observation.images.top': 'a', 'observation.images.wrist': 'b/c'}
    """
    if image_key is None:
        return {}
    keys = (image_key,) if isinstance(image_key, str) else tuple(image_key)
    if len(keys) != len(declared):
        raise ValueError(
            f"--image-key {','.join(keys)}: the checkpoint reads {len(declared)} camera"
            f"{'' if len(declared) == 1 else 's'} ({', '.join(declared)}); give one observation "
            f"key of the env per camera, in that order (--image-key "
            f"{','.join(f'KEY{k + 1}' for k in range(len(declared)))})")
    return dict(zip(declared, keys, strict=True))


def adapter_for_contract(contract: Any, env_options: Mapping[str, Any] | None = None
                         ) -> Adapter:
    """The adapter a checkpoint's declared observation contract asks for: LeRobot's view
    composition for a LeRobot folder, the official LIBERO client's conventions for a
    cosmos-framework LIBERO export.

    ``env_options`` are the env family's adapter options (its ``adapter_options``: the command
    line's ``--image-key``, ``--state-key``, ``--flip``, or a preset's): a LeRobot folder's
    cameras are mapped onto the ``image_key`` cameras (:class:`LeRobotViewsAdapter`), and a
    contract that reads fixed cameras (LIBERO's) refuses them rather than ignore them."""
    options = {k: v for k, v in (env_options or {}).items() if v is not None}
    if contract.convention == "lerobot":
        return LeRobotViewsAdapter(contract, **options)
    if contract.convention == "cosmos-framework-libero":
        if "image_key" in options:
            raise ValueError(
                f"--image-key {options['image_key']!r}: the checkpoint declares the official "
                "LIBERO client's cameras (agentview_image and wrist_image, rotated 180 "
                "degrees), which --env libero gives; another env's cameras cannot stand for "
                "them")
        return LiberoAdapter()
    raise ValueError(f"unknown observation contract {contract.convention!r}")


class MetaWorldAdapter(Adapter):
    """Meta-World conventions: one upright camera, the task as the prompt, 4-D actions.

    - Images: ``obs["image"]`` as the env gives it (:class:`~cosmos3_gym.envs.MetaWorldEnv`
      turns Meta-World's upside-down corner cameras upright already).
    - Actions: raw ``[dpos(3), gripper(1)]`` (4-D), or LIBERO's 10-D
      ``[dpos(3), rot6d(6), gripper(1)]`` (Meta-World has no hand rotation: rot6d is dropped),
      to Meta-World's ``[dxyz, effort]``. The gripper follows the convention of the Cosmos3
      action data, ``[0, 1]`` with 1 = open (as :class:`LiberoAdapter` reads it), while
      Meta-World's effort closes at +1: ``effort = -clip(2g - 1, -1, 1)``.
      :meth:`raw_actions` is the inverse (what the expert tests drive the env through).

    >>> adapter = MetaWorldAdapter()
    >>> adapter.actions(np.array([[[0.5, 0.0, -0.2, 0.0]]], np.float32)).tolist()
    [[[0.5, 0.0, -0.20000000298023224, 1.0]]]
    """

    name = "metaworld"
    domain = "metaworld"
    _raw_widths = (4, 10)

    def __init__(self, image_key: str = "image") -> None:
        self.image_key = image_key

    def images(self, obs: Any) -> np.ndarray:
        if not isinstance(obs, Mapping) or self.image_key not in obs:
            raise ValueError(
                f"metaworld adapter: expected a dict observation with {self.image_key!r}; "
                f"found {describe(obs)}"
            )
        return _check_image_batch(obs[self.image_key], f"observation[{self.image_key!r}]")

    def actions(self, raw: np.ndarray) -> np.ndarray:
        raw = np.asarray(raw)
        if raw.ndim != 3 or raw.shape[-1] not in self._raw_widths:
            raise ValueError(
                "metaworld adapter: expected raw actions [B, H, 4] (dpos, gripper) or "
                f"[B, H, 10] (dpos, rot6d, gripper); found {list(raw.shape)}"
            )
        effort = -np.clip(2.0 * raw[..., -1:] - 1.0, -1.0, 1.0)
        return np.concatenate([raw[..., 0:3], effort], axis=-1).astype(np.float32)

    @staticmethod
    def raw_actions(env_actions: np.ndarray) -> np.ndarray:
        """The inverse of :meth:`actions` for 4-D raw actions: Meta-World ``[..., 4]`` actions
        (effort in ``[-1, 1]``) -> raw ``[..., 4]`` with the gripper in ``[0, 1]``."""
        env_actions = np.asarray(env_actions, dtype=np.float32)
        gripper = (1.0 - np.clip(env_actions[..., 3:4], -1.0, 1.0)) / 2.0
        return np.concatenate([env_actions[..., 0:3], gripper], axis=-1)


class BoxActionAdapter(Adapter):
    """Another adapter's images and prompts, with its actions mapped from the model's normalised
    range ``[-1, 1]`` onto an env's ``Box`` bounds, affinely and per dimension:

        ``a = low + (x + 1) / 2 * (high - low)``

    so -1 lands on ``low``, +1 on ``high`` and 0 in the middle. For checkpoints whose actions
    come out normalised (no statistics, or ``normalization="none"``) driving an env that takes
    another range: gym-pusht's ``Box(0, 512, (2,))`` pixel targets, for instance. An action
    outside ``[-1, 1]`` is clipped onto the box's bounds, and how far it lay outside (in the
    env's units, the largest dimension's excess) is :meth:`clip_excess`: the runner records it
    per episode (``clipped_steps``, ``max_clip``). Command line: ``--action-map box``.

    Args:
        action_space: the env's single action space, a 1-D ``Box`` with finite bounds.
        base: the adapter whose images, prompt and actions this one maps (default: generic).

    >>> from gymnasium.spaces import Box
    >>> adapter = BoxActionAdapter(Box(0.0, 512.0, (2,), np.float32))
    >>> adapter.actions(np.array([[[-1.0, 0.0], [1.0, 0.5]]], np.float32)).tolist()
    [[[0.0, 256.0], [512.0, 384.0]]]
    >>> raw = np.array([[[1.5, 0.0]]], np.float32)                  # 0.5 beyond +1
    >>> adapter.actions(raw).tolist(), adapter.clip_excess(raw).tolist()
    ([[[512.0, 256.0]]], [[128.0]])
    """

    name = "box"

    def __init__(self, action_space: Any, base: str | Adapter = "generic") -> None:
        if not isinstance(action_space, Box) or len(action_space.shape) != 1:
            raise ValueError(
                f"box action map: expected a 1-D Box action space; found {action_space}"
            )
        low = np.asarray(action_space.low, np.float64)
        high = np.asarray(action_space.high, np.float64)
        if not (np.isfinite(low).all() and np.isfinite(high).all()):
            unbounded = np.flatnonzero(~np.isfinite(low + high)).tolist()
            raise ValueError(
                f"box action map: every bound must be finite to map [-1, 1] onto it; found "
                f"{action_space} (unbounded dims {unbounded})"
            )
        self.base = get_adapter(base)
        self.domain = self.base.domain
        self.action_space = action_space
        self._low, self._scale = low, (high - low) / 2.0

    def images(self, obs: Any) -> Any:
        return self.base.images(obs)

    def prompt(self, task: str) -> str:
        return self.base.prompt(task)

    def actions(self, raw: np.ndarray) -> np.ndarray:
        return np.clip(self._mapped(raw), self._low, self._low + 2.0 * self._scale
                       ).astype(np.float32)

    def clip_excess(self, raw: np.ndarray) -> np.ndarray:
        """``[B, H]``: how far each mapped action lay outside the box before :meth:`actions`
        clipped it (the largest excess over its dimensions, in the env's units; 0 inside)."""
        mapped = self._mapped(raw)
        high = self._low + 2.0 * self._scale
        excess = np.maximum(np.maximum(mapped - high, self._low - mapped), 0.0)
        return excess.max(axis=-1).astype(np.float32)

    def _mapped(self, raw: np.ndarray) -> np.ndarray:
        actions = np.asarray(self.base.actions(raw), np.float64)
        width = self._low.shape[0]
        if actions.ndim != 3 or actions.shape[-1] != width:
            raise ValueError(
                f"box action map: expected {self.base.name!r} actions [B, H, {width}] (the Box's "
                f"width, {self.action_space}); found {list(actions.shape)}"
            )
        return self._low + (actions + 1.0) * self._scale

    def env_action_dim(self, raw_action_dim: int) -> int:
        hook = getattr(self.base, "env_action_dim", None)
        width = hook(raw_action_dim) if callable(hook) else Adapter.env_action_dim(
            self.base, raw_action_dim)
        if width != self._low.shape[0]:
            raise ValueError(
                f"it maps {self.base.name!r} actions of the Box's own width "
                f"({self._low.shape[0]}) onto it; found {width}-D"
            )
        return width

    def __repr__(self) -> str:
        return f"{type(self).__name__}(base={self.base!r}, action_space={self.action_space})"


# How --action-map maps an adapter's actions onto the env's action space (None: unchanged).
ACTION_MAPS = ("box",)


def action_map_of(given: str | None, eval_env: Any) -> str | None:
    """The action map a run applies: ``--action-map`` where given (``"none"``: unchanged),
    else the env's own (a benchmark preset's ``action_map``), else none.

    >>> class PushT: action_map = "box"
    >>> action_map_of(None, PushT()), action_map_of("none", PushT())
    ('box', None)
    """
    chosen = given if given is not None else getattr(eval_env, "action_map", None)
    return None if chosen == "none" else chosen


def with_action_map(adapter: Adapter, action_map: str | None, action_space: Any) -> Adapter:
    """``adapter`` with its actions mapped onto ``action_space`` by ``action_map`` (one of
    :data:`ACTION_MAPS`, or ``None`` for unchanged)."""
    if action_map is None:
        return adapter
    if action_map != "box":
        raise ValueError(f"unknown action map {action_map!r}; expected one of {ACTION_MAPS}")
    return BoxActionAdapter(action_space, base=adapter)


ADAPTERS: dict[str, type[Adapter]] = {
    "generic": GenericAdapter, "libero": LiberoAdapter, "metaworld": MetaWorldAdapter,
    "droid": DroidAdapter,
}


def check_action_fit(
    adapter: Adapter,
    raw_action_dim: int,
    domain: str | None,
    action_space: Any,
    *,
    checkpoint: str = "the checkpoint",
    env_label: str = "the env's",
    fix: str,
) -> None:
    """Refuse a checkpoint whose actions, through ``adapter``, are not as wide as the env's.

    Needs no model call and no simulator: the width comes from the checkpoint's description
    (``raw_action_dim``, ``domain``) and the adapter's :meth:`Adapter.env_action_dim`; the env's
    from its single action space (the last axis of a ``Box``; other spaces are not checked).
    The one ``ValueError`` names both widths, the domain, the space and ``fix``;
    ``checkpoint`` and ``env_label`` (possessive) name the two sides in it.

    >>> check_action_fit(GenericAdapter(), 10, "libero", Box(-1, 1, (2,)), fix="Fix: ...")
    Traceback (most recent call last):
    ...
    ValueError: the checkpoint's actions do not fit the env: the checkpoint makes 10-D actions (domain 'libero'), which the 'generic' adapter passes on as 10-D env actions, but the env's action space is Box(-1.0, 1.0, (2,), float32), 2-D. Fix: ...
    """  # noqa: E501
    if not isinstance(action_space, Box) or not action_space.shape:
        return
    expected = int(action_space.shape[-1])
    name = getattr(adapter, "name", type(adapter).__name__)
    made = f"{checkpoint} makes {raw_action_dim}-D actions (domain {domain!r})"
    space = f"{env_label} action space is {action_space}, {expected}-D"
    head = "the checkpoint's actions do not fit the env"
    hook = getattr(adapter, "env_action_dim", None)
    try:
        width = hook(raw_action_dim) if callable(hook) else Adapter.env_action_dim(
            adapter, raw_action_dim)  # a duck-typed adapter gets the default probe
    except ValueError as err:
        raise ValueError(
            f"{head}: {made}, which the {name!r} adapter cannot take ({err}), and {space}. {fix}"
        ) from None
    if width != expected:
        raise ValueError(
            f"{head}: {made}, which the {name!r} adapter passes on as {width}-D env actions, "
            f"but {space}. {fix}"
        )


def adapter_for_domain(domain: str | None) -> str | None:
    """The name of the built-in adapter made for checkpoints of ``domain``, if there is one.

    >>> adapter_for_domain("libero"), adapter_for_domain("color_reach")
    ('libero', None)
    """
    names = [name for name, cls in ADAPTERS.items() if domain is not None and cls.domain == domain]
    return names[0] if names else None


def get_adapter(adapter: str | Adapter, **options: Any) -> Adapter:
    """An adapter by name (``"generic"``, ``"libero"``; ``options`` go to its constructor), or
    the given object, checked."""
    if isinstance(adapter, str):
        if adapter not in ADAPTERS:
            raise ValueError(f"unknown adapter {adapter!r}; expected one of {sorted(ADAPTERS)}")
        return ADAPTERS[adapter](**options)
    if options:
        raise ValueError(f"adapter options {sorted(options)} apply to an adapter name; found "
                         f"the adapter {adapter!r}")
    methods = ("images", "prompt", "actions")
    missing = [m for m in methods if not callable(getattr(adapter, m, None))]
    if missing:
        raise TypeError(
            f"adapter {adapter!r} lacks the methods {missing}; expected an adapter name "
            f"{sorted(ADAPTERS)} or an object with images(obs), prompt(task) and actions(raw)"
        )
    return adapter
