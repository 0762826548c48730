"""A run's output folder: held by one command at a time, bound to one run's identity.

Evaluations and rollouts write into a folder that is somebody's result, so both open it through
:class:`RunFolder`:

- **Lock.** The command takes an exclusive ``flock`` on ``.lock.rank{r}`` for its whole run
  (one per rank under torchrun, so the ranks of one launch write side by side while a second
  command, single-process or launched, finds rank 0's lock taken). A command that finds the
  folder held stops with :class:`FolderInUse`, which names the holder (pid, host, command line,
  start time), before it writes anything. The kernel drops the lock of a process that dies, so a
  folder left by a killed run is taken over by the next command without any clean-up. A process
  forked while the lock is held (an ``--async-envs`` env worker) closes its inherited copy of
  the lock's descriptor at once: a ``flock`` lives as long as any descriptor of it, so
  otherwise a killed run's workers (a hung simulator never exits) would keep the folder
  locked, naming a dead pid.
- **Identity.** :meth:`RunFolder.bind` compares the run's identity (the settings that decide
  which episodes the folder holds) with the one stored, under the lock. It is written atomically
  before the first record; once the folder holds a record a different identity is refused
  (:class:`RunMismatch` listing the differences). The identity holds no path of the folder
  itself, so a moved or copied folder resumes.
- **Kind.** A folder holds one kind of run (:data:`RUN_KINDS`: an evaluation, rollouts, a GRPO
  run, or the checkpoint ``cosmos3-gym train`` writes). A
  command that names its kind (``RunFolder(path, kind=...)``) is refused, with
  :class:`RunMismatch`, a folder that holds another kind's files, when it opens the folder and
  before it writes anything; the identity file records the kind (``"kind"`` beside
  ``"identity"``).
- **Someone else's folder.** A folder that is not empty and holds nothing of ours (no lock
  file, none of :data:`RUN_KINDS`' files: ``--out docs``, a dataset, a home folder) is refused
  with :class:`RunMismatch` before anything is written into it.
- **Left-overs.** Temporary files that a killed single-process run left behind are removed when
  the folder is opened (failed writes remove their own: :mod:`cosmos3_gym.jsonio`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
import weakref
from collections.abc import Callable, Iterable
from pathlib import Path
from types import TracebackType
from typing import Any

from cosmos3_gym.jsonio import TEMPORARY, process_alive, read_json_object, write_json_atomic

# The kinds of run a folder can hold, each with the files that show a folder holds one: its
# identity file first, then its records.
RUN_KINDS: dict[str, tuple[str, ...]] = {
    "evaluation": ("config.json", "episodes*.jsonl", "results.json"),
    "rollouts": ("rollout.json", "meta.json", "shard-*.npz"),
    "GRPO run": ("grpo.json", "curve.json", "state-*"),
    # What `cosmos3-gym train` writes: a checkpoint folder (diffusers layout) and its log.
    "checkpoint": ("train_log.json", "model_index.json", "action_policy.json", "transformer"),
}


class FolderInUse(RuntimeError):
    """Another live process holds the run folder's lock."""


class RunMismatch(ValueError):
    """The folder holds records of another run."""


def identity_differences(stored: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    """The keys on which two identities differ, with both values (a key one of them lacks reads
    as ``None``). Values compare as JSON, so a tuple and a list of the same items agree.

    >>> identity_differences({"seed": 0, "trials": 5}, {"seed": 1, "trials": 5})
    {'seed': {'stored': 0, 'this run': 1}}
    """
    stored, found = _as_json(stored), _as_json(found)
    return {k: {"stored": stored.get(k), "this run": found.get(k)}
            for k in sorted(set(stored) | set(found)) if stored.get(k) != found.get(k)}


def _as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


class RunFolder:
    """The output folder of one run (this process's rank of it), held while the run lasts.

    ``kind`` (a key of :data:`RUN_KINDS`; ``None``: any) is the kind of run the command writes.

    >>> import tempfile
    >>> path = tempfile.mkdtemp()
    >>> with RunFolder(path, kind="evaluation") as folder:
    ...     stored = folder.bind("config.json", {"seed": 0}, bound=False)
    ...     stored = folder.bind("config.json", {"seed": 0}, bound=True)  # the same run: fine
    ...     try:
    ...         folder.bind("config.json", {"seed": 1}, bound=True)
    ...     except RunMismatch as err:
    ...         print(str(err).split(";")[0].split(" ", 1)[1])
    holds a different run
    >>> try:
    ...     RunFolder(path, kind="rollouts").open()
    ... except RunMismatch as err:
    ...     print(str(err).split(" ", 1)[1].split(";")[0])
    holds an evaluation (config.json)
    """

    def __init__(self, path: str | Path, *, kind: str | None = None, rank: int = 0,
                 world_size: int = 1) -> None:
        if kind is not None and kind not in RUN_KINDS:
            raise ValueError(f"kind: expected one of {list(RUN_KINDS)} or None; found {kind!r}")
        self.path = Path(path)
        self.kind = kind
        self.rank, self.world_size = rank, world_size
        self.lock_path = self.path / f".lock.rank{rank}"
        self._fd: int | None = None

    # ------------------------------------------------------------------ lock

    def __enter__(self) -> RunFolder:
        self.open()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()

    def check_free(self) -> None:
        """What :meth:`open` would refuse, without writing anything: a path through a file, a
        folder another process holds (:class:`FolderInUse`), a folder of another kind of run.
        A command calls it before the model loads, so a busy folder is refused at once; the
        lock itself is taken by :meth:`open` later (which checks again)."""
        self._check_path()
        if not self.path.is_dir():
            return
        self._check_ours()
        try:
            fd = os.open(self.lock_path, os.O_RDONLY)
        except OSError:
            fd = None  # no lock file yet, or unreadable (:meth:`open` says why, naming it)
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as err:
                if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise FolderInUse(self._in_use()) from None
            finally:
                os.close(fd)  # closing releases a lock this call took
        self._check_kind()

    def _check_path(self) -> None:
        for part in (self.path, *self.path.parents):
            if part.exists() and not part.is_dir():
                raise NotADirectoryError(
                    f"{self.path}: {part} is a file; expected a folder (a new one, or one this "
                    "command wrote)")

    def _check_ours(self) -> None:
        """Refuse a folder that is not empty and holds no run: no lock file (every folder a
        run opened has one) and none of the files of :data:`RUN_KINDS`."""
        if not self.path.is_dir() or not any(self.path.iterdir()):
            return
        if any(self.path.glob(".lock.rank*")) or any(
                any(self.path.glob(p)) for patterns in RUN_KINDS.values() for p in patterns):
            return
        shown = sorted(p.name for p in self.path.iterdir())
        listed = ", ".join(shown[:3]) + (", ..." if len(shown) > 3 else "")
        raise RunMismatch(
            f"{self.path} is not empty ({listed}) and holds no run of cosmos3-gym (no "
            f"{self._identity_name()} or .lock.rank0); refusing to write into it. Give a new "
            "folder, or an empty one")

    def _identity_name(self) -> str:
        return RUN_KINDS[self.kind][0] if self.kind is not None else "run files"

    def _in_use(self) -> str:
        return (f"{self.path} is in use by another run ({self._holder()}); wait for it to end, "
                "or give this command another folder")

    def open(self) -> None:
        """Create the folder if needed and take its lock; :class:`FolderInUse` if another
        process holds it, ``PermissionError`` (naming the folder) if it cannot be written."""
        self._check_path()
        self._check_ours()
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as err:
            raise PermissionError(
                f"cannot write to {self.path} ({err.strerror}); expected a folder this user can "
                "create files in") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            os.close(fd)
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise FolderInUse(self._in_use()) from None
            raise PermissionError(f"cannot lock {self.lock_path} ({err.strerror}); the run "
                                  "folder must be on a file system with flock") from None
        self._fd = fd
        _HELD.add(self)
        holder = {"pid": os.getpid(), "host": socket.gethostname(), "argv": sys.argv,
                  "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
        except OSError:  # a full disk: the lock holds all the same; only its label is missing
            pass
        try:
            self._check_kind()
        except BaseException:
            self.close()
            raise
        if self.world_size == 1:
            self.remove_leftovers()

    def close(self) -> None:
        """Release the lock (the lock file stays: another process may be waiting on it)."""
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
        _HELD.discard(self)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _check_kind(self) -> None:
        """Refuse a folder that holds another kind of run than ``kind`` (its files, or an
        identity file that names another kind)."""
        if self.kind is None:
            return
        for other, patterns in RUN_KINDS.items():
            found = sorted(p.name for pattern in patterns for p in self.path.glob(pattern))
            if other != self.kind and found:
                shown = ", ".join(found[:3]) + (", ..." if len(found) > 3 else "")
                raise RunMismatch(
                    f"{self.path} holds {_a(other)} ({shown}); this command writes "
                    f"{_a(self.kind)}, and a folder holds one kind of run. Use another folder")
        own = self.path / RUN_KINDS[self.kind][0]
        if own.exists():
            stored = read_json_object(own, what="run identity file").get("kind", self.kind)
            if stored != self.kind:
                raise RunMismatch(
                    f"{own} is the identity of {_a(str(stored))}; this command writes "
                    f"{_a(self.kind)}, and a folder holds one kind of run. Use another folder")

    def _holder(self) -> str:
        try:
            info = json.loads(self.lock_path.read_text() or "{}")
        except (OSError, ValueError):
            info = {}
        if not info:
            return "a process that has not written its name yet"
        argv = " ".join(str(a) for a in info.get("argv", []))
        return (f"pid {info.get('pid')} on {info.get('host')}, started {info.get('started')}: "
                f"{argv}")

    def remove_leftovers(self) -> list[Path]:
        """Remove the temporary files (``.NAME.PID.tmp``, :data:`~cosmos3_gym.jsonio.TEMPORARY`)
        of processes that no longer run."""
        removed = []
        for path in self.path.rglob(".*.tmp*"):
            match = TEMPORARY.match(path.name)
            if match is None or process_alive(int(match.group(1))):
                continue
            with contextlib.suppress(OSError):
                path.unlink()
                removed.append(path)
        return removed

    # ------------------------------------------------------------------ identity

    def bind(self, name: str, identity: dict[str, Any], *, bound: bool,
             extra: dict[str, Any] | None = None,
             replaced: Callable[[], Iterable[Path]] = tuple,
             what: str = "a different run",
             upgrade: Callable[[dict[str, Any]], dict[str, Any]] | None = None
             ) -> dict[str, Any]:
        """Bind the folder to ``identity``, stored under the key ``identity`` of file ``name``
        (with ``extra`` beside it); returns the stored document.

        ``bound``: the folder holds records of the stored identity, so another one is refused
        (:class:`RunMismatch` listing the differences; ``what`` names the stored run in it).
        Unbound, a different stored identity belongs to an attempt that recorded nothing (a
        failed start): it is replaced, and the files ``replaced()`` names (that attempt's
        incidents, timings) are removed first. ``upgrade`` turns a stored identity into today's
        terms (keys added since an older folder was written, read as what that run had);
        otherwise a missing key reads as None.
        """
        if not self.held:
            raise RuntimeError("bind() needs the folder's lock: use `with RunFolder(...)`")
        if self.kind is not None:
            if name != RUN_KINDS[self.kind][0]:
                raise ValueError(f"{self.kind}: the identity file is "
                                 f"{RUN_KINDS[self.kind][0]}; found {name!r}")
            extra = {"kind": self.kind, **(extra or {})}
        path = self.path / name
        document = {k: v for k, v in (extra or {}).items() if k == "kind"}
        document.update({"identity": identity, **(extra or {})})
        if path.exists():
            stored = read_json_object(path, what="run identity file")
            found = stored.get("identity", {})
            diff = identity_differences(upgrade(found) if upgrade else found, identity)
            if not diff:
                if extra and any(_as_json(stored.get(k)) != _as_json(v)
                                 for k, v in extra.items()):
                    write_json_atomic(path, {**stored, **document})
                    return {**stored, **document}
                return stored
            if bound:
                raise RunMismatch(
                    f"{self.path} holds {what}; refusing to mix them. Differences: {diff}. Use "
                    f"another folder, or rerun with the stored settings ({name})")
            for stale in replaced():
                stale.unlink(missing_ok=True)
        write_json_atomic(path, document)
        return document


# The folders this process holds. A forked child drops its copies of their locks (closing, never
# unlocking: an unlock would release the parent's lock, which shares the open file). Where the
# child execs (subprocess), the descriptor is close-on-exec anyway.
_HELD: weakref.WeakSet[RunFolder] = weakref.WeakSet()


def _drop_inherited_locks() -> None:
    for folder in list(_HELD):
        if folder._fd is not None:
            with contextlib.suppress(OSError):
                os.close(folder._fd)
            folder._fd = None
    _HELD.clear()


os.register_at_fork(after_in_child=_drop_inherited_locks)


def _a(kind: str) -> str:
    """``an evaluation``, ``rollouts``: a kind of run as a sentence names it."""
    if kind.endswith("s"):
        return kind
    return f"an {kind}" if kind[:1] in "aeiou" else f"a {kind}"
