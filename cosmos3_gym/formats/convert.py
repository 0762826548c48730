"""``cosmos3-gym convert``: any format the readers take, written as a diffusers folder.

The output is the layout :mod:`cosmos3_gym.formats.diffusers` reads: ``transformer/`` and
``vae/`` (config and safetensors shards of at most :data:`SHARD_BYTES`, with an index where
there is more than one), ``text_tokenizer/``, ``model_index.json``, ``action_policy.json`` (the
head as the source declared it or a recipe named it, statistics included) and, where the source
declares one, ``observation_contract.json`` (how its observations become the model's image, so
the converted folder gets the same default adapter). Tensors are copied shard by shard, never
more than one shard in memory, bytes and dtypes as they are.

The folder is written whole (:func:`~cosmos3_gym.jsonio.staged_folder`): filled under a hidden
temporary name beside ``OUT`` and renamed to ``OUT`` at the end, so a kill or a full disk leaves
no ``OUT`` (or the empty one that was there), and the rerun removes what a killed run left.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from cosmos3_gym.checkpoint import (
    MODEL_INDEX,
    POLICY_CONFIG,
    TEXT_TOKENIZER,
    TRANSFORMER,
    VAE,
    PolicyConfig,
)
from cosmos3_gym.formats.base import CheckpointFolder, WeightFiles
from cosmos3_gym.jsonio import (
    copy_file_atomic,
    save_safetensors,
    staged_folder,
    write_json_atomic,
    write_text_atomic,
)

CONTRACT = "observation_contract.json"
SHARD_BYTES = 4 * 2**30


def write_contract(path: Path, contract: Any) -> None:
    data = dataclasses.asdict(contract)
    data["image_keys"] = list(data["image_keys"])
    write_json_atomic(path, data)


def read_contract(path: Path) -> Any:
    """An ``observation_contract.json`` as the :class:`ObservationContract` it holds."""
    from cosmos3_gym.formats.base import ObservationContract
    from cosmos3_gym.jsonio import read_json_object

    raw = read_json_object(path, what=CONTRACT)
    known = {f.name for f in dataclasses.fields(ObservationContract)}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; known: {sorted(known)}")
    if "image_keys" in raw:
        raw["image_keys"] = tuple(raw["image_keys"])
    if raw.get("canvas_hw") is not None:
        raw["canvas_hw"] = tuple(raw["canvas_hw"])
    return ObservationContract(**raw)


def _copy_tensors(weights: WeightFiles, out: Path, skip: tuple[str, ...] = ()) -> int:
    """Every tensor of ``weights`` under its parameter name into ``out``'s
    ``diffusion_pytorch_model*.safetensors``, a shard written as soon as it is full; returns
    how many tensors."""
    from safetensors import safe_open

    out.mkdir(parents=True, exist_ok=True)
    parts: list[tuple[Path, list[str]]] = []
    shard: dict[str, Any] = {}
    size = 0

    def flush() -> None:
        path = out / f".part-{len(parts):05d}.safetensors"
        save_safetensors(shard, path)
        parts.append((path, sorted(shard)))
        shard.clear()

    for path in weights.files:
        with safe_open(str(path), framework="pt") as f:
            for key in f.keys():
                name = weights.rename(key)
                if name is None or name in skip:
                    continue
                tensor = f.get_tensor(key).contiguous()
                nbytes = tensor.numel() * tensor.element_size()
                if shard and size + nbytes > SHARD_BYTES:
                    flush()
                    size = 0
                shard[name] = tensor
                size += nbytes
    flush()
    if len(parts) == 1:
        parts[0][0].rename(out / "diffusion_pytorch_model.safetensors")
        return len(parts[0][1])
    weight_map = {}
    for k, (path, names) in enumerate(parts, start=1):
        name = f"diffusion_pytorch_model-{k:05d}-of-{len(parts):05d}.safetensors"
        path.rename(out / name)
        weight_map.update({n: name for n in names})
    write_json_atomic(out / "diffusion_pytorch_model.safetensors.index.json",
                      {"metadata": {}, "weight_map": weight_map})
    return len(weight_map)


def convert(folder: CheckpointFolder, policy: PolicyConfig, contract: Any, out: str | Path
            ) -> Path:
    """Write ``folder`` (read by :func:`~cosmos3_gym.formats.read_checkpoint`) with the head
    ``policy`` and observation ``contract`` as a diffusers folder at ``out`` (which must not
    exist, or be empty), whole or not at all."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"{out} is a file; convert writes a new folder")
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty; convert writes a new folder")
    if out.resolve() == folder.root.resolve():
        raise ValueError("convert: the output folder is the source folder")
    with staged_folder(out) as tmp:
        _write(folder, policy, contract, tmp)
    return out


def _write(folder: CheckpointFolder, policy: PolicyConfig, contract: Any, out: Path) -> None:
    from cosmos3_gym.model.transformer import Cosmos3Transformer

    config = folder.transformer.to_dict()
    (out / TRANSFORMER).mkdir()
    write_text_atomic(out / TRANSFORMER / "config.json", json.dumps(config, indent=2))
    _copy_tensors(folder.transformer_weights, out / TRANSFORMER,
                  skip=Cosmos3Transformer.UNUSED_CHECKPOINT_KEYS)
    (out / VAE).mkdir()
    vae_config = {"_class_name": "AutoencoderKLWan",
                  **{k: v for k, v in folder.vae_config.items() if not k.startswith("_")}}
    write_text_atomic(out / VAE / "config.json", json.dumps(vae_config, indent=2))
    _copy_tensors(folder.vae_weights, out / VAE)
    tokenizer = out / TEXT_TOKENIZER
    tokenizer.mkdir()
    for file in sorted(folder.tokenizer.iterdir()):
        if file.is_file() and (file.suffix in (".json", ".jinja", ".txt", ".model", ".tiktoken")
                               or file.name == "merges.txt"):
            if file.name in ("config.json", "model.safetensors.index.json"):
                continue  # the export's model config, not the tokenizer's
            copy_file_atomic(file, tokenizer / file.name)
    write_text_atomic(out / MODEL_INDEX, json.dumps({
        "_class_name": "Cosmos3OmniPipeline", "converted_from": folder.format,
        "source": str(folder.root), "transformer": ["diffusers", "Cosmos3OmniTransformer"],
        "vae": ["diffusers", "AutoencoderKLWan"],
        "text_tokenizer": ["transformers", "AutoTokenizer"],
    }, indent=2))
    policy.save(out / POLICY_CONFIG)
    if contract is not None:
        write_contract(out / CONTRACT, contract)
