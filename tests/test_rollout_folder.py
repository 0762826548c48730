"""Rollouts on disk as RL runs use them: a run killed at any write resumes with its ids
continuing and every action linked to its own chunk, the cut part's episodes are recorded, a
full disk is one line and resumable, a moved folder resumes, and the log-probabilities are
recomputed from the folder alone."""

from __future__ import annotations

import errno
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3_gym.eval.cli import main
from cosmos3_gym.pipeline import Cosmos3ActionPipeline, chunk_log_prob
from cosmos3_gym.runner import load_rollouts, stochastic_record


def rollout_args(checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return ["rollout", "--checkpoint", str(checkpoint), "--env-steps", "24", "--num-envs", "2",
            "--shard-steps", "5", "--image-size", "32", "--max-episode-steps", "4",
            "--denoising-steps", "2", "--no-progress", "--out", str(out), *extra]


def check_links(data: dict) -> None:
    """Every action points at a chunk of its own env and episode, and the episode table agrees
    with the steps it summarises."""
    ids, episodes = data["chunk_ids"], data["episode_ids"]
    assert (ids[data["valid"]] >= 0).all()
    steps, envs = np.nonzero(data["valid"])
    chunk = ids[steps, envs]
    np.testing.assert_array_equal(data["chunk_env"][chunk], envs)
    np.testing.assert_array_equal(data["chunk_episode"][chunk], episodes[steps, envs])
    # Each executed action is one of its chunk's rows.
    rows = data["chunk_actions"][chunk]  # [N, H, D]
    sent = data["actions"][steps, envs][:, None]  # [N, 1, D]
    assert (rows == sent).all(axis=-1).any(axis=-1).all()
    assert len(np.unique(data["episode_id"])) == len(data["episode_id"])
    for e, length, env in zip(data["episode_id"], data["episode_length"], data["episode_env"],
                              strict=True):
        where = np.argwhere(episodes == e)
        assert len(where) == length and (where[:, 1] == env).all()


@pytest.fixture(scope="module")
def whole(checkpoint: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("whole")
    assert main(rollout_args(checkpoint, out)) == 0
    return load_rollouts(out)


def test_an_uninterrupted_run_links_every_action_to_its_chunk(whole: dict) -> None:
    check_links(whole)
    assert whole["actions"].shape[:2] == (24, 2) and len(whole["meta"]["shards"]) == 5
    assert whole["episode_finished"].sum() >= 10


# Kills its own process at the n-th file write of the run (argv[1]): a shard or a JSON file
# written only to its temporary copy, or the last shard written but meta.json not.
_CLI_KILLED_AT_WRITE = """
import os, signal, sys
from cosmos3_gym import jsonio

n, count = int(sys.argv[1]), [0]
real_replace = os.replace

def dying_replace(src, dst):
    count[0] += 1
    if count[0] == n:
        os.kill(os.getpid(), signal.SIGKILL)
    return real_replace(src, dst)

jsonio.os.replace = dying_replace
from cosmos3_gym.eval.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow
def test_a_rollout_killed_at_any_write_resumes_with_ids_continuing(checkpoint: Path,
                                                                    tmp_path: Path) -> None:
    # Writes: rollout.json twice (identity, then the part), 5 shards, meta.json.
    for n in range(1, 9):
        out = tmp_path / f"killed{n}"
        done = subprocess.run([sys.executable, "-c", _CLI_KILLED_AT_WRITE, str(n),
                               *rollout_args(checkpoint, out)], capture_output=True, text=True)
        assert done.returncode == -signal.SIGKILL, (n, done.stderr)
        saved = sorted(p.name for p in out.glob("shard-*.npz"))
        assert main(rollout_args(checkpoint, out)) == 0, n
        data = load_rollouts(out)
        assert data["actions"].shape[:2] == (24, 2), n
        assert not list(out.glob(".*.tmp")), n
        check_links(data)
        parts = data["meta"]["parts"]
        assert sum(p["steps"] for p in parts[-1:]) + 5 * len(saved) >= 24 or len(parts) == 1
        if 0 < len(saved) < 5:  # a resumed part: new chunk and episode ids, none reused
            first = parts[-1]["first_step"]
            old, new = data["chunk_ids"][:first], data["chunk_ids"][first:]
            assert new.min() > old.max(), n
            assert data["episode_ids"][first:].min() > data["episode_ids"][:first].max(), n
            # The cut part's finished episodes have their rows, marked finished.
            cut = np.unique(data["episode_ids"][:first])
            rows = dict(zip(data["episode_id"], data["episode_finished"], strict=True))
            ended = [e for e in cut if (data["terminations"] | data["truncations"])[
                :first][data["episode_ids"][:first] == e].any()]
            assert ended and all(rows[e] for e in ended), n
        if len(saved) == 5:  # killed between the last shard and meta.json: completed as is
            assert len(parts) == 1, n


def test_a_resumed_rollout_never_links_actions_to_the_earlier_part(
    checkpoint: Path, whole: dict, tmp_path: Path
) -> None:
    out = tmp_path / "r"
    assert main(rollout_args(checkpoint, out)) == 0
    for name in ("meta.json", "shard-00004.npz", "shard-00003.npz", "shard-00002.npz"):
        (out / name).unlink()  # as if killed after the second shard
    assert main(rollout_args(checkpoint, out)) == 0
    data = load_rollouts(out)
    check_links(data)
    np.testing.assert_array_equal(data["obs"][:10], whole["obs"][:10])  # kept as saved
    assert data["chunk_ids"][10:].min() == whole["chunk_ids"][:10].max() + 1
    assert [p["steps"] for p in data["meta"]["parts"]] == [24, 14]


def test_a_moved_folder_resumes(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "here"
    assert main(rollout_args(checkpoint, out)) == 0
    (out / "meta.json").unlink()
    (out / "shard-00004.npz").unlink()
    moved = tmp_path / "there"
    shutil.move(out, moved)
    assert main(rollout_args(checkpoint, moved)) == 0
    assert load_rollouts(moved)["actions"].shape[0] == 24


def _mount_tmpfs(path: Path, size_kb: int) -> bool:
    path.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True)
    return done.returncode == 0


def test_a_full_disk_is_one_line_and_resumes_once_space_is_freed(
    checkpoint: Path, tmp_path: Path, capsys, monkeypatch
) -> None:
    disk = tmp_path / "disk"
    if _mount_tmpfs(disk, 512):
        try:
            filler = disk / "filler"
            filler.write_bytes(b"\0" * (512 - 40) * 1024)  # leaves room for ~a shard or two
            out = disk / "run"
            with pytest.raises(SystemExit) as exit_info:
                main(rollout_args(checkpoint, out, "--shard-steps", "3"))
            err = capsys.readouterr().err
            assert exit_info.value.code == 1 and "Traceback" not in err
            assert len(err.strip().splitlines()) == 1 and "No space left on device" in err
            assert f"No space left on device: {out}/" in err  # the file that was not written
            assert not list(out.glob(".*.tmp"))
            filler.unlink()
            assert main(rollout_args(checkpoint, out, "--shard-steps", "3")) == 0
            check_links(load_rollouts(out))
        finally:
            subprocess.run(["umount", str(disk)], check=False)
    # Without a tmpfs (not root): the same through a writer that finds the disk full.
    from cosmos3_gym import jsonio

    out = tmp_path / "patched"
    real = jsonio.atomic_write
    calls = [0]

    def full_disk(path, write):
        calls[0] += 1
        if calls[0] > 3:
            def failing(f):
                write(f)
                raise OSError(errno.ENOSPC, "No space left on device", str(path))
            return real(path, failing)
        return real(path, write)

    monkeypatch.setattr(jsonio, "atomic_write", full_disk)
    import cosmos3_gym.runner.rollouts as rollouts

    monkeypatch.setattr(rollouts, "atomic_write", full_disk)
    with pytest.raises(SystemExit) as exit_info:
        main(rollout_args(checkpoint, out))
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and "No space left on device" in err
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    assert main(rollout_args(checkpoint, out)) == 0
    check_links(load_rollouts(out))


def test_log_probabilities_are_recomputed_from_the_folder(checkpoint: Path,
                                                          tmp_path: Path) -> None:
    out = tmp_path / "rl"
    assert main(rollout_args(checkpoint, out, "--sampler", "flow_sde",
                             "--n-action-steps", "2")) == 0
    data = load_rollouts(out)
    meta = json.loads((out / "meta.json").read_text())
    assert meta["sde_settings"]["sampler"] == "flow_sde" and meta["weights"]
    trainable = Cosmos3ActionPipeline.from_pretrained(checkpoint, trainable=True)
    assert all(p.requires_grad for p in trainable.transformer.parameters())
    rows = np.arange(len(data["chunk_env"]))
    record = stochastic_record(data, rows)
    recomputed = chunk_log_prob(trainable, record, [str(p) for p in data["chunk_prompts"]])
    assert recomputed.requires_grad
    recorded = torch.from_numpy(data["chunk_log_prob"])
    scale = recorded.abs().max()
    torch.testing.assert_close(recomputed.detach(), recorded, rtol=0, atol=1e-5 * float(scale))
    # The log-probability behind each executed action, as the README's recipe reads it.
    linked = data["chunk_log_prob"][data["chunk_ids"]]
    assert linked.shape == data["actions"].shape[:2]


def test_a_foreign_folder_is_refused_before_the_model_loads(checkpoint: Path, tmp_path: Path,
                                                            capsys) -> None:
    out = tmp_path / "r"
    assert main(rollout_args(checkpoint, out)) == 0
    with pytest.raises(SystemExit) as exit_info:
        main(rollout_args(checkpoint, out, "--seed", "3"))
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and "holds rollouts of another command" in err
    assert "'seed'" in err and len(err.strip().splitlines()) == 1


def test_python_rollouts_of_another_env_are_refused(checkpoint: Path, tmp_path: Path) -> None:
    """``collect_rollouts`` with an env the caller built: the folder records the env's family
    and settings, so the same tasks at another image size do not resume into it."""
    from cosmos3_gym.envs import ColorReachEval
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.runner import RunMismatch, collect_rollouts

    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    out = tmp_path / "run"

    def collect(size: int) -> Path:
        policy = VectorPolicy(pipe, adapter="generic", seed=0, num_inference_steps=1)
        env = ColorReachEval(["red"], image_size=size, max_episode_steps=3)
        return collect_rollouts(policy, env, 6, out, num_envs=1, shard_steps=3)

    collect(32)
    identity = json.loads((out / "rollout.json").read_text())["identity"]["env"]
    assert (identity["family"], identity["image_size"]) == (
        "cosmos3_gym.envs.color_reach.ColorReachEval", 32)
    with pytest.raises(RunMismatch, match="image_size"):
        collect(48)
    assert collect(32) == out  # the same env: complete, nothing to run
    # A folder written while every built-in family lived in envs/families.py resumes.
    document = json.loads((out / "rollout.json").read_text())
    document["identity"]["env"]["family"] = "cosmos3_gym.envs.families.ColorReachEval"
    (out / "rollout.json").write_text(json.dumps(document))
    assert collect(32) == out


def test_the_episode_table_keeps_every_task_name_whole(checkpoint: Path, tmp_path: Path) -> None:
    """Each shard's string columns are as wide as its own longest name; the merged table is as
    wide as the longest of all (a first shard of "red" alone left "yellow" as "yel")."""
    from cosmos3_gym.envs import ColorReachEval
    from cosmos3_gym.policy import VectorPolicy
    from cosmos3_gym.runner import collect_rollouts

    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    policy = VectorPolicy(pipe, adapter="generic", seed=0, num_inference_steps=1)
    env = ColorReachEval(["red", "yellow"], image_size=32, max_episode_steps=3)
    data = load_rollouts(collect_rollouts(policy, env, 8, tmp_path / "run", num_envs=1,
                                          shard_steps=2))
    assert data["episode_task"].tolist()[:3] == ["red", "yellow", "red"]


def test_a_full_disk_names_the_file_it_could_not_write(checkpoint: Path, tmp_path: Path,
                                                       capsys, monkeypatch) -> None:
    """A write or fsync that finds the disk full names no file (the system's OSError has none);
    the error line names the one that was not written."""
    from cosmos3_gym import jsonio

    real_fsync, calls = jsonio.os.fsync, [0]

    def full(fd: int) -> None:
        calls[0] += 1
        if calls[0] > 2:  # rollout.json twice, then the first shard
            raise OSError(errno.ENOSPC, "No space left on device")
        real_fsync(fd)

    monkeypatch.setattr(jsonio.os, "fsync", full)
    out = tmp_path / "run"
    with pytest.raises(SystemExit) as exit_info:
        main(rollout_args(checkpoint, out))
    err = capsys.readouterr().err
    assert exit_info.value.code == 1 and len(err.strip().splitlines()) == 1, err
    assert f"error: No space left on device: {out / 'shard-00000.npz'} (OSError, errno 28)" in err
    assert not list(out.glob(".*.tmp"))


def test_attempts_that_saved_nothing_are_not_parts(checkpoint: Path, whole: dict,
                                                   tmp_path: Path, capsys, monkeypatch) -> None:
    """Reruns on a disk that is still full save no shard; once it has room, the folder is the
    one an uninterrupted run writes: one part, the same steps."""
    import cosmos3_gym.runner.rollouts as rollouts

    real = rollouts.atomic_write

    def no_room(path, write):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    out = tmp_path / "run"
    monkeypatch.setattr(rollouts, "atomic_write", no_room)  # every shard write fails
    for _ in range(2):
        with pytest.raises(SystemExit):
            main(rollout_args(checkpoint, out))
    capsys.readouterr()
    monkeypatch.setattr(rollouts, "atomic_write", real)
    assert main(rollout_args(checkpoint, out)) == 0
    data = load_rollouts(out)
    assert [p["steps"] for p in data["meta"]["parts"]] == [24]
    assert data["meta"]["parts"][0]["seed"] == whole["meta"]["parts"][0]["seed"]
    for key in ("obs", "actions", "chunk_ids", "episode_ids", "chunk_noise", "episode_id"):
        np.testing.assert_array_equal(data[key], whole[key], err_msg=key)
