"""A GRPO run folder's saved states (resume) and its result (the fine-tuned checkpoint).

Every ``save_every`` iterations and at each measurement the run writes ``state-NNNNNN/``: the
trained parameters' fp32 masters (``trained.safetensors``), AdamW's state and torch's RNG
states (``optimizer.pt``, read back with ``weights_only=True``: tensors and plain containers,
never code), and the iteration and the curve (``state.json``). A state is written whole into a
temporary folder and renamed into place; then all but the two newest states go, so a kill at
any moment leaves a whole state, and a damaged newest state (a cut file) leaves the one before
it to resume from. A rerun of the same command restores the newest state. A full disk is one
``OSError`` naming the file that was not written; a damaged state file is one ``ValueError``
naming it and saying how to go on.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cosmos3_gym.train.config import EVALS, STATE_PREFIX, TEST_PREFIX

if TYPE_CHECKING:  # torch loads where a state is read or written, not for a note
    import torch

TRAINED, OPTIMIZER, META = "trained.safetensors", "optimizer.pt", "state.json"
CHECKPOINT, ADAPTER = "checkpoint", "adapter"
KEPT_STATES = 2


def state_dirs(out: Path) -> list[Path]:
    """The saved states of a run folder, oldest first (only whole ones: each is renamed into
    place after its last file is written)."""
    found = [p for p in out.glob(f"{STATE_PREFIX}*") if p.is_dir()
             and p.name[len(STATE_PREFIX):].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(STATE_PREFIX):]))


def remove_partial_writes(out: Path) -> None:
    """Remove what a killed run was writing (a state's or the result's temporary folder). Call
    it only while holding the folder's lock: no other process writes there."""
    for name in (STATE_PREFIX + "*", CHECKPOINT, ADAPTER):
        for partial in out.glob(f".{name}.*.tmp"):
            shutil.rmtree(partial, ignore_errors=True)


def save_state(out: Path, iteration: int, masters: dict[str, torch.Tensor],
               rest: dict[str, Any], curve: list[dict[str, Any]]) -> Path:
    """Write the run's state after ``iteration`` as ``state-{iteration:06d}/``, then remove
    all but the :data:`KEPT_STATES` newest states."""
    import torch
    from safetensors.torch import save

    from cosmos3_gym.jsonio import write_json_atomic

    buffer = io.BytesIO()
    torch.save(rest, buffer)
    files = {TRAINED: save(masters), OPTIMIZER: buffer.getvalue()}
    final = out / f"{STATE_PREFIX}{iteration:06d}"

    def write(tmp: Path) -> None:
        for name, data in files.items():
            _write_file(tmp / name, data)
        write_json_atomic(tmp / META, {"iteration": iteration, "curve": curve})

    _write_folder(final, write)
    for old in state_dirs(out)[:-KEPT_STATES]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(folder: Path) -> tuple[int, list[dict[str, Any]], dict[str, torch.Tensor],
                                      dict[str, Any]]:
    """``(iteration, curve, masters, rest)`` of a saved state; a damaged file is one
    ``ValueError`` that names it and the state to go on from."""
    import torch
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from cosmos3_gym.jsonio import read_json_object

    try:
        meta = read_json_object(folder / META, what="GRPO state")
    except (OSError, ValueError) as err:
        raise damaged(folder, META, str(err).removeprefix(f"{folder / META}: ")) from None
    iteration, curve = meta.get("iteration"), meta.get("curve")
    expected = int(folder.name[len(STATE_PREFIX):])
    if isinstance(iteration, bool) or iteration != expected:
        raise damaged(folder, META, f"expected \"iteration\": {expected}; found {iteration!r}")
    if not isinstance(curve, list) or not all(isinstance(p, dict) for p in curve) \
            or not curve or curve[-1].get("iteration") != iteration:
        raise damaged(folder, META, f"expected a \"curve\" of points ending at iteration "
                      f"{iteration}; found {type(curve).__name__}")
    try:
        masters = load_file(folder / TRAINED)
    except (OSError, SafetensorError) as err:
        raise damaged(folder, TRAINED, f"not a complete safetensors file ({err})") from None
    try:
        rest = torch.load(folder / OPTIMIZER, weights_only=True)
    except Exception as err:  # noqa: BLE001 (torch raises several kinds for a bad file)
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        why = ("it holds objects other than tensors and plain containers, which are not "
               "loaded" if "weights_only" in str(err) or "Unpickl" in type(err).__name__
               else f"not a readable torch file ({first})")
        raise damaged(folder, OPTIMIZER, why) from None
    if not isinstance(rest, dict) or "optimizer" not in rest or "rng" not in rest:
        raise damaged(folder, OPTIMIZER, "expected the optimiser's and the RNGs' states")
    return iteration, curve, masters, rest


def damaged(folder: Path, name: str, why: str) -> ValueError:
    """A damaged state file, in one line: what is wrong and how to go on."""
    older = [p for p in state_dirs(folder.parent) if p.name < folder.name]
    then = (f"remove {folder} to resume from {older[-1].name}" if older else
            f"remove {folder} to start the run again from iteration 0")
    return ValueError(f"{folder / name}: {why}; {then} (rerun the same command)")


def restart_note(out: Path) -> str | None:
    """What a rerun in ``out`` starts from when it holds a run's identity but no saved state
    (killed before its first save); None otherwise."""
    from cosmos3_gym.train.config import IDENTITY_FILE

    if (out / IDENTITY_FILE).exists() and not state_dirs(out):
        return f"{out} holds no saved state yet: the run starts from iteration 0"
    return None


def interrupted_note(out: Path) -> str:
    """What an interrupted ``rl grpo`` leaves in ``out`` and how to go on, in one line."""
    states = state_dirs(out) if out.is_dir() else []
    if not states:
        return (f"{out} holds no saved state yet (the first is saved after iteration 1 at the "
                "earliest); rerun the same command to start again from iteration 0")
    return (f"{out} keeps its newest saved state ({states[-1].name}) and the held-out "
            "evaluations up to it; rerun the same command to resume from that state")


def drop_later_evals(out: Path, iteration: int) -> None:
    """Held-out evaluations of iterations after the restored state measured weights that are
    gone: remove them (the resumed run measures its own), on the test episodes too (``--keep
    best``: a measurement of weights kept at an earlier iteration stays, as they do)."""
    for folder in sorted((out / EVALS).glob("*iter-*")):
        suffix = folder.name.removeprefix(TEST_PREFIX).removeprefix("iter-")
        if suffix.isdigit() and int(suffix) > iteration:
            shutil.rmtree(folder)


def write_checkpoint(pipe: Any, model: torch.nn.Module, folder: Path) -> Path:
    """The fine-tuned policy as a checkpoint folder ``eval`` loads: ``model`` (the transformer,
    adapters merged), the pipeline's VAE and tokenizer, and its action head's settings (domain,
    statistics, sampler: the ones this run used, so the folder needs no flags)."""
    from cosmos3_gym.checkpoint import POLICY_CONFIG, TEXT_TOKENIZER, TRANSFORMER, VAE
    from cosmos3_gym.model.weights import save_transformer

    def write(tmp: Path) -> None:
        was = model.training
        save_transformer(model.eval(), tmp / TRANSFORMER)
        model.train(was)
        pipe.vae.save_pretrained(tmp / VAE, safe_serialization=True)
        pipe.tokenizer.save_pretrained(tmp / TEXT_TOKENIZER)
        pipe.policy.save(tmp / POLICY_CONFIG)

    pipe.transformer = model
    _write_folder(folder, write)
    return folder


def write_adapter(trainable: Any, folder: Path) -> Path | None:
    """The LoRA adapters alone in peft's layout (:meth:`~cosmos3_gym.train.trainable.Trainable.
    save_adapter`), written whole or not at all; None where nothing is an adapter."""
    if trainable.tuner is None:
        return None
    _write_folder(folder, trainable.save_adapter)
    return folder


def _write_file(path: Path, data: bytes) -> None:
    """``data`` into ``path``, on disk before the folder's rename makes it count; an
    ``OSError`` names ``path`` (a write or fsync that finds the disk full names no file)."""
    try:
        with open(path, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        if err.filename is None:
            raise OSError(err.errno, err.strerror, str(path)) from None
        raise


def _write_folder(folder: Path, write: Any) -> None:
    """``write(tmp)`` into ``.NAME.PID.tmp`` beside ``folder``, then rename it over ``folder``.
    On a failure the temporary folder goes and ``folder`` is untouched; a full disk is one
    ``OSError`` naming the file (under ``folder``) that was not written."""
    tmp = folder.parent / f".{folder.name}.{os.getpid()}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir(parents=True)
        write(tmp)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
    except BaseException as err:
        with contextlib.suppress(OSError):
            shutil.rmtree(tmp)
        full = _disk_full(err, tmp, folder)
        if full is not None:
            raise full from None
        raise


def _disk_full(err: BaseException, tmp: Path, folder: Path) -> OSError | None:
    """``err`` as one ``OSError(ENOSPC)`` naming the file in ``folder`` it was writing, where
    the disk was full (torch's writer and safetensors' say so in their own words)."""
    text = str(err)
    if isinstance(err, OSError):
        if err.errno != errno.ENOSPC:
            return None
        name = err.filename
    elif "No space left on device" in text or "os error 28" in text:
        name = None
    else:
        return None
    where = str(folder) if name is None else str(name).replace(str(tmp), str(folder), 1)
    return OSError(errno.ENOSPC, "No space left on device", where)
