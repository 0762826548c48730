"""Admission: turn what a caller hands the pipeline into B RGB uint8 images and B prompts.

The rules follow sglang's Cosmos3 action batching (PR #36301), tightened where sglang was loose:

* Images come as a uint8 ``[B, H, W, C]`` array, a list/tuple of ``[H, W, C]`` / ``[H, W]``
  arrays, PIL images or file paths, or one such image (B = 1). Every array form may also be a
  torch tensor (a GPU simulator's observation): it stays a tensor on its own device, so images
  already on the pipeline's device reach preprocessing without a host round trip. A dict
  observation is accepted too: the first present of ``image``, ``image_path``,
  ``input_reference`` is used, otherwise ``images`` must be a dict with exactly one entry. Any
  field value may be any of the forms above; strings (and ``os.PathLike``) are local file paths
  opened with PIL. URLs and base64 payloads are a server's job and are not decoded here.
* Pixels must be uint8 (no silent rescaling of float images), rank 2 or 3, with 1, 3 or 4
  channels and non-zero height and width. Grayscale is repeated to RGB; RGBA drops its alpha
  channel (the same as PIL's ``convert("RGB")``: alpha is ignored, not composited).
* Prompts: a string is broadcast to all images, so is a one-element list; otherwise exactly one
  non-empty string per image. Unlike sglang, a whitespace-only prompt is rejected as empty.

Every error is a ``ValueError`` that names what was expected and what was found. Nothing the
caller passed is modified: each returned image is a fresh C-contiguous ``[H, W, 3]`` copy (a
numpy array, or a tensor on the device it came on).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

IMAGE_FIELDS = ("image", "image_path", "input_reference")
BATCH_IMAGE_FIELD = "images"

# PIL modes whose pixels are 8-bit and convert to RGB without loss of meaning.
_PIL_8BIT_MODES = frozenset({"RGB", "RGBA", "L", "LA", "P", "PA", "1", "CMYK", "YCbCr", "RGBX"})


AdmittedImage = np.ndarray | torch.Tensor  # one admitted image: uint8 [H, W, 3]


@dataclass(frozen=True)
class Admitted:
    """B validated observations: ``images[i]`` is uint8 ``[H_i, W_i, 3]`` (a numpy array or a
    tensor on its own device), ``prompts[i]`` a str."""

    images: list[AdmittedImage]
    prompts: list[str]

    @property
    def batch_size(self) -> int:
        return len(self.images)


def admit(images: Any, prompts: str | Sequence[str]) -> Admitted:
    """Validate images and prompts together; see the module docstring for the accepted forms.

    Example:
        >>> import numpy as np
        >>> batch = admit(np.zeros((2, 4, 6, 3), np.uint8), "pick up the bowl")
        >>> batch.batch_size, batch.images[0].shape, batch.prompts
        (2, (4, 6, 3), ['pick up the bowl', 'pick up the bowl'])
    """
    admitted_images = admit_images(images)
    admitted_prompts = admit_prompts(prompts, len(admitted_images))
    return Admitted(images=admitted_images, prompts=admitted_prompts)


def admit_images(images: Any) -> list[AdmittedImage]:
    """Return B fresh uint8 ``[H, W, 3]`` C-contiguous arrays (or tensors, on their device) from
    any accepted image form."""
    if isinstance(images, Mapping):
        images = _image_field(images)
    if isinstance(images, (np.ndarray, torch.Tensor)) and images.ndim == 4:
        if images.shape[0] == 0:
            raise ValueError("expected at least one image, got a [B, H, W, C] array with B=0")
        _check_channels_last(images)
        return [_to_rgb_uint8(images[i], f"image {i}") for i in range(images.shape[0])]
    if isinstance(images, (list, tuple)):
        if len(images) == 0:
            raise ValueError("expected at least one image, got an empty " + type(images).__name__)
        return [
            _to_rgb_uint8(_load_one(item, f"image {i}"), f"image {i}")
            for i, item in enumerate(images)
        ]
    if isinstance(images, np.ndarray) and images.ndim == 3 and images.shape[2] not in (1, 3, 4):
        # [B, H, W] or one image with an impossible channel count: say which shapes are taken.
        raise ValueError(
            f"image 0: expected 1, 3 or 4 channels, got {images.shape[2]} (a 3-D array is one "
            f"[H, W, C] image; found shape {list(images.shape)}: a batch of B grayscale images "
            "is [B, H, W, 1])"
        )
    return [_to_rgb_uint8(_load_one(images, "image 0"), "image 0")]


def _check_channels_last(images: np.ndarray | torch.Tensor) -> None:
    """Refuse a batch whose last axis cannot be channels, saying where they seem to be (torch
    vision code and LeRobot hold images channel-first, ``[B, C, H, W]``)."""
    shape = list(images.shape)
    if shape[-1] in (1, 3, 4):
        return
    tensor = isinstance(images, torch.Tensor)
    hint = ""
    if shape[1] in (1, 3, 4):
        move = "images.permute(0, 2, 3, 1)" if tensor else "images.transpose(0, 2, 3, 1)"
        hint = (f"; it looks channel-first [B, C, H, W] (C={shape[1]}): move the channels last "
                f"with {move}")
    raise ValueError(f"images: expected 1, 3 or 4 channels, got {shape[-1]} (a batch is "
                     f"channels-last [B, H, W, C]; found {'a tensor' if tensor else 'an array'} "
                     f"of shape {shape}{hint})")


def admit_prompts(prompts: str | Sequence[str], batch_size: int) -> list[str]:
    """Broadcast or pair prompts with ``batch_size`` images; see the module docstring."""
    if isinstance(prompts, str):
        _check_prompt(prompts, 0)
        return [prompts] * batch_size
    if not isinstance(prompts, (list, tuple)):
        raise ValueError(
            f"prompts: expected a str or a list/tuple of str, got {type(prompts).__name__}"
        )
    if len(prompts) == 0:
        raise ValueError("prompts: expected at least one prompt, got 0")
    for i, prompt in enumerate(prompts):
        _check_prompt(prompt, i)
    if len(prompts) == 1:
        return [prompts[0]] * batch_size
    if len(prompts) != batch_size:
        raise ValueError(
            f"expected one prompt per image (or a single prompt to broadcast), "
            f"got {len(prompts)} prompt(s) for {batch_size} image(s)"
        )
    return list(prompts)


def nonfinite(array: np.ndarray) -> str:
    """Where a batch ``[B, ...]`` holds values that are not finite, in words (the items, and
    which: NaN or infinity).

    >>> nonfinite(np.array([[0.0, np.nan], [np.inf, np.nan]]))
    'NaN in items [0, 1], infinity in items [1]'
    """
    found = []
    for word, mask in (("NaN", np.isnan(array)), ("infinity", np.isinf(array))):
        items = sorted({int(i) for i in np.argwhere(mask)[:, 0]})
        if items:
            found.append(f"{word} in items {items}")
    return ", ".join(found)


def _check_prompt(prompt: Any, index: int) -> None:
    if not isinstance(prompt, str):
        raise ValueError(f"prompt {index}: expected a non-empty str, got {type(prompt).__name__}")
    if not prompt.strip():
        raise ValueError(f"prompt {index}: expected a non-empty str, got {prompt!r}")


def _image_field(observation: Mapping[str, Any]) -> Any:
    """Pick the image value of a dict observation (sglang's field precedence)."""
    for key in IMAGE_FIELDS:
        if observation.get(key) is not None:
            return observation[key]
    batch = observation.get(BATCH_IMAGE_FIELD)
    if batch is None:
        raise ValueError(
            f"observation: expected one of the fields {[*IMAGE_FIELDS, BATCH_IMAGE_FIELD]}, "
            f"got keys {sorted(map(str, observation))}"
        )
    if not isinstance(batch, Mapping) or len(batch) != 1:
        found = f"a dict with {len(batch)} entries" if isinstance(batch, Mapping) else (
            type(batch).__name__
        )
        raise ValueError(
            f"observation['{BATCH_IMAGE_FIELD}']: expected a dict with exactly one entry (put "
            f"several images in a list or a [B, H, W, C] array inside it), got {found}"
        )
    return next(iter(batch.values()))


def _load_one(item: Any, where: str) -> np.ndarray:
    """One image as an ndarray (not yet validated); opens paths and converts PIL images."""
    if isinstance(item, (str, os.PathLike)):
        path = os.fspath(item)
        if not os.path.isfile(path):
            raise ValueError(f"{where}: expected an existing image file path, got {path!r}")
        with Image.open(path) as opened:
            return _pil_to_array(opened, where)
    if isinstance(item, Image.Image):
        return _pil_to_array(item, where)
    if isinstance(item, (np.ndarray, torch.Tensor)):
        if item.ndim not in (2, 3):
            raise ValueError(
                f"{where}: expected an [H, W] or [H, W, C] array, got shape {item.shape}"
            )
        return item
    raise ValueError(
        f"{where}: expected a uint8 ndarray, a PIL image or a file path, got {type(item).__name__}"
    )


def _pil_to_array(image: Image.Image, where: str) -> np.ndarray:
    if image.mode not in _PIL_8BIT_MODES:
        raise ValueError(f"{where}: expected an 8-bit PIL image, got mode {image.mode!r}")
    if image.mode not in ("RGB", "RGBA", "L"):
        image = image.convert("RGB")
    return np.asarray(image)


def _to_rgb_uint8(array: AdmittedImage, where: str) -> AdmittedImage:
    """Validate one image and return a fresh C-contiguous uint8 ``[H, W, 3]`` copy (a tensor's
    on its own device)."""
    if isinstance(array, torch.Tensor):
        return _tensor_to_rgb_uint8(array, where)
    if array.dtype != np.uint8:
        raise ValueError(f"{where}: expected uint8, got {array.dtype}")
    if array.ndim == 2:
        array = array[:, :, None]  # [H, W, 1]
    if array.ndim != 3:
        raise ValueError(f"{where}: expected an [H, W] or [H, W, C] array, got shape {array.shape}")
    height, width, channels = array.shape
    if height == 0 or width == 0:
        raise ValueError(f"{where}: expected non-zero height and width, got shape {array.shape}")
    if channels not in (1, 3, 4):
        raise ValueError(f"{where}: expected 1, 3 or 4 channels, got {channels}")
    if channels == 1:
        return np.ascontiguousarray(np.repeat(array, 3, axis=2))  # repeat always copies
    return np.array(array[:, :, :3], dtype=np.uint8, order="C", copy=True)


def _tensor_to_rgb_uint8(tensor: torch.Tensor, where: str) -> torch.Tensor:
    """:func:`_to_rgb_uint8` for a tensor: the same checks, the copy on the tensor's device."""
    if tensor.dtype != torch.uint8:
        raise ValueError(
            f"{where}: expected uint8, got {tensor.dtype} (a tensor on {tensor.device})"
        )
    if tensor.ndim == 2:
        tensor = tensor[:, :, None]  # [H, W, 1]
    if tensor.ndim != 3:
        raise ValueError(f"{where}: expected an [H, W] or [H, W, C] tensor, got shape "
                         f"{tuple(tensor.shape)}")
    height, width, channels = tensor.shape
    if height == 0 or width == 0:
        raise ValueError(f"{where}: expected non-zero height and width, got shape "
                         f"{tuple(tensor.shape)}")
    if channels not in (1, 3, 4):
        raise ValueError(f"{where}: expected 1, 3 or 4 channels, got {channels}")
    if channels == 1:
        return tensor.expand(height, width, 3).contiguous()  # a copy
    return tensor[:, :, :3].clone(memory_format=torch.contiguous_format)
