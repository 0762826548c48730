"""Loading weights: safetensors only, strict keys, straight to the device.

This module reads tensors: a component's tensors wherever a checkpoint format keeps them
(:class:`~cosmos3_gym.formats.WeightFiles`: the files and how their names map to ours), whose
files :mod:`cosmos3_gym.formats` found and checked complete (headers only, no torch) before
anything is built.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from cosmos3_gym.model.config import Cosmos3Config

if TYPE_CHECKING:
    from cosmos3_gym.formats.base import CheckpointFolder, WeightFiles
    from cosmos3_gym.model.transformer import Cosmos3Transformer

# Kept in fp32 whatever the load dtype: the timestep MLP sees sinusoids of t*0.001, where bf16
# would lose the small differences between neighbouring timesteps.
KEEP_IN_FP32 = ("time_embedder.",)


def load_state_dict(
    folder: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    skip: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors folder onto ``device`` (cast to ``dtype`` if given)."""
    folder = Path(folder)
    return load_weights(_folder_weights(folder), device=device, dtype=dtype, skip=skip)


def _folder_weights(folder: Path) -> WeightFiles:
    """Every safetensors file of ``folder``, names as they are."""
    from cosmos3_gym.formats.base import Headers, WeightFiles, safetensors_files

    headers = Headers()
    return WeightFiles(tuple(safetensors_files(folder, headers)), lambda key: key, str(folder),
                       headers=headers)


class TensorFiles:
    """The safetensors files of one load, each opened once: components that share a file (a
    LeRobot folder's transformer and VAE live in one ``model.safetensors``) read it through the
    same handle. A context manager; the files close when it exits."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = str(torch.device(device))
        self._stack = contextlib.ExitStack()
        self._handles: dict[Path, object] = {}

    def __call__(self, path: Path) -> object:
        handle = self._handles.get(path)
        if handle is None:
            handle = self._handles[path] = self._stack.enter_context(
                safe_open(str(path), framework="pt", device=self.device))
        return handle

    def __enter__(self) -> TensorFiles:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stack.close()


def load_weights(
    weights: WeightFiles,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    skip: tuple[str, ...] = (),
    keep_in_fp32: tuple[str, ...] = KEEP_IN_FP32,
    files: TensorFiles | None = None,
) -> dict[str, torch.Tensor]:
    """One component's tensors onto ``device`` under their parameter names (``weights.rename``;
    names in ``skip`` are read past), floats cast to ``dtype`` if given except those under
    ``keep_in_fp32``; a name given twice is an error naming both places. ``files``: the open
    files of a load that reads several components (default: opened here for this one)."""
    device = torch.device(device)
    if files is None:
        with TensorFiles(device) as own:
            return load_weights(weights, device=device, dtype=dtype, skip=skip,
                                keep_in_fp32=keep_in_fp32, files=own)
    state: dict[str, torch.Tensor] = {}
    seen: dict[str, str] = {}
    for path in weights.files:
        f = files(path)
        for key in weights.headers(path):
            name = weights.rename(key)
            if name is None or name in skip:
                continue
            if name in state:
                raise ValueError(f"tensor {name!r} is given twice: {seen[name]} and {key!r} "
                                 f"in {path}")
            tensor = f.get_tensor(key).to(device)
            if dtype is not None and tensor.is_floating_point():
                keep = any(name.startswith(prefix) for prefix in keep_in_fp32)
                tensor = tensor.to(torch.float32 if keep else dtype)
            state[name], seen[name] = tensor, f"{key!r} in {path}"
    return state


def check_keys(model: torch.nn.Module, shapes: dict[str, Sequence[int]], source: str,
               what: str = "the Cosmos3 generator built from its config") -> None:
    """Raise a ValueError listing missing and unexpected keys, or shape mismatches, of the
    tensors ``shapes`` names (parameter name -> shape: a checkpoint's headers, read before any
    tensor is) against ``model``'s parameters and buffers."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(shapes))
    unexpected = sorted(set(shapes) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {source} does not match {what}: "
            f"missing keys {missing[:20]}{' ...' if len(missing) > 20 else ''} ({len(missing)}); "
            f"unexpected keys {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''} "
            f"({len(unexpected)})"
        )
    wrong = [
        f"{k}: checkpoint {tuple(shapes[k])} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if tuple(shapes[k]) != tuple(v.shape)
    ]
    if wrong:
        raise ValueError(f"checkpoint {source} has tensors of the wrong shape for {what}: "
                         f"{wrong[:20]}")


def meta_transformer(cls: type[Cosmos3Transformer], config: Cosmos3Config,
                     weights: WeightFiles) -> Cosmos3Transformer:
    """The generator of ``config`` built on the meta device (no memory), checked against the
    tensors ``weights``' headers give (:func:`check_keys`: every parameter given, no tensor left
    over, every shape right) before any tensor is read."""
    with torch.device("meta"):
        model = cls(config)
    shapes = {n: s for n, s in weights.shapes().items() if n not in cls.UNUSED_CHECKPOINT_KEYS}
    check_keys(model, shapes, weights.mapping)
    return model


def meta_vae(config: dict, weights: WeightFiles) -> torch.nn.Module:
    """diffusers' ``AutoencoderKLWan`` of ``config`` on the meta device, checked against the
    tensors ``weights``' headers give, as :func:`meta_transformer` checks the generator."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

    settings = {k: v for k, v in config.items() if not k.startswith("_")}
    try:
        with torch.device("meta"):
            vae = AutoencoderKLWan(**settings)
    except TypeError as err:
        raise ValueError(f"VAE config ({weights.mapping}): {err}") from None
    check_keys(vae, weights.shapes(), weights.mapping,
               what="the AutoencoderKLWan built from its config")
    return vae


def check_tensors(folder: CheckpointFolder) -> None:
    """Every tensor of ``folder``'s generator and VAE against the models their configs build,
    from the headers alone (no tensor is read): what :func:`build_transformer` and
    :func:`build_vae` check before they load, so a folder that passes loads."""
    from cosmos3_gym.model.transformer import Cosmos3Transformer

    meta_transformer(Cosmos3Transformer, folder.transformer, folder.transformer_weights)
    meta_vae(folder.vae_config, folder.vae_weights)


def load_transformer(
    cls: type[Cosmos3Transformer],
    folder: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> Cosmos3Transformer:
    """Build the generator from ``folder/config.json`` and load its weights strictly.

    The module is built on the meta device (no memory) and the tensors are assigned as read,
    so a 16B checkpoint is never materialised twice nor on the wrong device.
    """
    folder = Path(folder)
    config_path = folder / "config.json"
    if not config_path.exists():
        raise FileNotFoundError(f"no config.json in {folder} (expected a diffusers transformer/)")
    config = Cosmos3Config.from_json_file(config_path)
    return build_transformer(cls, config, _folder_weights(folder), device=device, dtype=dtype)


def build_transformer(
    cls: type[Cosmos3Transformer],
    config: Cosmos3Config,
    weights: WeightFiles,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    files: TensorFiles | None = None,
) -> Cosmos3Transformer:
    """The generator of ``config`` with ``weights`` loaded strictly (every parameter given, no
    tensor left over, every shape right).

    The module is built on the meta device (no memory) and the tensors are assigned as read,
    so a 16B checkpoint is never materialised twice nor on the wrong device.
    """
    model = meta_transformer(cls, config, weights)
    state = load_weights(weights, device=device, dtype=dtype, skip=cls.UNUSED_CHECKPOINT_KEYS,
                         files=files)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def build_vae(config: dict, weights: WeightFiles, *, device: str | torch.device = "cpu",
              files: TensorFiles | None = None) -> torch.nn.Module:
    """diffusers' ``AutoencoderKLWan`` of ``config`` with ``weights`` loaded strictly, in fp32
    (the VAE encodes one frame per request; fp32 keeps the conditioning latent exact)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

    settings = {k: v for k, v in config.items() if not k.startswith("_")}
    vae = meta_vae(config, weights)
    state = load_weights(weights, device=device, dtype=torch.float32, keep_in_fp32=(),
                         files=files)
    vae.load_state_dict(state, strict=True, assign=True)
    meta = [n for n, t in [*vae.named_parameters(), *vae.named_buffers()] if t.is_meta]
    if meta:  # a buffer the state dict does not hold: build it for real instead
        vae = AutoencoderKLWan(**settings)
        vae.load_state_dict(state, strict=True)
    return vae.to(device).eval().requires_grad_(False)


def save_transformer(model: Cosmos3Transformer, folder: str | Path) -> Path:
    """Write ``config.json`` + ``diffusion_pytorch_model.safetensors`` (diffusers layout), each
    file atomically."""
    from cosmos3_gym.jsonio import save_safetensors, write_text_atomic

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "config.json", json.dumps(model.config.to_dict(), indent=2))
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_safetensors(state, folder / "diffusion_pytorch_model.safetensors")
    return folder
