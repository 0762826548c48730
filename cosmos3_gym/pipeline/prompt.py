"""Prompt stage: the structured JSON action caption, then chat-template tokens for the model.

Caption. Cosmos3 action checkpoints post-trained with ``format_prompt_as_json=True`` (the
official LIBERO recipe) see the task wrapped in a JSON object whose keys, in this order, are
``cinematography`` (the view-point sentence), ``actions`` (one entry with ``time``,
``description`` and ``idle_frame``), ``duration``, ``fps``, ``resolution`` (the padded canvas)
and ``aspect_ratio``, serialised with ``json.dumps`` defaults. That is what cosmos-framework's
action JSON formatter and its LIBERO policy server produce; sglang's and diffusers' builders omit
``idle_frame`` (and RLinf's sglang config uses ``ego_view`` for a concatenated two-camera image),
so their captions differ from the training captions. We follow the official one. The official
DROID server sends no idle-frame count (its entry is dropped) and appends its camera layout to
the framing sentence (``with_idle_frame=False``, ``view_description=...``).

LeRobot's Cosmos3 processor (huggingface/lerobot PR #3745) writes a plain-text caption instead
(:func:`build_lerobot_caption`): the task, the view-point sentence with the folder's view
description, "The video is D seconds long and is of F FPS." and "This video is of HxW
resolution.", each sentence joined with one space after a full stop and ". " otherwise. Its
duration is ``int(num_frames / fps)`` printed with one decimal (17 frames at 20 FPS: "0.0"), and
only four view points have a sentence there (:data:`LEROBOT_VIEWPOINTS`).

Tokens. Per caption: ``apply_chat_template([{"role": "user", "content": caption}],
add_generation_prompt=True)`` with no system message, then ``eos`` and ``<|vision_start|>``
appended (the vision tokens follow in the joint sequence). Captions of different lengths share a
batch: ids are right-padded with the pad id and an attention mask marks the real tokens, so the
model must mask padded keys (sglang instead rejects batches of unequal lengths).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from cosmos3_gym.pipeline.preprocess import TIER_BINS

# The official view-point sentences (cosmos-framework ``DEFAULT_VIEWPOINT_TEMPLATES``).
VIEWPOINT_TEMPLATES: dict[str, str] = {
    "ego_view": "This video is captured from a first-person perspective looking at the scene.",
    "third_person_view": (
        "This video is captured from a third-person perspective looking towards the agent from "
        "the front."
    ),
    "wrist_view": "This video is captured from a wrist-mounted camera.",
    "concat_view": "This video contains concatenated views from multiple camera perspectives.",
    "top_down_2d_view": "This video is captured from a top-down view of a flat 2D scene.",
    "video_game_view": (
        "This video is captured from an in-game camera perspective in a virtual environment."
    ),
}

# Canvas sizes with a named aspect ratio, as (width, height) -> "W,H", in the official lookup
# order of the tier table (the first tier listing a size names it); other sizes fall back to the
# reduced W:H.
_NAMED_CANVASES: dict[tuple[int, int], str] = {}
for _bins in TIER_BINS.values():
    for _name, _size in _bins.items():
        _NAMED_CANVASES.setdefault(_size, _name)


def aspect_ratio_name(canvas_w: int, canvas_h: int) -> str:
    """The caption's ``aspect_ratio``: the tier table's name for the canvas, else reduced W,H."""
    named = _NAMED_CANVASES.get((canvas_w, canvas_h))
    if named is not None:
        return named
    divisor = math.gcd(canvas_w, canvas_h)
    return f"{canvas_w // divisor},{canvas_h // divisor}"


def build_action_caption(
    task: str,
    *,
    view_point: str,
    num_frames: int,
    fps: float,
    canvas_h: int,
    canvas_w: int,
    idle_frames: int = 0,
    with_idle_frame: bool = True,
    view_description: str | None = None,
) -> str:
    """The official JSON action caption for one policy query, as a string.

    Args:
        task: the instruction (already augmented by the benchmark adapter if it does that);
            a final ``.``, ``!`` or ``?`` is kept, otherwise ``.`` is appended.
        view_point: a key of :data:`VIEWPOINT_TEMPLATES` (``"concat_view"`` for LIBERO's
            third-person | wrist image).
        num_frames: pixel frames of the clip, conditioning frame included (``H + 1``); the action
            chunk has ``num_frames − 1`` steps, which ``idle_frame`` counts.
        fps: the clip's frame rate (LIBERO: 20).
        canvas_h, canvas_w: the padded canvas the VAE sees (e.g. 192 x 320).
        idle_frames: idle steps announced in ``idle_frame``; 0 asks for continuous motion.
        with_idle_frame: include the ``idle_frame`` entry at all (False: the DROID server's
            caption, which has none).
        view_description: text appended to the view point's framing sentence (the official
            formatter's ``additional_view_description``), or None.

    Example:
        >>> build_action_caption("pick up the bowl", view_point="ego_view", num_frames=17,
        ...                      fps=20, canvas_h=192, canvas_w=320)[:50]
        '{"cinematography": {"framing": "This video is capt'
    """
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task: expected a non-empty str, got {task!r}")
    if view_point not in VIEWPOINT_TEMPLATES:
        raise ValueError(
            f"view_point: expected one of {sorted(VIEWPOINT_TEMPLATES)}, got {view_point!r}"
        )
    if not isinstance(num_frames, int) or num_frames < 2:
        raise ValueError(f"num_frames: expected an int >= 2, got {num_frames!r}")
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps: expected a finite number > 0, got {fps!r}")
    if not (isinstance(canvas_h, int) and isinstance(canvas_w, int) and canvas_h > 0
            and canvas_w > 0):
        raise ValueError(f"canvas: expected positive int H and W, got {canvas_h!r} x {canvas_w!r}")
    action_steps = num_frames - 1
    if not isinstance(idle_frames, int) or not 0 <= idle_frames <= action_steps:
        raise ValueError(
            f"idle_frames: expected an int in [0, {action_steps}], got {idle_frames!r}"
        )

    seconds = num_frames / fps
    # Official formatting: the time range rounds to whole seconds (M:SS), the duration truncates.
    end = round(seconds)
    description = task.strip()
    if not description.endswith((".", "!", "?")):
        description += "."
    framing = VIEWPOINT_TEMPLATES[view_point]
    if view_description:
        framing += (" " if framing.endswith(".") else ". ") + view_description.rstrip()
    action: dict[str, str] = {
        "time": f"0:00-{end // 60}:{end % 60:02d}",
        "description": description,
    }
    if with_idle_frame:
        action["idle_frame"] = f"{idle_frames} out of {action_steps}."
    caption: dict[str, Any] = {
        "cinematography": {"framing": framing},
        "actions": [action],
        "duration": f"{int(seconds)}s",
        "fps": float(fps),
        "resolution": {"H": canvas_h, "W": canvas_w},
        "aspect_ratio": aspect_ratio_name(canvas_w, canvas_h),
    }
    return json.dumps(caption)


# The view points LeRobot's caption has a sentence for; another one gets none there.
LEROBOT_VIEWPOINTS = ("concat_view", "ego_view", "third_person_view", "wrist_view")


def _join_sentence(text: str, sentence: str) -> str:
    """``sentence`` after ``text``: one space after a final full stop, else ". "."""
    if not sentence:
        return text
    if not text:
        return sentence
    text = text.rstrip()
    return text + (" " if text.endswith(".") else ". ") + sentence


def build_lerobot_caption(
    task: str,
    *,
    view_point: str | None,
    num_frames: int,
    fps: float,
    canvas_h: int,
    canvas_w: int,
    view_description: str | None = None,
) -> str:
    """The plain-text caption LeRobot's Cosmos3 processor writes for one policy query.

    Example:
        >>> build_lerobot_caption("pick up the bowl", view_point="concat_view", num_frames=17,
        ...                       fps=20, canvas_h=256, canvas_w=256)
        'pick up the bowl. This video contains concatenated views from multiple camera perspectives. The video is 0.0 seconds long and is of 20 FPS. This video is of 256x256 resolution.'
    """  # noqa: E501
    if not isinstance(task, str) or not task.strip():
        raise ValueError(f"task: expected a non-empty str, got {task!r}")
    if not (isinstance(fps, (int, float)) and math.isfinite(fps) and fps > 0):
        raise ValueError(f"fps: expected a finite number > 0, got {fps!r}")
    caption = task.rstrip()
    if view_point in LEROBOT_VIEWPOINTS:
        framing = VIEWPOINT_TEMPLATES[view_point]
        description = (view_description or "").rstrip()
        caption = _join_sentence(caption, _join_sentence(framing, description))
    seconds = int(num_frames / fps)
    caption = _join_sentence(
        caption, f"The video is {seconds:.1f} seconds long and is of {fps:.0f} FPS.")
    return _join_sentence(caption, f"This video is of {canvas_h}x{canvas_w} resolution.")


@dataclass(frozen=True)
class TokenizedPrompts:
    """A right-padded token batch: ``input_ids`` / ``attention_mask`` are ``[B, L_max]``."""

    input_ids: torch.Tensor  # [B, L_max] int64, pad id after each prompt
    attention_mask: torch.Tensor  # [B, L_max] bool, True on real tokens
    lengths: list[int]  # real length of each prompt, eos and <|vision_start|> included


VISION_START_TOKEN = "<|vision_start|>"


def tokenize_captions(
    tokenizer: Any,
    captions: Sequence[str],
    *,
    max_sequence_length: int,
    allow_empty: bool = False,
    eos_token_id: int | None = None,
    vision_start_token_id: int | None = None,
) -> TokenizedPrompts:
    """Chat-template each caption (no system turn), append eos and ``<|vision_start|>``, pad.

    A prompt longer than ``max_sequence_length − 2`` template tokens raises ``ValueError``
    (naming its index, length and the limit) instead of being truncated: a cut JSON caption is a
    different prompt, and it must never happen silently. Raise the limit if that is intended.

    Args:
        tokenizer: a ``transformers`` tokenizer with a chat template (the checkpoint's
            ``text_tokenizer/``), defining ``eos_token_id``, ``pad_token_id`` and
            ``<|vision_start|>``.
        captions: B captions (e.g. from :func:`build_action_caption`).
        max_sequence_length: the model's text budget per prompt, the two appended tokens included.
        allow_empty: accept ``""`` (the default negative prompt of the unconditional CFG pass,
            which is chat-templated as is, without the JSON caption, as diffusers does).
        eos_token_id, vision_start_token_id: the two ids appended after the template, where the
            checkpoint states them (LeRobot's config.json); None takes the tokenizer's.
    """
    if isinstance(captions, str) or len(captions) == 0:
        raise ValueError(
            f"captions: expected a non-empty sequence of str, got {type(captions).__name__}"
            + ("" if isinstance(captions, str) else " of length 0")
        )
    if max_sequence_length < 3:
        raise ValueError(f"max_sequence_length: expected >= 3, got {max_sequence_length}")
    eos_id, pad_id, vision_start_id = _special_ids(
        tokenizer, eos_token_id, vision_start_token_id)
    limit = max_sequence_length - 2
    sequences: list[list[int]] = []
    for i, caption in enumerate(captions):
        if not isinstance(caption, str) or (not caption and not allow_empty):
            raise ValueError(f"caption {i}: expected a non-empty str, got {caption!r}")
        ids = _chat_template_ids(tokenizer, caption)
        if len(ids) > limit:
            raise ValueError(
                f"caption {i}: {len(ids)} template tokens exceed max_sequence_length - 2 = {limit} "
                f"(max_sequence_length={max_sequence_length}); refusing to truncate"
            )
        sequences.append([*ids, eos_id, vision_start_id])

    lengths = [len(ids) for ids in sequences]
    input_ids = torch.full((len(sequences), max(lengths)), pad_id, dtype=torch.long)  # [B, L]
    attention_mask = torch.zeros((len(sequences), max(lengths)), dtype=torch.bool)  # [B, L]
    for row, ids in enumerate(sequences):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, : len(ids)] = True
    return TokenizedPrompts(input_ids=input_ids, attention_mask=attention_mask, lengths=lengths)


def _chat_template_ids(tokenizer: Any, caption: str) -> list[int]:
    encoded = tokenizer.apply_chat_template(
        [{"role": "user", "content": caption}],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    # Some transformers versions return a BatchEncoding even with return_dict=False.
    if not isinstance(encoded, list):
        encoded = encoded["input_ids"]
    return [int(t) for t in encoded]


def _special_ids(tokenizer: Any, eos_token_id: int | None = None,
                 vision_start_token_id: int | None = None) -> tuple[int, int, int]:
    eos_id = tokenizer.eos_token_id if eos_token_id is None else eos_token_id
    if eos_id is None:
        raise ValueError("tokenizer: expected an eos_token_id, got None")
    # Padded positions are masked (their id is never read): without a pad token, eos pads.
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos_id
    vision_start_id = vision_start_token_id
    if vision_start_id is None:
        vision_start_id = tokenizer.convert_tokens_to_ids(VISION_START_TOKEN)
        if vision_start_id is None or vision_start_id == tokenizer.unk_token_id:
            raise ValueError(f"tokenizer: expected a {VISION_START_TOKEN} token, found none")
    for name, value in (("eos_token_id", eos_id), ("vision_start_token_id", vision_start_id)):
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value:
            raise ValueError(f"{name}: expected a token id >= 0, got {value!r}")
    return int(eos_id), int(pad_id), int(vision_start_id)


# The JSON files of a transformers tokenizer folder (a damaged one is named before loading).
_TOKENIZER_JSON = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "added_tokens.json")


def check_tokenizer_files(folder: str | Path) -> None:
    """The tokenizer folder's JSON files parse (a cut ``tokenizer.json`` is one ``ValueError``
    naming it); what :func:`load_tokenizer` checks before transformers reads them, run by
    ``inspect`` and ``convert`` too (no transformers import)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"no tokenizer folder at {folder}")
    for name in _TOKENIZER_JSON:
        path = folder / name
        if path.is_file():
            try:
                json.loads(path.read_text(encoding="utf-8"))
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise ValueError(f"{path}: not valid JSON ({err}); the tokenizer file is damaged "
                                 "(a cut download?): download it again") from None


def load_tokenizer(folder: str | Path) -> Any:
    """The checkpoint's tokenizer (``transformers.AutoTokenizer``) from ``folder``; a damaged
    or missing file is one ``ValueError`` naming it, not a traceback from deep inside
    transformers."""
    from transformers import AutoTokenizer

    folder = Path(folder)
    check_tokenizer_files(folder)
    try:
        return AutoTokenizer.from_pretrained(folder)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds here
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        raise ValueError(f"the tokenizer at {folder} does not load ({type(err).__name__}: "
                         f"{first[:300]}); expected a transformers tokenizer folder "
                         "(tokenizer.json and tokenizer_config.json)") from None
