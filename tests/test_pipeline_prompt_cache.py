"""The prompt cache: text keys/values kept across calls, exact, bounded, and never stale.

``checkpoint`` is tests/conftest.py's tiny checkpoint."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.pipeline import InferenceOptions
from cosmos3_gym.pipeline.prompt_cache import PromptCache

PROMPTS = [
    "pick up the red bowl",
    "open the top drawer of the cabinet and put the black bowl inside it, then close it",
    "go",
]
CALL = dict(num_inference_steps=2, progress=False)


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(5).integers(0, 256, size=(3, 64, 128, 3), dtype=np.uint8)


def _pipes(checkpoint):
    cached = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    uncached = Cosmos3ActionPipeline.from_pretrained(
        checkpoint, options=InferenceOptions(prompt_cache=False)
    )
    return cached, uncached


def test_an_episode_of_replans_gives_the_uncached_actions_bit_for_bit(checkpoint, images) -> None:
    """B=1 calls on one prompt, as an env replans through its episode: the first call encodes
    the prompt, every later call reuses it, and every action equals the uncached pipeline's."""
    cached, uncached = _pipes(checkpoint)
    assert cached.options.prompt_cache and cached.prompt.cache is not None
    assert uncached.prompt.cache is None
    for call, prompt in enumerate([PROMPTS[1], PROMPTS[1], PROMPTS[1], PROMPTS[2], PROMPTS[1]]):
        image = images[call % 3 : call % 3 + 1]
        got = cached(image, prompt, seed=call, **CALL)
        want = uncached(image, prompt, seed=call, **CALL)
        assert np.array_equal(got.actions, want.actions), call
        new = call in (0, 3)  # the first sight of each prompt
        assert (got.timings["prompt_cache_misses"], got.timings["prompt_cache_hits"]) == (
            (1.0, 0.0) if new else (0.0, 1.0)
        )
        assert "prompt_cache_hits" not in want.timings
    assert len(cached.prompt.cache) == 2


def test_mixed_prompt_lengths_share_a_batch_with_the_cache(checkpoint, images) -> None:
    """Per-item batch invariance still holds, and a batch of seen and unseen prompts (one
    prompt twice) agrees with the uncached pipeline."""
    cached, uncached = _pipes(checkpoint)
    cached(images[:1], PROMPTS[0], seed=1, **CALL)  # seen before the batch
    prompts = [PROMPTS[0], PROMPTS[1], PROMPTS[1]]
    batched = cached(images, prompts, seed=[1, 2, 3], **CALL)
    assert (batched.timings["prompt_cache_misses"], batched.timings["prompt_cache_hits"]) == (
        1.0, 2.0)
    reference = uncached(images, prompts, seed=[1, 2, 3], **CALL)
    np.testing.assert_allclose(batched.actions, reference.actions, rtol=1e-5, atol=1e-5)
    for i in range(3):
        alone = cached(images[i : i + 1], prompts[i], seed=i + 1, **CALL)
        np.testing.assert_allclose(batched.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)


def _ids(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.zeros(len(lengths), max(lengths), dtype=torch.long)
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    ids[mask] = torch.randint(1, 600, (sum(lengths),), generator=gen)  # tiny vocabulary: 629
    return ids, mask


@torch.no_grad()
def test_an_entry_depends_on_its_own_tokens_only(checkpoint) -> None:
    """A row's keys/values are the prompt encoded alone, whatever its batch mates; past its
    length the row is zero padding, which the GEN attention masks."""
    model = Cosmos3ActionPipeline.from_pretrained(checkpoint).transformer
    cache = PromptCache(model, max_bytes=2**30)
    ids, mask = _ids([6, 9, 6], seed=1)
    ids[2] = ids[0]  # the same prompt twice in one batch: encoded once
    text = cache.encode(ids, mask)
    assert (cache.misses, cache.hits, len(cache)) == (2, 1, 2)
    assert torch.equal(text.lengths, torch.tensor([6, 9, 6])) and torch.equal(text.text_mask, mask)
    for row, n in enumerate([6, 9, 6]):
        alone = model.encode_text(ids[row : row + 1, :n], mask[row : row + 1, :n])
        for got, want in zip(text.keys + text.values, alone.keys + alone.values, strict=True):
            assert got.shape[2] == 9
            assert torch.equal(got[row, :, :n], want[0])
            assert not got[row, :, n:].any()


@torch.no_grad()
def test_the_least_recently_used_prompt_leaves_beyond_the_budget(checkpoint) -> None:
    model = Cosmos3ActionPipeline.from_pretrained(checkpoint).transformer
    a, b, c = (_ids([5], seed=s) for s in (1, 2, 3))
    probe = PromptCache(model, max_bytes=2**30)
    probe.encode(*a)
    cache = PromptCache(model, max_bytes=2 * probe.bytes)  # room for two 5-token prompts
    for ids in (a, b, a, c):  # a used again after b: b is the least recently used
        cache.encode(*ids)
    kept = set(cache.entries)
    assert tuple(a[0][0].tolist()) in kept and tuple(c[0][0].tolist()) in kept
    assert tuple(b[0][0].tolist()) not in kept and cache.bytes == 2 * probe.bytes
    cache.encode(*b)
    assert (cache.hits, cache.misses) == (1, 4)


@torch.no_grad()
def test_changed_text_weights_empty_the_cache(checkpoint) -> None:
    """An optimiser step on a text-pathway parameter (here: one in-place update) makes the
    stored keys stale: the next lookup encodes again, under the new weights."""
    model = Cosmos3ActionPipeline.from_pretrained(checkpoint).transformer
    cache = PromptCache(model, max_bytes=2**30)
    ids, mask = _ids([7], seed=4)
    before = cache.encode(ids, mask).keys[0].clone()
    cache.encode(ids, mask)
    assert (cache.misses, cache.hits) == (1, 1)
    model.layers[0].self_attn.to_k.weight.mul_(1.5)
    after = cache.encode(ids, mask)
    assert (cache.misses, cache.hits) == (2, 1)
    assert torch.equal(after.keys[0], model.encode_text(ids, mask).keys[0])
    assert not torch.equal(after.keys[0], before)
    model.layers[0].mlp_moe_gen.gate_proj.weight.mul_(1.5)  # a GEN weight: keys stay valid
    cache.encode(ids, mask)
    assert (cache.misses, cache.hits) == (2, 2)


def test_keys_are_token_sequences_so_the_canvas_and_cfg_rows_count(checkpoint) -> None:
    """The caption names the canvas, so one instruction on two canvases is two entries; with
    CFG the negative prompt's row is an entry too (hit on the second call)."""
    cached = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    small = np.zeros((1, 64, 128, 3), np.uint8)  # the 192x320 canvas
    large = np.zeros((1, 64, 64, 3), np.uint8)  # the 256x256 canvas
    cached(small, PROMPTS[0], **CALL)
    out = cached(large, PROMPTS[0], **CALL)
    assert out.timings["prompt_cache_misses"] == 1.0 and len(cached.prompt.cache) == 2
    first = cached(small, PROMPTS[0], guidance_scale=2.0, **CALL)
    assert (first.timings["prompt_cache_misses"], first.timings["prompt_cache_hits"]) == (1, 1)
    again = cached(small, PROMPTS[0], guidance_scale=2.0, **CALL)
    assert (again.timings["prompt_cache_misses"], again.timings["prompt_cache_hits"]) == (0, 2)


def test_prompt_cache_options_are_checked() -> None:
    with pytest.raises(ValueError, match="prompt_cache_mb must be an int >= 1; found 0"):
        InferenceOptions(prompt_cache_mb=0)
    assert replace(InferenceOptions(), prompt_cache=False).flip("prompt_cache")[0].prompt_cache
