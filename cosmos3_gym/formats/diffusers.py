"""The diffusers layout: one sub-folder per component, as ``Cosmos3OmniPipeline.save_pretrained``
writes the published ``nvidia/Cosmos3-*`` checkpoints.

``transformer/`` (``config.json`` + safetensors, sharded with an index or not), ``vae/`` (an
``AutoencoderKLWan`` folder), ``text_tokenizer/``, and optionally ``model_index.json``,
``scheduler/``, ``action_policy.json`` (how a fine-tuned head is used:
:class:`~cosmos3_gym.checkpoint.PolicyConfig`) and ``observation_contract.json`` (how the
observations become the model's image, where a converted LeRobot folder declared it:
:mod:`cosmos3_gym.formats.convert`). Tensor names are the generator's parameter
names as they are; nothing is renamed.
"""

from __future__ import annotations

from pathlib import Path

from cosmos3_gym.checkpoint import MODEL_INDEX, TEXT_TOKENIZER, TRANSFORMER, VAE
from cosmos3_gym.formats.base import CheckpointFolder, Headers, WeightFiles, inside
from cosmos3_gym.formats.convert import CONTRACT, read_contract
from cosmos3_gym.jsonio import read_json_object


def is_diffusers_folder(root: Path) -> bool:
    """A folder with any of the diffusers components (the reader names what it lacks)."""
    return any((root / name).is_dir() for name in (TRANSFORMER, VAE, TEXT_TOKENIZER)) or (
        root / MODEL_INDEX).is_file()


def component_weights(folder: Path, root: Path, headers: Headers) -> WeightFiles:
    """A diffusers component folder's safetensors, names as they are."""
    from cosmos3_gym.formats.base import safetensors_files

    files = tuple(inside(root, p, "weights") for p in safetensors_files(folder, headers))
    return WeightFiles(files, rename=lambda key: key,
                       mapping=f"{folder.relative_to(root)}/*.safetensors, names as they are",
                       headers=headers)


def vae_folder(folder: Path, root: Path, what: str, headers: Headers
               ) -> tuple[dict, WeightFiles]:
    """An ``AutoencoderKLWan`` folder's ``config.json`` and weights."""
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{what} {folder} has no config.json (expected a diffusers "
                                "AutoencoderKLWan folder: config.json and safetensors)")
    config = read_json_object(inside(root, folder / "config.json", "VAE config"),
                              what="VAE config.json")
    name = config.get("_class_name")
    if name is not None and name != "AutoencoderKLWan":
        raise ValueError(f"{folder / 'config.json'}: _class_name is {name!r}; expected "
                         "'AutoencoderKLWan' (the Wan VAE Cosmos3 uses)")
    return config, component_weights(folder, root, headers)


def read(root: Path, headers: Headers) -> CheckpointFolder:
    """A diffusers-layout folder, checked: every component present, configs and weights
    complete, nothing read from outside the folder."""
    from cosmos3_gym.model.config import Cosmos3Config

    missing = [name for name in (TRANSFORMER, VAE, TEXT_TOKENIZER) if not (root / name).is_dir()]
    if missing:
        raise FileNotFoundError(f"checkpoint {root} lacks {missing} (diffusers layout expected: "
                                f"{TRANSFORMER}/, {VAE}/ and {TEXT_TOKENIZER}/)")
    config_path = inside(root, root / TRANSFORMER / "config.json", "transformer config")
    transformer = Cosmos3Config.from_json_file(config_path)
    vae_config, vae_weights = vae_folder(root / VAE, root, "the VAE folder", headers)
    kind = None
    if (root / MODEL_INDEX).is_file():
        kind = read_json_object(inside(root, root / MODEL_INDEX, "model index"),
                                what=MODEL_INDEX).get("_class_name")
    tokenizer = inside(root, root / TEXT_TOKENIZER, "tokenizer")
    for file in tokenizer.iterdir():
        inside(root, file, "tokenizer file")
    contract = None
    if (root / CONTRACT).is_file():
        contract = read_contract(inside(root, root / CONTRACT, "observation contract"))
    return CheckpointFolder(
        root=root, format="diffusers", kind=kind, transformer=transformer,
        transformer_source=f"{TRANSFORMER}/config.json",
        transformer_weights=component_weights(root / TRANSFORMER, root, headers),
        vae_config=vae_config, vae_weights=vae_weights, vae_source=f"{VAE}/",
        tokenizer=tokenizer, tokenizer_source=f"{TEXT_TOKENIZER}/", contract=contract,
    )
