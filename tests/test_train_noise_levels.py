"""Training's noise levels for the future video and the actions: one shared σ (the
shipped recipe, drawn exactly as before) or each its own, with a share of pure-noise video; and
the video loss weighted towards the latent cells the chunk moves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from cosmos3_gym.eval.cli import build_parser, command_settings
from cosmos3_gym.tiny import build_tiny_transformer
from cosmos3_gym.train import TrainConfig, train
from cosmos3_gym.train.demos import Demos, EncodedDemos, motion_cells
from cosmos3_gym.train.trainer import flow_matching_loss, sample_noise_levels, sample_sigmas

VOCAB = 64
NUM_LATENT_FRAMES = 2


def test_shared_noise_levels_are_the_one_draw_the_shipped_recipe_made() -> None:
    """``shared`` is the draw training made before the option existed, and it takes no more from
    the generator, so every later draw of the step (and the shipped checkpoint) is unchanged."""
    before, after = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    sigma = sample_sigmas(64, before)
    actions, video = sample_noise_levels(64, after, video_noise="shared", pure_noise_video=0.0)
    assert torch.equal(actions, sigma) and torch.equal(video, sigma)
    assert torch.equal(before.get_state(), after.get_state())


def test_independent_noise_levels_draw_the_video_apart_with_a_pure_noise_share() -> None:
    batch, share = 20_000, 0.3
    generator = torch.Generator().manual_seed(0)
    actions, video = sample_noise_levels(batch, generator, video_noise="independent",
                                         pure_noise_video=share)
    assert actions.shape == video.shape == (batch,)
    pure = video == 1.0
    # Binomial(20000, 0.3): standard deviation 0.0032, the bound is five of them.
    assert abs(pure.float().mean().item() - share) < 0.016
    rest = video[~pure]
    assert rest.min() > 0.0 and rest.max() < 1.0 and actions.max() < 1.0
    # The other video levels follow the actions' distribution, and are drawn apart from them.
    deciles = torch.linspace(0.1, 0.9, 9)
    assert (torch.quantile(rest, deciles) - torch.quantile(actions, deciles)).abs().max() < 0.02
    r = np.corrcoef(actions[~pure].numpy(), rest.numpy())[0, 1]
    assert abs(r) < 0.04, r  # 14000 pairs: a correlation's standard deviation is 0.0085
    none = sample_noise_levels(batch, generator, video_noise="independent", pure_noise_video=0.0)
    assert not (none[1] == 1.0).any()
    everything = sample_noise_levels(8, generator, video_noise="independent",
                                     pure_noise_video=1.0)
    assert torch.equal(everything[1], torch.ones(8))
    with pytest.raises(ValueError, match="video_noise: expected one of"):
        sample_noise_levels(8, generator, video_noise="staggered", pure_noise_video=0.0)


def _data(n: int = 6, grid: int = 4) -> EncodedDemos:
    generator = torch.Generator().manual_seed(1)
    actions = torch.zeros(n, 4, 64)
    actions[..., :2] = torch.rand(n, 4, 2, generator=generator) * 2 - 1
    return EncodedDemos(
        latents=torch.randn(n, 48, NUM_LATENT_FRAMES, grid, grid, generator=generator),
        prompt_ids=torch.arange(n) % 4, actions=actions,
        input_ids=torch.randint(1, VOCAB, (4, 7), generator=generator),
        text_mask=torch.ones(4, 7, dtype=torch.bool),
    )


def _loss(model, data: EncodedDemos, seed: int = 3, **kwargs):
    return flow_matching_loss(
        model, data, torch.arange(data.latents.shape[0]), torch.Generator().manual_seed(seed),
        raw_action_dim=2, domain_id=0, fps=20.0, num_latent_frames=NUM_LATENT_FRAMES,
        video_loss_weight=1.0, **kwargs,
    )


@pytest.fixture(scope="module")
def model():
    return build_tiny_transformer(VOCAB, seed=2, hidden_size=64, head_dim=16,
                                  intermediate_size=64)


def test_each_group_is_denoised_at_its_own_timestep(model, monkeypatch) -> None:
    """The video tokens get the video's σ·1000, the action tokens the actions' (replayed from the
    same generator); ``shared`` passes no separate action timestep (the sampler's forward)."""
    seen: list[tuple[torch.Tensor, torch.Tensor | None]] = []
    forward = model.forward_gen

    def recording(*args, action_timesteps=None, **kwargs):
        seen.append((args[7], action_timesteps))
        return forward(*args, action_timesteps=action_timesteps, **kwargs)

    monkeypatch.setattr(model, "forward_gen", recording)
    data = _data()
    with torch.no_grad():
        _loss(model, data, video_noise="independent", pure_noise_video=0.5)
        _loss(model, data)
        _loss(model, data, video_noise="independent", pure_noise_video=1.0)
    actions, video = sample_noise_levels(6, torch.Generator().manual_seed(3),
                                         video_noise="independent", pure_noise_video=0.5)
    assert not torch.equal(actions, video)
    torch.testing.assert_close(seen[0][0], video * 1000.0, rtol=0, atol=0)
    torch.testing.assert_close(seen[0][1], actions * 1000.0, rtol=0, atol=0)
    shared = sample_sigmas(6, torch.Generator().manual_seed(3))
    torch.testing.assert_close(seen[1][0], shared * 1000.0, rtol=0, atol=0)
    assert seen[1][1] is None
    assert torch.equal(seen[2][0], torch.full((6,), 1000.0))
    assert (seen[2][1] < 1000.0).all()


def test_the_motion_weight_moves_the_video_loss_towards_the_cells_that_change(model) -> None:
    data = _data()
    with torch.no_grad():
        plain, plain_parts = _loss(model, data)
        still = torch.zeros(6, 4, 4)  # nothing moves: every cell weighs the same
        flat, flat_parts = _loss(model, data, motion=still, motion_weight=10.0)
        moved = still.clone()
        moved[:, 1, 2] = 1.0
        weighted, weighted_parts = _loss(model, data, motion=moved, motion_weight=10.0)
    assert torch.equal(flat, plain) and flat_parts == plain_parts
    assert weighted_parts["action"] == plain_parts["action"]
    assert abs(weighted_parts["video"] - plain_parts["video"]) > 1e-4
    with pytest.raises(ValueError, match="motion cells"):
        _loss(model, data, motion_weight=1.0)


def test_motion_cells_are_the_share_of_each_cells_pixels_the_chunk_changes() -> None:
    images = np.zeros((2, 32, 32, 3), np.uint8)
    futures = np.zeros((2, 4, 32, 32, 3), np.uint8)
    futures[0, 3, 5, 20, 1] = 9  # one channel of one pixel in the chunk's last frame, cell (0, 1)
    futures[1, :, 16:18, 0:16] = 200  # two rows of cell (1, 0) in every frame
    demos = Demos(images, np.zeros(2, np.int64), np.zeros((2, 4, 2), np.float32), futures,
                  ("reach the red target",))
    share = motion_cells(demos, 16)
    expected = torch.zeros(2, 2, 2)
    expected[0, 0, 1] = 1 / 256
    expected[1, 1, 0] = 32 / 256
    assert torch.equal(share, expected)
    with pytest.raises(ValueError, match="do not tile into 12 px cells"):
        motion_cells(demos, 12)


@pytest.mark.parametrize(("knobs", "message"), [
    ({"video_noise": "staggered"}, "video_noise: expected one of"),
    ({"video_noise": "independent", "pure_noise_video": 1.5}, r"a share in \[0, 1\]"),
    ({"pure_noise_video": 0.3}, "needs video_noise 'independent'"),
    ({"video_motion_weight": -1.0}, "video_motion_weight: expected >= 0"),
    ({"video_target": "past"}, "video_target: expected one of"),
])
def test_a_contradictory_recipe_is_refused_before_anything_is_written(
    tmp_path: Path, knobs: dict, message: str
) -> None:
    out = tmp_path / "ckpt"
    with pytest.raises(ValueError, match=message):
        train(TrainConfig(out=str(out), **knobs), progress=False)
    assert not out.exists()


def test_the_train_command_takes_the_noise_knobs() -> None:
    args = build_parser().parse_args([
        "train", "--video-noise", "independent", "--pure-noise-video", "0.3",
        "--video-motion-weight", "2.5",
    ])
    cfg = command_settings(args, TrainConfig)
    assert (cfg.video_noise, cfg.pure_noise_video, cfg.video_motion_weight) == (
        "independent", 0.3, 2.5)
    defaults = TrainConfig()  # the shipped checkpoint's recipe
    assert (defaults.video_noise, defaults.pure_noise_video, defaults.video_motion_weight) == (
        "shared", 0.0, 0.0)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["train", "--video-noise", "staggered"])
