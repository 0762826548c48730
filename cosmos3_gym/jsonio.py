"""JSON on disk, read with errors that name the file and written so that nothing is half-written.

Every JSON file the project reads or writes goes through here: checkpoint configs, action
statistics, run identities, results, episode logs. A reader gets one error naming the file and
what was wrong instead of a bare ``JSONDecodeError``; a writer either replaces a file whole
(:func:`write_json_atomic`) or appends whole lines (:func:`append_jsonl`), and a failed write
(a full disk, a read-only folder) leaves neither a partial file nor a temporary one behind.
A config's values are checked against the dataclass they fill (:func:`check_types`).
"""

from __future__ import annotations

import contextlib
import json
import os
import types
import typing
from collections.abc import Callable
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


def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Call ``write`` on a temporary file beside ``path``, fsync it, and rename it over
    ``path``: readers see the old file or the new one, never half of either. On any failure
    (a full disk, an interrupt) the temporary file is removed and the error raised; ``path``
    is untouched."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as err:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise _naming(err, path) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def _naming(err: OSError, path: Path) -> OSError:
    """``err`` with ``path`` as its file where the system named none (a ``write`` or ``fsync``
    that found the disk full names no file), so its one line says which file was not written.

    >>> str(_naming(OSError(28, "No space left on device"), Path("runs/x/results.json")))
    "[Errno 28] No space left on device: 'runs/x/results.json'"
    """
    if err.filename is not None or err.errno is None:
        return err
    return type(err)(err.errno, err.strerror, str(path))


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
