"""Cosmos3ActionPipeline end to end on a tiny random checkpoint, against independent references."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniTransformer, UniPCMultistepScheduler
from safetensors.torch import load_file

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.bench.diffusers_reference import reference_forward
from cosmos3_gym.checkpoint import POLICY_CONFIG, TRANSFORMER
from cosmos3_gym.pipeline.preprocess import latent_content_shape, plan_canvas, preprocess
from cosmos3_gym.tiny import write_tiny_checkpoint

PROMPTS = [
    "pick up the red bowl",
    "open the top drawer of the cabinet and put the black bowl inside it, then close it",
    "go",
]
STEPS = 3  # few steps keep the suite fast; the reference test also runs 1 step


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def pipe(checkpoint):
    return Cosmos3ActionPipeline.from_pretrained(checkpoint)


@pytest.fixture(scope="module")
def images():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, size=(3, 64, 128, 3), dtype=np.uint8)


def _run(pipe, images, prompts, seeds, **kwargs):
    return pipe(images, prompts, seed=seeds, num_inference_steps=STEPS, progress=False, **kwargs)


def test_output_contract_and_stage_timings(pipe, images) -> None:
    out = _run(pipe, images, PROMPTS, [1, 2, 3])
    assert out.actions.shape == (3, pipe.action_horizon, pipe.action_dim)
    assert out.actions.dtype == np.float32 and np.isfinite(out.actions).all()
    assert out.action_noise.shape == (3, pipe.action_horizon, 64)
    assert np.all(out.action_noise[..., pipe.action_dim :] == 0)
    assert out.seeds == [1, 2, 3]
    for stage in ("admission", "preprocess", "prompt", "encode", "noise", "denoise", "decode"):
        assert out.timings[f"{stage}_s"] >= 0.0
    assert out.timings["total_s"] >= out.timings["denoise_s"] > 0


def test_batched_output_matches_single_requests(pipe, images) -> None:
    """Prompts of different token lengths share one batch; row i equals request i alone."""
    lengths = [len(pipe.tokenizer(p).input_ids) for p in PROMPTS]
    assert len(set(lengths)) == 3
    batched = _run(pipe, images, PROMPTS, [11, 12, 13])
    for i in range(3):
        alone = _run(pipe, images[i : i + 1], [PROMPTS[i]], [11 + i])
        np.testing.assert_allclose(batched.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)


def _official_draw(state, pipe) -> np.ndarray:
    noise = np.random.RandomState(state).standard_normal((pipe.action_horizon, 64))
    noise[:, pipe.action_dim :] = 0  # padding channels are zeroed
    return noise.astype(np.float32)


def test_noise_is_the_official_arch_invariant_draw(pipe, images) -> None:
    big = 2**40 + 5
    out = _run(pipe, images[:3], PROMPTS[:3], [123, big, 2**32 - 1])
    np.testing.assert_array_equal(out.action_noise[0], _official_draw(123, pipe))
    # A seed past 2**32 seeds RandomState with its two 32-bit words, low word first:
    # 2**40 + 5 = 5 + 2**8 * 2**32.
    np.testing.assert_array_equal(out.action_noise[1], _official_draw([5, 2**8], pipe))
    assert not np.array_equal(out.action_noise[1], _official_draw(5, pipe))  # high word counts
    np.testing.assert_array_equal(out.action_noise[2], _official_draw(2**32 - 1, pipe))


def test_item_noise_depends_only_on_its_own_seed(pipe, images) -> None:
    same = _run(pipe, images, PROMPTS, 5)
    again = _run(pipe, images[[2, 0]], [PROMPTS[2], PROMPTS[0]], 5)
    np.testing.assert_allclose(same.action_noise[[2, 0]], again.action_noise, rtol=0, atol=0)
    other = _run(pipe, images, PROMPTS, [5, 6, 5])
    assert not np.allclose(same.actions[1], other.actions[1])
    np.testing.assert_allclose(same.actions[[0, 2]], other.actions[[0, 2]], rtol=1e-5, atol=1e-5)


def test_permuting_the_batch_permutes_the_output(pipe, images) -> None:
    out = _run(pipe, images, PROMPTS, [1, 2, 3])
    order = [2, 0, 1]
    permuted = _run(pipe, images[order], [PROMPTS[i] for i in order], [[1, 2, 3][i] for i in order])
    np.testing.assert_allclose(permuted.actions, out.actions[order], rtol=1e-5, atol=1e-5)


def test_micro_batched_equals_one_batch(checkpoint, pipe, images) -> None:
    small = Cosmos3ActionPipeline.from_pretrained(checkpoint, max_batch_size=2)
    whole = _run(pipe, images, PROMPTS, [1, 2, 3])
    split = _run(small, images, PROMPTS, [1, 2, 3])
    np.testing.assert_allclose(split.actions, whole.actions, rtol=1e-5, atol=1e-5)


def test_images_of_different_sizes_run_in_one_call(pipe, images) -> None:
    square = np.random.default_rng(1).integers(0, 256, size=(96, 96, 3), dtype=np.uint8)
    mixed = [images[0], square, images[1]]
    out = _run(pipe, mixed, PROMPTS, [1, 2, 3])
    alone = _run(pipe, [square], [PROMPTS[1]], [2])
    np.testing.assert_allclose(out.actions[1], alone.actions[0], rtol=1e-5, atol=1e-5)


def test_explicit_action_noise_replaces_the_seeded_draw(pipe, images) -> None:
    """Video noise still comes from the seeds; the action noise is the caller's."""
    seeded = _run(pipe, images, PROMPTS, [1, 2, 3])
    replay = _run(pipe, images, PROMPTS, [1, 2, 3], action_noise=seeded.action_noise)
    np.testing.assert_allclose(replay.actions, seeded.actions, rtol=1e-6, atol=1e-6)
    other = _run(pipe, images, PROMPTS, [1, 2, 3], action_noise=-seeded.action_noise)
    np.testing.assert_array_equal(other.action_noise, -seeded.action_noise)
    assert np.abs(other.actions - seeded.actions).max() > 1e-2
    assert replay.seeds == [1, 2, 3]


def test_classifier_free_guidance_batches_cond_and_uncond(pipe, images) -> None:
    plain = _run(pipe, images, PROMPTS, [1, 2, 3])
    guided = _run(pipe, images, PROMPTS, [1, 2, 3], guidance_scale=3.0)
    assert np.abs(guided.actions - plain.actions).max() > 1e-3
    for i in range(3):  # every row, shorter (padded) prompts included
        alone = _run(pipe, images[i : i + 1], PROMPTS[i : i + 1], [1 + i], guidance_scale=3.0)
        np.testing.assert_allclose(guided.actions[i], alone.actions[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"images": np.zeros((2, 32, 32, 3), np.float32)}, "uint8"),
        ({"prompts": ["a", "b"]}, r"2 prompt\(s\).*3 image\(s\)"),
        ({"prompts": ["a", "", "c"]}, "empty"),
        ({"seed": [1, 2]}, "one per image"),
        ({"seed": [1, -2, 3]}, r"seed\[1\]: expected an int in \[0, 2\*\*64\)"),
        ({"action_noise": np.zeros((2, 4, 64), np.float32)}, "batch axis of 3"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
    ],
)
def test_bad_input_is_refused_and_changes_nothing(pipe, images, kwargs, message) -> None:
    call = {"images": images, "prompts": PROMPTS, "seed": [1, 2, 3]}
    call.update(kwargs)
    before = call["images"].copy()
    with pytest.raises(ValueError, match=message):
        pipe(call.pop("images"), call.pop("prompts"), progress=False, **call)
    assert np.array_equal(before, kwargs.get("images", images))


def test_checkpoint_without_policy_file_needs_a_policy(checkpoint, tmp_path) -> None:
    import shutil

    copy = tmp_path / "ckpt"
    shutil.copytree(checkpoint, copy)
    (copy / POLICY_CONFIG).unlink()
    with pytest.raises(FileNotFoundError, match="PolicyConfig"):
        Cosmos3ActionPipeline.from_pretrained(copy)


def _diffusers_scheduler(num_steps: int, shift: float) -> UniPCMultistepScheduler:
    sched = UniPCMultistepScheduler(
        prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=shift,
        solver_order=2, solver_type="bh2", predict_x0=True, lower_order_final=True,
        final_sigmas_type="zero",
    )
    sched.set_timesteps(sigmas=np.linspace(float(np.float32(0.999)), 0.0, num_steps + 1)[:-1])
    sched.set_begin_index(0)
    return sched


def _checkpoint_flow_shift(checkpoint) -> float:
    """The shift the checkpoint's action_policy.json names, read without our loader."""
    return float(json.loads((checkpoint / POLICY_CONFIG).read_text())["flow_shift"])


def _reference_chunk(checkpoint, pipe, image, prompt, seed, num_steps, shift):
    """One request, rebuilt from diffusers' transformer and scheduler and the recipe's formulas,
    sampled with flow shift ``shift``."""
    policy = pipe.policy
    # diffusers' class built from our config.json, loaded from our safetensors: the checkpoint
    # format is diffusers'. (Only the unused text head lm_head is absent from tiny checkpoints.)
    config = json.loads((checkpoint / TRANSFORMER / "config.json").read_text())
    ref = Cosmos3OmniTransformer(**{k: v for k, v in config.items() if not k.startswith("_")})
    weights = load_file(str(checkpoint / TRANSFORMER / "diffusion_pytorch_model.safetensors"))
    missing, unexpected = ref.load_state_dict(weights, strict=False)
    assert missing == ["lm_head.weight"] and unexpected == []
    ref.eval()
    caption = json.dumps({
        "cinematography": {
            "framing": "This video contains concatenated views from multiple camera perspectives."
        },
        "actions": [{"time": "0:00-0:00", "description": prompt + ".",
                     "idle_frame": f"0 out of {policy.action_horizon}."}],
        "duration": "0s", "fps": policy.fps, "resolution": {"H": 192, "W": 320},
        "aspect_ratio": "16,9",
    })
    tok = pipe.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": caption}], tokenize=True,
                                  add_generation_prompt=True, return_dict=False)
    ids = [*ids, tok.eos_token_id, tok.convert_tokens_to_ids("<|vision_start|>")]
    input_ids = torch.tensor(ids)

    plan = plan_canvas(*image.shape[:2], policy.resolution_tier)
    pixels = preprocess([image], plan).unsqueeze(2)  # [1, 3, 1, H, W]
    vae = pipe.vae
    mu = vae.encode(pixels).latent_dist.mode()
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    h, w = latent_content_shape(plan)
    cond = ((mu - mean) / std)[..., :h, :w]

    t = policy.action_horizon // 4 + 1
    # The official arch-invariant draw: a fresh RandomState(seed) per modality, fp32.
    vision = np.random.RandomState(seed).standard_normal((48, t, h, w)).astype(np.float32)
    vision = torch.from_numpy(vision)[None]
    actions = np.random.RandomState(seed).standard_normal((policy.action_horizon, 64))
    actions = torch.from_numpy(actions.astype(np.float32))
    actions[:, policy.raw_action_dim :] = 0
    vision[:, :, :1] = cond
    vision_sched = _diffusers_scheduler(num_steps, shift)
    action_sched = _diffusers_scheduler(num_steps, shift)
    for step_t in vision_sched.timesteps:
        v_vis, v_act = reference_forward(
            ref, input_ids, vision, actions, float(step_t), domain=policy.domain_id, fps=policy.fps
        )
        v_act[:, policy.raw_action_dim :] = 0
        vision = vision_sched.step(v_vis, step_t, vision).prev_sample
        actions = action_sched.step(v_act, step_t, actions).prev_sample
        vision[:, :, :1] = cond
        actions[:, policy.raw_action_dim :] = 0
    stats = policy.stats["global_raw"]  # quantile_rot uses the raw-rotation statistics
    q01, q99 = np.array(stats["q01"]), np.array(stats["q99"])
    normalized = actions[:, : policy.raw_action_dim].numpy()
    return (normalized + 1) / 2 * (q99 - q01) + q01


@pytest.mark.parametrize("num_steps", [1, 4])
def test_pipeline_matches_diffusers_transformer_and_scheduler(checkpoint, pipe, images, num_steps):
    shift = _checkpoint_flow_shift(checkpoint)
    with torch.no_grad():
        expected = _reference_chunk(checkpoint, pipe, images[0], PROMPTS[0], 21, num_steps, shift)
    out = pipe(images[:1], PROMPTS[:1], seed=21, num_inference_steps=num_steps, progress=False)
    assert np.abs(expected).max() > 0.1
    np.testing.assert_allclose(out.actions[0], expected, rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def shift_one_checkpoint(checkpoint, tmp_path_factory):
    """The same weights with the shipped tiny checkpoint's flow shift (1.0) in its policy file;
    the test checkpoints' default is 5.0."""
    import shutil

    copy = tmp_path_factory.mktemp("shift1") / "ckpt"
    shutil.copytree(checkpoint, copy)
    policy = json.loads((copy / POLICY_CONFIG).read_text())
    assert policy["flow_shift"] == 5.0
    (copy / POLICY_CONFIG).write_text(json.dumps({**policy, "flow_shift": 1.0}))
    return copy


SHIFT_STEPS = 4
SHIFT_CALL = dict(seed=21, num_inference_steps=SHIFT_STEPS, progress=False)


@pytest.fixture(scope="module")
def shifted(shift_one_checkpoint):
    return Cosmos3ActionPipeline.from_pretrained(shift_one_checkpoint)


@pytest.fixture(scope="module")
def shift_one_reference(shift_one_checkpoint, shifted, images):
    """diffusers' transformer and scheduler at flow shift 1.0 (the weights of both checkpoints)."""
    with torch.no_grad():
        return _reference_chunk(shift_one_checkpoint, shifted, images[0], PROMPTS[0], 21,
                                SHIFT_STEPS, shift=1.0)


def test_checkpoint_flow_shift_reaches_the_sampler(
    shift_one_checkpoint, shifted, pipe, shift_one_reference, images
) -> None:
    """Sampling follows action_policy.json's flow_shift: the 1.0 checkpoint equals diffusers'
    scheduler at 1.0; the same weights and request under the 5.0 checkpoint are far from it."""
    assert _checkpoint_flow_shift(shift_one_checkpoint) == 1.0
    out = shifted(images[:1], PROMPTS[:1], **SHIFT_CALL)
    np.testing.assert_allclose(out.actions[0], shift_one_reference, rtol=1e-4, atol=1e-4)
    at_five = pipe(images[:1], PROMPTS[:1], **SHIFT_CALL)
    assert np.abs(at_five.actions[0] - shift_one_reference).max() > 1e-2


def test_call_flow_shift_overrides_the_checkpoints(
    checkpoint, shifted, pipe, shift_one_reference, images
) -> None:
    """``flow_shift=`` in the call wins over the checkpoint's shift, both ways."""
    assert _checkpoint_flow_shift(checkpoint) == 5.0
    out = pipe(images[:1], PROMPTS[:1], flow_shift=1.0, **SHIFT_CALL)
    np.testing.assert_allclose(out.actions[0], shift_one_reference, rtol=1e-4, atol=1e-4)
    at_five = pipe(images[:1], PROMPTS[:1], **SHIFT_CALL).actions
    np.testing.assert_array_equal(
        shifted(images[:1], PROMPTS[:1], flow_shift=5.0, **SHIFT_CALL).actions, at_five)


def test_return_video_decodes_the_predicted_clip_and_changes_no_action(pipe, images) -> None:
    plain = _run(pipe, images[:2], PROMPTS[:2], [1, 2])
    with_video = _run(pipe, images[:2], PROMPTS[:2], [1, 2], return_video=True)
    assert plain.video is None
    np.testing.assert_array_equal(with_video.actions, plain.actions)
    plan = plan_canvas(*images.shape[1:3], pipe.policy.resolution_tier)
    h, w = latent_content_shape(plan)
    assert len(with_video.video) == 2
    for clip in with_video.video:
        assert clip.dtype == np.uint8
        assert clip.shape == (pipe.action_horizon + 1, h * 16, w * 16, 3)
        assert clip.std() > 0  # decoded content, not a blank buffer


def test_return_video_per_item_decodes_only_the_rows_asked(pipe, images, monkeypatch) -> None:
    """A per-item ``return_video`` decodes those rows alone (the VAE decoder sees only them),
    gives the others None, and leaves every action as the call without video."""
    from cosmos3_gym.pipeline import stages

    decoded_batch_sizes = []
    real_decode = stages.decode_latents

    def counting_decode(vae, latents):
        decoded_batch_sizes.append(latents.shape[0])
        return real_decode(vae, latents)

    monkeypatch.setattr(stages, "decode_latents", counting_decode)
    plain = _run(pipe, images, PROMPTS, [4, 5, 6])
    assert decoded_batch_sizes == []
    masked = _run(pipe, images, PROMPTS, [4, 5, 6], return_video=[True, False, True])
    assert decoded_batch_sizes == [2]
    np.testing.assert_array_equal(masked.actions, plain.actions)
    assert masked.video[1] is None
    every = _run(pipe, images, PROMPTS, [4, 5, 6], return_video=True)
    assert decoded_batch_sizes == [2, 3]
    for row in (0, 2):  # the same latents, decoded in a batch of 2 instead of 3
        assert masked.video[row].shape == every.video[row].shape
        diff = np.abs(masked.video[row].astype(int) - every.video[row].astype(int))
        assert diff.max() <= 1 and diff.mean() < 0.01
    nothing = _run(pipe, images, PROMPTS, [4, 5, 6], return_video=[False, False, False])
    assert nothing.video is None and decoded_batch_sizes == [2, 3]


def test_return_video_needs_one_bool_per_image(pipe, images) -> None:
    with pytest.raises(ValueError, match=r"return_video: expected a bool or 3 bools .* \[True\]"):
        _run(pipe, images, PROMPTS, [1, 2, 3], return_video=[True])
