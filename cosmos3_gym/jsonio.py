"""Files on disk: JSON read with errors that name the file, and every file written whole.

Every JSON file the project reads or writes goes through here: checkpoint configs, action
statistics, run identities, results, episode logs. A reader gets one error naming the file and
what was wrong instead of a bare ``JSONDecodeError``; a writer either replaces a file whole
(:func:`write_json_atomic`) or appends whole lines (:func:`append_jsonl`), and a failed write
(a full disk, a read-only folder) leaves neither a partial file nor a temporary one behind.
A config's values are checked against the dataclass they fill (:func:`check_types`).

Files that are not JSON are written the same way: bytes (:func:`atomic_write`), text
(:func:`write_text_atomic`), safetensors (:func:`save_safetensors`), or through any writer that
takes a file name (:func:`atomic_path`: a video encoder, a figure). A folder that is one thing (a
converted or trained checkpoint) is written whole: filled under a temporary name beside it and
renamed at the end (:func:`staged_folder`). Each failure is an ``OSError`` naming the file that
was not written (``No space left on device: OUT/vae/config.json``), the one line the commands
print. Temporary names are ``.NAME.PID.tmp``; what a killed process left under them is removed
by the next writer of the same folder (:func:`remove_stale`).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import types
import typing
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO


def read_json(path: str | Path, *, what: str = "JSON file") -> Any:
    """The JSON document in ``path``; a ``FileNotFoundError`` or ``ValueError`` naming the file
    (and the line and column of a syntax error) otherwise. ``what`` says what the file is."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} at {path}") from None
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: expected a {what} (UTF-8 text); found bytes that are not "
                         f"UTF-8 at offset {err.start}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not valid JSON (line {err.lineno}, column {err.colno}: "
                         f"{err.msg}); expected a {what}") from None


def read_json_object(path: str | Path, *, what: str = "JSON file") -> dict[str, Any]:
    """:func:`read_json` of a file that must hold one JSON object."""
    data = read_json(path, what=what)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a {what} holding a JSON object; found "
                         f"{type(data).__name__}")
    return data


# The temporary names of this module's writers: ``.NAME.PID.tmp``, and ``.NAME.PID.tmp.mp4`` for
# a writer that picks its format by the name's suffix. A run folder removes those of dead pids.
TEMPORARY = re.compile(r"^\..+\.(\d+)\.tmp(\.\w+)?$")


def temporary_name(path: Path, suffix: str = "") -> Path:
    """The temporary name this process writes ``path`` under: ``.NAME.PID.tmp`` beside it, then
    ``suffix``."""
    return path.with_name(f".{path.name}.{os.getpid()}.tmp{suffix}")


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary file name beside ``path`` for a writer that takes a name (a video encoder);
    it ends in ``path``'s suffix, which such writers read the format from. When the block ends
    the file is fsynced and renamed over ``path``. On any failure the temporary file is removed
    and the error raised (an ``OSError`` naming ``path``); ``path`` is untouched."""
    path = Path(path)
    tmp = temporary_name(path, path.suffix)
    with _renamed_over(path, tmp):
        yield tmp


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, fsync it, and rename it over
    ``path``: readers see the old file or the new one, never half of either. On any failure
    (a full disk, an interrupt) the temporary file is removed and the error raised; ``path``
    is untouched."""
    path = Path(path)
    tmp = temporary_name(path)
    with _renamed_over(path, tmp), open(tmp, "wb") as f:
        write(f)


@contextlib.contextmanager
def _renamed_over(path: Path, tmp: Path) -> Iterator[None]:
    """The block writes ``tmp``; then it is fsynced and renamed over ``path``. On any failure
    ``tmp`` is removed and the error raised (an ``OSError`` naming ``path``)."""
    try:
        yield
        _fsync(tmp)
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _naming(err, path, tmp) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _naming(err: OSError, path: Path, tmp: Path | None = None) -> OSError:
    """``err`` with ``path`` as its file where the system named none (a ``write`` or ``fsync``
    that found the disk full names no file) or named the temporary file, so its one line says
    which file was not written.

    >>> str(_naming(OSError(28, "No space left on device"), Path("runs/x/results.json")))
    "[Errno 28] No space left on device: 'runs/x/results.json'"
    """
    if err.errno is None or (err.filename is not None and str(err.filename) != str(tmp)):
        return err
    return type(err)(err.errno, err.strerror, str(path))


def write_text_atomic(path: str | Path, text: str) -> None:
    """Replace ``path`` by ``text`` (UTF-8), atomically (:func:`atomic_write`)."""
    data = text.encode("utf-8")
    atomic_write(path, lambda f: f.write(data))


def copy_file_atomic(source: str | Path, path: str | Path) -> None:
    """Copy the file ``source`` to ``path``, atomically (:func:`atomic_write`)."""
    with open(source, "rb") as src:
        atomic_write(path, lambda f: shutil.copyfileobj(src, f))


# safetensors' writer is Rust: a failed write is a SafetensorError whose text ends in the
# system's error number ("I/O error: No space left on device (os error 28)").
_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def _system_error(err: BaseException) -> OSError | None:
    """``err`` as the ``OSError`` it is: itself, or the system error a ``SafetensorError``
    carries (a library's ``save_pretrained`` writes through safetensors too); None if it is
    no system error."""
    if isinstance(err, OSError):
        return err
    if type(err).__name__ == "SafetensorError" and type(err).__module__.startswith("safetensors"):
        found = _OS_ERROR.search(str(err))
        if found is not None:
            number = int(found.group(1))
            return OSError(number, os.strerror(number))
    return None


def save_safetensors(tensors: Mapping[str, Any], path: str | Path,
                     metadata: dict[str, str] | None = None) -> None:
    """``safetensors``' ``save_file`` (torch tensors, or numpy arrays) written atomically
    (:func:`atomic_path`); a failed write is the ``OSError`` it is (``No space left on
    device: PATH``), not a ``SafetensorError``."""
    import numpy as np

    if tensors and all(isinstance(v, np.ndarray) for v in tensors.values()):
        from safetensors.numpy import save_file
    else:
        from safetensors.torch import save_file
    with atomic_path(path) as tmp:
        try:
            save_file(dict(tensors), str(tmp), metadata=metadata)
        except Exception as err:
            system = _system_error(err)
            if system is None:
                raise
            raise system from None


def _stale_pattern(name: str) -> re.Pattern[str]:
    return re.compile(rf"^\.{re.escape(name)}\.(?:old\.)?(\d+)\.tmp(\.\w+)?$")


def remove_stale(path: str | Path) -> list[Path]:
    """Remove what killed processes left under temporary names of ``path`` (``.NAME.PID.tmp``
    files or folders beside it, of processes that no longer run); returns what was removed."""
    path = Path(path)
    pattern, removed = _stale_pattern(path.name), []
    if not path.parent.is_dir():
        return removed
    for found in path.parent.iterdir():
        match = pattern.match(found.name)
        if match is None or process_alive(int(match.group(1))):
            continue
        if found.is_dir() and not found.is_symlink():
            shutil.rmtree(found, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                found.unlink()
        removed.append(found)
    return removed


@contextlib.contextmanager
def staged_folder(path: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """A folder written whole: the block fills a temporary folder beside ``path``
    (``.NAME.PID.tmp``), whose files are fsynced and which is renamed to ``path`` when the
    block ends. ``path`` must not exist or be empty, unless ``replace``: then a folder there is
    replaced by the new one (renamed aside first, removed after). On any failure the temporary
    folder is removed and the error raised, an ``OSError`` naming the file under ``path`` that
    was not written; a kill leaves only the temporary folder, which the next call for ``path``
    removes (:func:`remove_stale`). Either way ``path`` holds the previous state or the whole
    new folder, never half of it.

    >>> import tempfile
    >>> out = Path(tempfile.mkdtemp()) / "converted"
    >>> with staged_folder(out) as tmp:
    ...     _ = (tmp / "config.json").write_text("{}")
    ...     print(out.exists(), tmp.name.startswith(".converted."))
    False True
    >>> sorted(p.name for p in out.parent.iterdir()), sorted(p.name for p in out.iterdir())
    (['converted'], ['config.json'])
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale(path)
    tmp = temporary_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        yield tmp
        for file in sorted(tmp.rglob("*")):
            if file.is_file() and not file.is_symlink():
                _fsync(file)
        old = None
        if path.is_dir() and any(path.iterdir()):
            if not replace:
                raise FileExistsError(f"{path} exists and is not empty")
            old = path.with_name(f".{path.name}.old.{os.getpid()}.tmp")
            os.rename(path, old)
        os.rename(tmp, path)  # over an empty folder, or none
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        system = _system_error(err)
        if system is None or system.errno is None or isinstance(err, FileExistsError):
            raise
        where = Path(system.filename) if system.filename is not None else path
        if where == tmp or tmp in where.parents:
            where = path / where.relative_to(tmp)
        raise type(system)(system.errno, system.strerror, str(where)) from None


def _fsync(path: Path) -> None:
    """Flush the written file ``path`` to disk; an ``OSError`` names it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as err:
        raise _naming(err, path) from None
    finally:
        os.close(fd)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs (this one does; another user's live one does)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def write_json_atomic(path: str | Path, data: Any) -> None:
    """Replace ``path`` by ``data`` as indented JSON, atomically (:func:`atomic_write`)."""
    text = (json.dumps(data, indent=2) + "\n").encode("utf-8")
    atomic_write(path, lambda f: f.write(text))


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The complete lines of a JSONL file (none if it does not exist); a partial last line (a
    write cut by a crash) is skipped. A corrupt line elsewhere is an error naming the file and
    line, since it means the file was edited or mixed."""
    path = Path(path)
    if not path.exists():
        return []
    lines = path.read_bytes().split(b"\n")
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if number == len(lines):  # the unterminated tail of an interrupted append
                continue
            raise ValueError(
                f"{path}:{number} is not valid JSON; expected one record per line"
            ) from None
    return records


def append_jsonl(path: str | Path, record: dict[str, Any]) -> None:
    """Append ``record`` as one line and fsync it. A partial last line left by an earlier crash
    is cut off first; if this write fails (a full disk), the file is cut back to where it was,
    so it never ends in a partial record this call wrote."""
    path = Path(path)
    line = (json.dumps(record, sort_keys=True) + "\n").encode("utf-8")
    if path.exists():
        _cut_partial_line(path)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        try:
            view = memoryview(line)
            while view:  # os.write may write less than asked
                view = view[os.write(fd, view):]
            os.fsync(fd)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise _naming(err, path) from None
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def _cut_partial_line(path: Path, block: int = 1 << 16) -> None:
    """Cut ``path`` back to the end of its last complete line. Only the tail is read (the last
    byte, and back to the last newline if that byte is not one), so an append costs the same
    at the millionth line as at the first."""
    with path.open("r+b") as f:
        end = f.seek(0, os.SEEK_END)
        if end == 0:
            return
        f.seek(end - 1)
        if f.read(1) == b"\n":
            return
        stop = end
        while stop > 0:
            start = max(0, stop - block)
            f.seek(start)
            newline = f.read(stop - start).rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return
            stop = start
        f.truncate(0)


def check_types(cls: type, raw: dict[str, Any], source: str) -> None:
    """Refuse values of a config file whose JSON type does not fit the dataclass field: a
    ``"two"`` where a number belongs is named here, not met later as a shape mismatch."""
    hints = typing.get_type_hints(cls)
    for key, value in raw.items():
        hint = hints.get(key)
        if hint is None or _fits(value, hint):
            continue
        raise ValueError(f"{source}: {key} is {value!r} ({type(value).__name__}); expected "
                         f"{_type_name(hint)}")


def check_range(name: str, value: Any, low: float, high: float, *, integer: bool = False,
                above: bool = False, why: str = "") -> None:
    """Refuse a config value that is not a finite number from ``low`` (excluded with ``above``)
    to ``high``: one ``ValueError`` naming the value, what it was and what it may be (``why``:
    what the upper bound guards against).

    >>> check_range("num_inference_steps", 30, 1, 1000, integer=True)
    >>> check_range("guidance_scale", float("nan"), 0, 100)
    Traceback (most recent call last):
    ...
    ValueError: guidance_scale: expected a finite number from 0 to at most 100; found nan
    """
    if integer:
        fits = isinstance(value, int) and not isinstance(value, bool)
    else:
        fits = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(
            value)
    if fits and (value > low if above else value >= low) and value <= high:
        return
    kind = "an integer" if integer else "a finite number"
    span = f"above {low} and at most {high}" if above else f"from {low} to at most {high}"
    raise ValueError(f"{name}: expected {kind} {span}{f' ({why})' if why else ''}; found "
                     f"{value!r}")


def _fits(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, arg) for arg in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is Any:
        return True
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (list, tuple):
        args = typing.get_args(hint)
        return isinstance(value, list) and (not args or all(_fits(v, args[0]) for v in value))
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return True


def _type_name(hint: Any) -> str:
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string",
             type(None): "null"}
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(hint))
    if origin in (list, tuple):
        return "a list"
    if origin is dict or hint is dict:
        return "an object"
    return names.get(hint, str(hint))
