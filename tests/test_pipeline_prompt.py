"""JSON action caption (official key order, idle_frame) and chat-template tokenization."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer

from cosmos3_gym.pipeline.prompt import (
    aspect_ratio_name,
    build_action_caption,
    tokenize_captions,
)
from cosmos3_gym.tiny import write_tiny_tokenizer

LIBERO_TASK = (
    "put both the alphabet soup and the tomato sauce in the basket. This video contains "
    "concatenated views from multiple camera perspectives. The left half shows the third-person "
    "view; the right half shows the wrist-mounted camera."
)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory):
    return AutoTokenizer.from_pretrained(write_tiny_tokenizer(tmp_path_factory.mktemp("tok")))


def test_libero_caption_is_the_official_string() -> None:
    caption = build_action_caption(
        LIBERO_TASK, view_point="concat_view", num_frames=17, fps=20, canvas_h=192, canvas_w=320
    )
    expected = (
        '{"cinematography": {"framing": "This video contains concatenated views from multiple '
        'camera perspectives."}, "actions": [{"time": "0:00-0:01", "description": "'
        + LIBERO_TASK
        + '", "idle_frame": "0 out of 16."}], "duration": "0s", "fps": 20.0, '
        '"resolution": {"H": 192, "W": 320}, "aspect_ratio": "16,9"}'
    )
    assert caption == expected


def test_caption_key_order_and_sentence_ending() -> None:
    caption = json.loads(
        build_action_caption(
            "  open the drawer ", view_point="ego_view", num_frames=33, fps=15.0, canvas_h=256,
            canvas_w=256, idle_frames=3,
        )
    )
    assert list(caption) == [
        "cinematography", "actions", "duration", "fps", "resolution", "aspect_ratio"
    ]
    assert list(caption["actions"][0]) == ["time", "description", "idle_frame"]
    assert caption["actions"][0]["description"] == "open the drawer."
    assert caption["actions"][0]["idle_frame"] == "3 out of 32."
    # 33 frames at 15 fps = 2.2 s: the range rounds (0:02), the duration truncates (2s).
    assert caption["actions"][0]["time"] == "0:00-0:02"
    assert caption["duration"] == "2s"
    assert caption["fps"] == 15.0 and caption["aspect_ratio"] == "1,1"
    question = json.loads(build_action_caption("is it open?", view_point="wrist_view",
                                               num_frames=5, fps=5, canvas_h=64, canvas_w=64))
    assert question["actions"][0]["description"] == "is it open?"


def test_duration_truncates_and_time_rounds_past_a_minute() -> None:
    caption = json.loads(build_action_caption("wait", view_point="ego_view", num_frames=1531,
                                              fps=20, canvas_h=192, canvas_w=320))
    assert caption["duration"] == "76s"  # 76.55 s truncated
    assert caption["actions"][0]["time"] == "0:00-1:17"  # rounded to 77 s


def test_aspect_ratio_names() -> None:
    assert aspect_ratio_name(320, 192) == "16,9"  # a named canvas, not the reduced 5,3
    assert aspect_ratio_name(512, 768) == "2,3"
    assert aspect_ratio_name(960, 960) == "1,1"
    assert aspect_ratio_name(300, 200) == "3,2"  # unnamed: reduced W,H


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"task": ""}, "task: expected a non-empty str"),
        ({"view_point": "side"}, "view_point: expected one of .* got 'side'"),
        ({"num_frames": 1}, "num_frames: expected an int >= 2, got 1"),
        ({"fps": 0}, "fps: expected a finite number > 0, got 0"),
        ({"canvas_h": 0}, "canvas: expected positive int H and W, got 0 x 320"),
        ({"idle_frames": 17}, r"idle_frames: expected an int in \[0, 16\], got 17"),
    ],
)
def test_bad_caption_arguments_are_rejected(kwargs: dict, message: str) -> None:
    args = {"task": "go", "view_point": "concat_view", "num_frames": 17, "fps": 20,
            "canvas_h": 192, "canvas_w": 320}
    args.update(kwargs)
    task = args.pop("task")
    with pytest.raises(ValueError, match=message):
        build_action_caption(task, **args)


def test_tokens_are_template_then_eos_then_vision_start(tokenizer) -> None:
    caption = "pick up the black bowl."
    out = tokenize_captions(tokenizer, [caption], max_sequence_length=64)
    # The Qwen3 chat layout written out by hand: no system turn, generation prompt at the end.
    rendered = f"<|im_start|>user\n{caption}<|im_end|>\n<|im_start|>assistant\n"
    expected = tokenizer.encode(rendered, add_special_tokens=False) + [
        tokenizer.convert_tokens_to_ids("<|im_end|>"),
        tokenizer.convert_tokens_to_ids("<|vision_start|>"),
    ]
    assert out.input_ids[0].tolist() == expected
    assert out.lengths == [len(expected)]
    assert out.attention_mask.all()


def test_no_system_message_is_injected(tokenizer) -> None:
    ids = tokenize_captions(tokenizer, ["go left."], max_sequence_length=64).input_ids[0]
    text = tokenizer.decode(ids.tolist())
    assert text.startswith("<|im_start|>user\n") and "system" not in text
    assert text.endswith("<|im_start|>assistant\n<|im_end|><|vision_start|>")
    # A system turn appears only when given (Qwen3 behaviour, unlike Qwen2.5's default one).
    with_system = tokenizer.apply_chat_template(
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "go"}],
        tokenize=False, add_generation_prompt=True,
    )
    assert with_system.startswith("<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\n")


def test_mixed_prompt_lengths_share_a_batch(tokenizer) -> None:
    captions = ["go left.", "pick up the black bowl and place it on the plate."]
    batch = tokenize_captions(tokenizer, captions, max_sequence_length=128)
    singles = [tokenize_captions(tokenizer, [c], max_sequence_length=128) for c in captions]
    assert batch.input_ids.shape == (2, max(batch.lengths))
    assert batch.input_ids.dtype == torch.long and batch.attention_mask.dtype == torch.bool
    for row, single in enumerate(singles):
        n = single.lengths[0]
        assert batch.lengths[row] == n
        assert batch.input_ids[row, :n].tolist() == single.input_ids[0].tolist()
        assert batch.attention_mask[row, :n].all() and not batch.attention_mask[row, n:].any()
        assert (batch.input_ids[row, n:] == tokenizer.pad_token_id).all()
    assert batch.lengths[0] < batch.lengths[1]


def test_overlong_prompt_raises_instead_of_truncating(tokenizer) -> None:
    caption = "pick up the black bowl and place it on the plate. " * 4
    n = len(tokenize_captions(tokenizer, [caption], max_sequence_length=4096).input_ids[0]) - 2
    with pytest.raises(ValueError, match=f"caption 0: {n} template tokens exceed "
                                         f"max_sequence_length - 2 = {n - 1}"):
        tokenize_captions(tokenizer, [caption], max_sequence_length=n + 1)
    assert tokenize_captions(tokenizer, [caption], max_sequence_length=n + 2).lengths == [n + 2]


def test_bad_captions_are_rejected(tokenizer) -> None:
    with pytest.raises(ValueError, match="captions: expected a non-empty sequence of str, got str"):
        tokenize_captions(tokenizer, "go", max_sequence_length=64)
    with pytest.raises(ValueError, match="caption 1: expected a non-empty str, got ''"):
        tokenize_captions(tokenizer, ["go", ""], max_sequence_length=64)


def test_tiny_tokenizer_round_trips_and_is_deterministic(tmp_path: Path, tokenizer) -> None:
    again = AutoTokenizer.from_pretrained(write_tiny_tokenizer(tmp_path / "again"))
    assert again.get_vocab() == tokenizer.get_vocab()
    text = '{"fps": 20.0} put the bowl on the plate; Ünïcode too'
    assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token == "<|endoftext|>"
