"""Bad inputs a user meets, each one ``error:`` line that names what was expected, what was
found and which file, before anything runs; and checkpoints that would read outside themselves
or run pickled code are refused."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pytest

from cosmos3_gym.checkpoint import PolicyConfig, read_action_stats
from cosmos3_gym.eval.cli import main
from cosmos3_gym.pipeline import Cosmos3ActionPipeline
from cosmos3_gym.tiny import COLOR_REACH_POLICY, tiny_action_stats, write_tiny_checkpoint


def eval_args(checkpoint: Path, out: Path, *extra: str) -> list[str]:
    return ["eval", "--checkpoint", str(checkpoint), "--tasks", "red", "--trials", "1",
            "--num-envs", "1", "--image-size", "32", "--max-episode-steps", "3",
            "--denoising-steps", "2", "--no-progress", "--out", str(out), *extra]


def refused(capsys, argv: list[str], *, code: int = 2) -> str:
    """The one error line ``argv`` ends with (exit ``code``, no traceback)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == code, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def libero_head(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint with a LIBERO-like head (quantile_rot statistics)."""
    return write_tiny_checkpoint(tmp_path_factory.mktemp("libero_head"))


def _copy(checkpoint: Path, tmp_path: Path) -> Path:
    target = tmp_path / "ckpt"
    shutil.copytree(checkpoint, target)
    return target


def test_action_statistics_with_nan_are_refused_when_read(libero_head, tmp_path, capsys) -> None:
    stats = tiny_action_stats(10)
    stats["global"]["q99"][3] = math.nan
    path = tmp_path / "stats.json"
    path.write_text(json.dumps(stats))
    with pytest.raises(ValueError, match=r"stats\.json\['global'\]: expected finite numbers; "
                                         r"found NaN or infinity in .*'q99': \[3\]"):
        read_action_stats(path)
    line = refused(capsys, eval_args(libero_head, tmp_path / "out", "--action-stats", str(path)))
    assert "expected finite numbers" in line and str(path) in line
    assert not (tmp_path / "out").exists()
    # In a checkpoint's own action_policy.json too: the file is named.
    ckpt = _copy(libero_head, tmp_path)
    policy = json.loads((ckpt / "action_policy.json").read_text())
    policy["stats"] = stats
    (ckpt / "action_policy.json").write_text(json.dumps(policy))
    with pytest.raises(ValueError, match=r"action_policy\.json: .*expected finite numbers"):
        PolicyConfig.from_json_file(ckpt / "action_policy.json")


@pytest.mark.parametrize("part", ["transformer", "vae"])
def test_a_truncated_safetensors_file_is_named(checkpoint, tmp_path, capsys, part) -> None:
    ckpt = _copy(checkpoint, tmp_path)
    weights = ckpt / part / "diffusion_pytorch_model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    line = refused(capsys, eval_args(ckpt, tmp_path / "out"))
    assert f"{weights} is truncated" in line and "download or copy it again" in line
    assert not (tmp_path / "out").exists()
    weights.write_bytes(data[:5])
    assert f"{weights} is not a complete safetensors file" in refused(
        capsys, eval_args(ckpt, tmp_path / "out"))


def test_a_wrong_type_in_the_transformer_config_is_named(checkpoint, tmp_path, capsys) -> None:
    ckpt = _copy(checkpoint, tmp_path)
    config_path = ckpt / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    config["num_hidden_layers"] = "two"
    config_path.write_text(json.dumps(config))
    line = refused(capsys, eval_args(ckpt, tmp_path / "out"))
    assert f"{config_path}: num_hidden_layers is 'two' (str); expected an integer" in line


def test_a_missing_shape_key_is_named_not_met_as_a_shape_mismatch(checkpoint, tmp_path,
                                                                  capsys) -> None:
    ckpt = _copy(checkpoint, tmp_path)
    config_path = ckpt / "transformer" / "config.json"
    config = json.loads(config_path.read_text())
    del config["hidden_size"]
    config_path.write_text(json.dumps(config))
    line = refused(capsys, eval_args(ckpt, tmp_path / "out"))
    assert f"{config_path}: missing ['hidden_size']" in line


@pytest.mark.parametrize("name", ["action_policy.json", "transformer/config.json",
                                  "vae/config.json"])
def test_bad_json_names_its_file(checkpoint, tmp_path, capsys, name) -> None:
    ckpt = _copy(checkpoint, tmp_path)
    (ckpt / name).write_text('{"raw_action_dim": 2,')
    line = refused(capsys, eval_args(ckpt, tmp_path / "out"))
    assert f"{ckpt / name}: not valid JSON (line 1, column" in line


def test_a_corrupt_run_config_names_its_file(checkpoint, tmp_path, capsys) -> None:
    out = tmp_path / "out"
    assert main(eval_args(checkpoint, out)) == 0
    (out / "config.json").write_text("{ nope")
    line = refused(capsys, eval_args(checkpoint, out))
    assert f"{out / 'config.json'}: not valid JSON" in line


def test_a_grayscale_batch_without_a_channel_axis_is_refused_with_the_right_shape(
    pipeline,
) -> None:
    from cosmos3_gym.policy import VectorPolicy

    batch = np.zeros((2, 32, 64), np.uint8)  # [B, H, W]: not one 64-channel image
    with pytest.raises(ValueError, match=r"got 64 \(a 3-D array is one \[H, W, C\] image; found "
                                         r"shape \[2, 32, 64\]: a batch of B grayscale images "
                                         r"is \[B, H, W, 1\]\)"):
        pipeline(batch, "reach the red target")
    with pytest.raises(ValueError, match=r"rank 3 \[2, 32, 64\]; a batch of grayscale images "
                                         r"\[B, H, W\] takes a channel axis: \[B, H, W, 1\]"):
        VectorPolicy(pipeline).select_action(batch, "reach the red target")
    out = pipeline(batch[..., None], ["reach the red target"] * 2, num_inference_steps=1)
    assert out.actions.shape[0] == 2  # [B, H, W, 1] is taken, as grayscale


def test_a_pickled_vae_is_refused(checkpoint, tmp_path) -> None:
    ckpt = _copy(checkpoint, tmp_path)
    (ckpt / "vae" / "diffusion_pytorch_model.safetensors").unlink()
    (ckpt / "vae" / "diffusion_pytorch_model.bin").write_bytes(b"pickle would run here")
    with pytest.raises(ValueError, match="offers only pickled weights"):
        Cosmos3ActionPipeline.from_pretrained(ckpt)


@pytest.mark.parametrize("outside", ["../elsewhere.safetensors", "/etc/x.safetensors"])
def test_an_index_naming_files_outside_the_checkpoint_is_refused(checkpoint, tmp_path,
                                                                  outside) -> None:
    ckpt = _copy(checkpoint, tmp_path)
    weights = ckpt / "transformer" / "diffusion_pytorch_model.safetensors"
    shutil.copy(weights, ckpt / "elsewhere.safetensors")
    from safetensors import safe_open

    with safe_open(str(weights), "pt") as f:
        keys = list(f.keys())
    index = {"metadata": {}, "weight_map": {k: "diffusion_pytorch_model.safetensors"
                                            for k in keys}}
    index["weight_map"][keys[0]] = outside
    (ckpt / "transformer" / "diffusion_pytorch_model.safetensors.index.json").write_text(
        json.dumps(index))
    with pytest.raises(ValueError, match=r"names shards outside .*transformer: \[.*"
                                         r"may only name files inside its own folder"):
        Cosmos3ActionPipeline.from_pretrained(ckpt)


def test_a_head_of_another_width_in_the_stats_is_refused(tmp_path, capsys) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", policy_overrides=COLOR_REACH_POLICY)
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(tiny_action_stats(10)))
    with pytest.raises(ValueError, match="holds 10-D statistics; the checkpoint's 'libero' head "
                                         "makes 7-D actions"):
        Cosmos3ActionPipeline.from_pretrained(
            write_tiny_checkpoint(tmp_path / "seven", policy_overrides={"raw_action_dim": 7,
                                                                        "stats": None}),
            action_stats=str(stats))
    del ckpt


@pytest.mark.parametrize("where", ["--action-stats", "action_policy.json"])
@pytest.mark.parametrize("command", ["eval", "rollout"])
def test_statistics_of_zero_spread_are_refused_before_the_model_loads(
    tmp_path, capsys, monkeypatch, where, command
) -> None:
    """A meanstd head whose statistics have std 0 ran to 0% success, every action the mean."""
    stats = {"mean": [0.1, -0.2], "std": [0.0, 0.0], "min": [-1.0, -1.0], "max": [1.0, 1.0],
             "q01": [-0.9, -0.9], "q99": [0.9, 0.9]}
    embedded = where == "action_policy.json"
    checkpoint = write_tiny_checkpoint(tmp_path / "ckpt", policy_overrides={
        **COLOR_REACH_POLICY, "normalization": "meanstd", "stats": None})
    if embedded:  # a file written elsewhere: PolicyConfig itself refuses such statistics
        policy = json.loads((checkpoint / "action_policy.json").read_text())
        (checkpoint / "action_policy.json").write_text(
            json.dumps({**policy, "stats": {"global": stats}}))
    extra: tuple[str, ...] = ()
    if not embedded:
        path = tmp_path / "stats.json"
        path.write_text(json.dumps({"global": stats}))
        extra = ("--action-stats", str(path))

    def refuse(*args, **kwargs):
        raise AssertionError("the model loaded before its statistics were checked")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", refuse)
    out = tmp_path / "out"
    argv = eval_args(checkpoint, out, *extra) if command == "eval" else [
        "rollout", "--checkpoint", str(checkpoint), "--env-steps", "2", "--no-progress",
        "--out", str(out), *extra]
    line = refused(capsys, argv)
    assert ("stats['global']: std is 0 in every dim, so mode 'meanstd' would make every vector "
            "it maps (an action, or a state) the same one") in line, line
    assert not out.exists()
