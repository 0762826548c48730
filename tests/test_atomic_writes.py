"""Nothing half-written out: every file the project writes is written under a temporary name
beside it and renamed, a folder that is one thing (``convert``'s output) is renamed into place
whole, and a full disk is one ``error:`` line naming the file that was not written."""

from __future__ import annotations

import errno
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from cosmos3_gym import jsonio
from cosmos3_gym.eval.cli import main

SOURCE = Path(__file__).parent / "fixtures" / "lerobot_cosmos3" / "libero"

# A child that runs the command line and kills itself (SIGKILL: no clean-up of any kind) at its
# K-th rename of a written file or folder, so the kill lands after a file was written whole
# and before it took its name: the points where a half folder could be left.
KILLED_AT = """
import os, signal, sys
import cosmos3_gym.formats.convert, cosmos3_gym.model.transformer, safetensors.torch
from cosmos3_gym.eval.cli import main
k, count = int(sys.argv[1]), [0]
def killing(real):
    def rename(*args, **kwargs):
        count[0] += 1
        if count[0] == k:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*args, **kwargs)
    return rename
os.replace, os.rename = killing(os.replace), killing(os.rename)
sys.exit(main(sys.argv[2:]))
"""


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its relative path, with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file()}


def leftovers(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name != out.name)


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> tuple[Path, int]:
    """An uninterrupted conversion, and how many renames it made (the kill points)."""
    out = tmp_path_factory.mktemp("whole") / "out"
    count = [0]
    real_replace, real_rename = os.replace, os.rename

    def counting(real):
        def rename(*args, **kwargs):
            count[0] += 1
            return real(*args, **kwargs)
        return rename

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", counting(real_replace))
        patch.setattr(os, "rename", counting(real_rename))
        assert main(["convert", str(SOURCE), str(out)]) == 0
    return out, count[0]


@pytest.mark.slow
def test_convert_killed_at_random_points_leaves_no_half_folder_and_the_rerun_finishes(
    converted, tmp_path
) -> None:
    reference, renames = converted
    assert renames >= 10  # configs, shards, tokenizer files, the folder itself
    points = sorted(random.Random(55).sample(range(1, renames), 4)) + [renames]
    for k in points:  # the last one: as the finished folder is renamed into place
        out = tmp_path / f"kill{k}" / "out"
        done = subprocess.run([sys.executable, "-c", KILLED_AT, str(k), "convert", str(SOURCE),
                               str(out)], capture_output=True, text=True, timeout=300)
        assert done.returncode == -signal.SIGKILL, (k, done.stderr[-2000:])
        assert not out.exists(), k  # never a half folder
        assert leftovers(out) and all(n.startswith(".out.") for n in leftovers(out)), k
        assert main(["convert", str(SOURCE), str(out)]) == 0, k
        assert leftovers(out) == [], k  # the killed run's temporary folder is gone
        assert tree(out) == tree(reference), k


def _check_full_disk(out: Path, capsys, exit_info) -> None:
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert f"No space left on device: {out}/" in err, err  # a file of OUT, not a temporary one
    assert ".tmp" not in err and "nothing was written" in err
    assert not out.exists() and leftovers(out) == []


def test_convert_on_a_full_disk_is_one_line_and_writes_nothing(converted, tmp_path, capsys,
                                                               monkeypatch) -> None:
    reference, _ = converted
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1024k", "tmpfs", str(disk)],
                             capture_output=True).returncode == 0
    if mounted:  # a real full disk where this user may mount one (the output is 2.5 MB)
        try:
            out = disk / "out"
            with pytest.raises(SystemExit) as exit_info:
                main(["convert", str(SOURCE), str(out)])
            _check_full_disk(out, capsys, exit_info)
        finally:
            subprocess.run(["umount", str(disk)], check=False)
    # Anywhere: the disk fills at each of the conversion's fsyncs in turn (the file written,
    # and the folder's own sync before it is renamed).
    real_fsync = os.fsync
    for fail_at in (1, 2, 5, 9):
        calls = [0]

        def full(fd: int, fail_at: int = fail_at, calls: list[int] = calls) -> None:
            calls[0] += 1
            if calls[0] == fail_at:
                raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)

        monkeypatch.setattr(jsonio.os, "fsync", full)
        out = tmp_path / f"full{fail_at}" / "out"
        with pytest.raises(SystemExit) as exit_info:
            main(["convert", str(SOURCE), str(out)])
        _check_full_disk(out, capsys, exit_info)
        monkeypatch.setattr(jsonio.os, "fsync", real_fsync)
        assert main(["convert", str(SOURCE), str(out)]) == 0
        assert tree(out) == tree(reference)
    capsys.readouterr()


def test_a_rerun_into_an_empty_folder_and_never_into_a_full_one(converted, tmp_path,
                                                                capsys) -> None:
    reference, _ = converted
    out = tmp_path / "out"
    out.mkdir()  # an empty folder is taken (and replaced whole)
    assert main(["convert", str(SOURCE), str(out)]) == 0
    assert tree(out) == tree(reference) and leftovers(out) == []
    before = tree(out)
    with pytest.raises(SystemExit) as exit_info:
        main(["convert", str(SOURCE), str(out)])
    assert exit_info.value.code == 2 and "exists and is not empty" in capsys.readouterr().err
    assert tree(out) == before


def test_a_safetensors_file_on_a_full_disk_is_an_oserror_naming_it(tmp_path, monkeypatch) -> None:
    """safetensors writes in Rust: its failure is a SafetensorError carrying the system's error
    number; the writer turns it into the OSError it is, naming the file, and leaves nothing."""
    import torch
    from safetensors import SafetensorError
    from safetensors import torch as st

    def full(tensors, filename, metadata=None):
        Path(filename).write_bytes(b"half")
        raise SafetensorError("Error while serializing: I/O error: No space left on device "
                              "(os error 28)")

    monkeypatch.setattr(st, "save_file", full)
    path = tmp_path / "weights.safetensors"
    with pytest.raises(OSError) as info:
        jsonio.save_safetensors({"w": torch.zeros(3)}, path)
    assert (info.value.errno, info.value.filename) == (errno.ENOSPC, str(path))
    assert list(tmp_path.iterdir()) == []


def test_a_writer_that_takes_a_file_name_leaves_the_old_file_or_the_new_one(tmp_path) -> None:
    path = tmp_path / "plot.png"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), jsonio.atomic_path(path) as tmp:
        tmp.write_bytes(b"ha")
        raise RuntimeError("the encoder failed")
    assert path.read_bytes() == b"old" and sorted(tmp_path.iterdir()) == [path]
    with jsonio.atomic_path(path) as tmp:
        tmp.write_bytes(b"new")
    assert path.read_bytes() == b"new" and sorted(tmp_path.iterdir()) == [path]


def test_a_staged_folder_replaces_the_old_one_whole_and_removes_dead_writers_leftovers(
    tmp_path
) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "old.json").write_text("{}")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    (tmp_path / f".ckpt.{dead}.tmp").mkdir()  # a killed writer's half folder
    (tmp_path / f".ckpt.{dead}.tmp" / "half.safetensors").write_bytes(b"x")
    with pytest.raises(FileExistsError), jsonio.staged_folder(out) as tmp:
        (tmp / "new.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["old.json"]
    assert leftovers(out) == []  # the dead writer's folder, and this attempt's, are gone
    with jsonio.staged_folder(out, replace=True) as tmp:
        (tmp / "new.json").write_text("{}")
    assert sorted(p.name for p in out.iterdir()) == ["new.json"] and leftovers(out) == []


TRAIN = ["--seed", "1", "--episodes", "1", "--train-steps", "2", "--batch-size", "2",
         "--hidden-size", "64", "--head-dim", "16", "--intermediate-size", "64",
         "--warmup-steps", "1", "--log-every", "1", "--vae-steps", "1", "--vae-batch-size", "2",
         "--vae-holdout-episodes", "1", "--no-progress"]


def test_train_on_a_full_disk_leaves_the_previous_checkpoint_and_refuses_a_foreign_folder(
    tmp_path, capsys, monkeypatch
) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "train_log.json").write_text("{}")  # a checkpoint this command wrote earlier
    (out / "marker").write_text("the previous checkpoint")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonio.os, "fsync", full)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", str(out), *TRAIN])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"No space left on device: {out}/transformer/config.json" in err
    assert "nothing was written" in err
    assert (out / "marker").read_text() == "the previous checkpoint" and leftovers(out) == []
    monkeypatch.undo()
    # A checkpoint train did not write (a converted one) is never replaced by a trained one.
    converted = tmp_path / "converted"
    assert main(["convert", str(SOURCE), str(converted)]) == 0
    before = tree(converted)
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--out", str(converted), *TRAIN])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "holds no checkpoint this command wrote" in err
    assert tree(converted) == before


def test_figures_and_videos_are_written_under_a_temporary_name(tmp_path, monkeypatch) -> None:
    """A plot or a video is there whole or not at all: the encoder writes a temporary file that
    is renamed when it is complete (a reader never opens a half-written MP4)."""
    import numpy as np

    from cosmos3_gym.eval.videos import mp4_available, write_video
    from cosmos3_gym.plotting import new_figure, save_figure

    renamed: list[tuple[str, str]] = []
    real_replace = os.replace

    def replace(src, dst):
        renamed.append((Path(src).name, Path(dst).name))
        return real_replace(src, dst)

    monkeypatch.setattr(jsonio.os, "replace", replace)
    frames = [np.full((32, 32, 3), v, np.uint8) for v in (0, 128, 255)]
    suffixes = [".gif"] + ([".mp4"] if mp4_available() else [])
    for suffix in suffixes:
        assert write_video(tmp_path / f"episode{suffix}", frames) == 3
    fig = new_figure(2, 2)
    fig.add_subplot().plot([0, 1], [1, 0])
    save_figure(fig, tmp_path / "results")
    pid = os.getpid()
    videos = [f"episode{s}" for s in suffixes]  # the encoders read the format off the suffix
    assert renamed == ([(f".{n}.{pid}.tmp{Path(n).suffix}", n) for n in videos]
                       + [(f".{n}.{pid}.tmp", n) for n in ("results.png", "results.svg")])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [*videos, "results.png", "results.svg"])
    assert (tmp_path / "results.png").read_bytes()[:4] == b"\x89PNG"
    if mp4_available():
        assert b"ftyp" in (tmp_path / "episode.mp4").read_bytes()[:32]


def test_size_on_a_full_disk_is_one_line_naming_its_json(tmp_path, capsys, monkeypatch) -> None:
    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(jsonio.os, "fsync", full)
    out = tmp_path / "synthetic.json"
    with pytest.raises(SystemExit) as exit_info:
        main(["size", "--synthetic", "tiny", "--cases", "droid_480x832", "--step-counts", "1",
              "--batch-sizes", "1", "--warmup", "0", "--repeats", "1", "--flips", "none",
              "--no-reference", "--out", str(out)])
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"error: No space left on device: {out} (OSError, errno 28)" in err
    assert list(tmp_path.iterdir()) == []
