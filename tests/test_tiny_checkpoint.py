"""The shipped ``tiny`` checkpoint: it loads offline, it solves ColorReach only when the prompt is
right, and the training entry point that produced it is reproducible."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from cosmos3_gym.eval.cli import main as cli_main
from cosmos3_gym.eval.results import format_table
from cosmos3_gym.formats import resolve_checkpoint
from cosmos3_gym.jsonio import read_jsonl
from cosmos3_gym.pipeline import Cosmos3ActionPipeline
from cosmos3_gym.pipeline.preprocess import plan_canvas
from cosmos3_gym.tiny import build_tiny_transformer
from cosmos3_gym.train import (
    TrainConfig,
    train,
    transformer_overrides,
)
from cosmos3_gym.train.demos import collect_demos, demo_canvas
from cosmos3_gym.train.vae import psnr, reconstruction_psnr

ROOT = Path(__file__).resolve().parents[1]

# A fixed episode set: 6 trials of each of the 4 colours, their env seeds derived from this one
# (a stream apart from the training demos' seeds 0..episodes-1).
EVAL_SEED = 50_000
EVAL_TRIALS = 6
EVAL_ENVS = 8


@pytest.fixture(scope="module")
def tiny_pipe() -> Cosmos3ActionPipeline:
    return Cosmos3ActionPipeline.from_pretrained("tiny")


def test_tiny_checkpoint_loads_offline_by_name(tiny_pipe: Cosmos3ActionPipeline) -> None:
    root = resolve_checkpoint("tiny")
    assert root.parent.name == "checkpoints" and (root / "transformer").is_dir()
    assert tiny_pipe.policy.raw_action_dim == 2
    assert tiny_pipe.action_horizon % 4 == 0
    training = json.loads((root / "training.json").read_text())
    assert training["command"].startswith("python -m cosmos3_gym.train")


@pytest.mark.slow
def test_tiny_checkpoint_reaches_the_named_target(tiny_pipe: Cosmos3ActionPipeline) -> None:
    """Evaluated as any evaluation is (cosmos3_gym.evaluate, whole chunks): with each
    episode's own prompt, and with another task's (``shuffle_prompts``: every prompt names a
    wrong colour, so only chance reaches the target)."""
    import cosmos3_gym

    common = dict(trials=EVAL_TRIALS, seed=EVAL_SEED, num_envs=EVAL_ENVS, image_size=128)
    right = cosmos3_gym.evaluate(tiny_pipe, "color_reach", **common)
    shuffled = cosmos3_gym.evaluate(tiny_pipe, "color_reach", shuffle_prompts=True, **common)
    assert len(right.episodes) == len(shuffled.episodes) == 24
    assert right.success_rate >= 0.8, right.table()
    assert shuffled.success_rate <= 0.4, shuffled.table()


# The shipped VAE on clips of episodes no training run used (training seed 0 took episodes
# 0..1439; these are seed 7's). Measured when the checkpoint was trained: see training.json.
# The bar: frames the agent has moved in differ from the observed one by about 20 dB (two
# agent squares of error), so a reconstruction must be well above that for the agent's
# position in a decoded frame to mean anything.
VAE_PSNR_FLOOR_DB = 23.0


def test_tiny_vae_reconstructs_held_out_clips(tiny_pipe: Cosmos3ActionPipeline) -> None:
    demos = collect_demos(TrainConfig(seed=7), episodes=range(12))[:24]
    psnr = reconstruction_psnr(tiny_pipe.vae, demos.clips, demo_canvas(tiny_pipe, demos))
    assert psnr["clips"] == 24
    assert min(psnr["per_frame"]) >= VAE_PSNR_FLOOR_DB, psnr


def _dev_script():
    spec = importlib.util.spec_from_file_location("dev", ROOT / "scripts" / "dev.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def demo_imagined(tmp_path_factory) -> tuple[dict, list[dict]]:
    """``make demo``'s imagined run on the shipped checkpoint: results.json and its episodes."""
    out = tmp_path_factory.mktemp("demo") / "imagined"
    argv = list(_dev_script().DEMO_IMAGINED)
    argv[argv.index("--out") + 1] = str(out)
    assert cli_main([*argv, "--no-progress"]) == 0
    return json.loads((out / "results.json").read_text()), read_jsonl(out / "episodes.jsonl")


def test_the_demo_imagined_frames_show_the_scene(demo_imagined) -> None:
    """``make demo``'s imagined run: the frames the model draws are the scene it was shown (its
    frame 0 against the observation, over every planned chunk), and the summary measures its
    predicted frames against the env's."""
    results, records = demo_imagined
    imagined = results["imagined"]
    assert imagined["episodes"] == results["episodes"] == len(records) == 4
    # every executed step once, every planned chunk once
    assert imagined["frames"] == sum(r["steps"] for r in records)
    assert imagined["chunks"] == sum(r["chunks"] for r in records)
    assert imagined["reconstruction_psnr_db"] >= VAE_PSNR_FLOOR_DB, imagined
    assert all(math.isfinite(v) for v in imagined["psnr_db"].values()), imagined


def test_the_demo_shows_no_out_of_range_actions(demo_imagined) -> None:
    """``make demo`` printed "out-of-range actions: 18 of 20 episodes sent an action outside the
    action space": the head's samples of the expert's saturated velocities landed up to 0.05
    past ColorReach's [-1, 1]. The shipped head clips its samples to the range it was trained
    in (clip_actions), so the demo's episodes send none, and nothing is clipped after it."""
    results, records = demo_imagined
    assert results["success_rate"] == 1.0 and results["episodes"] == 4
    assert results["out_of_range_episodes"] == results["clipped_episodes"] == 0
    assert all(r["max_action_excess"] == 0 for r in records)
    table = format_table(results)
    assert "out-of-range" not in table and "clipped" not in table


def test_the_shipped_head_clips_its_samples_to_its_training_range(
    tiny_pipe: Cosmos3ActionPipeline,
) -> None:
    """The sampled (normalised) actions stay as sampled, for a learner; the actions are those
    clipped into [-1, 1]. The same head unclipped gives them as sampled."""
    from cosmos3_gym.envs.color_reach import ColorReachEnv, prompt_for

    assert tiny_pipe.policy.clip_actions
    env = ColorReachEnv()
    images = np.stack([env.reset(seed=s, options={"target": "red"})[0] for s in range(8)])
    out = tiny_pipe(images, prompt_for("red"), seed=list(range(8)), progress=False)
    sampled = out.normalized_actions
    assert np.abs(sampled).max() > 1.0  # the saturated velocity, sampled past the bound
    np.testing.assert_array_equal(out.actions, np.clip(sampled, -1.0, 1.0))
    unclipped = Cosmos3ActionPipeline.from_pretrained(
        "tiny", policy=dataclasses.replace(tiny_pipe.policy, clip_actions=False))
    again = unclipped(images, prompt_for("red"), seed=list(range(8)), progress=False)
    np.testing.assert_array_equal(again.normalized_actions, sampled)
    np.testing.assert_array_equal(again.actions, sampled)


@pytest.mark.slow
def test_the_demo_run_is_the_same_episodes_without_out_of_range_actions(tmp_path) -> None:
    """``make demo``'s evaluation (20 episodes): every task at 100%, no out-of-range or clipped
    action in its summary; the head unclipped runs the very same episodes (the env clipped
    those actions itself) and reports them out of range."""
    from cosmos3_gym.eval.evaluate import evaluate

    argv = [a for a in _dev_script().DEMO_EVAL if a != "--videos"]
    argv[argv.index("--out") + 1] = str(tmp_path / "demo")
    assert cli_main([*argv, "--no-progress"]) == 0
    results = json.loads((tmp_path / "demo" / "results.json").read_text())
    assert results["episodes"] == 20
    assert all(task["success_rate"] == 1.0 for task in results["per_task"].values())
    table = format_table(results)
    assert "out-of-range" not in table and "clipped" not in table
    config = json.loads((tmp_path / "demo" / "config.json").read_text())["session"]
    pipe = Cosmos3ActionPipeline.from_pretrained("tiny")
    unclipped = Cosmos3ActionPipeline.from_pretrained(
        "tiny", policy=dataclasses.replace(pipe.policy, clip_actions=False))
    from cosmos3_gym.eval.cli import settings_from
    from cosmos3_gym.eval.evaluate import EvalConfig

    before = evaluate(settings_from(EvalConfig, config), tmp_path / "unclipped",
                      pipeline=unclipped, summary=False)
    assert before["out_of_range_episodes"] > 0
    hashes = {(r["task"], r["trial"]): r["obs_sha256"]
              for r in read_jsonl(tmp_path / "demo" / "episodes.jsonl")}
    assert hashes == {(r["task"], r["trial"]): r["obs_sha256"]
                      for r in read_jsonl(tmp_path / "unclipped" / "episodes.jsonl")}


# How much nearer its own step's env frame a predicted frame must be than each baseline.
IMAGINED_MARGIN_DB = 1.0


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "the shipped checkpoint predicts a still future (video_target 'still'), measured on the "
    "demo's imagined run: predicted 21.0 dB at their own step, the observed frame copied 19.6; "
    "the env's frames 4 steps earlier 21.2 (predicted 20.8 there), 4 steps later 21.6 "
    "(predicted 20.6 there). The independent-noise recipe (train/trainer.py) is not shipped yet"))
def test_the_demo_imagined_frames_predict_the_future(demo_imagined) -> None:
    """The predicted frames are the future the policy acts in: nearer the env's frame at their
    own step, by 1 dB, than the observed frame copied and than the env's frames 4 steps (one
    latent frame) earlier and later, and on the pixels that moved nearer the future than the
    present. A still future fails every one of these; the env's own clip through the VAE (the
    oracle) passes them by 6.5, 4.8 and 5.0 dB."""
    results, records = demo_imagined
    imagined = results["imagined"]
    db = imagined["psnr_db"]
    assert db["predicted"] >= db["copy_observed"] + IMAGINED_MARGIN_DB, imagined
    for name in ("earlier", "later"):
        shifted = imagined[name]
        assert shifted["frames"] > 0, imagined
        assert shifted["psnr_db"]["predicted"] >= (
            shifted["psnr_db"]["shifted"] + IMAGINED_MARGIN_DB), (name, imagined)
    changed = [r["imagined"]["changed"] for r in records]
    pixels = sum(c["pixels"] for c in changed)
    assert pixels > 0
    future, present = (sum(c["mse"][name] * c["pixels"] for c in changed if c["pixels"]) / pixels
                       for name in ("future", "present"))
    assert future < present, (future, present)


def test_the_env_clip_through_the_shipped_vae_passes_the_imagined_bars(
    tiny_pipe: Cosmos3ActionPipeline,
) -> None:
    """The oracle of the bars above: each chunk's clip is the env's own frames from its step
    (through the shipped VAE's encode and decode, as the training targets are made), assigned to
    steps as the imagined run assigns the decoded frames. It beats every baseline by the margin,
    so a model that fails them fails on its prediction, not on the measure or on how the VAE's
    one future latent frame maps to the chunk's four steps. Measured on the shipped VAE (its
    decoder also drew still futures): +5.0 dB over the copy, +3.2 over the frames 4 steps
    earlier, +1.3 over those 4 steps later; a decoder trained on the real future only (the
    ``future`` video target) gives +7.1, +4.6 and +5.2."""
    from cosmos3_gym.envs import ColorReachEnv, ColorReachExpert
    from cosmos3_gym.eval.videos import ImaginedChunk, imagined_errors
    from cosmos3_gym.train.demos import COLOR_ORDER
    from cosmos3_gym.train.vae import encode_clips

    expert, horizon = ColorReachExpert(), tiny_pipe.policy.action_horizon
    totals: dict[str, list[tuple[float, int]]] = {}
    for seed in range(4):
        env = ColorReachEnv(image_size=128, colors=COLOR_ORDER)
        frames = [env.reset(seed=EVAL_SEED + seed)[0]]
        for _ in range(env.max_episode_steps):
            obs, _, terminated, truncated, _ = env.step(expert(env.state_dict()))
            frames.append(obs)
            if terminated or truncated:
                break
        last = len(frames) - 1
        starts = range(0, last, horizon)
        clips = np.stack([[frames[min(s + k, last)] for k in range(horizon + 1)] for s in starts])
        plan = plan_canvas(128, 128, tiny_pipe.policy.resolution_tier)
        with torch.no_grad():
            decoded = tiny_pipe.vae.decode(encode_clips(tiny_pipe.vae, clips, plan)).sample
        pixels = ((decoded + 1.0) * 127.5).round().clamp(0, 255).to(torch.uint8)
        pixels = pixels.permute(0, 2, 3, 4, 1).numpy()  # [chunks, H + 1, h, w, 3]
        errors = imagined_errors(
            [ImaginedChunk(s, "", clip) for s, clip in zip(starts, pixels, strict=True)], frames)
        assert errors is not None
        rows = {"predicted": (errors["mse"]["predicted"], errors["frames"]),
                "copy_observed": (errors["mse"]["copy_observed"], errors["frames"])}
        for name in ("earlier", "later"):
            if errors[name]["frames"]:
                for part in ("predicted", "shifted"):
                    rows[f"{name}.{part}"] = (errors[name]["mse"][part], errors[name]["frames"])
        for key, row in rows.items():
            totals.setdefault(key, []).append(row)
    db = {key: psnr(sum(m * n for m, n in rows) / sum(n for _, n in rows))
          for key, rows in totals.items()}
    assert db["predicted"] >= db["copy_observed"] + IMAGINED_MARGIN_DB, db
    for name in ("earlier", "later"):
        assert db[f"{name}.predicted"] >= db[f"{name}.shifted"] + IMAGINED_MARGIN_DB, db


def _small_run(out: Path) -> TrainConfig:
    return TrainConfig(
        out=str(out), seed=3, episodes=2, keep_prob=0.5, hidden_size=64, head_dim=16,
        intermediate_size=64, steps=4, batch_size=4, warmup_steps=2, log_every=1,
        vae_steps=2, vae_batch_size=2, vae_warmup_steps=1, vae_holdout_episodes=1,
    )


def test_training_is_bit_reproducible(tmp_path: Path) -> None:
    """Two runs of one seed write the same bits, the second with the model being trained
    evaluated every other step (``eval_every``: the evaluation's own call, in memory, which
    gives the training its state back)."""
    logs, weights = [], []
    vaes = []
    for name in ("first", "second"):
        cfg = _small_run(tmp_path / name)
        if name == "second":
            cfg.eval_every, cfg.eval_trials = 2, 1
        logs.append(train(cfg))
        folder = Path(cfg.out) / "transformer"
        weights.append(load_file(str(folder / "diffusion_pytorch_model.safetensors")))
        vaes.append(Path(cfg.out) / "vae")
    assert [p["loss"] for p in logs[0]["loss_curve"]] == [p["loss"] for p in logs[1]["loss_curve"]]
    assert logs[0]["vae"] == logs[1]["vae"]
    assert logs[0]["evaluations"] == []
    assert [e["step"] for e in logs[1]["evaluations"]] == [2, 4]
    assert all(e["episodes"] == 4 and 0.0 <= e["success_rate"] <= 1.0
               for e in logs[1]["evaluations"])
    assert weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
    # The VAE's decoder trained too, to the same bits; its encoder is the initial one.
    vae_weights = [load_file(str(v / "diffusion_pytorch_model.safetensors")) for v in vaes]
    assert all(torch.equal(vae_weights[0][k], vae_weights[1][k]) for k in vae_weights[0])
    assert (vaes[0] / "config.json").read_text() == (vaes[1] / "config.json").read_text()
    from cosmos3_gym.tiny import build_tiny_vae

    initial_vae = build_tiny_vae(seed=3).state_dict()
    decoder = [k for k in initial_vae if k.startswith(("decoder.", "post_quant_conv."))]
    encoder = [k for k in initial_vae if k.startswith(("encoder.", "quant_conv."))]
    assert len(decoder) > 10 and len(encoder) > 10
    assert [k for k in decoder if torch.equal(initial_vae[k], vae_weights[0][k])] == []
    assert all(torch.equal(initial_vae[k], vae_weights[0][k]) for k in encoder)
    # Training moved every trainable weight away from the random initialisation, the GEN
    # projections included (the pipeline fuses those for inference; training must not).
    cfg = _small_run(tmp_path / "first")
    vocab = len(Cosmos3ActionPipeline.from_pretrained(cfg.out).tokenizer)
    initial = build_tiny_transformer(vocab, seed=cfg.seed, **transformer_overrides(cfg))
    gen = [n for n in initial.state_dict() if any(
        part in n for part in ("moe_gen", "add_", "norm_added", "action_", "proj_in", "proj_out")
    )]
    assert len(gen) > 10
    assert [n for n in gen if torch.equal(initial.state_dict()[n], weights[0][n])] == []


def test_training_progress_shows_its_loss_and_changes_nothing(tmp_path: Path, capsys) -> None:
    runs = {}
    for shown in (True, False):
        cfg = _small_run(tmp_path / f"progress{int(shown)}")
        log = train(cfg, progress=shown)
        bars = capsys.readouterr().err
        folder = Path(cfg.out) / "transformer"
        weights = load_file(str(folder / "diffusion_pytorch_model.safetensors"))
        runs[shown] = ([p["loss"] for p in log["loss_curve"]], weights, bars)
    (curve_on, weights_on, bars_on), (curve_off, weights_off, bars_off) = runs[True], runs[False]
    assert curve_on == curve_off
    assert weights_on.keys() == weights_off.keys()
    assert all(torch.equal(weights_on[k], weights_off[k]) for k in weights_on)
    # One bar per phase; the training bar carries the last logged loss.
    assert "demos:" in bars_on and "vae:" in bars_on and "encode:" in bars_on
    assert f"loss={curve_on[-1]:.4f}" in bars_on and "4/4" in bars_on
    assert bars_off == ""


def test_train_command_writes_a_loadable_checkpoint(tmp_path: Path, capsys) -> None:
    out = tmp_path / "ckpt"
    argv = ["--out", str(out), "--seed", "1", "--episodes", "1", "--train-steps", "2",
            "--batch-size", "2", "--hidden-size", "64", "--head-dim", "16",
            "--intermediate-size", "64", "--warmup-steps", "1", "--log-every", "1",
            "--vae-steps", "1", "--vae-batch-size", "2", "--vae-holdout-episodes", "1"]
    # As the README runs it: `cosmos3-gym train --out DIR ...`.
    assert cli_main(["train", *argv]) == 0
    assert "wrote" in capsys.readouterr().out
    log = json.loads((out / "train_log.json").read_text())
    assert len(log["loss_curve"]) == 2 and log["wall_s"] > 0
    pipe = Cosmos3ActionPipeline.from_pretrained(out)
    assert pipe(torch.zeros(1, 128, 128, 3, dtype=torch.uint8).numpy(), "reach the red target",
                progress=False).actions.shape == (1, 4, 2)


def test_inference_only_attention_fold_leaves_training_numerics_alone(tmp_path, monkeypatch):
    """Folding query groups gives the same forward, but its backward sums K/V gradients in
    another order; training must keep the reference numerics (the shipped checkpoint's)."""
    from cosmos3_gym.model import transformer

    curves = []
    for fold in (True, False):
        original = transformer.MoTAttention.__init__

        def init(self, *args, _original=original, _fold=fold, **kwargs):
            _original(self, *args, **kwargs)
            self.fold_query_groups = _fold

        monkeypatch.setattr(transformer.MoTAttention, "__init__", init)
        log = train(_small_run(tmp_path / f"fold{int(fold)}"))
        monkeypatch.undo()
        curves.append([p["loss"] for p in log["loss_curve"]])
    assert curves[0] == curves[1]


def test_training_latents_are_the_pipeline_encode_of_the_observation_and_its_future(
    tiny_pipe: Cosmos3ActionPipeline,
) -> None:
    """Latent frame 0 of a training clip is what the encode stage gives the sampler at
    inference (causal encoder); frame 1 codes the chunk's rendered frames, so it moves with them."""
    from cosmos3_gym.pipeline.stages import MicroBatch, SamplingParams
    from cosmos3_gym.train.demos import encode_raw_latents

    demos = collect_demos(TrainConfig(seed=7), episodes=range(2))[:3]
    plan = demo_canvas(tiny_pipe, demos)
    raw = encode_raw_latents(tiny_pipe.vae, demos, plan, batch_size=3)
    assert raw.shape[:3] == (3, 48, tiny_pipe.noise.num_latent_frames)
    from cosmos3_gym.pipeline.vae import latent_normalization

    mean, inv_std = latent_normalization(tiny_pipe.vae)
    training = (raw - mean.view(1, -1, 1, 1, 1)) * inv_std.view(1, -1, 1, 1, 1)
    batch = MicroBatch(indices=[0, 1, 2], images=list(demos.images), prompts=[], seeds=[],
                       plan=plan)
    params = SamplingParams(num_inference_steps=1, guidance_scale=1.0, flow_shift=1.0,
                            progress=False)
    for stage in (tiny_pipe.preprocess, tiny_pipe.encode):
        batch = stage(batch, params)
    torch.testing.assert_close(training[:, :, :1], batch.cond_latent, atol=2e-4, rtol=1e-4)
    still = demos[:3]
    still.futures = np.repeat(still.images[:, None], 4, axis=1)  # the agent never moves
    frozen = encode_raw_latents(tiny_pipe.vae, still, plan, batch_size=3)
    assert not torch.allclose(frozen[:, :, 1:], raw[:, :, 1:], atol=1e-3)
