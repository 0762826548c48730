"""The Cosmos3 generator against diffusers' reference, and its batching/caching contracts."""

from __future__ import annotations

import json

import pytest
import torch
from diffusers import Cosmos3OmniTransformer
from safetensors.torch import save_file

from cosmos3_gym.bench.diffusers_reference import reference_forward
from cosmos3_gym.model import Cosmos3Config, Cosmos3Transformer

DOMAIN = 5
FPS = 20.0

# Tiny configurations covering both backbone families. rope_axes_dim sums to head_dim // 2.
SWIGLU = dict(
    hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
    num_hidden_layers=2, intermediate_size=96, vocab_size=97, rope_axes_dim=[4, 2, 2],
    action_gen=True, action_dim=64, rope_theta=5_000_000.0,
)
RELU2_UND_K_NORM = dict(
    SWIGLU, hidden_act="relu2", qk_norm_for_text=False, use_und_k_norm_for_gen=True,
    rope_theta=100_000_000.0,
)
CONFIGS = {"swiglu": SWIGLU, "relu2_und_k_norm": RELU2_UND_K_NORM}


def _randomize(module: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere, norms included, so no parameter hides behind a 0 or a 1."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            scale = 0.2 if "norm" not in name else 0.5
            base = 1.0 if "norm" in name else 0.0
            p.copy_(base + scale * torch.randn(p.shape, generator=gen))


def _pair(kind: str, seed: int = 0) -> tuple[Cosmos3OmniTransformer, Cosmos3Transformer]:
    ref = Cosmos3OmniTransformer(**CONFIGS[kind]).eval()
    _randomize(ref, seed)
    ours = Cosmos3Transformer(Cosmos3Config.from_dict(dict(ref.config))).eval()
    ours.load_state_dict(
        {k: v for k, v in ref.state_dict().items() if k not in ours.UNUSED_CHECKPOINT_KEYS},
        strict=True,
    )
    return ref, ours


def _reference_forward(ref, input_ids, vision, actions, timestep, num_cond_frames=1):
    return reference_forward(
        ref, input_ids, vision, actions, timestep, domain=DOMAIN, fps=FPS,
        num_cond_frames=num_cond_frames,
    )


def _ours_forward(model, input_ids, vision, actions, timestep, num_cond_frames=1,
                  action_timestep=None):
    t = vision.shape[2]
    vision_noisy = (torch.arange(t) >= num_cond_frames)[None]
    return model(
        input_ids[None], torch.ones(1, input_ids.shape[0], dtype=torch.bool), vision, vision_noisy,
        actions[None], torch.ones(1, actions.shape[0], dtype=torch.bool),
        torch.tensor([DOMAIN]), torch.tensor([float(timestep)]), fps=FPS,
        action_timesteps=None if action_timestep is None else torch.tensor([action_timestep]),
    )


def _sample(seed: int, length: int = 7, latent=(3, 4, 6), horizon: int = 8, vocab: int = 97):
    gen = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(0, vocab, (length,), generator=gen)
    vision = torch.randn(1, 48, *latent, generator=gen)
    actions = torch.randn(horizon, 64, generator=gen)
    return input_ids, vision, actions


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize("timestep", [999.0, 604.0, 31.0])
def test_velocities_match_diffusers_reference(kind: str, timestep: float) -> None:
    ref, ours = _pair(kind)
    input_ids, vision, actions = _sample(1)
    with torch.no_grad():
        ref_vis, ref_act = _reference_forward(ref, input_ids, vision, actions, timestep)
        our_vis, our_act = _ours_forward(ours, input_ids, vision, actions, timestep)
    assert our_vis.shape == ref_vis.shape and our_act[0].shape == ref_act.shape
    assert ref_vis.abs().max() > 0.1 and ref_act.abs().max() > 0.1  # not trivially zero
    torch.testing.assert_close(our_vis, ref_vis, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_act[0], ref_act, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", sorted(CONFIGS))
@pytest.mark.parametrize(("video_t", "action_t"), [(1000.0, 31.0), (150.0, 870.0)])
def test_separate_video_and_action_timesteps_match_diffusers(
    kind: str, video_t: float, action_t: float
) -> None:
    """Video and action tokens at their own noise levels (training draws them independently)
    equal diffusers' forward given per-modality timesteps; swapping the two is detected."""
    ref, ours = _pair(kind)
    input_ids, vision, actions = _sample(4)
    with torch.no_grad():
        ref_vis, ref_act = reference_forward(
            ref, input_ids, vision, actions, video_t, domain=DOMAIN, fps=FPS,
            action_timestep=action_t,
        )
        our_vis, our_act = _ours_forward(ours, input_ids, vision, actions, video_t,
                                         action_timestep=action_t)
        swapped_vis, swapped_act = _ours_forward(ours, input_ids, vision, actions, action_t,
                                                 action_timestep=video_t)
    torch.testing.assert_close(our_vis, ref_vis, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_act[0], ref_act, rtol=1e-5, atol=1e-5)
    assert (swapped_vis - ref_vis).abs().max() > 1e-3
    assert (swapped_act[0] - ref_act).abs().max() > 1e-3


def test_an_action_timestep_equal_to_the_shared_one_changes_no_bit() -> None:
    """The shared-timestep forward (what the sampler runs) is the same computation whether the
    action tokens' timestep is left out or given equal."""
    _, model = _pair("swiglu")
    ids, mask, vis, vis_noisy, act, act_noisy, dom, ts = _batch_inputs([5, 9, 7])
    with torch.no_grad():
        shared = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, ts, fps=FPS)
        given = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, ts, fps=FPS,
                      action_timesteps=ts.clone())
        other = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, ts, fps=FPS,
                      action_timesteps=ts * 0.5)
    assert torch.equal(shared[0], given[0]) and torch.equal(shared[1], given[1])
    assert (other[1] - shared[1]).abs().max() > 1e-4


def test_odd_latent_grid_is_padded_like_diffusers() -> None:
    ref, ours = _pair("swiglu", seed=3)
    input_ids, vision, actions = _sample(2, latent=(2, 3, 5), horizon=4)
    with torch.no_grad():
        ref_vis, ref_act = _reference_forward(ref, input_ids, vision, actions, 500.0)
        our_vis, our_act = _ours_forward(ours, input_ids, vision, actions, 500.0)
    torch.testing.assert_close(our_vis, ref_vis, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_act[0], ref_act, rtol=1e-5, atol=1e-5)


def test_breaking_the_rope_breaks_parity(monkeypatch: pytest.MonkeyPatch) -> None:
    """The parity test can fail: flipping the RoPE rotation's sign is detected."""
    from cosmos3_gym.model import transformer as transformer_module

    ref, ours = _pair("swiglu")
    input_ids, vision, actions = _sample(1)

    original = transformer_module.apply_rope
    monkeypatch.setattr(
        transformer_module, "apply_rope", lambda x, cos, sin: original(x, cos, -sin)
    )
    with torch.no_grad():
        ref_vis, _ = _reference_forward(ref, input_ids, vision, actions, 500.0)
        our_vis, _ = _ours_forward(ours, input_ids, vision, actions, 500.0)
    assert (our_vis - ref_vis).abs().max() > 1e-3


def _batch_inputs(lengths: list[int], seed: int = 0, horizon: int = 8):
    gen = torch.Generator().manual_seed(seed)
    b, max_len = len(lengths), max(lengths)
    input_ids = torch.zeros(b, max_len, dtype=torch.long)
    text_mask = torch.zeros(b, max_len, dtype=torch.bool)
    for i, n in enumerate(lengths):
        input_ids[i, :n] = torch.randint(1, 97, (n,), generator=gen)
        text_mask[i, :n] = True
    vision = torch.randn(b, 48, 3, 4, 4, generator=gen)
    actions = torch.randn(b, horizon, 64, generator=gen)
    vision_noisy = (torch.arange(3) >= 1)[None].expand(b, -1)
    action_noisy = torch.ones(b, horizon, dtype=torch.bool)
    domains = torch.tensor([5, 8, 5, 0][:b])
    timesteps = torch.tensor([900.0, 400.0, 700.0, 100.0][:b])
    return input_ids, text_mask, vision, vision_noisy, actions, action_noisy, domains, timesteps


@pytest.mark.parametrize("kind", sorted(CONFIGS))
def test_mixed_prompt_lengths_share_a_batch(kind: str) -> None:
    """Item i of a padded batch of mixed-length prompts equals item i run alone."""
    _, model = _pair(kind)
    lengths = [5, 11, 8, 3]
    ids, mask, vis, vis_noisy, act, act_noisy, dom, ts = _batch_inputs(lengths)
    with torch.no_grad():
        batch_vis, batch_act = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, ts, fps=FPS)
        for i, n in enumerate(lengths):
            sl = slice(i, i + 1)
            alone_vis, alone_act = model(
                ids[sl, :n], mask[sl, :n], vis[sl], vis_noisy[sl], act[sl], act_noisy[sl],
                dom[sl], ts[sl], fps=FPS,
            )
            # Same math; only the attention kernels' reduction order may differ.
            torch.testing.assert_close(batch_vis[sl], alone_vis, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(batch_act[sl], alone_act, rtol=1e-5, atol=1e-5)


def test_unmasked_padding_would_change_the_output() -> None:
    """The key mask matters: without it, padded text keys leak into GEN attention."""
    _, model = _pair("swiglu")
    ids, mask, vis, vis_noisy, act, act_noisy, dom, ts = _batch_inputs([4, 12])
    with torch.no_grad():
        masked = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, ts, fps=FPS)[1]
        text = model.encode_text(ids, mask)
        layout = model.gen_layout(text, latent_shape=(3, 4, 4), num_actions=8, fps=FPS)
        layout.key_mask = None
        leaky = model.forward_gen(text, layout, vis, vis_noisy, act, act_noisy, dom, ts)[1]
    assert (masked[0] - leaky[0]).abs().max() > 1e-3
    torch.testing.assert_close(masked[1], leaky[1])  # the longest prompt has no padding


def test_cached_text_forward_equals_uncached_forward() -> None:
    _, model = _pair("relu2_und_k_norm")
    ids, mask, vis, vis_noisy, act, act_noisy, dom, ts = _batch_inputs([6, 9, 9])
    with torch.no_grad():
        text = model.encode_text(ids, mask)
        layout = model.gen_layout(text, latent_shape=(3, 4, 4), num_actions=8, fps=FPS)
        for step_ts in (ts, ts * 0.5, ts * 0.1):
            cached = model.forward_gen(text, layout, vis, vis_noisy, act, act_noisy, dom, step_ts)
            uncached = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, step_ts, fps=FPS)
            assert torch.equal(cached[0], uncached[0]) and torch.equal(cached[1], uncached[1])


def test_clean_tokens_get_zero_velocity_and_no_time_embedding() -> None:
    _, model = _pair("swiglu")
    ids, mask, vis, vis_noisy, act, _, dom, ts = _batch_inputs([5, 5])
    act_noisy = torch.zeros(2, 8, dtype=torch.bool)  # forward dynamics: actions are clean
    with torch.no_grad():
        v_vis, v_act = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, ts, fps=FPS)
        other_t = model(ids, mask, vis, vis_noisy, act, act_noisy, dom, ts * 0, fps=FPS)
    assert torch.count_nonzero(v_act) == 0
    assert torch.count_nonzero(v_vis[:, :, 0]) == 0
    assert (v_vis[:, :, 1:] - other_t[0][:, :, 1:]).abs().max() > 1e-4


def test_loads_a_sharded_safetensors_folder_strictly(tmp_path) -> None:
    ref, ours = _pair("swiglu", seed=7)
    state = ref.state_dict()
    keys = sorted(state)
    shards = {
        "model-00001-of-00002.safetensors": keys[::2],
        "model-00002-of-00002.safetensors": keys[1::2],
    }
    for name, shard_keys in shards.items():
        save_file({k: state[k].contiguous() for k in shard_keys}, str(tmp_path / name))
    index = {"weight_map": {k: name for name, ks in shards.items() for k in ks}}
    (tmp_path / "diffusion_pytorch_model.safetensors.index.json").write_text(json.dumps(index))
    (tmp_path / "config.json").write_text(json.dumps(dict(ref.config)))
    loaded = Cosmos3Transformer.from_pretrained(tmp_path, dtype=torch.float32)
    for k, v in ours.state_dict().items():
        assert torch.equal(loaded.state_dict()[k], v), k
    assert loaded.time_embedder.linear_1.weight.dtype == torch.float32
    bf16 = Cosmos3Transformer.from_pretrained(tmp_path, dtype=torch.bfloat16)
    assert bf16.proj_in.weight.dtype == torch.bfloat16
    assert bf16.time_embedder.linear_1.weight.dtype == torch.float32  # kept in fp32


def test_checkpoint_with_wrong_keys_is_refused_with_the_keys_named(tmp_path) -> None:
    ref, _ = _pair("swiglu")
    state = dict(ref.state_dict())
    state.pop("layers.1.mlp_moe_gen.up_proj.weight")
    state["layers.0.self_attn.qkv_fused.weight"] = torch.zeros(3)
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp_path / "w.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(dict(ref.config)))
    with pytest.raises(ValueError, match=r"missing keys \['layers.1.mlp_moe_gen.up_proj.weight'\]"
                       r".*unexpected keys \['layers.0.self_attn.qkv_fused.weight'\]"):
        Cosmos3Transformer.from_pretrained(tmp_path)


def test_pickled_only_checkpoint_is_refused(tmp_path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(SWIGLU))
    (tmp_path / "diffusion_pytorch_model.bin").write_bytes(b"not loaded")
    with pytest.raises(ValueError, match="only pickled weights"):
        Cosmos3Transformer.from_pretrained(tmp_path)
