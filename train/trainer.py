"""Train a tiny Cosmos3 policy on expert demos (ColorReach's, or Meta-World's scripted experts
with ``--env metaworld --tasks ...``), deterministically on CPU.

The recipe, end to end:

1. **Layout first.** :func:`~cosmos3_gym.tiny.write_tiny_checkpoint` writes the full diffusers
   folder (tokenizer, tiny VAE, randomly initialised transformer, scheduler,
   ``action_policy.json``), and training loads it back through
   :meth:`Cosmos3ActionPipeline.from_pretrained`, so train and inference share one tokenizer, one
   VAE and one policy head description. The VAE's per-channel ``latents_mean``/``latents_std``
   are set from the demos' latents (as Wan2.2's are from its data): with the test statistics,
   frames differ by ~0.03 in latent space and learning stalls. The transformer is trained from
   its own unfused copy (the pipeline fuses GEN projections). The pipeline encodes frames with
   diffusers' causal VAE encode (``InferenceOptions(frame_encoder=False)``).
2. **Demos.** ColorReach episodes from fixed seeds, driven by the scripted expert with random
   detours (DAgger-lite: with probability ``detour_prob`` a random velocity is executed instead,
   so off-expert states are visited); every kept state is labelled with the expert's open-loop
   chunk of ``H`` actions from that state and the ``H`` frames the env renders as that chunk
   runs (the env is deterministic: :meth:`ColorReachEnv.preview`). Meta-World's experts read
   the simulator's state, so there the episode is recorded whole and a state is labelled with
   the expert's actions along it (:func:`~cosmos3_gym.train.demos.collect_demos`).
3. **Pipeline inputs.** Each sample goes through the pipeline's own stages
   (:func:`~cosmos3_gym.train.demos.encode_demos`): preprocess and encode (the 128x128 image on
   the 256 canvas, 8x8 content latents, one 2x2 patch per arena cell) and the prompt stage's
   tokens (the JSON caption). Each step runs the UND pathway once over the four captions and
   takes each sample's rows (:meth:`~cosmos3_gym.model.TextKVCache.rows`).
4. **VAE decoder.** The VAE's encoder stays as initialised; its decoder learns to draw the
   first ``vae_clips`` demo clips (observation and rendered chunk, encoded as the pipeline
   encodes) from their latents (:mod:`cosmos3_gym.train.vae` says why), and its PSNR on clips
   of held-out episodes goes into the log. The decoder is used for imagined videos only; the
   actions never pass through it.
5. **Loss.** Flow matching in the sampler's convention: ``x_σ = (1 − σ)·x0 + σ·ε``, target
   velocity ``ε − x0``, timestep ``σ·1000``; σ drawn half uniform, half logit-normal. The action
   tokens carry the expert chunk (padding channels zero, as the sampler keeps them). The future
   latent frames are trained towards ``video_target``: ``"still"`` (the default, the shipped
   checkpoint's) repeats the conditioning frame's latent; ``"future"`` uses the latents of the
   frames the chunk renders, the real future. With the real future the policy learns to read
   its actions off the noisy future frames, which the sampler does not have (there the future
   is its own guess), and its closed-loop success collapses, so the shipped checkpoint predicts
   a still future. ``video_noise="independent"`` draws the future video's σ apart from the
   actions' (the same distribution; a share ``pure_noise_video`` of the samples at σ = 1, the
   video pure noise), so the action head learns to act beside a future in any state, the
   sampler's joint one included (it denoises both at one timestep, which this covers: the
   sampler is unchanged). ``video_motion_weight`` weights the video loss up on the latent cells
   whose pixels the chunk changes (:func:`~cosmos3_gym.train.demos.motion_cells`). The shipped
   checkpoint uses neither; what each measured (success rates, how near the predicted frames
   come to the env's) is in docs/benchmarks.md, "Training the tiny checkpoint".
6. **Optimiser.** AdamW, linear warmup then cosine decay, a fixed number of steps, a fixed data
   order from the seed, ``torch.use_deterministic_algorithms(True)``.
7. **Success while training** (``eval_every``): every ``eval_every`` steps the model being
   trained is evaluated on the demos' env as it is in memory, by the evaluation's own call
   (:func:`cosmos3_gym.evaluate`, ``eval_trials`` per task from ``eval_seed``);
   ``train_log.json`` keeps each result. The call restores the model's mode and the random
   number generators, so the training's losses and weights are the same bits with or without
   it.

Run::

    cosmos3-gym train --out /tmp/tiny --seed 0

writes the checkpoint folder and ``train_log.json`` (loss curve, wall time) inside it.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cosmos3_gym.jsonio import write_text_atomic
from cosmos3_gym.progress import progress_bar
from cosmos3_gym.train.config import (
    VIDEO_NOISE,
    TrainConfig,
    check_demo_env,
    demo_episode_steps,
    policy_overrides,
    transformer_overrides,
)
from cosmos3_gym.train.demos import (
    EncodedDemos,
    collect_demos,
    demo_canvas,
    encode_demos,
    encode_raw_latents,
    latent_statistics,
    motion_cells,
)
from cosmos3_gym.train.vae import reconstruction_psnr, train_vae

VIDEO_TARGETS = ("still", "future")


def check_recipe(cfg: TrainConfig) -> None:
    """Refuse knobs that name no recipe or contradict each other, before anything is written."""
    check_demo_env(cfg.env)
    if cfg.env == "metaworld":
        from cosmos3_gym.envs.metaworld import check_metaworld_runs, check_metaworld_tasks

        if not cfg.tasks:
            raise ValueError("--env metaworld: name the tasks whose experts give the demos "
                             "with --tasks (e.g. button-press-topdown-v3)")
        check_metaworld_tasks(cfg.tasks)
        check_metaworld_runs()
    elif cfg.tasks is not None or cfg.max_episode_steps is not None:
        given = [f for f in ("tasks", "max_episode_steps") if getattr(cfg, f) is not None]
        raise ValueError(f"{', '.join(given)}: apply to --env metaworld; ColorReach's demos "
                         "take all four colours and the env's own episode length")
    if cfg.video_target not in VIDEO_TARGETS:
        raise ValueError(f"video_target: expected one of {VIDEO_TARGETS}, got {cfg.video_target!r}")
    if cfg.video_noise not in VIDEO_NOISE:
        raise ValueError(f"video_noise: expected one of {VIDEO_NOISE}, got {cfg.video_noise!r}")
    if not 0.0 <= cfg.pure_noise_video <= 1.0:
        raise ValueError(
            f"pure_noise_video: expected a share in [0, 1], got {cfg.pure_noise_video}")
    if cfg.pure_noise_video and cfg.video_noise == "shared":
        raise ValueError(f"pure_noise_video: {cfg.pure_noise_video} needs video_noise "
                         "'independent' (with 'shared' the video's σ is the actions')")
    if cfg.video_motion_weight < 0.0:
        raise ValueError(f"video_motion_weight: expected >= 0, got {cfg.video_motion_weight}")


def sample_sigmas(batch: int, generator: torch.Generator) -> torch.Tensor:
    """Half uniform, half logit-normal(0, 1) σ in (0, 1): all noise levels, mid ones more."""
    uniform = torch.rand(batch, generator=generator)
    logit_normal = torch.sigmoid(torch.randn(batch, generator=generator))
    pick = torch.rand(batch, generator=generator) < 0.5
    return torch.where(pick, uniform, logit_normal).clamp(1e-3, 1.0 - 1e-3)


def sample_noise_levels(
    batch: int, generator: torch.Generator, *, video_noise: str, pure_noise_video: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """σ of the action tokens and σ of the future video tokens, ``[batch]`` each.

    ``"shared"``: one σ for both (the sampler's joint state). ``"independent"``: the video's σ
    drawn apart from the actions' (same distribution), and for a share ``pure_noise_video`` of
    the samples exactly 1 (the video pure noise), so the action head learns to act beside any
    state of the future: pure noise (the sampler's first step), half denoised, or clean."""
    sigma_actions = sample_sigmas(batch, generator)
    if video_noise == "shared":
        return sigma_actions, sigma_actions
    if video_noise != "independent":
        raise ValueError(f"video_noise: expected one of {VIDEO_NOISE}, got {video_noise!r}")
    sigma_video = sample_sigmas(batch, generator)
    pure = torch.rand(batch, generator=generator) < pure_noise_video
    return sigma_actions, torch.where(pure, torch.ones(()), sigma_video)


def flow_matching_loss(
    model: Any, data: EncodedDemos, index: torch.Tensor, generator: torch.Generator, *,
    raw_action_dim: int, domain_id: int, fps: float, num_latent_frames: int,
    video_loss_weight: float, video_noise: str = "shared", pure_noise_video: float = 0.0,
    motion: torch.Tensor | None = None, motion_weight: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Velocity MSE on the action tokens (+ weighted on the future latent frames).

    With one latent frame per sample (``video_target="still"``) every future latent frame is
    trained towards the conditioning one; with the clip's latent frames (``"future"``) towards
    the latents of the frames the expert's chunk renders. ``video_noise`` and
    ``pure_noise_video``: the two groups' noise levels (:func:`sample_noise_levels`).
    ``motion`` (``[N, h, w]``, :func:`~cosmos3_gym.train.demos.motion_cells`) and
    ``motion_weight``: each latent cell's video loss weighs ``1 + motion_weight * share moved``,
    normalised to a weighted mean."""
    if motion_weight and motion is None:
        raise ValueError("motion_weight needs the motion cells (train/demos.py, motion_cells)")
    b = index.shape[0]
    latents = data.latents[index]  # [b, 48, 1 or T, h, w]
    cond = latents[:, :, :1]
    if latents.shape[2] == 1:  # the "still" target: every future frame is the observation's
        x0_vision = cond.expand(-1, -1, num_latent_frames, -1, -1)  # [b, 48, T, h, w]
    elif latents.shape[2] == num_latent_frames:  # the real future
        x0_vision = latents
    else:
        raise ValueError(f"demo latents have {latents.shape[2]} frames; expected 1 or the "
                         f"sampler's {num_latent_frames}")
    x0_actions = data.actions[index]  # [b, H, 64]
    horizon = x0_actions.shape[1]

    sigma, sigma_video = sample_noise_levels(
        b, generator, video_noise=video_noise, pure_noise_video=pure_noise_video
    )
    eps_actions = torch.randn(x0_actions.shape, generator=generator)
    eps_actions[..., raw_action_dim:] = 0.0  # the sampler's padding channels are zero
    eps_vision = torch.randn(x0_vision.shape, generator=generator)
    s_a = sigma[:, None, None]
    s_v = sigma_video[:, None, None, None, None]
    noisy_actions = (1.0 - s_a) * x0_actions + s_a * eps_actions
    noisy_vision = (1.0 - s_v) * x0_vision + s_v * eps_vision
    noisy_vision[:, :, :1] = cond  # latent frame 0 is the clean observation

    text = model.encode_text(data.input_ids, data.text_mask).rows(data.prompt_ids[index])
    layout = model.gen_layout(
        text, latent_shape=tuple(noisy_vision.shape[2:]), num_actions=horizon, fps=fps
    )
    vision_noisy = (torch.arange(num_latent_frames) > 0)[None].expand(b, -1)
    action_noisy = torch.ones(b, horizon, dtype=torch.bool)
    domain_ids = torch.full((b,), domain_id, dtype=torch.long)
    v_vision, v_action = model.forward_gen(
        text, layout, noisy_vision, vision_noisy, noisy_actions, action_noisy, domain_ids,
        sigma_video * 1000.0,
        action_timesteps=None if video_noise == "shared" else sigma * 1000.0,
    )
    action_target = (eps_actions - x0_actions)[..., :raw_action_dim]
    action_loss = (v_action[..., :raw_action_dim] - action_target).square().mean()
    video_target = (eps_vision - x0_vision)[:, :, 1:]
    video_error = (v_vision[:, :, 1:] - video_target).square()  # [b, 48, T - 1, h, w]
    if motion_weight:
        weight = 1.0 + motion_weight * motion[index][:, None, None]  # [b, 1, 1, h, w]
        video_loss = (video_error * weight).mean() / weight.mean()
    else:
        video_loss = video_error.mean()
    loss = action_loss + video_loss_weight * video_loss
    return loss, {"action": action_loss.item(), "video": video_loss.item()}


def _lr_factor(step: int, warmup: int, total: int) -> float:
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(total - warmup, 1)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def train_transformer(
    model: torch.nn.Module, data: EncodedDemos, cfg: TrainConfig, *, raw_action_dim: int,
    domain_id: int, fps: float, num_latent_frames: int, progress: bool = True,
    motion: torch.Tensor | None = None,
    evaluate: Callable[[int], dict[str, Any]] | None = None,
) -> list[dict[str, float]]:
    """Fixed-step AdamW on the flow-matching loss; returns the logged loss curve (a progress
    bar shows the last logged losses). ``motion``: the demos' motion cells, which
    ``cfg.video_motion_weight`` needs (:func:`flow_matching_loss`). ``evaluate(step)`` runs
    after every ``cfg.eval_every``-th step (its success rate joins the bar)."""
    model.train().requires_grad_(True)
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay, betas=(0.9, 0.99)
    )
    n = data.latents.shape[0]
    order = torch.randperm(n, generator=generator)
    cursor = 0
    curve: list[dict[str, float]] = []
    window: list[tuple[float, float, float]] = []
    shown: dict[str, str] = {}  # the bar's postfix: the last logged losses, the last success
    bar = progress_bar(enabled=progress, total=cfg.steps, desc="train", unit="step")
    for step in range(cfg.steps):
        if cursor + cfg.batch_size > n:  # a fresh permutation per epoch, from the one generator
            order, cursor = torch.randperm(n, generator=generator), 0
        index = order[cursor : cursor + cfg.batch_size]
        cursor += cfg.batch_size
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * _lr_factor(step, cfg.warmup_steps, cfg.steps)
        loss, parts = flow_matching_loss(
            model, data, index, generator, raw_action_dim=raw_action_dim, domain_id=domain_id,
            fps=fps, num_latent_frames=num_latent_frames, video_loss_weight=cfg.video_loss_weight,
            video_noise=cfg.video_noise, pure_noise_video=cfg.pure_noise_video,
            motion=motion, motion_weight=cfg.video_motion_weight,
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        window.append((loss.item(), parts["action"], parts["video"]))
        if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
            mean = np.mean(window, axis=0)
            curve.append({"step": step + 1, "loss": float(mean[0]), "action_loss": float(mean[1]),
                          "video_loss": float(mean[2]), "lr": optimizer.param_groups[0]["lr"]})
            shown.update(loss=f"{mean[0]:.4f}", action=f"{mean[1]:.4f}", video=f"{mean[2]:.4f}")
            bar.set_postfix(shown, refresh=False)
            window = []
        if evaluate is not None and cfg.eval_every and (step + 1) % cfg.eval_every == 0:
            shown["success"] = f"{evaluate(step + 1)['success_rate']:.0%}"
            bar.set_postfix(shown, refresh=False)
        bar.update(1)
    bar.close()
    return curve


TRAIN_LOG = "train_log.json"


def train(cfg: TrainConfig, *, progress: bool = True) -> dict[str, Any]:
    """Collect, encode, train and write the checkpoint to ``cfg.out``; returns the log.

    The folder is written whole (:func:`~cosmos3_gym.jsonio.staged_folder`): built under a
    temporary name beside ``cfg.out`` and renamed into place at the end, so an interrupted or
    failed run leaves ``cfg.out`` as it was. A folder this command wrote (it holds
    ``train_log.json``) is replaced; any other folder that is not empty is refused.

    ``progress`` shows a bar per phase (demos, encoding, training with its loss), on rank 0
    only; it changes nothing else."""
    from cosmos3_gym.jsonio import staged_folder

    check_recipe(cfg)
    out = Path(cfg.out)
    if out.exists() and not out.is_dir():
        raise FileExistsError(f"--out {out} is a file; train writes a checkpoint folder")
    if out.is_dir() and any(out.iterdir()) and not (out / TRAIN_LOG).is_file():
        raise FileExistsError(
            f"--out {out} is not empty and holds no checkpoint this command wrote (no "
            f"{TRAIN_LOG}); give a new folder (train replaces only its own)")
    with staged_folder(out, replace=True) as work:
        return _train(cfg, work, progress)


def _train(cfg: TrainConfig, out: Path, progress: bool) -> dict[str, Any]:
    from cosmos3_gym.model import Cosmos3Transformer
    from cosmos3_gym.model.weights import save_transformer
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline, InferenceOptions
    from cosmos3_gym.tiny import build_tiny_vae, write_tiny_checkpoint, write_tiny_vae

    options = InferenceOptions(frame_encoder=False)
    start = time.perf_counter()
    torch.manual_seed(cfg.seed)
    torch.set_num_threads(cfg.threads)
    torch.use_deterministic_algorithms(True)
    # Filling fresh tensors with NaN is a debugging aid of deterministic mode, not part of it;
    # on CPU it costs a third of a step.
    torch.utils.deterministic.fill_uninitialized_memory = False
    write_tiny_checkpoint(
        out, seed=cfg.seed, policy_overrides=policy_overrides(cfg), **transformer_overrides(cfg)
    )
    demos = collect_demos(cfg, progress=progress)
    held_out = collect_demos(
        cfg, episodes=range(cfg.episodes, cfg.episodes + cfg.vae_holdout_episodes)
    )
    # The random VAE's latents barely move between frames under the test statistics; like the
    # real Wan2.2 VAE, the shipped one normalises with per-channel statistics of its data.
    mean, std = latent_statistics(
        Cosmos3ActionPipeline.from_pretrained(out, options=options), demos, cfg.stats_samples,
        cfg.encode_batch_size,
    )
    write_tiny_vae(out / "vae", seed=cfg.seed, latents_mean=mean, latents_std=std)
    pipe = Cosmos3ActionPipeline.from_pretrained(out, options=options)
    policy = pipe.policy
    plan = demo_canvas(pipe, demos)
    # Whole clips (the observation and the frames its chunk renders) through the encoder: the
    # decoder's training data, and the real future when that is the video target.
    clip_count = len(demos) if cfg.video_target == "future" else min(cfg.vae_clips, len(demos))
    clip_latents = encode_raw_latents(pipe.vae, demos[:clip_count], plan, cfg.encode_batch_size,
                                      progress=progress)
    data = encode_demos(pipe, demos, cfg.encode_batch_size, progress=progress,
                        future_latents=clip_latents if cfg.video_target == "future" else None)
    encoded_at = time.perf_counter()

    # The VAE's encoder stays as initialised (the latents above); its decoder learns to draw
    # the clips from them (train/vae.py says why the encoder stays).
    vae = build_tiny_vae(seed=cfg.seed)  # the checkpoint's, as write_tiny_vae wrote it
    vae_curve = train_vae(
        vae, clip_latents[: cfg.vae_clips], demos[: cfg.vae_clips].clips, (mean, std),
        steps=cfg.vae_steps, batch_size=cfg.vae_batch_size, lr=cfg.vae_lr, crop=cfg.vae_crop,
        warmup_steps=cfg.vae_warmup_steps, seed=cfg.seed, log_every=cfg.log_every,
        still_rows=cfg.vae_still_rows if cfg.video_target == "still" else 0, progress=progress,
    )
    vae.register_to_config(latents_mean=mean, latents_std=std)
    vae.save_pretrained(out / "vae", safe_serialization=True)
    heldout_psnr = reconstruction_psnr(vae, held_out.clips, plan, cfg.encode_batch_size)
    vae_at = time.perf_counter()
    print(f"{len(demos)} samples from {cfg.episodes} episodes encoded in "
          f"{encoded_at - start:.1f}s; VAE decoder trained on {min(cfg.vae_clips, len(demos))} "
          f"clips in {vae_at - encoded_at:.1f}s (held-out PSNR {heldout_psnr['per_frame']} dB "
          "per frame)", flush=True)

    # The pipeline fuses the GEN projections for inference (fused weights are plain tensors that
    # autograd would not train), so training loads its own unfused copy of the same weights.
    model = Cosmos3Transformer.from_pretrained(out / "transformer")
    motion = None
    if cfg.video_motion_weight:  # one cell per latent: the image's pixels over the latent width
        motion = motion_cells(demos, cfg.image_size // data.latents.shape[-1])
    evaluations: list[dict[str, Any]] = []
    curve = train_transformer(
        model, data, cfg, raw_action_dim=policy.raw_action_dim, domain_id=policy.domain_id,
        fps=policy.fps, num_latent_frames=pipe.noise.num_latent_frames, progress=progress,
        motion=motion, evaluate=success_while_training(model, pipe, cfg, evaluations),
    )
    save_transformer(model.eval(), out / "transformer")
    wall = time.perf_counter() - start
    log = {
        "config": asdict(cfg), "num_samples": len(demos), "loss_curve": curve,
        "final_loss": curve[-1]["loss"] if curve else None,
        "evaluations": evaluations,
        "vae": {"loss_curve": vae_curve, "heldout_psnr_db": heldout_psnr,
                "heldout_episodes": [cfg.episodes, cfg.episodes + cfg.vae_holdout_episodes]},
        "encode_wall_s": round(encoded_at - start, 2),
        "vae_wall_s": round(vae_at - encoded_at, 2),
        "train_wall_s": round(wall - (vae_at - start), 2), "wall_s": round(wall, 2),
        "torch": torch.__version__,
    }
    write_text_atomic(out / TRAIN_LOG, json.dumps(log, indent=2))
    return log


def success_while_training(model: torch.nn.Module, pipe: Any, cfg: TrainConfig,
                           evaluations: list[dict[str, Any]]
                           ) -> Callable[[int], dict[str, Any]] | None:
    """The hook that evaluates ``model`` (the transformer being trained) on the demos' env
    (ColorReach, or Meta-World's tasks without shadows, as the demos were rendered) at a step,
    appending each result to ``evaluations`` (None without ``cfg.eval_every``): a
    pipeline around the model itself, its projections unfused (fused copies would not follow
    the optimiser), with ``pipe``'s VAE, tokenizer and head."""
    if not cfg.eval_every:
        return None
    from dataclasses import replace

    from cosmos3_gym.eval.api import evaluate
    from cosmos3_gym.pipeline import Cosmos3ActionPipeline

    being_trained = Cosmos3ActionPipeline(
        model, pipe.vae, pipe.tokenizer, pipe.policy, contract=pipe.contract,
        options=replace(pipe.options, fuse_projections=False))

    env: dict[str, Any] = {}
    if cfg.env == "metaworld":
        env = {"tasks": list(cfg.tasks or ()), "env_kwargs": {"shadows": False},
               "max_episode_steps": demo_episode_steps(cfg)}

    def hook(step: int) -> dict[str, Any]:
        results = evaluate(being_trained, cfg.env, trials=cfg.eval_trials,
                           seed=cfg.eval_seed, image_size=cfg.image_size, **env)
        point = {"step": step, "success_rate": results.success_rate,
                 "interval": list(results.interval), "episodes": len(results.episodes)}
        evaluations.append(point)
        return point

    return hook

