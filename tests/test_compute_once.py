"""Compute once, hand on: a run reads its checkpoint folder once, and every part of a run (eval,
rollout, GRPO's training and held-out episodes) drives its env through the same adapter.

The file counts are taken in a fresh interpreter with an audit hook on ``open`` (every file
Python opens) and a wrapper on ``safetensors.safe_open`` / ``safetensors.numpy.load_file``
(opened by Rust code, which the hook does not see). The tokenizer's folder is not counted:
``transformers.AutoTokenizer.from_pretrained`` opens its ``tokenizer_config.json`` several
times itself, in one call (that is transformers' own reading, not this project's).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

FIXTURES = Path(__file__).parent / "fixtures" / "lerobot_cosmos3"
TOKENIZER_FOLDERS = ("tokenizer", "text_tokenizer")

# Runs the command line in this interpreter, counting opens of files under ROOT; prints one
# JSON line {relative path: count} (safetensors opens are counted under "PATH [safetensors]").
_COUNTING_CLI = r"""
import collections, json, os, sys
from pathlib import Path

root = Path(sys.argv[1]).resolve()
counts = collections.Counter()

def relative(path):
    try:
        resolved = Path(os.fsdecode(path)).resolve()
    except (TypeError, ValueError, OSError):
        return None
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else None

def hook(event, args):
    if event == "open" and isinstance(args[0], (str, bytes, os.PathLike)):
        name = relative(args[0])
        if name is not None:
            counts[name] += 1

sys.addaudithook(hook)
import safetensors
import safetensors.numpy

def counted(opener):
    def open_counted(filename, *args, **kwargs):
        name = relative(filename)
        if name is not None:
            counts[name + " [safetensors]"] += 1
        return opener(filename, *args, **kwargs)
    return open_counted

safetensors.safe_open = counted(safetensors.safe_open)
safetensors.numpy.load_file = counted(safetensors.numpy.load_file)
from cosmos3_gym.eval.cli import main

try:
    code = main(sys.argv[2:])
except SystemExit as exit:
    code = exit.code
print("COUNTS " + json.dumps({"code": code, "counts": counts}))
"""


def count_opens(folder: Path, args: list[str], cwd: Path) -> dict[str, int]:
    env = {**os.environ, "MUJOCO_GL": os.environ.get("MUJOCO_GL", "egl")}
    done = subprocess.run([sys.executable, "-c", _COUNTING_CLI, str(folder), *args],
                          capture_output=True, text=True, cwd=cwd, env=env, timeout=1200)
    line = next((x for x in done.stdout.splitlines() if x.startswith("COUNTS ")), None)
    assert line is not None, done.stdout[-2000:] + done.stderr[-4000:]
    found = json.loads(line.removeprefix("COUNTS "))
    assert found["code"] in (0, None), done.stdout[-2000:] + done.stderr[-4000:]
    return {k: v for k, v in found["counts"].items()
            if k.split("/")[0] not in TOKENIZER_FOLDERS}


def assert_read_once(folder: Path, counts: dict[str, int]) -> None:
    """Every JSON file of the folder opened once; every safetensors file at most twice: its
    header (read and checked once) and its load (one handle, however many components it
    holds)."""
    files = [p for p in folder.rglob("*") if p.is_file()
             and p.relative_to(folder).parts[0] not in TOKENIZER_FOLDERS]
    assert files
    for path in files:
        name = str(path.relative_to(folder))
        opened = counts.get(name, 0) + counts.get(name + " [safetensors]", 0)
        if path.suffix == ".json":
            assert opened <= 1, (name, opened, counts)
        elif path.suffix == ".safetensors":
            assert opened <= 2, (name, opened, counts)
    read = [p for p in files if p.suffix in (".json", ".safetensors")]
    assert any(counts.get(str(p.relative_to(folder)), 0) for p in read)  # the count saw opens


@pytest.fixture(scope="module")
def tiny_copy(tmp_path_factory) -> Path:
    from cosmos3_gym.formats import resolve_checkpoint

    folder = tmp_path_factory.mktemp("tiny") / "tiny"
    shutil.copytree(resolve_checkpoint("tiny"), folder)
    return folder


def test_eval_rollout_and_grpo_read_the_checkpoint_folder_once(tiny_copy: Path,
                                                                 tmp_path: Path) -> None:
    common = ["--checkpoint", str(tiny_copy), "--no-progress"]
    runs = {
        "eval": ["eval", *common, "--tasks", "red", "--trials", "1", "--num-envs", "1",
                 "--max-episode-steps", "4", "--out", str(tmp_path / "eval")],
        "rollout": ["rollout", *common, "--env-steps", "4", "--num-envs", "1",
                    "--out", str(tmp_path / "rollout")],
        "rl grpo": ["rl", "grpo", *common, "--tasks", "red", "--iterations", "1",
                    "--groups", "1", "--group-size", "2", "--num-envs", "2",
                    "--eval-trials", "1", "--max-episode-steps", "4", "--denoising-steps", "2",
                    "--out", str(tmp_path / "grpo")],
    }
    for name, args in runs.items():
        counts = count_opens(tiny_copy, args, tmp_path)
        assert_read_once(tiny_copy, counts), name


@pytest.mark.slow
@pytest.mark.libero
def test_a_lerobot_folder_is_read_once_by_a_libero_eval_and_a_rollout(tmp_path: Path) -> None:
    pytest.importorskip("libero.libero")
    folder = FIXTURES / "libero"
    common = ["--checkpoint", str(folder), "--env", "libero", "--suite", "libero_10",
              "--tasks", "0", "--num-envs", "1", "--max-episode-steps", "2", "--no-progress"]
    for args in (["eval", *common, "--trials", "1", "--out", str(tmp_path / "eval")],
                 ["rollout", *common, "--env-steps", "2", "--out", str(tmp_path / "rollout")]):
        assert_read_once(folder, count_opens(folder, args, tmp_path))


def lerobot_folder_with_gripper_inversion(tmp_path: Path) -> Path:
    folder = tmp_path / "lerobot_invert_gripper"
    shutil.copytree(FIXTURES / "libero", folder)
    config = json.loads((folder / "config.json").read_text())
    config["invert_gripper"] = True
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder


def test_grpo_trains_and_measures_through_one_adapter(tmp_path: Path, monkeypatch) -> None:
    """GRPO's training episodes and its held-out evaluations drive the env through the one
    adapter the run resolved (before, training made the env family's adapter itself, without
    its options or the checkpoint's declared conventions, and the held-out evaluation made its
    own)."""
    from cosmos3_gym.policy import vector_policy
    from cosmos3_gym.train.config import GRPOConfig
    from cosmos3_gym.train.grpo import run_grpo

    seen: list[object] = []
    original = vector_policy.VectorPolicy.__init__

    def recording(self, pipeline, *args, **kwargs):
        original(self, pipeline, *args, **kwargs)
        seen.append(self.adapter)

    monkeypatch.setattr(vector_policy.VectorPolicy, "__init__", recording)
    config = GRPOConfig(tasks=["red"], iterations=1, groups=1, group_size=2, num_envs=2,
                        eval_trials=1, max_episode_steps=4, num_inference_steps=2,
                        progress=False, out=str(tmp_path / "grpo"))
    run = config.preflight()
    run_grpo(config, progress=False, run=run)
    assert len(seen) >= 3  # held-out before, the iteration's training episodes, held-out after
    assert all(adapter is run.adapter for adapter in seen)


@pytest.mark.slow
@pytest.mark.libero
def test_a_lerobot_folder_gets_its_own_views_in_grpo_and_eval_and_grpo_says_what_it_cannot_train(
        tmp_path: Path) -> None:
    """A LeRobot folder (its gripper inverted) is driven through its declared views by an
    evaluation and by a GRPO run alike (the same actions and images for the same model output
    and observation). GRPO cannot train it: its head samples with diffusers' UniPC, on which the
    stochastic steps are not defined; that is refused when the run is resolved, in one line,
    instead of at the first training chunk after the load and a held-out evaluation."""
    pytest.importorskip("libero.libero")
    from cosmos3_gym.eval.evaluate import EvalConfig
    from cosmos3_gym.eval.run import resolve
    from cosmos3_gym.source import read_model_source
    from cosmos3_gym.train.config import GRPOConfig

    folder = lerobot_folder_with_gripper_inversion(tmp_path)
    env = dict(env="libero", suite="libero_10", tasks=["0"], max_episode_steps=2)
    config = GRPOConfig(checkpoint=str(folder), **env, out=str(tmp_path / "grpo"))
    with pytest.raises(ValueError, match="diffusers scheduler"):
        config.preflight()
    assert not (tmp_path / "grpo").exists()
    settings = config.resolved()
    family = settings.make_env()
    grpo_adapter = read_model_source(settings, family).adapter(family, settings.action_map)
    evaluation = resolve(EvalConfig(checkpoint=str(folder), **env), tmp_path / "eval",
                         kind="evaluation")
    assert type(evaluation.adapter).__name__ == "LeRobotViewsAdapter"  # the folder's views
    assert type(grpo_adapter) is type(evaluation.adapter)
    envs = evaluation.env.make(1, False)
    try:
        obs, _ = envs.reset(seed=0)
    finally:
        envs.close()
    raw = np.random.default_rng(0).uniform(-1, 1, (1, 16, 10)).astype(np.float32)
    np.testing.assert_array_equal(grpo_adapter.actions(raw), evaluation.adapter.actions(raw))
    np.testing.assert_array_equal(grpo_adapter.images(obs), evaluation.adapter.images(obs))
