"""Episode videos: the env's frames, or what the policy saw and imagined beside what happened.

``--videos`` writes the env's frames as a GIF. ``--videos imagined`` writes, per episode, one
video in which every frame shows three panels side by side, under the prompt the model read:

    prompt: "reach the red target"
    what the model saw (step 8)   what it imagined (step 10)   what happened (step 10)
    [its input image]             [predicted frame]            [env frame]
    red · trial 0 · seed 42 · success · chunk 3 of 7

For each planned chunk the video runs from the observation the model planned from (predicted
frame 0, the VAE's reconstruction of that input, beside it) through every step executed from
that chunk, with the predicted frame for that step (pipeline ``return_video``: frame ``t``
follows action ``t``) beside the frame the env rendered. So an episode of ``S`` steps and ``C``
chunks has ``S + C`` frames. The predicted frames are the pipeline's decoded pixels, enlarged by
an integer factor only (each pixel repeated), never resampled.

MP4 (H.264) where ``imageio`` and ``imageio-ffmpeg`` are installed, GIF otherwise.
"""

from __future__ import annotations

import importlib.util
import math
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from cosmos3_gym.jsonio import atomic_path

FPS = 10  # env videos have always played at 10 frames per second
# Panels are enlarged (by whole pixels) until they are at least this tall, so a 64 or 128 px
# observation stays readable beside its caption.
MIN_PANEL_HEIGHT = 160
BLOCK = 16  # H.264 wants frame sides in multiples of its 16 px macro-blocks
PAD = 8
FONT_SIZE = 14
BACKGROUND = (255, 255, 255)
INK = (30, 30, 30)
MUTED = (100, 100, 100)
OUTCOME_COLOURS = {True: (20, 120, 50), False: (180, 30, 30)}


def episode_video_stem(task: str, trial: int, seed: int, success: bool) -> str:
    """``{task}__trial{NNN}__seed{S}__{success|failure}``: a video's name without its suffix."""
    task_part = re.sub(r"[^A-Za-z0-9_.-]+", "-", task)
    return f"{task_part}__trial{trial:03d}__seed{seed}__{'success' if success else 'failure'}"


def unused_path(folder: Path, stem: str, suffix: str) -> Path:
    """``folder/stem.suffix``, or ``stem__1``, ``stem__2``... when taken: a re-run episode
    (resume, fault) never overwrites a video."""
    path = folder / f"{stem}{suffix}"
    n = 1
    while path.exists():
        path = folder / f"{stem}__{n}{suffix}"
        n += 1
    return path


def mp4_available() -> bool:
    """Whether MP4 can be written: ``imageio`` with its ``imageio-ffmpeg`` encoder."""
    return all(importlib.util.find_spec(m) is not None for m in ("imageio", "imageio_ffmpeg"))


def write_video(path: Path, frames: Iterable[np.ndarray], fps: float = FPS) -> int:
    """Write uint8 ``[H, W, 3]`` frames to ``path`` (``.mp4`` or ``.gif``); returns the count.

    MP4 frames are streamed to the encoder; a GIF holds them all (PIL writes it at the end).
    Either is written under a temporary name and renamed (:func:`~cosmos3_gym.jsonio.atomic_path`):
    a video that is there is whole.
    """
    if path.suffix == ".mp4":
        import imageio.v2 as imageio

        count = 0
        with atomic_path(path) as tmp:
            # quality 8 of 10: captions and thin edges stay sharp at a few hundred kB per episode
            with imageio.get_writer(tmp, fps=fps, codec="libx264", quality=8,
                                    macro_block_size=BLOCK) as writer:
                for frame in frames:
                    writer.append_data(frame)
                    count += 1
        return count
    if path.suffix != ".gif":
        raise ValueError(f"video path must end in .mp4 or .gif; found {path.name}")
    images = [Image.fromarray(f) for f in frames]
    if not images:
        raise ValueError(f"no frames to write to {path}")
    with atomic_path(path) as tmp:
        images[0].save(tmp, save_all=True, append_images=images[1:],
                       duration=round(1000 / fps), loop=0)
    return len(images)


@dataclass(frozen=True)
class ImaginedChunk:
    """One planned chunk as the imagined video shows it."""

    start: int  # the episode step the chunk was planned at (its index in the env frames)
    prompt: str  # the prompt the model was given
    predicted: np.ndarray  # uint8 [H + 1, h, w, 3], the pipeline's decoded future


@dataclass(frozen=True)
class ImaginedLayout:
    """Where the panels of an imagined-video frame lie: the same for every frame of a video.

    Built from the predicted clip's frame size ``(h, w)``; every panel is ``scale`` times that.
    """

    frame_height: int
    frame_width: int
    scale: int
    panel_top: int
    panel_lefts: tuple[int, int, int]  # model input, predicted, env
    panel_height: int
    panel_width: int
    caption_lines: tuple[str, ...]

    @classmethod
    def for_clip(cls, height: int, width: int, prompt: str) -> ImaginedLayout:
        scale = max(1, math.ceil(MIN_PANEL_HEIGHT / height))
        ph, pw = height * scale, width * scale
        inner_width = 3 * pw + 2 * PAD
        lines = _wrap(f'prompt: "{prompt}"', inner_width)
        line = _line_height()
        panel_top = PAD + len(lines) * line + PAD + line
        frame_height = _round_up(panel_top + ph + PAD + line + PAD, BLOCK)
        frame_width = _round_up(inner_width + 2 * PAD, BLOCK)
        lefts = (PAD, PAD + pw + PAD, PAD + 2 * (pw + PAD))
        return cls(frame_height, frame_width, scale, panel_top, lefts, ph, pw, tuple(lines))

    def panel(self, frame: np.ndarray, index: int) -> np.ndarray:
        """The pixels of panel ``index`` (0 model input, 1 predicted, 2 env) of a frame."""
        left = self.panel_lefts[index]
        return frame[self.panel_top : self.panel_top + self.panel_height,
                     left : left + self.panel_width]


def imagined_frames(
    chunks: Sequence[ImaginedChunk], env_frames: Sequence[np.ndarray], footer: str
) -> Iterator[np.ndarray]:
    """The frames of one episode's imagined video (see the module notes), composed lazily.

    ``env_frames[s]`` is the adapted observation at step ``s`` (what the model is given, and
    what the env rendered); ``footer`` names the episode.
    """
    spans = _chunk_spans(chunks, len(env_frames))
    layout = ImaginedLayout.for_clip(*chunks[0].predicted.shape[1:3], chunks[0].prompt)
    for number, (chunk, end) in enumerate(spans, start=1):
        steps = end - chunk.start
        if steps + 1 > len(chunk.predicted):
            raise ValueError(
                f"chunk {number} ran {steps} steps but its predicted clip has "
                f"{len(chunk.predicted)} frames; expected at least {steps + 1}"
            )
        if chunk.prompt != chunks[0].prompt or (
            chunk.predicted.shape[1:3] != chunks[0].predicted.shape[1:3]
        ):
            raise ValueError(
                f"chunk {number} has prompt {chunk.prompt!r} and {chunk.predicted.shape[1:3]} "
                f"frames; expected the episode's {chunks[0].prompt!r} and "
                f"{chunks[0].predicted.shape[1:3]} (one layout per video)"
            )
        seen = _fit(env_frames[chunk.start], layout)
        for t in range(steps + 1):
            step = chunk.start + t
            canvas = Image.new("RGB", (layout.frame_width, layout.frame_height), BACKGROUND)
            draw = ImageDraw.Draw(canvas)
            font, line = caption_font(), _line_height()
            for k, text in enumerate(layout.caption_lines):
                draw.text((PAD, PAD + k * line), text, fill=INK, font=font)
            labels = (f"what the model saw (step {chunk.start})",
                      f"what it imagined (step {step})", f"what happened (step {step})")
            for left, label in zip(layout.panel_lefts, labels, strict=True):
                draw.text((left, layout.panel_top - line), label, fill=MUTED, font=font)
            draw.text((PAD, layout.panel_top + layout.panel_height + PAD),
                      f"{footer} · chunk {number} of {len(spans)}", fill=INK, font=font)
            frame = np.array(canvas)
            panels = (seen, _enlarge(chunk.predicted[t], layout.scale),
                      _fit(env_frames[step], layout))
            for index, pixels in enumerate(panels):
                layout.panel(frame, index)[...] = pixels
            yield frame


# Steps between the env frames the imagined-frame check compares a prediction with: one latent
# frame of the Wan2.2 VAE (4x temporal compression), the size of an off-by-one-latent error.
ALIGNMENT_SHIFT = 4


def imagined_errors(
    chunks: Sequence[ImaginedChunk], env_frames: Sequence[np.ndarray],
    shift: int = ALIGNMENT_SHIFT,
) -> dict[str, Any] | None:
    """How close one episode's predicted frames are to what the env rendered, and to frames
    ``shift`` steps off: mean squared errors over uint8 pixels, with their frame counts.

    Every executed step ``s + k`` (``k >= 1``) of a chunk planned at step ``s`` counts once: its
    predicted frame ``k`` against the env's frame ``s + k`` (``predicted``); the baselines
    against that same env frame: the observed frame ``s`` copied (``copy_observed``) and the
    model's own frame 0, its reconstruction of that observation, copied
    (``copy_reconstruction``). ``reconstruction`` (with ``chunks``, its count) is each chunk's
    frame 0 against the observation it decodes: the VAE's own error. ``earlier`` / ``later``
    compare predicted frame ``k`` with the env's frame ``s + k - shift`` / ``s + k + shift``
    (``shifted``) and, on those same steps, with frame ``s + k`` (``predicted``), where the
    episode has such a frame. A misaligned clip
    (frame ``k`` drawn for step ``s + k - shift``, say) is nearer the shifted frames.
    ``changed`` looks only at the pixels where the env's frame ``s + k`` differs from the
    observed frame ``s`` (what moved): predicted frame ``k`` against frame ``s + k`` there
    (``future``) and against frame ``s`` (``present``), pooled over ``pixels`` such pixels of
    ``frames`` frames (None where nothing moved). A still prediction is nearer the present.

    Returns None when the predicted frames and the env's frames differ in size (a canvas with a
    resize, as LIBERO's): the check compares pixels, never resampled ones.
    """
    spans = _chunk_spans(chunks, len(env_frames))
    if any(c.predicted.shape[1:] != env_frames[c.start].shape for c in chunks):
        return None
    frames = [np.asarray(f, dtype=np.float64) for f in env_frames]
    sums = {"predicted": [], "copy_observed": [], "copy_reconstruction": []}
    shifted: dict[str, dict[str, list[float]]] = {
        "earlier": {"predicted": [], "shifted": []}, "later": {"predicted": [], "shifted": []}
    }

    def mse(a: np.ndarray, b: np.ndarray) -> float:
        return float(np.mean(np.square(np.asarray(a, np.float64) - b)))

    reconstruction = [mse(c.predicted[0], frames[c.start]) for c, _ in spans]
    changed = {"frames": 0, "pixels": 0, "future": 0.0, "present": 0.0}  # squared-error sums
    for chunk, end in spans:
        for k in range(1, end - chunk.start + 1):
            step, guess = chunk.start + k, chunk.predicted[k]
            truth = frames[step]
            moved = np.any(truth != frames[chunk.start], axis=-1)  # [h, w]
            if moved.any():
                pixels = np.asarray(guess, np.float64)[moved]  # [n, 3]
                changed["frames"] += 1
                changed["pixels"] += int(moved.sum())
                changed["future"] += float(np.square(pixels - truth[moved]).sum())
                changed["present"] += float(np.square(pixels - frames[chunk.start][moved]).sum())
            sums["predicted"].append(mse(guess, truth))
            sums["copy_observed"].append(mse(frames[chunk.start], truth))
            sums["copy_reconstruction"].append(mse(chunk.predicted[0], truth))
            for name, other in (("earlier", step - shift), ("later", step + shift)):
                if 0 <= other < len(frames):
                    shifted[name]["predicted"].append(sums["predicted"][-1])
                    shifted[name]["shifted"].append(mse(guess, frames[other]))
    if not sums["predicted"]:
        return None
    result: dict[str, Any] = {
        "frames": len(sums["predicted"]), "shift": shift,
        "mse": {k: float(np.mean(v)) for k, v in sums.items()},
        "chunks": len(reconstruction), "reconstruction_mse": float(np.mean(reconstruction)),
        "changed": {"frames": changed["frames"], "pixels": changed["pixels"], "mse": {
            name: changed[name] / (3 * changed["pixels"]) if changed["pixels"] else None
            for name in ("future", "present")
        }},
    }
    for name, parts in shifted.items():
        result[name] = {"frames": len(parts["predicted"]),
                        "mse": {k: float(np.mean(v)) if v else None for k, v in parts.items()}}
    return result


def _chunk_spans(
    chunks: Sequence[ImaginedChunk], num_env_frames: int
) -> list[tuple[ImaginedChunk, int]]:
    """Each chunk with the last env frame it covers: the next chunk's start, or the episode's
    last frame."""
    if not chunks:
        raise ValueError("an imagined video needs at least one planned chunk; found none")
    ends = [c.start for c in chunks[1:]] + [num_env_frames - 1]
    spans = list(zip(chunks, ends, strict=True))
    for chunk, end in spans:
        if not 0 <= chunk.start <= end < num_env_frames:
            raise ValueError(
                f"chunk planned at step {chunk.start} ends at frame {end}; expected "
                f"0 <= start <= end < {num_env_frames} (the episode's env frames)"
            )
    return spans


def _enlarge(image: np.ndarray, scale: int) -> np.ndarray:
    return image if scale == 1 else image.repeat(scale, axis=0).repeat(scale, axis=1)


def _fit(image: np.ndarray, layout: ImaginedLayout) -> np.ndarray:
    """An env frame at panel size: enlarged like the prediction when it has the prediction's
    size, otherwise resized (the model's canvas may differ from the env's frame)."""
    h, w = layout.panel_height // layout.scale, layout.panel_width // layout.scale
    if image.shape[:2] == (h, w):
        return _enlarge(image, layout.scale)
    size = (layout.panel_width, layout.panel_height)
    return np.asarray(Image.fromarray(image).resize(size, Image.Resampling.BILINEAR))


def caption_font() -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    """The font of the videos' captions and labels (PIL's own, ``FONT_SIZE`` pixels)."""
    return ImageFont.load_default(size=FONT_SIZE)


def _line_height() -> int:
    return FONT_SIZE + 6


def _wrap(text: str, width: int) -> list[str]:
    """Greedy word wrap of ``text`` into lines at most ``width`` pixels wide."""
    font = caption_font()
    lines: list[str] = []
    for word in text.split():
        if lines and font.getlength(f"{lines[-1]} {word}") <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines or [""]


def _round_up(value: int, block: int) -> int:
    return -(-value // block) * block
