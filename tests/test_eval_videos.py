"""Imagined-future videos: what the model saw, what it predicted and what the env did, per chunk;
decoded only for the episodes that write a video, with no effect on any action."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cosmos3_gym.envs import derive_seed
from cosmos3_gym.eval import evaluate as evaluate_module
from cosmos3_gym.eval import videos
from cosmos3_gym.eval.cli import build_parser
from cosmos3_gym.eval.evaluate import EvalConfig, evaluate
from cosmos3_gym.eval.results import read_episode_records
from cosmos3_gym.eval.videos import ImaginedChunk, ImaginedLayout, imagined_frames
from cosmos3_gym.pipeline import SamplerConfig

SEED = 7
HORIZON = 4  # the tiny checkpoint's action chunk


class SpyPipeline:
    """The real pipeline, recording what each call was given and the clips it decoded."""

    def __init__(self, pipe) -> None:
        self.pipe, self.calls = pipe, []

    def __call__(self, images, prompts, **kwargs):
        out = self.pipe(images, prompts, **kwargs)
        self.calls.append({"images": np.array(images), "prompts": list(prompts),
                           "seeds": list(kwargs["seed"]),
                           "return_video": kwargs.get("return_video"), "video": out.video})
        return out

    def rows(self):
        """(seed, image, prompt, asked for video, clip) of every planned row."""
        for call in self.calls:
            asked = call["return_video"] or [False] * len(call["seeds"])
            clips = call["video"] or [None] * len(call["seeds"])
            yield from zip(call["seeds"], call["images"], call["prompts"], asked, clips,
                           strict=True)


def config(checkpoint: Path, **overrides) -> EvalConfig:
    fields = dict(checkpoint=str(checkpoint), tasks=["red", "blue"], trials=2, num_envs=3,
                  seed=SEED, image_size=32, max_episode_steps=6,
                  sampling=SamplerConfig(num_inference_steps=2), progress=False)
    return EvalConfig(**{**fields, **overrides})


def chunk_steps(record: dict) -> list[int]:
    """Steps executed from each chunk: whole 4-step chunks, the last one cut by the episode."""
    return [min(HORIZON, record["steps"] - c * HORIZON) for c in range(record["chunks"])]


def test_the_videos_flag_takes_an_optional_kind() -> None:
    from cosmos3_gym.eval.cli import command_settings

    parser = build_parser()
    base = ["eval", "--out", "x"]

    def parsed(argv: list[str]) -> EvalConfig:
        return command_settings(parser.parse_args(argv), EvalConfig)

    assert parsed([*base, "--videos"]).videos == "env"
    assert parsed(["eval", "--videos", "imagined", "--out", "x"]).videos == "imagined"
    assert parsed(base).videos is None
    assert parsed([*base, "--videos", "--video-trials", "2"]).video_trials == 2
    for wrong in ("future", True):  # a bool is not a kind of video: one error, not a guess
        with pytest.raises(ValueError, match=f"videos must be one of .*; found {wrong!r}"):
            EvalConfig(videos=wrong)


def test_imagined_videos_show_each_planned_chunk_beside_the_env_frames(
    checkpoint: Path, pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    written: dict[str, list[np.ndarray]] = {}
    real_write = videos.write_video

    def keep_frames(path: Path, frames, fps: float = videos.FPS) -> int:
        frames = list(frames)
        written[path.name] = frames
        return real_write(path, frames, fps)

    monkeypatch.setattr(evaluate_module, "write_video", keep_frames)
    spy = SpyPipeline(pipeline)
    plain = tmp_path / "plain"
    evaluate(config(checkpoint), plain, pipeline=pipeline)
    out = tmp_path / "imagined"
    evaluate(config(checkpoint, videos="imagined", video_trials=1), out, pipeline=spy)

    # Asking for video changed no episode: same steps, chunks, outcomes and action excesses.
    fields = ("task", "trial", "steps", "chunks", "success", "max_action_excess")
    records = read_episode_records(out)
    assert [[r[k] for k in fields] for r in records] == [
        [r[k] for k in fields] for r in read_episode_records(plain)
    ]
    # Only trial 0 of each task writes a video, and only its chunks were decoded.
    recorded = {(r["task"], r["trial"]) for r in records if r["video"]}
    assert recorded == {("red", 0), ("blue", 0)}
    by_seed = {}
    for seed, image, prompt, asked, clip in spy.rows():
        assert (clip is not None) == asked
        by_seed[seed] = (image, prompt, clip)
    for r in records:
        chunk_seeds = [derive_seed(SEED, r["task"], r["trial"], c) for c in range(r["chunks"])]
        decoded = [by_seed[s][2] is not None for s in chunk_seeds]
        assert decoded == [r["trial"] == 0] * r["chunks"]
    assert sorted(p.suffix for p in (out / "videos").iterdir()) == [".mp4", ".mp4"]

    for r in records:
        if not r["video"]:
            continue
        path = out / r["video"]
        frames = written[path.name]
        steps = chunk_steps(r)
        assert len(frames) == r["steps"] + r["chunks"] == sum(n + 1 for n in steps)
        first_image, prompt, first_clip = by_seed[derive_seed(SEED, r["task"], r["trial"], 0)]
        layout = ImaginedLayout.for_clip(*first_clip.shape[1:3], prompt)
        assert layout.scale > 1  # 32 px frames are enlarged to a readable panel
        index = 0
        for c, n in enumerate(steps):
            image, _, clip = by_seed[derive_seed(SEED, r["task"], r["trial"], c)]
            for t in range(n + 1):
                frame = frames[index]
                assert frame.shape == (layout.frame_height, layout.frame_width, 3)
                s = layout.scale
                # The predicted panel is the pipeline's decoded frame t, pixel for pixel.
                np.testing.assert_array_equal(layout.panel(frame, 1)[::s, ::s], clip[t])
                # The input panel is the image the pipeline was given for this chunk.
                np.testing.assert_array_equal(layout.panel(frame, 0)[::s, ::s], image)
                if t == 0:  # the env panel starts from that same observation
                    np.testing.assert_array_equal(layout.panel(frame, 2)[::s, ::s], image)
                index += 1
            if c + 1 < len(steps):  # the env panel ends where the next chunk was planned
                next_image = by_seed[derive_seed(SEED, r["task"], r["trial"], c + 1)][0]
                np.testing.assert_array_equal(layout.panel(frames[index - 1], 2)[::s, ::s],
                                              next_image)
        import imageio.v2 as imageio

        with imageio.get_reader(path) as reader:
            encoded = [f for f in reader]
        assert len(encoded) == len(frames)
        assert encoded[0].shape == frames[0].shape


def test_imagined_videos_fall_back_to_gif_without_an_mp4_encoder(
    checkpoint: Path, pipeline, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(evaluate_module, "mp4_available", lambda: False)
    evaluate(config(checkpoint, tasks=["red"], trials=1, videos="imagined"), tmp_path,
             pipeline=pipeline)
    (record,) = read_episode_records(tmp_path)
    assert record["video"].endswith("__trial000__seed"
                                    f"{record['seed']}__"
                                    f"{'success' if record['success'] else 'failure'}.gif")
    with Image.open(tmp_path / record["video"]) as gif:
        assert gif.n_frames == record["steps"] + record["chunks"]
        assert gif.size[0] % 16 == 0 and gif.size[1] % 16 == 0


def _clip(value: int, frames: int = HORIZON + 1, size: int = 8) -> np.ndarray:
    clip = np.zeros((frames, size, size, 3), np.uint8)
    clip[:] = value + np.arange(frames)[:, None, None, None]
    return clip


def test_imagined_frames_cover_every_executed_step_once_per_chunk() -> None:
    env_frames = [np.full((8, 8, 3), 100 + s, np.uint8) for s in range(7)]  # 6 steps
    chunks = [ImaginedChunk(0, "go", _clip(10)), ImaginedChunk(4, "go", _clip(50))]
    frames = list(imagined_frames(chunks, env_frames, "red · trial 0"))
    assert len(frames) == 6 + 2  # one per step, one per chunk
    layout = ImaginedLayout.for_clip(8, 8, "go")
    s = layout.scale
    shown = [(int(layout.panel(f, 1)[0, 0, 0]), int(layout.panel(f, 2)[0, 0, 0]),
              int(layout.panel(f, 0)[0, 0, 0])) for f in frames]
    # (predicted, env, model input): chunk 1 steps 0..4, then chunk 2 steps 4..6
    assert shown == [(10, 100, 100), (11, 101, 100), (12, 102, 100), (13, 103, 100),
                     (14, 104, 100), (50, 104, 104), (51, 105, 104), (52, 106, 104)]
    assert all(layout.panel(f, 1)[::s, ::s].shape == (8, 8, 3) for f in frames)


def test_imagined_frames_refuse_a_chunk_longer_than_its_prediction() -> None:
    env_frames = [np.zeros((8, 8, 3), np.uint8)] * 7
    chunks = [ImaginedChunk(0, "go", _clip(10, frames=3))]
    with pytest.raises(ValueError, match="chunk 1 ran 6 steps but its predicted clip has 3 "
                                         "frames; expected at least 7"):
        list(imagined_frames(chunks, env_frames, "x"))
    with pytest.raises(ValueError, match="at least one planned chunk"):
        list(imagined_frames([], env_frames, "x"))


def _moving_square(steps: int) -> list[np.ndarray]:
    """Env frames of a white square moving 3 px right per step on a dark background."""
    frames = []
    for s in range(steps + 1):
        frame = np.full((16, 64, 3), 16, np.uint8)
        frame[4:10, 2 + 3 * s : 8 + 3 * s] = 255
        frames.append(frame)
    return frames


def test_imagined_errors_tell_an_aligned_prediction_from_a_shifted_one() -> None:
    env_frames = _moving_square(12)
    starts = (0, 4, 8)

    def clip(start: int, offset: int) -> np.ndarray:  # frame k drawn from env step start+k+offset
        return np.stack([env_frames[min(max(start + k + offset, 0), 12)] for k in range(5)])

    aligned = videos.imagined_errors([ImaginedChunk(s, "go", clip(s, 0)) for s in starts],
                                     env_frames)
    assert aligned["frames"] == 12 and aligned["shift"] == videos.ALIGNMENT_SHIFT
    assert aligned["mse"]["predicted"] == 0.0 and aligned["reconstruction_mse"] == 0.0
    assert aligned["chunks"] == 3
    assert aligned["mse"]["copy_observed"] > 0 and aligned["mse"]["copy_reconstruction"] > 0
    assert aligned["earlier"]["frames"] == 9 and aligned["later"]["frames"] == 8  # steps 4-12, 1-8
    assert aligned["earlier"]["mse"]["shifted"] > 0 and aligned["later"]["mse"]["shifted"] > 0
    # A clip one latent frame late (frame k shows step start+k-4) matches the earlier frames.
    late = videos.imagined_errors([ImaginedChunk(s, "go", clip(s, -4)) for s in starts],
                                  env_frames)
    assert late["earlier"]["mse"]["shifted"] == 0.0 < late["earlier"]["mse"]["predicted"]
    assert late["mse"]["predicted"] > late["mse"]["copy_observed"]
    # A clip off by one step is nearer its own step than 4 steps off, but not exact.
    off_by_one = videos.imagined_errors(
        [ImaginedChunk(s, "go", clip(s, 1)) for s in starts], env_frames
    )
    assert 0 < off_by_one["mse"]["predicted"] < off_by_one["later"]["mse"]["shifted"]
    # On the pixels that moved, an aligned clip is the future itself; a still one (every
    # frame the observation) is the present, and as far from the future as the scene moved.
    assert aligned["changed"]["frames"] == 12 and aligned["changed"]["pixels"] > 12
    assert aligned["changed"]["mse"]["future"] == 0.0 < aligned["changed"]["mse"]["present"]
    still = videos.imagined_errors(
        [ImaginedChunk(s, "go", np.stack([env_frames[s]] * 5)) for s in starts], env_frames
    )
    assert still["changed"]["pixels"] == aligned["changed"]["pixels"]
    assert still["changed"]["mse"]["present"] == 0.0 < still["changed"]["mse"]["future"]
    assert still["changed"]["mse"]["future"] == aligned["changed"]["mse"]["present"]
    nothing_moves = videos.imagined_errors(
        [ImaginedChunk(0, "go", np.stack([env_frames[0]] * 5))], [env_frames[0]] * 5
    )
    assert nothing_moves["changed"] == {"frames": 0, "pixels": 0,
                                        "mse": {"future": None, "present": None}}
    # Frames of another size than the env's (a resized canvas) are not compared.
    small = [ImaginedChunk(0, "go", clip(0, 0)[:, :8])]
    assert videos.imagined_errors(small, env_frames[:5]) is None


def test_results_pool_the_imagined_errors_over_episodes() -> None:
    from cosmos3_gym.eval.results import format_imagined, imagined_summary

    def block(frames: int, predicted: float, copy: float) -> dict:
        shifted = {"frames": frames, "mse": {"predicted": predicted, "shifted": 4 * copy}}
        return {"frames": frames, "shift": 4, "earlier": shifted, "later": shifted,
                "chunks": frames // 4, "reconstruction_mse": predicted,
                "mse": {"predicted": predicted, "copy_observed": copy,
                        "copy_reconstruction": copy}}

    records = [{"imagined": block(10, 1.0, 10.0)}, {"imagined": None},
               {"imagined": block(30, 5.0, 10.0)}]
    summary = imagined_summary(records)
    assert summary["episodes"] == 2 and summary["frames"] == 40
    # pooled over frames: (10 * 1 + 30 * 5) / 40 = 4.0
    assert summary["psnr_db"]["predicted"] == pytest.approx(10 * np.log10(255**2 / 4.0))
    assert summary["psnr_db"]["copy_observed"] == pytest.approx(10 * np.log10(255**2 / 10.0))
    assert summary["earlier"]["psnr_db"]["shifted"] == pytest.approx(10 * np.log10(255**2 / 40))
    assert summary["chunks"] == 9  # 2 + 7 chunks: (2 * 1 + 7 * 5) / 9
    assert summary["reconstruction_psnr_db"] == pytest.approx(10 * np.log10(255**2 * 9 / 37))
    lines = format_imagined(summary)
    assert "over 9 chunks" in lines[0]
    assert "40 predicted frames over 2 episodes" in lines[1] and "4 steps earlier" in lines[2]
    assert imagined_summary([{"imagined": None}]) is None
