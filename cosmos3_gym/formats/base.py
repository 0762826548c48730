"""What every checkpoint format reads into: a :class:`CheckpointFolder`, before any weight loads.

A reader (``formats/diffusers.py``, ``lerobot.py``, ``cosmos_framework.py``) turns a folder as
downloaded into one description: the generator's config, where each component's tensors are and
how their names map onto ours (:class:`WeightFiles`), the VAE, the tokenizer, the policy and the
observation contract the folder declares. ``cosmos3-gym inspect`` prints it, the pipeline's
``from_pretrained`` builds from it, ``cosmos3-gym convert`` writes it as a diffusers folder.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cosmos3_gym.checkpoint import PolicyConfig
from cosmos3_gym.jsonio import read_json_object
from cosmos3_gym.model.config import Cosmos3Config

# Suffixes of pickled weight files: never loaded (unpickling can run code).
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def allowed_roots(root: Path) -> tuple[Path, ...]:
    """Where a checkpoint's files may resolve to: the folder itself, and for a snapshot in the
    Hugging Face cache (``models--ORG--NAME/snapshots/REV``, whose files are links into the
    repository's ``blobs/``) that repository's ``blobs/`` folder."""
    resolved = root.resolve()
    roots = [resolved]
    if resolved.parent.name == "snapshots" and resolved.parent.parent.name.startswith("models--"):
        roots.append(resolved.parent.parent / "blobs")
    return tuple(roots)


def inside(root: Path, path: Path, what: str) -> Path:
    """``path`` if it resolves inside ``root`` (symbolic links followed; :func:`allowed_roots`),
    else a ``ValueError``: a checkpoint reads nothing outside its own folder, whatever its links
    point at."""
    resolved = path.resolve()
    if not any(resolved.is_relative_to(r) for r in allowed_roots(root)):
        raise ValueError(f"{path} ({what}) resolves to {resolved}, outside the checkpoint folder "
                         f"{root}; a checkpoint may only read files inside itself (copy the file "
                         "in instead of linking it)")
    return path


def safetensors_files(folder: Path, headers: Headers) -> list[Path]:
    """The weight files of ``folder``: the index's shards if there is one, else every file.

    Every shard an index names must lie inside ``folder`` (an entry such as ``../x`` or an
    absolute path is refused: a checkpoint reads nothing outside itself), and every file must be
    a complete safetensors file (its header read here, into ``headers``, so a truncated download
    is named now and no later step reads the header again).
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
    else:
        files = sorted(folder.glob("*.safetensors"))
    if files:
        for path in files:
            headers(path)
        return files
    pickled = sorted(p.name for p in folder.iterdir() if p.suffix in PICKLE_SUFFIXES)
    if pickled:
        raise ValueError(
            f"{folder} offers only pickled weights {pickled}; cosmos3-gym loads safetensors only "
            "(pickle can run code). Convert them with safetensors.torch.save_file first."
        )
    raise FileNotFoundError(f"no *.safetensors weights in {folder}")


def read_header(path: Path) -> dict[str, dict[str, Any]]:
    """The tensor table of a safetensors file (name -> ``{"dtype", "shape", "data_offsets"}``),
    from one read of its header, which also checks the file complete: the header parses and the
    file is as long as the header says; else a ``ValueError`` naming it (a cut download, a wrong
    file). A run reads each header once, through :class:`Headers`."""
    return _read_safetensors(path)[0]


# Bytes of each tensor's start and end a file's digest covers (Headers.digests).
DIGEST_SAMPLE = 4096
# Bytes per element of the safetensors dtypes: a tensor's shape must fill its data exactly.
DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def _pickle_kind(head: bytes) -> str | None:
    """What pickle a file that starts with ``head`` is (``torch.save``'s zip archive, or a
    plain pickle of protocol 2 to 5), else None.

    >>> _pickle_kind(b"PK\\x03\\x04abcd"), _pickle_kind(b"\\x80\\x04\\x95..."), _pickle_kind(b"{}")
    ('a torch.save archive (a zip of pickles)', 'a pickle', None)
    """
    if head.startswith(b"PK\x03\x04"):
        return "a torch.save archive (a zip of pickles)"
    if len(head) >= 2 and head[0] == 0x80 and 2 <= head[1] <= 5:
        return "a pickle"
    return None


class _BadEntry(Exception):
    """A header entry that parses but cannot describe its bytes (its message is the error)."""


def _check_entry(path: Path, name: str, entry: dict[str, Any]) -> None:
    """A header entry whose shape fills its bytes (a shape of 2^62 x 2^62 elements in 4
    bytes, which safetensors refuses only when the tensor is read, is named now)."""
    start, stop = entry["data_offsets"]
    shape = entry["shape"]
    if start < 0 or stop < start or any(n < 0 for n in shape):
        raise _BadEntry(f"{path}: tensor {name!r} has shape {shape} and data_offsets "
                         f"{entry['data_offsets']}; expected sizes >= 0 and start <= end")
    size = DTYPE_BYTES.get(entry["dtype"])
    if size is None:
        return  # a dtype newer than this table: safetensors checks it when it reads
    need = size * math.prod(shape)
    if need != stop - start:
        raise _BadEntry(f"{path}: tensor {name!r} of shape {shape} ({entry['dtype']}) needs "
                         f"{need} bytes; its header gives it {stop - start}; the file is "
                         "damaged (download or copy it again)")


def _read_safetensors(path: Path) -> tuple[dict[str, dict[str, Any]], str]:
    """:func:`read_header`'s table, and a digest of the header and of each tensor's first and
    last :data:`DIGEST_SAMPLE` bytes, from one open of the file."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            pickled = _pickle_kind(head)
            if pickled is not None:
                raise _BadEntry(
                    f"{path} is {pickled}, not a safetensors file; cosmos3-gym never unpickles "
                    "a file (unpickling can run code): convert it with safetensors' save_file, "
                    "or fetch the folder's own file again")
            header_len = int.from_bytes(head, "little")
            if size < 8 or header_len <= 0 or 8 + header_len > size:
                raise ValueError("shorter than its header says")
            raw = f.read(header_len)
            header = json.loads(raw)
            table = {k: {"dtype": v["dtype"], "shape": [int(n) for n in v["shape"]],
                         "data_offsets": [int(n) for n in v["data_offsets"]]}
                     for k, v in header.items() if k != "__metadata__"}
            for name, entry in table.items():
                _check_entry(path, name, entry)
            end = max((entry["data_offsets"][1] for entry in table.values()), default=0)
            if 8 + header_len + end > size:
                raise EOFError(f"{path} is truncated: its header describes "
                               f"{8 + header_len + end} bytes, the file has {size}; download "
                               "or copy it again")
            digest = hashlib.blake2b(raw, digest_size=8)
            for entry in sorted(table.values(), key=lambda e: e["data_offsets"][0]):
                start, stop = entry["data_offsets"]
                for lo, hi in ((start, min(stop, start + DIGEST_SAMPLE)),
                               (max(start, stop - DIGEST_SAMPLE), stop)):
                    f.seek(8 + header_len + lo)
                    digest.update(f.read(hi - lo))
    except (EOFError, _BadEntry) as err:
        raise ValueError(str(err)) from None
    except (ValueError, KeyError, TypeError, IndexError, UnicodeDecodeError,
            AttributeError) as err:
        raise ValueError(f"{path} is not a complete safetensors file ({err}); expected the "
                         "whole file (download or copy it again)") from None
    return table, digest.hexdigest()


class Headers:
    """The tensor tables of a checkpoint's safetensors files, each file's header read once:
    one read of a folder (:func:`cosmos3_gym.formats.read_checkpoint`) makes one and hands it to
    every part that needs a table (the weight files of each component, the check that every
    tensor is claimed, ``inspect``'s summary).

    >>> import tempfile, pathlib, json
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "w.safetensors"
    >>> head = json.dumps({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    >>> _ = path.write_bytes(len(head).to_bytes(8, "little") + head + bytes(8))
    >>> headers = Headers()
    >>> headers(path)["a"]["shape"], headers(path) is headers(path), headers.reads
    ([2], True, 1)
    """

    def __init__(self) -> None:
        self._tables: dict[Path, dict[str, dict[str, Any]]] = {}
        self._digests: dict[Path, str] = {}
        self.reads = 0

    def __call__(self, path: Path) -> dict[str, dict[str, Any]]:
        path = Path(path)
        table = self._tables.get(path)
        if table is None:
            table, self._digests[path] = _read_safetensors(path)
            self._tables[path] = table
            self.reads += 1
        return table

    def digests(self) -> dict[Path, str]:
        """Each file read so far -> a digest of its header and of every tensor's first and
        last bytes (what a run's weights fingerprint is made of: a fine-tune, which changes
        every element of the tensors it trains, changes it; an edit confined to the middle of
        one large tensor does not)."""
        return dict(sorted(self._digests.items()))


@dataclass(frozen=True)
class WeightFiles:
    """One component's tensors on disk: the safetensors files that hold them and how a file's
    tensor names become the component's parameter names.

    ``rename`` maps a file's name to the parameter name, or to ``None`` for a tensor that is not
    this component's (another component's, or a part the format ships that cosmos3-gym does not
    run: the ViT of a cosmos-framework export). ``mapping`` says the rule in words (inspect
    prints it).
    """

    files: tuple[Path, ...]
    rename: Callable[[str], str | None]
    mapping: str
    # The headers of ``files``, read once for the whole checkpoint (components that share a file,
    # as a LeRobot folder's transformer and VAE do, share its table).
    headers: Headers = field(default_factory=Headers, compare=False, repr=False)

    def names(self) -> dict[str, tuple[Path, str]]:
        """Parameter name -> (file, the file's tensor name), from the headers alone; a name
        that two files (or two tensors) both give is an error naming both."""
        found: dict[str, tuple[Path, str]] = {}
        for path in self.files:
            for key in self.headers(path):
                name = self.rename(key)
                if name is None:
                    continue
                if name in found:
                    other = found[name]
                    raise ValueError(f"{name!r} is given twice: by {other[1]!r} in {other[0]} and "
                                     f"by {key!r} in {path}")
                found[name] = (path, key)
        return found

    def shapes(self) -> dict[str, list[int]]:
        """Parameter name -> shape, from the headers alone."""
        return {name: self.headers(path)[key]["shape"]
                for name, (path, key) in self.names().items()}


@dataclass(frozen=True)
class ObservationContract:
    """How the checkpoint's owner turns an observation into the model's image, as the folder
    declares it; the policy builds its default adapter from it
    (:func:`~cosmos3_gym.policy.adapters.adapter_for_contract`).

    Attributes:
        convention: ``"lerobot"`` (LeRobot's view composition: ``image_keys[0]`` across the top,
            the others side by side below, each resized with padding) or
            ``"cosmos-framework-libero"`` (the official LIBERO client: both cameras rotated 180
            degrees, 256 x 256 each, side by side).
        image_keys: the observation keys of the camera images, in composition order.
        num_views: views the canvas has room for (missing ones are black).
        primary_height: rows of the top view (LeRobot's ``image_height``).
        canvas_hw: the composed canvas, ``(height, width)``.
        state_key: the observation key of the robot state, where the head takes one.
        domain: the embodiment the actions belong to (``"libero"``: LIBERO's 7-D env actions
            are made from the 10-D rot6d ones).
        n_action_steps: actions of each chunk the owner's policy executes before replanning
            (None: the whole chunk).
        seed, deterministic_seed: the owner's noise seeds (LeRobot's ``seed`` and
            ``deterministic_seed``: :meth:`~cosmos3_gym.policy.SeedRule.lerobot`).
    """

    convention: str
    image_keys: tuple[str, ...] = ()
    num_views: int = 1
    primary_height: int | None = None
    canvas_hw: tuple[int, int] | None = None
    state_key: str | None = None
    domain: str | None = None
    n_action_steps: int | None = None
    seed: int = 0
    deterministic_seed: bool = False


@dataclass(frozen=True)
class CheckpointFolder:
    """A checkpoint as read from disk, before any weight loads.

    Attributes:
        root: the folder.
        format: ``"diffusers"``, ``"lerobot"`` or ``"cosmos-framework"``.
        kind: the format's own name of what it holds (LeRobot's policy ``type``,
            cosmos-framework's ``model_type``, diffusers' pipeline class).
        transformer: the generator's config.
        transformer_source: where each value of :attr:`transformer` came from (one line).
        transformer_weights: the generator's tensors.
        vae_config: ``AutoencoderKLWan`` arguments.
        vae_weights: the VAE's tensors.
        vae_source: where the VAE came from (one line).
        tokenizer: the tokenizer folder.
        tokenizer_source: how it was found (one line).
        policy: the policy the folder declares (LeRobot folders, diffusers folders with
            ``action_policy.json``), else None (:func:`~cosmos3_gym.checkpoint.resolve_policy`
            decides from a domain or recipe).
        contract: the observation contract the folder declares, if any.
        ignored: tensors in the files that cosmos3-gym reads but does not run, by what they are
            (``{"vision tower (ViT)": 391}``).
        notes: facts about the folder worth printing (sources of the choices made).
    """

    root: Path
    format: str
    kind: str | None
    transformer: Cosmos3Config
    transformer_source: str
    transformer_weights: WeightFiles
    vae_config: dict[str, Any]
    vae_weights: WeightFiles
    vae_source: str
    tokenizer: Path
    tokenizer_source: str
    policy: PolicyConfig | None = None
    contract: ObservationContract | None = None
    ignored: dict[str, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    # The commit of a Hugging Face cache snapshot the folder is (None: a plain folder).
    revision: str | None = None
    # Every safetensors header the read parsed (the weights', the statistics'), each once.
    headers: Headers = field(default_factory=Headers, compare=False, repr=False)

    def files(self) -> list[tuple[Path, int]]:
        """Every file of the folder (symbolic links followed, inside it only) with its size."""
        out = []
        for path in sorted(self.root.rglob("*")):
            if path.is_file() and not any(part.startswith(".") for part in
                                          path.relative_to(self.root).parts):
                out.append((path, path.stat().st_size))
        return out


def check_claimed(files: Iterable[Path], owners: Iterable[WeightFiles],
                  ignore: Callable[[str], str | None], where: str, headers: Headers
                  ) -> dict[str, int]:
    """Every tensor of ``files`` belongs to one of ``owners`` or is one ``ignore`` names (it
    returns what the tensor is, or None); any other is an error naming the first ones. Returns
    the ignored tensors' counts by what they are."""
    owners = list(owners)
    ignored: dict[str, int] = {}
    stray: list[str] = []
    for path in files:
        for key in headers(path):
            if any(owner.rename(key) is not None for owner in owners):
                continue
            what = ignore(key)
            if what is None:
                stray.append(key)
            else:
                ignored[what] = ignored.get(what, 0) + 1
    if stray:
        raise ValueError(f"{where} holds {len(stray)} tensors cosmos3-gym does not know: "
                         f"{stray[:8]}{' ...' if len(stray) > 8 else ''}; expected only "
                         f"{', '.join(o.mapping for o in owners)}")
    return ignored
