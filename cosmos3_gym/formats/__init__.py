"""Cosmos3 checkpoints as their owners ship them: three on-disk formats, one reader.

* ``diffusers``: ``transformer/``, ``vae/``, ``text_tokenizer/`` (the published
  ``nvidia/Cosmos3-*`` folders, and this project's own; :mod:`~cosmos3_gym.formats.diffusers`);
* ``lerobot``: a LeRobot policy folder (``lerobot/Cosmos3-*-Policy-LIBERO_10``, ...;
  :mod:`~cosmos3_gym.formats.lerobot`);
* ``cosmos-framework``: an export of cosmos-framework's ``export_model.py``
  (``nvidia/cosmos3-nano-libero10-sdg-export-R``, ...;
  :mod:`~cosmos3_gym.formats.cosmos_framework`).

:func:`read_checkpoint` tells them apart and reads each into a
:class:`~cosmos3_gym.formats.base.CheckpointFolder` without loading a weight: configs checked,
every weight file complete, every tensor name accounted for. The formats, their sources and
what could not be sourced: docs/checkpoints.md.
"""

from __future__ import annotations

from pathlib import Path

from cosmos3_gym.formats.base import CheckpointFolder, ObservationContract, WeightFiles

FORMATS = ("diffusers", "lerobot", "cosmos-framework")
SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints"


def resolve_checkpoint(path: str | Path) -> Path:
    """``path`` as a checkpoint folder, or a name of a checkpoint shipped in the package."""
    candidate = Path(path)
    if candidate.is_dir():
        return candidate
    shipped = SHIPPED / str(path)
    if shipped.is_dir():
        return shipped
    hint = ""
    if str(path) == "tiny":
        hint = ("; the tiny checkpoint is not shipped with this install (expected "
                "cosmos3_gym/checkpoints/tiny/): pass a checkpoint folder, e.g. one written by "
                "cosmos3_gym.tiny.write_tiny_checkpoint")
    if candidate.is_file():
        raise NotADirectoryError(f"--checkpoint {path} is a file; a checkpoint is a folder (the "
                                 f"one it is in: {candidate.parent}?)")
    raise FileNotFoundError(
        f"no checkpoint folder at {str(path)!r} (and no shipped checkpoint of that name); "
        f"expected a folder in one of the formats {', '.join(FORMATS)} (docs/checkpoints.md)"
        f"{hint}")


def detect_format(root: Path) -> str:
    """Which of :data:`FORMATS` the folder is in, from its files alone."""
    from cosmos3_gym.formats import cosmos_framework, diffusers, lerobot
    from cosmos3_gym.jsonio import read_json_object

    # The root config.json tells a LeRobot folder and an export apart (a diffusers folder's
    # configs are in its components' folders); one that does not parse is named now.
    if (root / "config.json").is_file():
        raw = read_json_object(root / "config.json", what="checkpoint config.json")
        if lerobot.is_lerobot_config(raw):
            return "lerobot"
        if cosmos_framework.is_export_config(raw):
            return "cosmos-framework"
    if diffusers.is_diffusers_folder(root):
        return "diffusers"
    found = sorted(p.name for p in root.iterdir())[:12]
    raise FileNotFoundError(
        f"{root} is not a Cosmos3 checkpoint in any known format (found {found}); expected a "
        "diffusers folder (transformer/, vae/, text_tokenizer/), a LeRobot policy folder "
        "(config.json of type cosmos3 with model.safetensors) or a cosmos-framework export "
        "(config.json with a \"model\" section and model-*.safetensors)")


def read_checkpoint(path: str | Path, *, vae: str | Path | None = None,
                    tokenizer: str | Path | None = None) -> CheckpointFolder:
    """The checkpoint at ``path`` (a folder, or a shipped name), read and checked without
    loading a weight. ``vae`` is the VAE of a cosmos-framework export (which holds none);
    ``tokenizer`` overrides the tokenizer a LeRobot folder names."""
    from cosmos3_gym.formats import cosmos_framework, diffusers, lerobot

    root = resolve_checkpoint(path)
    kind = detect_format(root)
    unused = [name for name, value in (("vae", vae), ("tokenizer", tokenizer))
              if value is not None and not (name == "vae" and kind == "cosmos-framework")
              and not (name == "tokenizer" and kind == "lerobot")]
    if unused:
        raise ValueError(f"{root} is a {kind} checkpoint, which brings its own "
                         f"{' and '.join(unused)}; --{' and --'.join(unused)} would not be used")
    if kind == "lerobot":
        return lerobot.read(root, tokenizer=tokenizer)
    if kind == "cosmos-framework":
        return cosmos_framework.read(root, vae=vae)
    return diffusers.read(root)


def contract_of(folder: CheckpointFolder, domain: str | None) -> ObservationContract | None:
    """The observation contract a checkpoint declares, for a head of ``domain``: a LeRobot
    folder's own; for a cosmos-framework LIBERO export the official LIBERO client's (the
    conventions its LIBERO post-training used: docs/libero.md); None otherwise (the env's
    adapter decides)."""
    if folder.contract is not None:
        return folder.contract
    if folder.format == "cosmos-framework" and domain == "libero":
        return ObservationContract(convention="cosmos-framework-libero", domain="libero")
    return None


__all__ = ["FORMATS", "CheckpointFolder", "ObservationContract", "WeightFiles",
           "contract_of", "detect_format", "read_checkpoint", "resolve_checkpoint"]
