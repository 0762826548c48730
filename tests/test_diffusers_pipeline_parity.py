"""The whole policy pipeline against diffusers' own ``Cosmos3OmniPipeline`` in policy mode.

A tiny random folder written by diffusers' ``save_pretrained`` is loaded by both sides (the same
transformer and VAE tensors), both start from the same noise, and with the options that differ
on purpose aligned (diffusers: no system prompt, its native flow schedule; ours: no
``idle_frame`` in the caption, as diffusers' caption has none) the actions agree to fp32
rounding, without and with guidance. Each deliberate difference then has a test of its own that
shows it and says why this project follows the official format there, so a diffusers change
that moves toward (or away from) the official format is noticed here.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
from PIL import Image

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.bench.diffusers_reference import (
    load_reference_pipeline,
    reference_policy_actions,
)
from cosmos3_gym.pipeline.preprocess import latent_content_shape, plan_canvas, preprocess
from cosmos3_gym.pipeline.prompt import build_action_caption
from cosmos3_gym.pipeline.scheduler import flow_unipc_sigmas
from cosmos3_gym.tiny import write_tiny_diffusers_folder

DOMAIN, CHUNK, TIER, FPS = "droid_lerobot", 16, 256, 20.0
PROMPT = "put the marker in the cup"
SEED = 5
IMAGE = np.random.default_rng(0).integers(0, 256, size=(256, 256, 3), dtype=np.uint8)
# fp32 rounding over a few steps, of actions up to about 5 (measured: 1.7e-6 at 4 steps,
# 1.4e-6 at 10, 4.2e-6 with guidance 3).
ATOL = 2e-5


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_tiny_diffusers_folder(tmp_path_factory.mktemp("diffusers_parity"))


@pytest.fixture(scope="module")
def reference(folder):
    """diffusers with its two differing defaults switched to the official behaviour."""
    pipe = load_reference_pipeline(folder, default_use_system_prompt=False,
                                   use_native_flow_schedule=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def ours(folder):
    return Cosmos3ActionPipeline.from_pretrained(folder, domain=DOMAIN)


@pytest.fixture(scope="module")
def aligned(ours):
    """Ours with diffusers' caption (no idle_frame entry)."""
    return Cosmos3ActionPipeline(ours.transformer, ours.vae, ours.tokenizer,
                                 dataclasses.replace(ours.policy, idle_frame=False))


def _video_noise(seed: int, image: np.ndarray) -> np.ndarray:
    """The official per-item draw for the canvas of ``image`` (what our seeded noise is)."""
    plan = plan_canvas(image.shape[0], image.shape[1], TIER)
    h, w = latent_content_shape(plan)
    shape = (48, CHUNK // 4 + 1, h, w)
    return np.random.RandomState(seed).standard_normal(shape).astype(np.float32)


def _both(ours_pipe, reference, steps: int, guidance: float, action_noise=None):
    out = ours_pipe(IMAGE[None], PROMPT, seed=SEED, num_inference_steps=steps,
                    guidance_scale=guidance, action_noise=action_noise, progress=False)
    ref = reference_policy_actions(
        reference, IMAGE, PROMPT, video_noise=_video_noise(SEED, IMAGE),
        action_noise=out.action_noise[0] if action_noise is None else action_noise[0],
        domain=DOMAIN, chunk=CHUNK, tier=TIER, fps=FPS, num_inference_steps=steps,
        guidance_scale=guidance,
    )
    return out.normalized_actions[0], ref


def test_the_shared_options_are_the_same(ours, reference) -> None:
    assert ours.policy.flow_shift == reference.scheduler.config.flow_shift == 5.0
    assert ours.sampler_source["flow_shift"] == "scheduler/scheduler_config.json"
    assert (ours.action_horizon, ours.action_dim, ours.policy.fps) == (CHUNK, 10, FPS)


@pytest.mark.parametrize(("steps", "guidance"), [(4, 1.0), (10, 1.0), (4, 3.0)],
                         ids=["4steps", "10steps", "guidance3"])
def test_actions_equal_diffusers_pipeline_to_fp32_rounding(aligned, reference, steps,
                                                           guidance) -> None:
    actions, ref = _both(aligned, reference, steps, guidance)
    assert actions.shape == ref.shape == (CHUNK, 10)
    assert np.abs(ref).max() > 1.0  # actions of size, not a vanishing signal
    np.testing.assert_allclose(actions, ref, rtol=0, atol=ATOL)


# ----------------------------------------------------------------- the deliberate differences


def test_caption_idle_frame_is_the_official_formats(ours, aligned, reference) -> None:
    """cosmos-framework's ActionPromptJsonFormatter (and its LIBERO server) put
    ``"idle_frame": "0 out of 16."`` in the action entry; diffusers' caption has no such key.
    Everything else in the two captions is the same."""
    plan = plan_canvas(*IMAGE.shape[:2], TIER)
    official = json.loads(build_action_caption(
        PROMPT, view_point="ego_view", num_frames=CHUNK + 1, fps=FPS, canvas_h=plan.target_h,
        canvas_w=plan.target_w))
    theirs = json.loads(reference._build_action_json_prompt(
        PROMPT, view_point="ego_view", num_frames=CHUNK + 1, fps=FPS, height=plan.target_h,
        width=plan.target_w))
    assert official["actions"][0].pop("idle_frame") == f"0 out of {CHUNK}."
    assert official == theirs
    # It is a different prompt: the actions move.
    default, ref = _both(ours, reference, 4, 1.0)
    assert np.abs(default - ref).max() > 1e-3


def test_no_system_prompt_in_action_mode(ours, reference) -> None:
    """cosmos-framework runs action mode without a system turn (``use_system_prompt=False``);
    diffusers prepends one by default (``default_use_system_prompt=True``)."""
    kwargs = {"num_frames": CHUNK + 1, "height": 256, "width": 256, "fps": FPS,
              "action_mode": "policy", "action_view_point": "ego_view"}
    with_system, _ = reference.tokenize_prompt(PROMPT, use_system_prompt=True, **kwargs)
    without, _ = reference.tokenize_prompt(PROMPT, use_system_prompt=False, **kwargs)
    system = reference.text_tokenizer.apply_chat_template(
        [{"role": "system", "content": "x"}], tokenize=True, return_dict=False)
    assert with_system[0] == system[0] and len(with_system) > len(without)
    assert with_system[-len(without):] == without  # the same user turn after it
    assert reference.__class__(
        transformer=reference.transformer, text_tokenizer=reference.text_tokenizer,
        vae=reference.vae, scheduler=reference.scheduler, enable_safety_checker=False,
    ).config.default_use_system_prompt  # diffusers' default is the system turn


@pytest.mark.parametrize("steps", [4, 10])
def test_the_sigma_grid_is_flowunipcs(reference, steps) -> None:
    """cosmos-framework's FlowUniPC starts from ``linspace(0.999, 0, N + 1)`` then shifts;
    diffusers' default UniPC grid starts at ~1 (its ``use_native_flow_schedule`` gives ours)."""
    _, official = flow_unipc_sigmas(steps, 5.0)
    scheduler = reference.scheduler.__class__.from_config(reference.scheduler.config)
    scheduler.set_timesteps(steps)
    assert scheduler.timesteps.tolist() != official.tolist()
    native = np.linspace(1.0 - 1.0 / 1000, 0.0, steps + 1)[:-1]
    scheduler.set_timesteps(steps, sigmas=native)
    assert scheduler.timesteps.tolist() == official.tolist()


def test_padding_to_the_canvas_does_not_round_the_height_to_16(reference) -> None:
    """The official transforms resize onto the tier's closest bin and pad; diffusers' video
    processor first rounds the image to a multiple of 16 (180 -> 176 rows), then pads."""
    image = np.random.default_rng(1).integers(0, 256, size=(180, 320, 3), dtype=np.uint8)
    plan = plan_canvas(180, 320, TIER)
    ours = preprocess([image], plan, device=torch.device("cpu"), dtype=torch.float32)
    _, size, target_h, target_w = reference._prepare_action_video_conditioning(
        [Image.fromarray(image)], TIER, CHUNK + 1, device="cpu", dtype=torch.float32)
    assert (target_h, target_w) == (plan.target_h, plan.target_w) == (192, 320)
    assert int(size[2]) == 176 and plan.content_h == 180  # content rows
    expected = torch.from_numpy(image).permute(2, 0, 1).float() / 127.5 - 1.0
    torch.testing.assert_close(ours[0, :, :180], expected, rtol=0, atol=1e-6)  # untouched


def test_caller_noise_padding_channels_are_zeroed(aligned, reference) -> None:
    """cosmos-framework zeroes the action noise beyond the raw width before the first step;
    diffusers keeps a caller's padding channels, and its first step sees them."""
    noise = np.random.default_rng(2).standard_normal((1, CHUNK, 64)).astype(np.float32)
    zeroed = noise.copy()
    zeroed[..., 10:] = 0.0
    padded_ours, padded_ref = _both(aligned, reference, 4, 1.0, action_noise=noise)
    zeroed_ours, zeroed_ref = _both(aligned, reference, 4, 1.0, action_noise=zeroed)
    np.testing.assert_array_equal(padded_ours, zeroed_ours)  # ours ignores them
    np.testing.assert_allclose(zeroed_ours, zeroed_ref, rtol=0, atol=ATOL)
    assert np.abs(padded_ref - zeroed_ref).max() > 1e-2  # diffusers does not


def test_diffusers_scales_a_uint8_ndarray_out_of_range(reference) -> None:
    """Gymnasium gives uint8 arrays, which we take as they are; diffusers' ndarray branch
    assumes [0, 1] floats and maps uint8 to [-1, 509] (PIL images are fine)."""
    array = reference.video_processor.preprocess_video([IMAGE])
    pil = reference.video_processor.preprocess_video([Image.fromarray(IMAGE)])
    assert float(array.max()) > 100.0 and float(pil.max()) <= 1.0
