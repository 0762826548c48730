"""One evaluation as separate jobs: ``eval --shard I/N`` and ``cosmos3-gym merge`` (eval/shards.py).

The shards' merged folder is the folder one run writes: the same episodes (seeds, observation
hashes, outcomes) in the run's order, the same results.json rates and intervals; it resumes and
reports like any run. Merge refuses anything that is not every finished shard of one run, in
one line, writing nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cosmos3_gym.eval.cli import main
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.eval.shards import shard_episodes
from cosmos3_gym.jsonio import read_jsonl
from cosmos3_gym.tiny import COLOR_REACH_POLICY, write_tiny_checkpoint

FIELDS = ("task", "task_index", "trial", "seed", "reset_options", "obs_sha256", "steps",
          "chunks", "return", "success", "out_of_range_steps")
RATES = ("success_rate", "successes", "episodes", "interval", "mean_return", "mean_length",
         "complete", "episodes_expected")


def eval_args(checkpoint: Path, *extra: str) -> list[str]:
    return ["eval", "--checkpoint", str(checkpoint), "--tasks", "red,blue", "--trials", "3",
            "--num-envs", "2", "--seed", "5", "--image-size", "32", "--max-episode-steps", "5",
            "--denoising-steps", "2", "--no-progress", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One run in one process, the same run as shards 0/2 and 1/2, and their merge."""
    root = tmp_path_factory.mktemp("shards")
    checkpoint = write_tiny_checkpoint(root / "ckpt", policy_overrides=COLOR_REACH_POLICY)
    found = {"checkpoint": checkpoint}
    for name, extra in (("single", ()), ("shard0", ("--shard", "0/2")),
                        ("shard1", ("--shard", "1/2"))):
        found[name] = root / name
        assert main([*eval_args(checkpoint, *extra), "--out", str(found[name])]) == 0
    found["merged"] = root / "merged"
    assert main(["merge", str(found["shard1"]), str(found["shard0"]),
                 "--out", str(found["merged"])]) == 0
    return found


def lines(folder: Path) -> list[list[object]]:
    return [[r[k] for k in FIELDS] for r in read_episode_records(folder)]


def test_shards_deal_every_tasks_trials_evenly_from_the_seed() -> None:
    for tasks, trials, count in ((10, 50, 8), (3, 5, 2), (1, 3, 3), (4, 7, 5)):
        shares = [shard_episodes(tasks, trials, 9, i, count) for i in range(count)]
        assert sorted(k for share in shares for k in share) == list(range(tasks * trials))
        totals = [len(share) for share in shares]
        assert max(totals) - min(totals) <= 1
        for task in range(tasks):
            per_task = [sum(k // trials == task for k in share) for share in shares]
            assert max(per_task) - min(per_task) <= 1, (tasks, trials, count, per_task)
    # the seed decides which trials a shard gets; the same seed, the same share
    assert shard_episodes(10, 50, 9, 0, 8) == shard_episodes(10, 50, 9, 0, 8)
    assert shard_episodes(10, 50, 9, 0, 8) != shard_episodes(10, 50, 10, 0, 8)
    # no shard takes the same trial numbers of every task
    trials_of = [{k % 50 for k in shard_episodes(10, 50, 9, 0, 8) if k // 50 == t}
                 for t in range(10)]
    assert len({frozenset(s) for s in trials_of}) > 1


def test_merged_shards_are_the_one_process_run(runs: dict[str, Path]) -> None:
    share0, share1 = (read_episode_records(runs[f"shard{i}"]) for i in (0, 1))
    assert len(share0) == len(share1) == 3
    assert not {(r["task"], r["trial"]) for r in share0} & {(r["task"], r["trial"])
                                                             for r in share1}
    merged, single = runs["merged"], runs["single"]
    assert lines(merged) == lines(single)
    # episodes.jsonl itself holds them in the run's order
    assert [(r["task_index"], r["trial"]) for r in read_jsonl(merged / "episodes.jsonl")] == [
        (t, k) for t in range(2) for k in range(3)]
    results, alone = (json.loads((f / "results.json").read_text()) for f in (merged, single))
    assert {k: results[k] for k in RATES} == {k: alone[k] for k in RATES}
    assert results["per_task"] == alone["per_task"]
    assert results["config"] == alone["config"] and results["config"]["shard"] is None
    assert results["protocol"] == alone["protocol"]
    assert results["throughput"]["processes"] == 2
    identity = json.loads((merged / "config.json").read_text())["identity"]
    assert identity == json.loads((single / "config.json").read_text())["identity"]
    assert (merged / "results.png").is_file() or not (single / "results.png").is_file()


def test_a_merged_folder_resumes_and_reports_like_a_run(runs: dict[str, Path],
                                                        capsys: pytest.CaptureFixture) -> None:
    capsys.readouterr()
    assert main([*eval_args(runs["checkpoint"]), "--out", str(runs["merged"])]) == 0
    out = capsys.readouterr().out
    assert "is complete: its 6 episodes were recorded before, nothing to run" in out
    assert main(["report", str(runs["merged"])]) == 0
    assert "all" in capsys.readouterr().out


def _refused(argv: list[str], capsys: pytest.CaptureFixture) -> str:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("cosmos3-gym merge: error:"), err
    return err


def _copy(folder: Path, to: Path) -> Path:
    shutil.copytree(folder, to, ignore=shutil.ignore_patterns(".lock*"))
    return to


def test_merge_refuses_what_is_not_every_finished_shard_of_one_run(
        runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    shard0, shard1, checkpoint = runs["shard0"], runs["shard1"], runs["checkpoint"]
    other_seed, other_model = tmp_path / "seed6", tmp_path / "shipped"
    assert main([*eval_args(checkpoint, "--shard", "1/2", "--seed", "6"),
                 "--out", str(other_seed)]) == 0
    shipped = [a if a != str(checkpoint) else "tiny" for a in eval_args(checkpoint)]
    assert main([*shipped, "--shard", "1/2", "--out", str(other_model)]) == 0
    unfinished = _copy(shard1, tmp_path / "unfinished")
    log = unfinished / "episodes.jsonl"
    log.write_text("".join(log.read_text().splitlines(keepends=True)[:-1]))
    overlapping = _copy(shard1, tmp_path / "overlapping")
    with (overlapping / "episodes.jsonl").open("a") as f:
        f.write((shard0 / "episodes.jsonl").read_text().splitlines(keepends=True)[0])
    out = tmp_path / "merged"
    cases = {
        "given twice": [shard0, _copy(shard0, tmp_path / "again"), shard1],
        "seed": [shard0, other_seed],
        "checkpoint": [shard0, other_model],
        "missing": [shard0],
        "unfinished: 2 of its 3 episodes": [shard0, unfinished],
        "episodes of other shards": [shard0, overlapping],
        "not a shard": [shard0, runs["single"]],
    }
    for expected, folders in cases.items():
        err = _refused(["merge", *map(str, folders), "--out", str(out)], capsys)
        assert expected in err, (expected, err)
        assert not out.exists()
    # a folder of another kind of run is refused as --out, and left as it was
    rollouts = tmp_path / "rollouts"
    rollouts.mkdir()
    (rollouts / "rollout.json").write_text("{}")
    err = _refused(["merge", str(shard0), str(shard1), "--out", str(rollouts)], capsys)
    assert "holds rollouts" in err
    assert sorted(p.name for p in rollouts.iterdir()) == ["rollout.json"]


@pytest.mark.slow
@pytest.mark.libero
def test_libero_shards_merge_into_the_one_process_run(tmp_path: Path) -> None:
    pytest.importorskip("libero.libero")
    folder = Path(__file__).parent / "fixtures" / "lerobot_cosmos3" / "libero"
    common = ["eval", "--checkpoint", str(folder), "--env", "libero", "--suite", "libero_10",
              "--tasks", "0", "--trials", "3", "--num-envs", "1", "--max-episode-steps", "3",
              "--seed", "2", "--no-progress"]
    for name, extra in (("single", ()), ("s0", ("--shard", "0/2")), ("s1", ("--shard", "1/2"))):
        assert main([*common, *extra, "--out", str(tmp_path / name)]) == 0
    assert main(["merge", str(tmp_path / "s0"), str(tmp_path / "s1"),
                 "--out", str(tmp_path / "merged")]) == 0
    assert lines(tmp_path / "merged") == lines(tmp_path / "single")
    results, alone = (json.loads((tmp_path / f / "results.json").read_text())
                      for f in ("merged", "single"))
    assert {k: results[k] for k in RATES} == {k: alone[k] for k in RATES}
    assert {r["init_state_id"] for r in read_episode_records(tmp_path / "merged")} == {0, 1, 2}


def test_more_shards_than_episodes_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--tasks", "red", "--trials", "2", "--shard", "2/3", "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == ("cosmos3-gym eval: error: --shard 2/3: the run has 2 episodes (1 task, 2 "
                   "trials each); expected at most 2 shards")
    assert not out.exists()


def test_a_shard_of_a_run_of_arms_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exit_info:
        main(["eval", "--tasks", "red", "--trials", "2", "--repeats", "2", "--shard", "0/2",
              "--out", str(out)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("cosmos3-gym eval: error: --shard 0/2 with --repeats: a shard is a "
                          "share of one run's episodes") and "\n" not in err
    assert not out.exists()
