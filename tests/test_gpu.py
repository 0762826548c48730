"""Device checks, run where CUDA is present (`python -m pytest -q -m gpu` on a GPU machine).

CI machines have no GPU, so these skip there; they are the prepared script for a GPU session:
bf16 parity of the generator with diffusers' reference, and CPU/GPU agreement of the pipeline
(noise is drawn on the host, so both devices start from the same numbers).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from diffusers import Cosmos3OmniTransformer

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.bench.diffusers_reference import reference_forward
from cosmos3_gym.model import Cosmos3Config, Cosmos3Transformer
from cosmos3_gym.tiny import write_tiny_checkpoint

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

CONFIG = dict(
    hidden_size=256, head_dim=64, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=4, intermediate_size=512, vocab_size=97, rope_axes_dim=[12, 10, 10],
    action_gen=True, action_dim=64,
)


@pytest.mark.parametrize("action_t", [None, 120.0])
def test_bf16_generator_tracks_diffusers_bf16(action_t: float | None) -> None:
    """Both in bf16 on the GPU, compared with the fp32 reference as the yardstick; also with
    the action tokens at their own noise level (``action_timesteps``, as training runs it)."""
    torch.manual_seed(0)
    ref = Cosmos3OmniTransformer(**CONFIG).eval()
    ours = Cosmos3Transformer(Cosmos3Config.from_dict(dict(ref.config))).eval()
    ours.load_state_dict(
        {k: v for k, v in ref.state_dict().items() if k not in ours.UNUSED_CHECKPOINT_KEYS}
    )
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (40,), generator=gen)
    vision = torch.randn(1, 48, 3, 6, 10, generator=gen)
    actions = torch.randn(16, 64, generator=gen)
    with torch.no_grad():
        exact, exact_act = reference_forward(ref, ids, vision, actions, 604.0, domain=5, fps=20.0,
                                             action_timestep=action_t)
        ref_bf16 = ref.to("cuda", torch.bfloat16)
        ref_vis, ref_act = reference_forward(
            ref_bf16, ids.cuda(), vision.cuda().bfloat16(), actions.cuda().bfloat16(), 604.0,
            domain=5, fps=20.0, action_timestep=action_t,
        )
        ours = ours.to("cuda", torch.bfloat16).fuse_gen_projections()
        ours.time_embedder.float()
        our_vis, our_act = ours(
            ids[None].cuda(), torch.ones(1, 40, dtype=torch.bool, device="cuda"),
            vision.cuda(), (torch.arange(3, device="cuda") > 0)[None], actions[None].cuda(),
            torch.ones(1, 16, dtype=torch.bool, device="cuda"), torch.tensor([5], device="cuda"),
            torch.tensor([604.0], device="cuda"), fps=20.0,
            action_timesteps=None if action_t is None else torch.tensor([action_t], device="cuda"),
        )
    ref_err = (ref_vis.float().cpu() - exact).abs().max()
    our_err = (our_vis.float().cpu() - exact).abs().max()
    # Ours may differ from diffusers' bf16 rounding, but not be worse than it by much.
    assert our_err <= 2 * ref_err + 1e-3, (our_err, ref_err)
    act_ref_err = (ref_act.float().cpu() - exact_act).abs().max()
    act_our_err = (our_act[0].float().cpu() - exact_act).abs().max()
    assert act_our_err <= 2 * act_ref_err + 1e-3, (act_our_err, act_ref_err)


def test_pipeline_fp32_on_gpu_matches_cpu(tmp_path) -> None:
    path = write_tiny_checkpoint(tmp_path / "tiny")
    images = np.random.default_rng(0).integers(0, 256, (4, 256, 512, 3), dtype=np.uint8)
    prompts = ["put the bowl on the plate", "open the drawer", "turn on the stove", "push"]
    kwargs = dict(seed=[1, 2, 3, 4], num_inference_steps=8, progress=False)
    cpu = Cosmos3ActionPipeline.from_pretrained(path)(images, prompts, **kwargs)
    gpu_pipe = Cosmos3ActionPipeline.from_pretrained(path, device="cuda", dtype=torch.float32)
    gpu = gpu_pipe(images, prompts, **kwargs)
    np.testing.assert_allclose(gpu.actions, cpu.actions, rtol=1e-3, atol=1e-3)
    assert gpu.timings["denoise_peak_bytes"] > 0


def test_bf16_pipeline_is_batch_invariant_on_gpu(tmp_path) -> None:
    path = write_tiny_checkpoint(tmp_path / "tiny")
    pipe = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")  # bf16 default on CUDA
    images = np.random.default_rng(0).integers(0, 256, (3, 256, 512, 3), dtype=np.uint8)
    prompts = ["put the bowl on the plate", "open the top drawer and put the bowl inside", "go"]
    batched = pipe(images, prompts, seed=[1, 2, 3], num_inference_steps=8, progress=False)
    for i in range(3):
        alone = pipe(images[i : i + 1], prompts[i : i + 1], seed=[i + 1], num_inference_steps=8,
                     progress=False)
        # bf16 kernels may pick other tilings per batch size: a loose bound, stated.
        np.testing.assert_allclose(batched.actions[i], alone.actions[0], rtol=5e-2, atol=5e-2)


def test_frame_encoder_bf16_on_gpu_tracks_diffusers_bf16() -> None:
    from cosmos3_gym.model.wan_frame_encoder import WanFrameEncoder
    from cosmos3_gym.tiny import build_tiny_vae

    frames = (torch.rand(4, 3, 192, 320, generator=torch.Generator().manual_seed(0)) * 2 - 1)
    with torch.no_grad():
        vae = build_tiny_vae(3).cuda()
        reference = vae.encode(frames.cuda().unsqueeze(2)).latent_dist.mode()[:, :, 0]
        vae16 = build_tiny_vae(3).cuda().to(torch.bfloat16)
        video16 = frames.cuda().bfloat16().unsqueeze(2)
        diffusers16 = vae16.encode(video16).latent_dist.mode()[:, :, 0].float()
        ours16 = WanFrameEncoder(vae16)(frames.cuda().bfloat16()).float()
    diffusers_error = (diffusers16 - reference).abs().max()
    assert (ours16 - reference).abs().max() <= 1.5 * diffusers_error + 1e-3


def _nano_layers(num_layers: int = 2, **overrides):
    """Cosmos3-Nano's layer widths (4096 hidden, 32/8 heads of 128, MLP 12288), fewer layers:
    the kernels' real block sizes at a test's cost."""
    from cosmos3_gym.model.presets import GENERATOR_PRESETS

    return Cosmos3Config.from_dict({**GENERATOR_PRESETS["nano"], "num_hidden_layers": num_layers,
                                    "vocab_size": 1024, "sound_gen": False, **overrides})


def _gen_step_inputs(model, lengths, batch_tokens=(3, 10, 20), actions=16, seed=0):
    gen = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ids = torch.zeros(b, max(lengths), dtype=torch.long)
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    ids[mask] = torch.randint(1, 1000, (sum(lengths),), generator=gen)
    t, h, w = batch_tokens
    return dict(
        ids=ids.cuda(), mask=mask.cuda(),
        vision=torch.randn(b, 48, t, h, w, generator=gen).cuda().bfloat16(),
        vision_noisy=(torch.arange(t) > 0)[None].expand(b, t).cuda(),
        actions=torch.randn(b, actions, 64, generator=gen).cuda().bfloat16(),
        action_noisy=torch.ones(b, actions, dtype=torch.bool).cuda(),
        domains=torch.full((b,), 5).cuda(), timesteps=torch.full((b,), 611.0).cuda(),
        latent=(t, h, w), num_actions=actions,
    )


def _replayed(model, graphs, inp):
    """One GEN step of ``inp`` bound to ``graphs`` (captured on first use) and replayed."""
    text = model.encode_text(inp["ids"], inp["mask"])
    layout = model.gen_layout(text, latent_shape=inp["latent"], num_actions=inp["num_actions"],
                              fps=20.0)
    step = graphs.bind(text, layout, inp["vision"], inp["vision_noisy"], inp["actions"],
                       inp["action_noisy"], inp["domains"])
    assert step is not None
    return step(inp["vision"], inp["actions"], inp["timesteps"])


def _forward(model, inp, ops=None):
    from cosmos3_gym.model.kernels import TORCH_OPS

    text = model.encode_text(inp["ids"], inp["mask"])
    layout = model.gen_layout(text, latent_shape=inp["latent"], num_actions=inp["num_actions"],
                              fps=20.0, preallocate_kv=True)
    return model.forward_gen(text, layout, inp["vision"], inp["vision_noisy"], inp["actions"],
                             inp["action_noisy"], inp["domains"], inp["timesteps"],
                             ops=ops or TORCH_OPS)


@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_triton_kernels_compiled_track_eager_at_nano_widths(hidden_act) -> None:
    """Compiled Triton kernels at the real block sizes, against eager bf16 on the same GPU."""
    from cosmos3_gym.model.kernels import TritonGenOps
    from cosmos3_gym.model.presets import random_transformer

    model = random_transformer(_nano_layers(hidden_act=hidden_act), device="cuda",
                               dtype=torch.bfloat16, seed=1).fuse_gen_projections()
    inp = _gen_step_inputs(model, [121, 97])
    with torch.no_grad():
        expected, actual = _forward(model, inp), _forward(model, inp, TritonGenOps())
    for e, a in zip(expected, actual, strict=True):
        scale = e.float().abs().max()
        assert (a.float() - e.float()).abs().max() <= 2e-2 * scale, hidden_act


def test_cuda_graph_replay_is_bit_identical_to_eager() -> None:
    from cosmos3_gym.model.cuda_graphs import GenGraphs
    from cosmos3_gym.model.presets import random_transformer

    model = random_transformer(_nano_layers(), device="cuda", dtype=torch.bfloat16, seed=2)
    model.fuse_gen_projections()
    graphs = GenGraphs(model)
    for lengths, seed in (([121], 0), ([110, 121], 1), ([115], 2)):
        inp = _gen_step_inputs(model, lengths, seed=seed)
        with torch.no_grad():
            expected = _forward(model, inp)
            actual = _replayed(model, graphs, inp)
        for e, a in zip(expected, actual, strict=True):
            assert torch.equal(e, a), lengths
    assert graphs.captures == 3


def test_a_bare_diffusers_folder_loads_by_domain_on_gpu(tmp_path) -> None:
    """The published folder format, loaded by --domain, computes on the GPU what it does on the
    CPU (fp32), and in the bf16 default gives finite actions of the domain's width."""
    from cosmos3_gym.tiny import write_tiny_diffusers_folder

    root = write_tiny_diffusers_folder(tmp_path / "bare")
    images = np.random.default_rng(0).integers(0, 256, (2, 256, 512, 3), dtype=np.uint8)
    prompts = ["put the bowl on the plate", "open the drawer"]
    kwargs = dict(seed=[1, 2], num_inference_steps=4, progress=False)
    cpu = Cosmos3ActionPipeline.from_pretrained(root, domain="droid_lerobot")(images, prompts,
                                                                             **kwargs)
    gpu32 = Cosmos3ActionPipeline.from_pretrained(
        root, domain="droid_lerobot", device="cuda", dtype=torch.float32
    )(images, prompts, **kwargs)
    np.testing.assert_allclose(gpu32.actions, cpu.actions, rtol=1e-3, atol=1e-3)
    bf16 = Cosmos3ActionPipeline.from_pretrained(root, domain="droid_lerobot", device="cuda")
    out = bf16(images, prompts, **kwargs)
    assert out.actions.shape == cpu.actions.shape == (2, 16, 10)
    assert np.isfinite(out.actions).all()


def test_video_for_some_items_on_gpu_changes_no_action(tmp_path) -> None:
    """bf16 on CUDA: asking for the predicted clips of some items decodes those alone and leaves
    every action bit-identical to the call without video."""
    pipe = Cosmos3ActionPipeline.from_pretrained(write_tiny_checkpoint(tmp_path / "tiny"),
                                                 device="cuda")
    images = np.random.default_rng(0).integers(0, 256, (3, 256, 512, 3), dtype=np.uint8)
    prompts = ["put the bowl on the plate", "open the top drawer and put the bowl inside", "go"]
    kwargs = dict(seed=[4, 5, 6], num_inference_steps=8, progress=False)
    plain = pipe(images, prompts, **kwargs)
    some = pipe(images, prompts, return_video=[True, False, True], **kwargs)
    every = pipe(images, prompts, return_video=True, **kwargs)
    np.testing.assert_array_equal(some.actions, plain.actions)
    np.testing.assert_array_equal(every.actions, plain.actions)
    assert some.video[1] is None
    for row in (0, 2):  # the same latents, decoded in a batch of 2 instead of 3
        assert some.video[row].dtype == np.uint8 and some.video[row].ndim == 4
        diff = np.abs(some.video[row].astype(int) - every.video[row].astype(int))
        assert diff.max() <= 2 and diff.mean() < 0.05, (diff.max(), diff.mean())


def _tiny_inputs(count: int = 3):
    images = np.random.default_rng(0).integers(0, 256, (count, 256, 512, 3), dtype=np.uint8)
    prompts = ["put the bowl on the plate", "open the top drawer and put the bowl inside", "go",
               "push the plate to the left", "close the drawer"][:count]
    return images, prompts


def test_cuda_default_is_the_fast_path_and_as_accurate_as_eager(tmp_path) -> None:
    """On CUDA, InferenceOptions() means CUDA graphs and the fused kernels (nothing switched
    off on this device), and the fast path's actions are as close to fp32 as eager bf16's."""
    from cosmos3_gym.pipeline import InferenceOptions

    path = write_tiny_checkpoint(tmp_path / "tiny")
    images, prompts = _tiny_inputs()
    kwargs = dict(seed=[1, 2, 3], num_inference_steps=8, progress=False)
    fast = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")
    assert fast.options.cuda_graphs and fast.options.triton_kernels
    eager = Cosmos3ActionPipeline.from_pretrained(
        path, device="cuda", options=InferenceOptions(cuda_graphs=False, triton_kernels=False)
    )
    reference = Cosmos3ActionPipeline.from_pretrained(path)(images, prompts, **kwargs).actions
    got = fast(images, prompts, **kwargs).actions
    assert fast.disabled_options == {} and fast.denoise.graphs.captures >= 1
    fast_error = np.abs(got - reference).max()
    eager_error = np.abs(eager(images, prompts, **kwargs).actions - reference).max()
    assert fast_error <= 1.5 * eager_error + 1e-3, (fast_error, eager_error)


def test_prompt_cache_on_gpu_gives_the_uncached_actions(tmp_path) -> None:
    """bf16 on CUDA with the default fast path: an episode's B=1 replans with the prompt cache
    equal the uncached pipeline's bit for bit, and a repeated batch hits for every row."""
    from cosmos3_gym.pipeline import InferenceOptions

    path = write_tiny_checkpoint(tmp_path / "tiny")
    cached = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")
    uncached = Cosmos3ActionPipeline.from_pretrained(
        path, device="cuda", options=InferenceOptions(prompt_cache=False)
    )
    images, prompts = _tiny_inputs()
    for call in range(4):
        got = cached(images[call % 3 : call % 3 + 1], prompts[1], seed=call,
                     num_inference_steps=8, progress=False)
        want = uncached(images[call % 3 : call % 3 + 1], prompts[1], seed=call,
                        num_inference_steps=8, progress=False)
        np.testing.assert_array_equal(got.actions, want.actions)
        assert got.timings["prompt_cache_hits"] == (call > 0)
    first = cached(images, prompts, seed=[1, 2, 3], num_inference_steps=8, progress=False)
    again = cached(images, prompts, seed=[1, 2, 3], num_inference_steps=8, progress=False)
    assert again.timings["prompt_cache_hits"] == 3
    np.testing.assert_array_equal(first.actions, again.actions)


def test_a_real_out_of_memory_error_splits_the_call(tmp_path) -> None:
    """CUDA's own OutOfMemoryError (a real failed allocation) in a micro-batch of more than two
    items: the call splits and returns every item, as the unsplit call would within bf16."""
    path = write_tiny_checkpoint(tmp_path / "tiny")
    pipe = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")
    images, prompts = _tiny_inputs(5)
    kwargs = dict(seed=list(range(5)), num_inference_steps=4, progress=False)
    expected = pipe(images, prompts, **kwargs).actions
    denoise = pipe.denoise

    def denoise_or_fail(batch, params):
        if batch.size > 2:
            torch.empty(2**62, dtype=torch.uint8, device="cuda")  # raises OutOfMemoryError
        return denoise(batch, params)

    denoise_or_fail.name = "denoise"
    pipe.stages = tuple(denoise_or_fail if s is denoise else s for s in pipe.stages)
    out = pipe(images, prompts, **kwargs)
    assert pipe.memory_batch_limit == 2
    np.testing.assert_allclose(out.actions, expected, atol=5e-2)


def test_synthetic_eval_on_gpu_runs_the_fast_path(tmp_path) -> None:
    import json

    from cosmos3_gym.eval.cli import main

    out = tmp_path / "eval"
    assert main(["eval", "--synthetic", "tiny", "--trials", "1", "--num-envs", "4",
                 "--denoising-steps", "2", "--max-episode-steps", "6", "--no-progress",
                 "--out", str(out)]) == 0
    t = json.loads((out / "results.json").read_text())["throughput"]
    assert t["devices"] == ["cuda:0"] and t["dtypes"] == ["bfloat16"] and t["gpus"]
    assert t["options"]["cuda_graphs"] and t["options"]["triton_kernels"]
    assert t["disabled_options"] == {} and t["pipeline_s"] > 0


@pytest.mark.parametrize("hidden_act", ["silu", "relu2"])
def test_fp8_kernels_compiled_track_eager_fp8_at_nano_widths(hidden_act) -> None:
    """The FP8 GEN step (e4m3 tensor cores, quantising Triton kernels compiled) against the
    eager FP8 ops on the same GPU, and both close to bf16 (SQNR)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability >= 8.9")
    from cosmos3_gym.model.fp8 import sqnr_db
    from cosmos3_gym.model.kernels import TorchGenOps, TritonGenOps
    from cosmos3_gym.model.presets import random_transformer

    model = random_transformer(_nano_layers(hidden_act=hidden_act), device="cuda",
                               dtype=torch.bfloat16, seed=3).fuse_gen_projections()
    model.quantize_gen_fp8()
    inp = _gen_step_inputs(model, [121, 97])
    with torch.no_grad():
        plain = _forward(model, inp)
        eager = _forward(model, inp, TorchGenOps(fp8=True))
        fused = _forward(model, inp, TritonGenOps(fp8=True))
    for p, e, f in zip(plain, eager, fused, strict=True):
        assert torch.isfinite(f.float()).all()
        assert sqnr_db(e.float(), f.float()) > 30, hidden_act  # one e4m3 step apart at most
        assert sqnr_db(p.float(), f.float()) > 15, hidden_act


def test_fp8_graph_replay_is_bit_identical_to_eager_fp8() -> None:
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability >= 8.9")
    from cosmos3_gym.model.cuda_graphs import GenGraphs
    from cosmos3_gym.model.kernels import TritonGenOps
    from cosmos3_gym.model.presets import random_transformer

    model = random_transformer(_nano_layers(), device="cuda", dtype=torch.bfloat16, seed=4)
    model.fuse_gen_projections().quantize_gen_fp8()
    ops = TritonGenOps(fp8=True)
    graphs = GenGraphs(model, ops=ops)
    inp = _gen_step_inputs(model, [110, 121])
    with torch.no_grad():
        expected = _forward(model, inp, ops)
        actual = _replayed(model, graphs, inp)
    for e, a in zip(expected, actual, strict=True):
        assert torch.equal(e, a)


def test_fp8_pipeline_on_gpu_runs_both_kinds_of_step_as_graphs(tmp_path) -> None:
    """--precision fp8 on the CUDA default: bf16 and FP8 steps each replay their own graph,
    nothing is switched off, and padded prompts give finite actions near bf16's."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 GEMMs need compute capability >= 8.9")
    from cosmos3_gym.pipeline import InferenceOptions

    path = write_tiny_checkpoint(tmp_path / "tiny")
    images, prompts = _tiny_inputs()
    kwargs = dict(seed=[1, 2, 3], num_inference_steps=8, progress=False)
    fp8 = Cosmos3ActionPipeline.from_pretrained(
        path, device="cuda", options=InferenceOptions(fp8=True, fp8_min_tokens=0))
    bf16 = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")
    got = fp8(images, prompts, **kwargs).actions
    assert fp8.disabled_options == {}
    assert fp8.denoise.graphs.captures == 1 and fp8.denoise.fp8_graphs.captures == 1
    reference = bf16(images, prompts, **kwargs).actions
    assert np.isfinite(got).all() and not np.array_equal(got, reference)
    assert np.abs(got - reference).max() < 0.1 * np.abs(reference).max()


def test_guidance_interval_on_gpu_runs_each_row_set_as_its_own_graph(tmp_path) -> None:
    """On the CUDA default, a first-step guidance interval replays a graph of the [cond;
    uncond] rows on step 0 and one of the conditional rows after it (the [2, 1, 1, 1] forwards
    of the Edge-Policy-DROID recipe); an interval over every step is today's guidance and one
    over none is guidance 1, bit for bit, and the actions track the CPU's."""
    path = write_tiny_checkpoint(tmp_path / "tiny")
    images, prompts = _tiny_inputs()
    kwargs = dict(seed=[1, 2, 3], num_inference_steps=4, flow_shift=5.0, guidance_scale=3.0,
                  progress=False)
    pipe = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")
    first = pipe(images, prompts, guidance_interval=(960.0, 1001.0), **kwargs).actions
    assert pipe.disabled_options == {} and pipe.denoise.graphs.captures == 2
    every = pipe(images, prompts, **kwargs).actions
    np.testing.assert_array_equal(
        pipe(images, prompts, guidance_interval=(-1.0, 1001.0), **kwargs).actions, every)
    unguided = pipe(images, prompts, **{**kwargs, "guidance_scale": 1.0}).actions
    np.testing.assert_array_equal(
        pipe(images, prompts, guidance_interval=(1001.0, 2000.0), **kwargs).actions, unguided)
    cpu = Cosmos3ActionPipeline.from_pretrained(path)
    reference = cpu(images, prompts, guidance_interval=(960.0, 1001.0), **kwargs).actions
    bf16_error = np.abs(first - reference).max()
    assert bf16_error < 0.1 * np.abs(reference).max(), bf16_error
    assert np.abs(first - every).max() > bf16_error  # the interval is not lost in bf16 noise


def test_state_rows_on_gpu_track_the_cpu_and_stay_batch_invariant(tmp_path) -> None:
    """A state-conditioned head (one clean state row) on the CUDA fast path: fp32 on the GPU
    equals the CPU's actions, bf16 rows equal each item alone within bf16's tiling bound."""
    path = write_tiny_checkpoint(tmp_path / "tiny", policy_overrides={"history_length": 1})
    images, prompts = _tiny_inputs()
    state = np.random.default_rng(4).uniform(-0.4, 0.6, (3, 1, 10)).astype(np.float32)
    kwargs = dict(seed=[1, 2, 3], num_inference_steps=8, progress=False)
    cpu = Cosmos3ActionPipeline.from_pretrained(path)(images, prompts, state=state, **kwargs)
    fp32 = Cosmos3ActionPipeline.from_pretrained(path, device="cuda", dtype=torch.float32)
    np.testing.assert_allclose(fp32(images, prompts, state=state, **kwargs).actions,
                               cpu.actions, rtol=1e-3, atol=1e-3)
    bf16 = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")
    batched = bf16(images, prompts, state=state, **kwargs)
    assert bf16.disabled_options == {} and bf16.denoise.graphs.captures >= 1
    assert batched.actions.shape == (3, bf16.action_horizon, 10)
    for i in range(3):
        alone = bf16(images[i : i + 1], prompts[i : i + 1], state=state[i : i + 1],
                     seed=[i + 1], num_inference_steps=8, progress=False)
        np.testing.assert_allclose(batched.actions[i], alone.actions[0], rtol=5e-2, atol=5e-2)
    moved = bf16(images, prompts, state=state + 0.5, **kwargs).actions
    assert np.abs(moved - batched.actions).max() > 5e-2  # the state conditions the actions


def test_committed_rows_on_gpu_come_back_exactly_and_graphs_replay_other_counts(tmp_path
                                                                               ) -> None:
    """RTC's committed rows on the CUDA fast path (bf16, graphs): the rows come back bit for
    bit, a graph captured for one pattern of committed rows replays another (the clean-row
    mask is a graph input) as eager does, and fp32 on the GPU tracks the CPU."""
    from cosmos3_gym.pipeline import InferenceOptions

    path = write_tiny_checkpoint(tmp_path / "tiny", policy_overrides={"history_length": 1})
    images, prompts = _tiny_inputs()
    state = np.random.default_rng(4).uniform(-0.4, 0.6, (3, 1, 10)).astype(np.float32)
    rng = np.random.default_rng(5)
    kwargs = dict(seed=[1, 2, 3], num_inference_steps=8, progress=False, state=state)

    def committed(counts):
        return [None if c is None else rng.uniform(-0.5, 0.5, (c, 10)).astype(np.float32)
                for c in counts]

    first, second = committed([1, None, 3]), committed([2, 1, None])
    cpu = Cosmos3ActionPipeline.from_pretrained(path)(images, prompts, committed_actions=second,
                                                      **kwargs)
    fp32 = Cosmos3ActionPipeline.from_pretrained(path, device="cuda", dtype=torch.float32)
    np.testing.assert_allclose(fp32(images, prompts, committed_actions=second, **kwargs).actions,
                               cpu.actions, rtol=1e-3, atol=1e-3)
    fast = Cosmos3ActionPipeline.from_pretrained(path, device="cuda")
    eager = Cosmos3ActionPipeline.from_pretrained(
        path, device="cuda", options=InferenceOptions(cuda_graphs=False, triton_kernels=False))
    fast(images, prompts, committed_actions=first, **kwargs)  # captures with the first mask
    got = fast(images, prompts, committed_actions=second, **kwargs)
    assert fast.disabled_options == {} and fast.denoise.graphs.hits >= 1
    for k, rows in enumerate(second):
        if rows is not None:
            np.testing.assert_array_equal(got.actions[k, :len(rows)], rows)
    want = eager(images, prompts, committed_actions=second, **kwargs).actions
    np.testing.assert_allclose(got.actions, want, rtol=5e-2, atol=5e-2)


def test_measured_latency_on_gpu_is_each_calls_wall_time(tmp_path) -> None:
    """``--latency measured`` on CUDA: each chunk's delay is its call's wall time in steps, the
    calls of one batch share it, and a replay of the run gives the same episodes."""
    import json

    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.eval.results import read_episode_records

    out = tmp_path / "measured"
    common = ["--synthetic", "tiny", "--trials", "1", "--num-envs", "4", "--denoising-steps",
              "4", "--max-episode-steps", "24", "--env-kwargs", '{"max_speed": 0.02}',
              "--no-progress"]
    assert main(["eval", *common, "--latency", "measured", "--control-hz", "200",
                 "--out", str(out)]) == 0
    records = read_episode_records(out)
    chunks = [c for r in records for c in r["chunk_timing"]]
    assert len(chunks) > 4
    for c in chunks:
        assert c["delay"] == int(np.ceil(round(c["latency_s"] * 200, 9)))
    results = json.loads((out / "results.json").read_text())
    assert results["latency"]["model"].startswith("real time") and results["latency"]["chunks"]
    replay = tmp_path / "replay"
    assert main(["eval", *common, "--latency", f"replay:{out}", "--out", str(replay)]) == 0
    assert [r["obs_sha256"] for r in read_episode_records(replay)] == [
        r["obs_sha256"] for r in records]


def test_cuda_tensor_observations_reach_the_pipeline_without_a_host_copy(tmp_path) -> None:
    """A GPU simulator's uint8 CUDA tensors (ManiSkill3's) give the actions of the same frames
    as numpy, and admission keeps them on the device (no host round trip)."""
    from cosmos3_gym import VectorPolicy
    from cosmos3_gym.pipeline.admission import admit_images

    frames = np.random.default_rng(0).integers(0, 256, (3, 96, 128, 3), dtype=np.uint8)
    on_gpu = torch.from_numpy(frames).cuda()
    assert all(image.is_cuda for image in admit_images(on_gpu))
    pipe = Cosmos3ActionPipeline.from_pretrained(write_tiny_checkpoint(tmp_path / "c"),
                                                 device="cuda", dtype=torch.float32)
    prompts = ["pick up the cube"] * 3
    from_numpy = VectorPolicy(pipe, seed=2)({"rgb": frames}, prompts)
    from_cuda = VectorPolicy(pipe, seed=2)({"rgb": on_gpu, "qpos": torch.zeros(3, 7).cuda()},
                                           prompts)
    np.testing.assert_array_equal(from_cuda, from_numpy)


@pytest.mark.parametrize("case", ["libero", "state"])
def test_lerobot_folders_on_the_gpu_give_lerobots_actions(case) -> None:
    """The LeRobot fixtures (written by LeRobot's own code, reference actions from its CPU run)
    on CUDA: fp32 to 1e-3 of LeRobot's, bf16 to a few percent; diffusers' UniPC, the float
    resize and the state row on the device, the fast path on (CUDA graphs, kernels)."""
    import json
    from pathlib import Path

    folder = Path(__file__).parent / "fixtures" / "lerobot_cosmos3" / case
    with np.load(folder / "reference.npz") as data:
        ref = {k: data[k] for k in data.files}
    tasks = json.loads((folder / "reference.json").read_text())["tasks"]
    seeds = [int(s) for s in ref["seeds"]]
    extra = {"state": ref["state"][:, None, :]} if case == "state" else {}
    for dtype, tolerance in ((torch.float32, 1e-3), (torch.bfloat16, 0.1)):
        pipe = Cosmos3ActionPipeline.from_pretrained(folder, device="cuda", dtype=dtype)
        out = pipe(ref["canvas"], tasks, seed=seeds, progress=False, **extra)
        scale = float(np.abs(ref["actions_folder"]).max())
        assert np.abs(out.actions - ref["actions_folder"]).max() <= tolerance * max(scale, 1.0)


@pytest.mark.maniskill
def test_maniskill_simulates_on_the_gpu_from_the_command_line(tmp_path, monkeypatch) -> None:
    """``--env maniskill:pick_cube`` with physx_cuda: 16 envs in ManiSkill3's own vector env,
    their camera frames reaching the pipeline as CUDA tensors, every episode recorded with its
    scheduled seed, its length and ManiSkill's success. Its own stage of scripts/gpu_session.sh
    (``maniskill``), which reports where SAPIEN cannot start on the device."""
    import json

    from cosmos3_gym.envs.maniskill import resolve_sim_backend
    from cosmos3_gym.envs.presets import preset_eval_env
    from cosmos3_gym.eval.cli import main

    assert resolve_sim_backend("auto") == "physx_cuda"  # the default where CUDA is
    seen: list[tuple[str, bool]] = []
    call = Cosmos3ActionPipeline.__call__

    def spy(self, images, *args, **kwargs):
        seen.append((type(images).__name__, bool(getattr(images, "is_cuda", False))))
        return call(self, images, *args, **kwargs)

    monkeypatch.setattr(Cosmos3ActionPipeline, "__call__", spy)
    out = tmp_path / "maniskill"
    assert main(["eval", "--env", "maniskill:pick_cube", "--env-kwargs",
                 '{"sim_backend": "physx_cuda"}', "--synthetic", "tiny", "--trials", "16",
                 "--num-envs", "16", "--max-episode-steps", "40", "--denoising-steps", "2",
                 "--no-progress", "--out", str(out)]) == 0
    assert seen and all(kind == "Tensor" and cuda for kind, cuda in seen), seen[:3]
    identity = json.loads((out / "config.json").read_text())["identity"]
    assert identity["simulation"] == {"sim_backend": "physx_cuda", "vector_env": "maniskill"}
    records = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    scheduled = sorted(e.seed for e in preset_eval_env("maniskill:pick_cube").episodes(16, 0))
    assert sorted(r["seed"] for r in records) == scheduled
    assert sorted(r["env_slot"] for r in records) == list(range(16))  # one episode per slot
    assert all(isinstance(r["success"], bool) and 1 <= r["steps"] <= 40 and r["chunks"] >= 1
               for r in records)
    assert any(r["chunks"] >= 2 for r in records)  # a few chunks, not one
    assert json.loads((out / "results.json").read_text())["complete"]


def test_every_step_stochastic_scores_back_on_gpu_and_trains(tmp_path) -> None:
    """``rl grpo --sde-steps all --ratio step`` on CUDA: a chunk's recomputed log-probability
    over its eight Gaussian steps equals the recorded one (the on-policy ratio the update starts
    from is 1), per step too, gradients reach the weights, and a short run finishes with
    finite update statistics and the memory estimate's device check passed."""
    import json

    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.pipeline import chunk_log_prob

    path = write_tiny_checkpoint(tmp_path / "tiny")
    pipe = Cosmos3ActionPipeline.from_pretrained(path, device="cuda", dtype=torch.float32)
    trainable = Cosmos3Transformer.from_pretrained(path / "transformer").to("cuda")
    trainable.requires_grad_(True)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (4, 128, 128, 3), dtype=np.uint8)
    prompts = [f"reach the {c} target" for c in ("red", "green", "blue", "yellow")]
    out = pipe(images, prompts, seed=[1, 2, 3, 4], progress=False, sampler="flow_sde",
               sde_steps="all", executed_actions=4)
    assert out.stochastic.steps.shape[1] == pipe.policy.num_inference_steps
    log_prob = chunk_log_prob(pipe, out.stochastic, prompts, model=trainable)
    np.testing.assert_allclose(log_prob.detach().cpu().numpy(), out.stochastic.log_prob,
                               rtol=0, atol=1e-3)
    log_prob.sum().backward()
    assert any(float(p.grad.abs().sum()) > 0 for p in trainable.parameters()
               if p.grad is not None)
    steps = chunk_log_prob(pipe, out.stochastic, prompts, model=trainable, per_step=True)
    assert steps.shape == (4, pipe.policy.num_inference_steps)  # --ratio step's scores
    np.testing.assert_allclose(steps.sum(1).detach().cpu().numpy(), out.stochastic.log_prob,
                               rtol=0, atol=1e-3)
    run = tmp_path / "grpo"
    # --ema too: the average lives beside the trained weights on the device; --keep best
    # copies the measured weights to the host and back into the device's at the end.
    assert main(["rl", "grpo", "--sde-steps", "all", "--ratio", "step", "--ema", "0.9",
                 "--keep", "best", "--device", "cuda", "--iterations", "1",
                 "--groups", "2", "--group-size", "4", "--num-envs", "8", "--eval-trials", "1",
                 "--env-kwargs", '{"max_speed": 0.28}', "--no-progress",
                 "--out", str(run)]) == 0
    done = json.loads((run / "curve.json").read_text())
    curve = done["curve"]
    updates = [p for p in curve if p.get("update_steps")]
    assert all(np.isfinite(p["approx_kl"]) and np.isfinite(p["loss"]) for p in updates)
    assert done["kept"]["iteration"] in (0, 1) and done["kept"]["test_episodes"] == 4
    assert (run / "checkpoint" / "transformer").is_dir()


def test_shared_group_noise_on_gpu_differs_only_in_the_scored_draws(tmp_path) -> None:
    """``--group-noise shared``'s pipeline call on CUDA: rows that share a seed and differ in
    their step-noise seeds share the start noise, the step and the state before it, differ
    after it, and score back; a short ``rl grpo --group-noise shared --loss-norm collected``
    run finishes."""
    import json

    from cosmos3_gym.eval.cli import main
    from cosmos3_gym.pipeline import chunk_log_prob

    path = write_tiny_checkpoint(tmp_path / "tiny")
    pipe = Cosmos3ActionPipeline.from_pretrained(path, device="cuda", dtype=torch.float32)
    trainable = Cosmos3Transformer.from_pretrained(path / "transformer").to("cuda")
    rng = np.random.default_rng(2)
    images = np.repeat(rng.integers(0, 255, (1, 128, 128, 3), dtype=np.uint8), 4, axis=0)
    prompts = ["reach the red target"] * 4
    out = pipe(images, prompts, seed=[9] * 4, step_noise_seed=[1, 2, 3, 4], progress=False,
               sampler="flow_sde", executed_actions=4)
    sde = out.stochastic
    assert (sde.steps == sde.steps[0]).all()
    np.testing.assert_array_equal(sde.actions_before[1:], np.repeat(sde.actions_before[:1], 3, 0))
    assert len({row.tobytes() for row in sde.actions_after}) == 4
    with torch.no_grad():
        log_prob = chunk_log_prob(pipe, sde, prompts, model=trainable)
    np.testing.assert_allclose(log_prob.cpu().numpy(), sde.log_prob, rtol=0, atol=1e-3)
    run = tmp_path / "grpo"
    # --loss-norm collected: the loss's scale (a host float) meets the device's loss.
    assert main(["rl", "grpo", "--group-noise", "shared", "--device", "cuda", "--iterations",
                 "1", "--groups", "2", "--group-size", "4", "--num-envs", "8", "--eval-trials",
                 "1", "--env-kwargs", '{"max_speed": 0.28}', "--no-progress",
                 "--loss-norm", "collected", "--max-grad-norm", "10", "--out", str(run)]) == 0
    identity = json.loads((run / "grpo.json").read_text())["identity"]
    assert identity["group_noise"] == "shared" and identity["loss_norm"] == "collected"
    curve = json.loads((run / "curve.json").read_text())["curve"]
    assert all(np.isfinite(p["loss"]) for p in curve if p.get("update_steps"))


def test_random_but_last_on_gpu_never_draws_the_last_step_and_scores_back(tmp_path) -> None:
    """``--sde-steps random-but-last`` on CUDA: 32 chunks draw their one stochastic step from all
    but the last, and each recomputed log-probability equals the recorded one."""
    from cosmos3_gym.pipeline import chunk_log_prob

    path = write_tiny_checkpoint(tmp_path / "tiny")
    pipe = Cosmos3ActionPipeline.from_pretrained(path, device="cuda", dtype=torch.float32)
    trainable = Cosmos3Transformer.from_pretrained(path / "transformer").to("cuda")
    rng = np.random.default_rng(1)
    images = rng.integers(0, 255, (32, 128, 128, 3), dtype=np.uint8)
    prompts = [f"reach the {('red', 'green', 'blue', 'yellow')[k % 4]} target" for k in range(32)]
    out = pipe(images, prompts, seed=list(range(32)), progress=False, sampler="flow_sde",
               sde_steps="random-but-last", executed_actions=4)
    last = pipe.policy.num_inference_steps - 1
    assert out.stochastic.steps.shape == (32, 1) and int(out.stochastic.steps.max()) < last
    with torch.no_grad():
        log_prob = chunk_log_prob(pipe, out.stochastic, prompts, model=trainable)
    np.testing.assert_allclose(log_prob.cpu().numpy(), out.stochastic.log_prob, rtol=0, atol=1e-3)
