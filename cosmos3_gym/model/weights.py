"""Loading a diffusers ``transformer/`` folder: safetensors only, strict keys, straight to device.

This module is the one place that knows how transformer weights sit on disk:
``config.json`` plus ``diffusion_pytorch_model.safetensors`` or sharded
``*.safetensors`` with a ``*.safetensors.index.json``.
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
    folder = Path(folder)
    device = torch.device(device)
    state: dict[str, torch.Tensor] = {}
    for path in safetensors_files(folder):
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            for key in f.keys():
                if key in skip:
                    continue
                if key in state:
                    raise ValueError(f"tensor {key!r} appears in more than one shard of {folder}")
                tensor = f.get_tensor(key)
                if dtype is not None and tensor.is_floating_point():
                    keep = any(key.startswith(prefix) for prefix in KEEP_IN_FP32)
                    tensor = tensor.to(torch.float32 if keep else dtype)
                state[key] = tensor
    return state


def check_keys(model: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """Raise a ValueError listing missing and unexpected keys, or shape mismatches."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {source} does not match the Cosmos3 generator built from its config: "
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
        raise ValueError(f"checkpoint {source} has tensors of the wrong shape: {wrong[:20]}")


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
    with torch.device("meta"):
        model = cls(config)
    state = load_state_dict(folder, device=device, dtype=dtype, skip=cls.UNUSED_CHECKPOINT_KEYS)
    check_keys(model, state, str(folder))
    model.load_state_dict(state, strict=True, assign=True)
    return model.eval().requires_grad_(False)


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
