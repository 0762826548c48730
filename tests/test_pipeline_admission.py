"""Admission rules: image forms, dtype/rank/channel checks, prompt cardinality, no mutation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cosmos3_gym.pipeline.admission import admit, admit_images, admit_prompts


def _image(h: int = 4, w: int = 6, c: int = 3, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, c), dtype=np.uint8)


def test_batched_array_gives_one_image_per_row() -> None:
    batch = np.stack([_image(seed=i) for i in range(3)])  # [3, 4, 6, 3]
    out = admit(batch, ["a", "b", "c"])
    assert out.batch_size == 3
    for i in range(3):
        np.testing.assert_array_equal(out.images[i], batch[i])
    assert out.prompts == ["a", "b", "c"]


def test_list_tuple_pil_and_single_forms() -> None:
    a, b = _image(seed=1), _image(5, 7, seed=2)
    assert len(admit_images([a, b])) == 2
    assert len(admit_images((a, Image.fromarray(b)))) == 2
    single = admit_images(a)
    assert len(single) == 1 and np.array_equal(single[0], a)
    pil = admit_images(Image.fromarray(b))
    assert np.array_equal(pil[0], b)


def test_grayscale_is_repeated_and_rgba_drops_alpha() -> None:
    gray = _image(c=1)[:, :, 0]  # [H, W]
    out = admit_images(gray)[0]
    assert out.shape == (4, 6, 3)
    for ch in range(3):
        np.testing.assert_array_equal(out[:, :, ch], gray)
    rgba = _image(c=4)
    np.testing.assert_array_equal(admit_images(rgba)[0], rgba[:, :, :3])
    one_channel = _image(c=1)
    assert admit_images(one_channel)[0].shape == (4, 6, 3)


def test_image_paths_are_loaded(tmp_path: Path) -> None:
    a, b = _image(seed=3), _image(seed=4)
    pa, pb = tmp_path / "a.png", tmp_path / "b.png"
    Image.fromarray(a).save(pa)
    Image.fromarray(b).save(pb)
    out = admit_images({"image_path": [str(pa), pb]})
    np.testing.assert_array_equal(out[0], a)
    np.testing.assert_array_equal(out[1], b)
    with pytest.raises(ValueError, match="image 0: expected an existing image file path"):
        admit_images({"image_path": str(tmp_path / "missing.png")})


def test_dict_field_precedence() -> None:
    a, b, c = _image(seed=5), _image(seed=6), _image(seed=7)
    out = admit_images({"input_reference": c, "image_path": None, "image": a, "images": {"x": b}})
    np.testing.assert_array_equal(out[0], a)
    out = admit_images({"input_reference": c, "images": {"x": b}})
    np.testing.assert_array_equal(out[0], c)
    out = admit_images({"images": {"cam": np.stack([a, b])}})
    assert len(out) == 2 and np.array_equal(out[1], b)


def test_images_dict_must_have_exactly_one_entry() -> None:
    a = _image()
    with pytest.raises(ValueError, match="exactly one entry .* got a dict with 2 entries"):
        admit_images({"images": {"x": a, "y": a}})
    with pytest.raises(ValueError, match="exactly one entry .* got list"):
        admit_images({"images": [a]})


def test_dict_without_image_field_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"expected one of the fields .* got keys \['state'\]"):
        admit_images({"state": np.zeros(3)})


def test_non_uint8_is_rejected() -> None:
    with pytest.raises(ValueError, match="image 0: expected uint8, got float32"):
        admit_images(np.zeros((4, 6, 3), np.float32))
    with pytest.raises(ValueError, match="image 1: expected uint8, got float64"):
        admit_images([_image(), np.zeros((4, 6, 3))])


def test_wrong_rank_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"image 0: expected an \[H, W\] or \[H, W, C\] array, got "
                       r"shape \(4,\)"):
        admit_images(np.zeros(4, np.uint8))
    with pytest.raises(ValueError, match=r"got shape \(1, 2, 2, 2, 3\)"):
        admit_images(np.zeros((1, 2, 2, 2, 3), np.uint8))
    with pytest.raises(ValueError, match=r"image 0: .* got shape \(1, 4, 6, 3\)"):
        admit_images([np.zeros((1, 4, 6, 3), np.uint8)])


def test_wrong_channel_count_is_rejected() -> None:
    with pytest.raises(ValueError, match="image 0: expected 1, 3 or 4 channels, got 2"):
        admit_images(np.zeros((4, 6, 2), np.uint8))


@pytest.mark.parametrize("make", [lambda s: np.zeros(s, np.uint8),
                                  lambda s: torch.zeros(s, dtype=torch.uint8)])
def test_a_channel_first_batch_is_named_as_such(make) -> None:
    # Torch vision code holds images [B, C, H, W]; the message used to blame "image 0" for 64
    # channels.
    move = "permute" if isinstance(make((1,)), torch.Tensor) else "transpose"
    with pytest.raises(ValueError, match=(
            r"images: expected 1, 3 or 4 channels, got 64 \(a batch is channels-last "
            r"\[B, H, W, C\]; found an? (array|tensor) of shape \[2, 3, 64, 64\]; it looks "
            r"channel-first \[B, C, H, W\] \(C=3\): move the channels last with "
            rf"images.{move}\(0, 2, 3, 1\)\)")):
        admit_images(make((2, 3, 64, 64)))


def test_zero_size_is_rejected() -> None:
    with pytest.raises(ValueError, match=r"non-zero height and width, got shape \(0, 6, 3\)"):
        admit_images(np.zeros((0, 6, 3), np.uint8))
    with pytest.raises(ValueError, match="expected at least one image, got a .* B=0"):
        admit_images(np.zeros((0, 4, 6, 3), np.uint8))
    with pytest.raises(ValueError, match="expected at least one image, got an empty list"):
        admit_images([])


def test_unsupported_types_and_pil_modes_are_rejected() -> None:
    with pytest.raises(ValueError, match="image 0: expected a uint8 ndarray, a PIL image or a file "
                       "path, got int"):
        admit_images(3)
    with pytest.raises(ValueError, match="expected an 8-bit PIL image, got mode 'I;16'"):
        admit_images(Image.new("I;16", (4, 4)))


def test_string_prompt_is_broadcast() -> None:
    assert admit_prompts("open the drawer", 3) == ["open the drawer"] * 3


def test_one_element_list_is_broadcast() -> None:
    assert admit_prompts(["open the drawer"], 2) == ["open the drawer"] * 2


def test_prompt_count_must_match_image_count() -> None:
    with pytest.raises(ValueError, match=r"got 3 prompt\(s\) for 2 image\(s\)"):
        admit(np.zeros((2, 4, 6, 3), np.uint8), ["a", "b", "c"])


def test_empty_prompt_list_is_rejected() -> None:
    with pytest.raises(ValueError, match="expected at least one prompt, got 0"):
        admit_prompts([], 2)


def test_empty_and_non_string_prompts_are_rejected_with_their_index() -> None:
    with pytest.raises(ValueError, match="prompt 1: expected a non-empty str, got ''"):
        admit_prompts(["a", "", "c"], 3)
    with pytest.raises(ValueError, match="prompt 2: expected a non-empty str, got int"):
        admit_prompts(["a", "b", 7], 3)
    with pytest.raises(ValueError, match="prompt 0: expected a non-empty str, got '  '"):
        admit_prompts("  ", 1)
    with pytest.raises(ValueError, match="prompts: expected a str or a list/tuple of str, got No"):
        admit_prompts(None, 1)  # type: ignore[arg-type]


def test_caller_arrays_are_never_modified_or_aliased() -> None:
    batch = np.stack([_image(seed=i) for i in range(2)])
    rgba = _image(c=4, seed=9)
    before_batch, before_rgba = batch.copy(), rgba.copy()
    prompts = ["a"]
    out = admit(batch, prompts)
    out_rgba = admit_images([rgba])
    for img in [*out.images, *out_rgba]:
        assert img.flags.c_contiguous and img.flags.writeable
        img[...] = 0  # writing into the results must not reach the caller's arrays
    assert not np.shares_memory(out.images[0], batch)
    np.testing.assert_array_equal(batch, before_batch)
    np.testing.assert_array_equal(rgba, before_rgba)
    assert prompts == ["a"]


def test_failed_admission_changes_nothing() -> None:
    images = [_image(seed=0), np.zeros((4, 6, 3), np.float32)]
    snapshot = [images[0].copy(), images[1].copy()]
    with pytest.raises(ValueError):
        admit(images, "a")
    assert len(images) == 2
    np.testing.assert_array_equal(images[0], snapshot[0])
    np.testing.assert_array_equal(images[1], snapshot[1])
