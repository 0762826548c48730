"""One planned chunk of an imagined video as a picture: what the model predicted for each step of
the chunk (top row) above what the env rendered at that step (bottom row).

Reads the frames of a video that ``cosmos3-gym eval --videos imagined`` wrote (MP4 or GIF) and
cuts the "what it imagined" and "what happened" panels out of each frame of the chunk, at their
own pixels (every panel is the clip enlarged by whole pixels). The docs' picture is made
from ``make demo``'s imagined run::

    python scripts/imagined_strip.py runs/demo_imagined red --chunk 3 \
        --out docs/demo_imagined_chunk.png
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from cosmos3_gym.eval.videos import ImaginedLayout, caption_font

GAP = 6
LABEL = 18


def read_frames(path: Path) -> list[np.ndarray]:
    if path.suffix == ".gif":
        with Image.open(path) as gif:
            frames = []
            for index in range(gif.n_frames):
                gif.seek(index)
                frames.append(np.array(gif.convert("RGB")))
            return frames
    import imageio.v2 as imageio

    return [np.asarray(f)[..., :3] for f in imageio.mimread(path, memtest=False)]


def chunk_strip(
    run: Path, task: str, chunk: int, clip_size: tuple[int, int], horizon: int
) -> Image.Image:
    """The picture of chunk ``chunk`` (1-based) of ``task``'s first imagined episode in ``run``,
    an evaluation that executed whole chunks of ``horizon`` steps."""
    records = [json.loads(line) for line in (run / "episodes.jsonl").read_text().splitlines()]
    record = next((r for r in records if r["task"] == task and r.get("video")), None)
    if record is None:
        raise SystemExit(f"{run}: no episode of task {task!r} with a video")
    steps_per_chunk = horizon
    frames = read_frames(run / record["video"])
    layout = ImaginedLayout.for_clip(*clip_size, _prompt(run, task))
    first = (chunk - 1) * (steps_per_chunk + 1)  # each chunk shows its start and each step
    shown = frames[first : first + steps_per_chunk + 1]
    if len(shown) != steps_per_chunk + 1:
        raise SystemExit(f"{record['video']}: chunk {chunk} is past the episode's end")
    start = (chunk - 1) * steps_per_chunk
    width = len(shown) * (layout.panel_width + GAP) + 120
    height = 2 * (layout.panel_height + GAP) + LABEL + GAP
    canvas = Image.new("RGB", (width, height), (255, 255, 255))
    draw = ImageDraw.Draw(canvas)
    rows = (("imagined", 1), ("env", 2))
    for k, frame in enumerate(shown):
        left = 120 + k * (layout.panel_width + GAP)
        draw.text((left, 2), f"step {start + k}" + (" (input)" if k == 0 else ""),
                  fill=(30, 30, 30), font=caption_font())
        for row, (_, panel) in enumerate(rows):
            top = LABEL + GAP + row * (layout.panel_height + GAP)
            canvas.paste(Image.fromarray(np.ascontiguousarray(layout.panel(frame, panel))),
                         (left, top))
    for row, (name, _) in enumerate(rows):
        top = LABEL + GAP + row * (layout.panel_height + GAP) + layout.panel_height // 2
        draw.text((4, top), "predicted" if name == "imagined" else "env", fill=(30, 30, 30),
                  font=caption_font())
    return canvas


def _prompt(run: Path, task: str) -> str:
    """The prompt the model read for ``task``: the ColorReach wording of the task name."""
    from cosmos3_gym.envs.color_reach import COLORS, prompt_for

    if task not in COLORS:
        raise SystemExit(f"{run}: task {task!r} is not a ColorReach colour ({sorted(COLORS)})")
    return prompt_for(task)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="an eval folder written with --videos imagined")
    parser.add_argument("task", help="the task whose first imagined episode to show")
    parser.add_argument("--chunk", type=int, default=1, help="which chunk, from 1")
    parser.add_argument("--clip-size", type=int, nargs=2, default=(128, 128),
                        metavar=("H", "W"), help="the predicted clip's frame size")
    parser.add_argument("--horizon", type=int, default=4,
                        help="steps executed per chunk (the checkpoint's whole chunk)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    chunk_strip(args.run, args.task, args.chunk, tuple(args.clip_size), args.horizon).save(
        args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
