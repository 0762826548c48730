"""Loading weights: safetensors only, strict keys, straight to the device.

This module reads tensors: a folder's safetensors (``diffusion_pytorch_model.safetensors`` or
shards with a ``*.safetensors.index.json``), checked complete before anything is built, and a
component's tensors wherever a checkpoint format keeps them
(:class:`~cosmos3_gym.formats.WeightFiles`: the files and how their names map to ours).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open

from cosmos3_gym.jsonio import read_json_object
from cosmos3_gym.model.config import Cosmos3Config

if TYPE_CHECKING:
    from cosmos3_gym.formats import WeightFiles
    from cosmos3_gym.model.transformer import Cosmos3Transformer

_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")
# Kept in fp32 whatever the load dtype: the timestep MLP sees sinusoids of t*0.001, where bf16
# would lose the small differences between neighbouring timesteps.
KEEP_IN_FP32 = ("time_embedder.",)


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of ``folder``: the index's shards if there is one, else every file.

    Every shard an index names must lie inside ``folder`` (an entry such as ``../x`` or an
    absolute path is refused: a checkpoint reads nothing outside itself), and every file must be
    a complete safetensors file (its header read here, so a truncated download is named now).
    """
    indexes = sorted(folder.glob("*.safetensors.index.json"))
    if len(indexes) > 1:
        raise ValueError(f"{folder} holds several safetensors indexes: {[p.name for p in indexes]}")
    if indexes:
        index = read_json_object(indexes[0], what="safetensors index")
        weight_map = index.get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str)
                                                        for v in weight_map.values()):
            raise ValueError(f"{indexes[0]}: expected a 'weight_map' of tensor name -> shard "
                             "file name")
        root = folder.resolve()
        outside = sorted({name for name in weight_map.values()
                          if not (root / name).resolve().is_relative_to(root)})
        if outside:
            raise ValueError(f"{indexes[0]} names shards outside {folder}: {outside}; an index "
                             "may only name files inside its own folder")
        files = sorted({folder / name for name in weight_map.values()})
        missing = [p.name for p in files if not p.exists()]
        if missing:
            raise FileNotFoundError(
                f"{indexes[0].name} lists shards missing from {folder}: {missing}"
            )
        return [check_safetensors(p) for p in files]
    files = sorted(folder.glob("*.safetensors"))
    if files:
        return [check_safetensors(p) for p in files]
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in _PICKLE_SUFFIXES)
    if pickled:
        raise ValueError(
            f"{folder} offers only pickled weights {pickled}; cosmos3-gym loads safetensors only "
            "(pickle can run code). Convert them with safetensors.torch.save_file first."
        )
    raise FileNotFoundError(f"no *.safetensors weights in {folder}")


def check_safetensors(path: Path) -> Path:
    """``path`` if it is a complete safetensors file: its header parses and the file is as long
    as the header says; else a ``ValueError`` naming it (a cut download, a wrong file)."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as f:
            header_len = int.from_bytes(f.read(8), "little")
            if size < 8 or header_len <= 0 or 8 + header_len > size:
                raise ValueError("shorter than its header says")
            header = json.loads(f.read(header_len))
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"),
                  default=0)
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError) as err:
        raise ValueError(f"{path} is not a complete safetensors file ({err}); expected the "
                         "whole file (download or copy it again)") from None
    if 8 + header_len + end > size:
        raise ValueError(f"{path} is truncated: its header describes {8 + header_len + end} "
                         f"bytes, the file has {size}; download or copy it again")
    return path


def load_state_dict(
    folder: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    skip: tuple[str, ...] = (),
) -> dict[str, torch.Tensor]:
    """Read every tensor of a safetensors folder onto ``device`` (cast to ``dtype`` if given)."""
    from cosmos3_gym.formats import WeightFiles

    folder = Path(folder)
    weights = WeightFiles(tuple(safetensors_files(folder)), lambda key: key, str(folder))
    return load_weights(weights, device=device, dtype=dtype, skip=skip)


def load_weights(
    weights: WeightFiles,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    skip: tuple[str, ...] = (),
    keep_in_fp32: tuple[str, ...] = KEEP_IN_FP32,
) -> dict[str, torch.Tensor]:
    """One component's tensors onto ``device`` under their parameter names (``weights.rename``;
    names in ``skip`` are read past), floats cast to ``dtype`` if given except those under
    ``keep_in_fp32``; a name given twice is an error naming both places."""
    device = torch.device(device)
    state: dict[str, torch.Tensor] = {}
    seen: dict[str, str] = {}
    for path in weights.files:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():
                name = weights.rename(key)
                if name is None or name in skip:
                    continue
                if name in state:
                    raise ValueError(f"tensor {name!r} is given twice: {seen[name]} and {key!r} "
                                     f"in {path}")
                tensor = f.get_tensor(key)
                if dtype is not None and tensor.is_floating_point():
                    keep = any(name.startswith(prefix) for prefix in keep_in_fp32)
                    tensor = tensor.to(torch.float32 if keep else dtype)
                state[name], seen[name] = tensor, f"{key!r} in {path}"
    return state


def check_keys(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str,
               what: str = "the Cosmos3 generator built from its config") -> None:
    """Raise a ValueError listing missing and unexpected keys, or shape mismatches."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {source} does not match {what}: "
            f"missing keys {missing[:20]}{' ...' if len(missing) > 20 else ''} ({len(missing)}); "
            f"unexpected keys {unexpected[:20]}{' ...' if len(unexpected) > 20 else ''} "
            f"({len(unexpected)})"
        )
    wrong = [
        f"{k}: checkpoint {tuple(state[k].shape)} vs model {tuple(v.shape)}"
        for k, v in expected.items()
        if tuple(state[k].shape) != tuple(v.shape)
    ]
    if wrong:
        raise ValueError(f"checkpoint {source} has tensors of the wrong shape for {what}: "
                         f"{wrong[:20]}")


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
    from cosmos3_gym.formats import WeightFiles

    config = Cosmos3Config.from_json_file(config_path)
    weights = WeightFiles(tuple(safetensors_files(folder)), lambda key: key, str(folder))
    return build_transformer(cls, config, weights, device=device, dtype=dtype)


def build_transformer(
    cls: type[Cosmos3Transformer],
    config: Cosmos3Config,
    weights: WeightFiles,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
) -> Cosmos3Transformer:
    """The generator of ``config`` with ``weights`` loaded strictly (every parameter given, no
    tensor left over, every shape right).

    The module is built on the meta device (no memory) and the tensors are assigned as read,
    so a 16B checkpoint is never materialised twice nor on the wrong device.
    """
    with torch.device("meta"):
        model = cls(config)
    state = load_weights(weights, device=device, dtype=dtype, skip=cls.UNUSED_CHECKPOINT_KEYS)
    check_keys(model, state, weights.mapping)
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


def build_vae(config: dict, weights: WeightFiles, *, device: str | torch.device = "cpu"
              ) -> torch.nn.Module:
    """diffusers' ``AutoencoderKLWan`` of ``config`` with ``weights`` loaded strictly, in fp32
    (the VAE encodes one frame per request; fp32 keeps the conditioning latent exact)."""
    from diffusers.models.autoencoders.autoencoder_kl_wan import AutoencoderKLWan

    settings = {k: v for k, v in config.items() if not k.startswith("_")}
    try:
        with torch.device("meta"):
            vae = AutoencoderKLWan(**settings)
    except TypeError as err:
        raise ValueError(f"VAE config ({weights.mapping}): {err}") from None
    state = load_weights(weights, device=device, dtype=torch.float32, keep_in_fp32=())
    check_keys(vae, state, weights.mapping, what="the AutoencoderKLWan built from its config")
    vae.load_state_dict(state, strict=True, assign=True)
    meta = [n for n, t in [*vae.named_parameters(), *vae.named_buffers()] if t.is_meta]
    if meta:  # a buffer the state dict does not hold: build it for real instead
        vae = AutoencoderKLWan(**settings)
        vae.load_state_dict(state, strict=True)
    return vae.to(device).eval().requires_grad_(False)


def save_transformer(model: Cosmos3Transformer, folder: str | Path) -> Path:
    """Write ``config.json`` + ``diffusion_pytorch_model.safetensors`` (diffusers layout)."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "config.json", "w") as f:
        json.dump(model.config.to_dict(), f, indent=2)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(folder / "diffusion_pytorch_model.safetensors"))
    return folder
