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

import re
from dataclasses import replace
from pathlib import Path

from cosmos3_gym.formats.base import (
    CheckpointFolder,
    Headers,
    ObservationContract,
    WeightFiles,
)

FORMATS = ("diffusers", "lerobot", "cosmos-framework")
SHIPPED = Path(__file__).resolve().parent.parent / "checkpoints"


# A Hugging Face repository id, optionally at a revision: ``org/name`` or ``org/name@rev``.
_REPO_ID = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")


def resolve_checkpoint(path: str | Path) -> Path:
    """``path`` as a checkpoint folder: a folder, a name of a checkpoint shipped in the package,
    or a Hugging Face repository id (``lerobot/Cosmos3-Nano-Policy-LIBERO_10``, optionally
    ``@revision``) found through ``huggingface_hub``: its local cache first, else downloaded
    (never with ``HF_HUB_OFFLINE=1``). The snapshot folder it resolves to names the revision
    (:func:`revision_of`)."""
    candidate = Path(path)
    if candidate.is_dir():
        return candidate
    shipped = SHIPPED / str(path)
    if shipped.is_dir():
        return shipped
    if candidate.is_file():
        raise NotADirectoryError(f"--checkpoint {path} is a file; a checkpoint is a folder (the "
                                 f"one it is in: {candidate.parent}?)")
    match = _REPO_ID.match(str(path))
    # A relative path whose first folder exists here is a path, not a repository id.
    if match is not None and not Path(match["repo"].split("/")[0]).is_dir():
        return hub_snapshot(match["repo"], match["revision"])
    hint = ""
    if str(path) == "tiny":
        hint = ("; the tiny checkpoint is not shipped with this install (expected "
                "cosmos3_gym/checkpoints/tiny/): pass a checkpoint folder, e.g. one written by "
                "cosmos3_gym.tiny.write_tiny_checkpoint")
    raise FileNotFoundError(
        f"no checkpoint folder at {str(path)!r} (and no shipped checkpoint of that name); "
        f"expected a folder in one of the formats {', '.join(FORMATS)} (docs/checkpoints.md: "
        "a released Cosmos3 policy, or one written by `cosmos3-gym train --out DIR`), or a "
        f"Hugging Face repository id (org/name[@revision]){hint}")


def hub_snapshot(repo: str, revision: str | None) -> Path:
    """The snapshot folder of Hugging Face repository ``repo`` at ``revision`` (default: its
    main branch): the local cache's if it holds one, else downloaded, unless the hub is offline
    (``HF_HUB_OFFLINE=1``); one error naming the repository and the fix otherwise."""
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:  # pragma: no cover - a transformers dependency
        raise FileNotFoundError(f"{repo} looks like a Hugging Face repository id, and "
                                "huggingface_hub is not installed; give a folder") from None
    at = f"{repo}@{revision}" if revision else repo
    try:
        return Path(snapshot_download(repo, revision=revision, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    except Exception as err:  # noqa: BLE001 - a damaged cache entry: named, with the fix
        raise FileNotFoundError(f"{at}: the Hugging Face cache entry could not be read "
                                f"({type(err).__name__}: {err})") from None
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"no checkpoint folder at {at!r}, and the Hugging Face cache "
            f"({constants.HF_HUB_CACHE}) holds no snapshot of {at} while HF_HUB_OFFLINE is set; "
            f"download it where the hub is reachable (hf download {repo}"
            f"{' --revision ' + revision if revision else ''}) or give a folder")
    try:
        return Path(snapshot_download(repo, revision=revision))
    except Exception as err:  # noqa: BLE001 - unreachable hub, unknown repo: one line
        raise FileNotFoundError(
            f"no checkpoint folder at {at!r}, and it could not be fetched from the Hugging Face "
            f"hub ({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); give "
            "a folder, or download it first (hf download REPO)") from None


def revision_of(root: Path) -> str | None:
    """The commit a Hugging Face cache snapshot folder holds (``.../models--ORG--NAME/snapshots/
    COMMIT``), else None (a plain folder has no revision).

    >>> revision_of(Path("/c/models--org--name/snapshots/0123abc")), revision_of(Path("/m/x"))
    ('0123abc', None)
    """
    resolved = Path(root)
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        return resolved.name
    return None


def detect_format(root: Path) -> tuple[str, dict | None]:
    """Which of :data:`FORMATS` the folder is in, from its files alone, and its root
    ``config.json`` as read (None where it has none): the format's reader takes it, so the file
    is read once."""
    from cosmos3_gym.formats import cosmos_framework, diffusers, lerobot
    from cosmos3_gym.jsonio import read_json_object

    # The root config.json tells a LeRobot folder and an export apart (a diffusers folder's
    # configs are in its components' folders); one that does not parse is named now.
    raw = None
    if (root / "config.json").is_file():
        raw = read_json_object(root / "config.json", what="checkpoint config.json")
        if lerobot.is_lerobot_config(raw):
            return "lerobot", raw
        if cosmos_framework.is_export_config(raw):
            return "cosmos-framework", raw
    if diffusers.is_diffusers_folder(root):
        return "diffusers", raw
    found = sorted(p.name for p in root.iterdir())[:12]
    raise FileNotFoundError(
        f"{root} is not a Cosmos3 checkpoint in any known format (found {found}); expected a "
        "diffusers folder (transformer/, vae/, text_tokenizer/), a LeRobot policy folder "
        "(config.json of type cosmos3 with model.safetensors) or a cosmos-framework export "
        "(config.json with a \"model\" section and model-*.safetensors)")


def read_checkpoint(path: str | Path, *, vae: str | Path | None = None,
                    tokenizer: str | Path | None = None) -> CheckpointFolder:
    """The checkpoint at ``path`` (a folder, a shipped name or a Hugging Face repository id),
    read and checked without loading a weight: every config file read once, every safetensors
    header once. A run reads its folder here once and hands the result on (to the checks, the
    policy, ``Cosmos3ActionPipeline.from_pretrained``). ``vae`` is the VAE of a cosmos-framework
    export (which holds none); ``tokenizer`` overrides the tokenizer a LeRobot folder names."""
    from cosmos3_gym.formats import cosmos_framework, diffusers, lerobot

    root = resolve_checkpoint(path)
    kind, raw = detect_format(root)
    unused = [name for name, value in (("vae", vae), ("tokenizer", tokenizer))
              if value is not None and not (name == "vae" and kind == "cosmos-framework")
              and not (name == "tokenizer" and kind == "lerobot")]
    if unused:
        raise ValueError(f"{root} is a {kind} checkpoint, which brings its own "
                         f"{' and '.join(unused)}; --{' and --'.join(unused)} would not be used")
    headers = Headers()
    if kind == "lerobot":
        folder = lerobot.read(root, raw, headers, tokenizer=tokenizer)
    elif kind == "cosmos-framework":
        folder = cosmos_framework.read(root, raw, headers, vae=vae)
    else:
        folder = diffusers.read(root, headers)
    return replace(folder, revision=revision_of(root), headers=headers)


def check_loads(folder: CheckpointFolder) -> None:
    """What a load checks before it reads a weight, run without loading one: the tokenizer's
    files parse (:func:`~cosmos3_gym.pipeline.prompt.check_tokenizer_files`), and every tensor
    of the generator and the VAE has the name and shape the models their configs build expect,
    from the headers (:func:`~cosmos3_gym.model.weights.check_tensors`, on the meta device: it
    imports torch, and allocates nothing). The values and statistics were checked when the
    folder was read (:func:`read_checkpoint`: ``Cosmos3Config``, ``PolicyConfig``). ``inspect``,
    ``convert`` and ``Cosmos3ActionPipeline.from_pretrained`` all run it, so a folder that
    ``inspect`` calls ok loads."""
    from cosmos3_gym.model.weights import check_tensors
    from cosmos3_gym.pipeline.prompt import check_tokenizer_files

    check_tokenizer_files(folder.tokenizer)
    check_tensors(folder)


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
           "check_loads", "contract_of", "detect_format", "hub_snapshot", "read_checkpoint",
           "resolve_checkpoint", "revision_of"]
