"""Where the model runs, as users ask for it: --device / --precision on eval, rollout and bench,
torchrun ranks on their own GPUs, and weight-free runs of the real loop (--synthetic)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from cosmos3_gym.devices import resolve_device, resolve_dtype
from cosmos3_gym.eval.cli import main


def _error(capsys, argv) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    return err


@pytest.fixture
def two_gpus(monkeypatch):
    """A machine with two CUDA devices, as far as device resolution can tell."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.delenv("LOCAL_RANK", raising=False)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("command", [
    ["eval", "--out", "{out}"],
    ["rollout", "--env-steps", "2", "--out", "{out}"],
    ["bench", "--out", "{out}/bench.json"],
    ["size", "--synthetic", "tiny", "--out", "{out}/bench.json"],
])
def test_cuda_without_cuda_is_one_error_line_before_anything_loads(
    command, tmp_path, capsys, monkeypatch
) -> None:
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    def no_loading(*args, **kwargs):
        raise AssertionError("nothing may load for a device that is not there")

    monkeypatch.setattr(Cosmos3ActionPipeline, "from_pretrained", no_loading)
    out = tmp_path / "run"
    argv = [a.format(out=out) for a in command] + ["--device", "cuda"]
    err = _error(capsys, argv)
    assert "--device cuda: no CUDA device here" in err and "Use --device cpu (or auto)" in err
    assert not out.exists()


def test_unknown_devices_and_gpus_that_are_not_there_are_refused(
    two_gpus, tmp_path, capsys
) -> None:
    err = _error(capsys, ["eval", "--device", "cuda:3", "--out", str(tmp_path / "a")])
    assert "cuda:3 does not exist; this machine has 2 CUDA devices (cuda:0..1)" in err
    err = _error(capsys, ["eval", "--device", "tpu", "--out", str(tmp_path / "b")])
    assert "--device: expected auto, cpu, cuda or cuda:N; found 'tpu'" in err
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_each_torchrun_rank_takes_its_own_gpu(two_gpus, monkeypatch) -> None:
    assert resolve_device("auto") == torch.device("cuda", 0)  # outside torchrun
    for rank in ("0", "1"):
        monkeypatch.setenv("LOCAL_RANK", rank)
        assert resolve_device("auto") == torch.device("cuda", int(rank))
        assert resolve_device("cuda") == torch.device("cuda", int(rank))
        assert resolve_device("cuda:0") == torch.device("cuda", 0)  # as given
        assert resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setenv("LOCAL_RANK", "2")  # three ranks on a two-GPU node
    with pytest.raises(ValueError, match=r"--device auto \(LOCAL_RANK=2\): cuda:2 does not exist"):
        resolve_device("auto")


def test_auto_precision_is_bfloat16_on_cuda_and_float32_on_the_cpu() -> None:
    assert resolve_dtype("auto", torch.device("cuda", 0)) == torch.bfloat16
    assert resolve_dtype(None, torch.device("cpu")) == torch.float32
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="dtype: expected one of"):
        resolve_dtype("float16", torch.device("cpu"))


def test_auto_is_the_cpu_without_cuda(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == torch.device("cpu")


SYNTHETIC_EVAL = ["eval", "--synthetic", "tiny", "--trials", "1", "--num-envs", "4",
                  "--denoising-steps", "1", "--max-episode-steps", "3", "--no-progress"]


def test_synthetic_eval_runs_the_real_loop_and_says_its_successes_mean_nothing(
    tmp_path, capsys
) -> None:
    out = tmp_path / "synthetic"
    assert main([*SYNTHETIC_EVAL, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "model: synthetic tiny (random weights): success rates are meaningless" in printed
    assert "ran on cpu in float32 with prompt_cache" in printed
    assert "episodes/hour" in printed and "% of the run)" in printed
    results = json.loads((out / "results.json").read_text())
    assert results["episodes"] == 4 and results["config"]["synthetic"] == "tiny"
    assert results["config"]["image_size"] == 256  # one LIBERO view, shown twice
    t = results["throughput"]
    assert t["synthetic"] == "tiny" and t["devices"] == ["cpu"] and t["dtypes"] == ["float32"]
    assert t["options"]["prompt_cache"] is True and t["disabled_options"] == {}
    assert t["pipeline_s"] > 0 and t["env_s"] > 0 and t["other_s"] >= 0
    assert t["pipeline_s"] + t["env_s"] <= t["wall_s"]
    assert t["loop_overhead"] == pytest.approx((t["wall_s"] - t["pipeline_s"]) / t["pipeline_s"])
    assert t["episodes_per_hour"] == pytest.approx(3600 * t["episodes_per_s"])
    stored = json.loads((out / "config.json").read_text())["identity"]
    assert stored["synthetic"] == "tiny" and stored["dtype"] == "float32"


def test_the_synthetic_model_sees_libero_shaped_input() -> None:
    """ColorReach's 256x256 frame is shown twice side by side: LIBERO's 256x512 model input,
    its 250 + 16 GEN tokens, LIBERO's prompt sentences, and the env's 2-D action."""
    from cosmos3_gym.pipeline.preprocess import latent_content_shape, plan_canvas
    from cosmos3_gym.synthetic import TwoViewColorReachAdapter, synthetic_policy

    adapter = TwoViewColorReachAdapter()
    frames = np.random.default_rng(0).integers(0, 256, (3, 256, 256, 3), dtype=np.uint8)
    images = adapter.images(frames)
    assert images.shape == (3, 256, 512, 3)
    assert np.array_equal(images[:, :, :256], frames) and np.array_equal(images[:, :, 256:], frames)
    policy = synthetic_policy()
    h, w = latent_content_shape(plan_canvas(256, 512, policy.resolution_tier))
    assert 5 * -(-h // 2) * -(-w // 2) + policy.action_horizon == 266
    assert adapter.prompt("reach the red target").startswith("reach the red target. This video")
    raw = np.arange(2 * 16 * 10, dtype=np.float32).reshape(2, 16, 10)
    assert np.array_equal(adapter.actions(raw), raw[..., :2])


def test_synthetic_and_a_checkpoint_are_one_or_the_other(tmp_path, capsys) -> None:
    err = _error(capsys, ["eval", "--synthetic", "tiny", "--checkpoint", "tiny", "--domain",
                          "libero", "--out", str(tmp_path / "x")])
    assert "--synthetic tiny builds a model with random weights; --checkpoint, --domain would " \
           "not be used" in err
    with pytest.raises(SystemExit) as exit_info:  # argparse's own error, with the usage
        main(["eval", "--synthetic", "mega", "--out", str(tmp_path / "y")])
    assert exit_info.value.code == 2 and "invalid choice: 'mega'" in capsys.readouterr().err


def test_synthetic_rollout_records_where_its_model_ran(tmp_path) -> None:
    out = tmp_path / "rollouts"
    assert main(["rollout", "--synthetic", "tiny", "--env-steps", "3", "--num-envs", "2",
                 "--denoising-steps", "1", "--no-progress", "--out", str(out)]) == 0
    meta = json.loads((out / "meta.json").read_text())
    runtime = meta["provenance"]["runtime"]
    assert (runtime["device"], runtime["dtype"], runtime["synthetic"]) == ("cpu", "float32", "tiny")
    assert runtime["options"]["cuda_graphs"] is False and meta["num_steps"] == 3


def test_another_precision_is_another_evaluation(tmp_path, capsys) -> None:
    """A folder evaluated in float32 does not take bfloat16 episodes; one written before the
    precision was recorded (every such run was float32 on the CPU) resumes in float32."""
    out = tmp_path / "run"
    base = ["eval", "--trials", "1", "--tasks", "red", "--num-envs", "1", "--no-progress",
            "--out", str(out)]
    assert main([*base, "--precision", "fp32"]) == 0
    err = _error(capsys, [*base, "--precision", "bf16", "--trials", "2"])
    assert "holds a different evaluation" in err and "'dtype'" in err
    config = json.loads((out / "config.json").read_text())
    del config["identity"]["dtype"]  # as written before this key existed
    (out / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(base) == 0
    assert "is complete" in capsys.readouterr().out


def test_fp8_precision_runs_emulated_on_the_cpu_and_is_another_evaluation(tmp_path,
                                                                         capsys) -> None:
    """--precision fp8: the generation tower's GEMMs in FP8 (torch emulates them on the CPU),
    recorded in the folder's identity and runtime; a bf16 rerun into it is refused, and a folder
    written before the key existed resumes as bf16."""
    out = tmp_path / "run"
    base = ["eval", "--trials", "1", "--tasks", "red", "--num-envs", "1", "--no-progress",
            "--denoising-steps", "2", "--out", str(out)]
    assert main([*base, "--precision", "fp8"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["identity"]["precision"] == "fp8"
    throughput = json.loads((out / "throughput.json").read_text())
    assert throughput["options"]["fp8"] is True and throughput["disabled_options"] == {}
    err = _error(capsys, [*base, "--trials", "2"])
    assert "holds a different evaluation" in err and "'precision'" in err
    del config["identity"]["precision"]
    (out / "config.json").write_text(json.dumps(config))
    capsys.readouterr()
    assert main(base) == 0
    assert "is complete" in capsys.readouterr().out
