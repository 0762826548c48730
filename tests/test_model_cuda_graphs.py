"""The CUDA-graph step's buffer logic, checked on CPU against the eager forward.

A graph replays recorded kernels on fixed memory, so what can go wrong is the plumbing: an
input not copied into its static buffer, a stale text prefix, an output overwritten by the next
replay, the wrong graph for a shape. Here a recorder that re-runs the function on the static
buffers stands in for ``torch.cuda.CUDAGraph`` (same buffers, same copies); tests/test_gpu.py
checks real captures against the eager forward on a GPU.
"""

from __future__ import annotations

import logging

import pytest
import torch

from cosmos3_gym.model.cuda_graphs import GenGraphs, Graph
from cosmos3_gym.model.presets import random_transformer


class _Rerun(Graph):
    def __init__(self, fn, outputs):
        self.fn, self.outputs = fn, outputs

    def replay(self) -> None:
        for static, fresh in zip(self.outputs, self.fn(), strict=True):
            static.copy_(fresh)


def rerun_capture(fn, pool):
    outputs = fn()
    return _Rerun(fn, outputs), outputs


@pytest.fixture(scope="module")
def model():
    return random_transformer("tiny", seed=7).fuse_gen_projections()


def _request(model, lengths, seed, latent=(3, 4, 6)):
    gen = torch.Generator().manual_seed(seed)
    b = len(lengths)
    ids = torch.zeros(b, max(lengths), dtype=torch.long)
    mask = torch.arange(max(lengths))[None] < torch.tensor(lengths)[:, None]
    ids[mask] = torch.randint(1, 1000, (sum(lengths),), generator=gen)
    text = model.encode_text(ids, mask)
    return dict(
        text=text,
        vision_noisy=(torch.arange(latent[0]) > 0)[None].expand(b, latent[0]),
        action_noisy=torch.ones(b, 8, dtype=torch.bool),
        domain_ids=torch.randint(0, 32, (b,), generator=gen),
        steps=[(torch.randn(b, 48, *latent, generator=gen), torch.randn(b, 8, 64, generator=gen),
                torch.full((b,), 900.0 - 100 * i)) for i in range(3)],
    )


def _layout(model, text, preallocate_kv, latent=None):
    latent = latent or (3, 4, 6)
    return model.gen_layout(text, latent_shape=latent, num_actions=8, fps=20.0,
                            preallocate_kv=preallocate_kv)


def _latent(req):
    return tuple(req["steps"][0][0].shape[2:])


def _eager(model, req):
    layout = _layout(model, req["text"], preallocate_kv=True, latent=_latent(req))
    return [model.forward_gen(req["text"], layout, v, req["vision_noisy"], a,
                              req["action_noisy"], req["domain_ids"], t)
            for v, a, t in req["steps"]]


def _graphed(graphs, model, req):
    v0, a0, _ = req["steps"][0]
    layout = _layout(model, req["text"], preallocate_kv=False, latent=_latent(req))
    step = graphs.bind(req["text"], layout, v0, req["vision_noisy"], a0, req["action_noisy"],
                       req["domain_ids"])
    assert step is not None
    return [step(v, a, t) for v, a, t in req["steps"]]


@torch.no_grad()
def test_graph_steps_equal_the_eager_forward_across_requests(model) -> None:
    graphs = GenGraphs(model, capture=rerun_capture)
    first = _request(model, [9, 4], seed=0)        # padded: key mask
    second = _request(model, [3, 9], seed=1)       # same padded shape: the graph is reused
    third = _request(model, [5, 5, 5], seed=2)     # another shape: a second graph
    for req in (first, second, third, first):
        outs = _graphed(graphs, model, req)
        for (g_vis, g_act), (e_vis, e_act) in zip(outs, _eager(model, req), strict=True):
            assert torch.equal(g_vis, e_vis) and torch.equal(g_act, e_act)
    assert graphs.captures == 2 and len(graphs.graphs) == 2


@torch.no_grad()
def test_one_capture_per_batch_prompt_length_and_latent_grid(model) -> None:
    """The graph key holds everything that fixes a step's shapes: a request replays an
    earlier graph only where batch, (padded) prompt length and latent grid all match, and
    every replay equals the eager forward."""
    graphs = GenGraphs(model, capture=rerun_capture)
    requests = [  # (lengths, latent grid, expected captures, expected hits) after each
        ([5], (3, 4, 6), 1, 0),
        ([5], (3, 4, 6), 1, 1),     # other tokens, same shapes: a hit
        ([7], (3, 4, 6), 2, 1),     # batch 1 again, another prompt length: a capture
        ([7], (3, 4, 8), 3, 1),     # same prompt length, another latent grid
        ([5, 5], (3, 4, 6), 4, 1),  # batch 2
        ([5, 3], (3, 4, 6), 5, 1),  # batch 2, same padded length, but a key mask now
        ([7], (3, 4, 6), 5, 2),
    ]
    keys = set()
    for seed, (lengths, latent, captures, hits) in enumerate(requests):
        req = _request(model, lengths, seed=10 + seed, latent=latent)
        v0, a0, _ = req["steps"][0]
        layout = _layout(model, req["text"], preallocate_kv=False, latent=latent)
        keys.add(GenGraphs._key(req["text"], layout, v0, a0))
        assert len(keys) == captures, (lengths, latent)  # a new shape is a new key, and only it
        outs = _graphed(graphs, model, req)
        for (g_vis, g_act), (e_vis, e_act) in zip(outs, _eager(model, req), strict=True):
            assert torch.equal(g_vis, e_vis) and torch.equal(g_act, e_act)
        assert (graphs.captures, graphs.hits) == (captures, hits), (lengths, latent)


@torch.no_grad()
def test_outputs_survive_the_next_replay(model) -> None:
    """The sampler keeps earlier steps' outputs: a replay must not overwrite them."""
    graphs = GenGraphs(model, capture=rerun_capture)
    req = _request(model, [6], seed=3)
    outs = _graphed(graphs, model, req)
    assert not torch.equal(outs[0][1], outs[1][1])
    assert torch.equal(outs[0][1], _eager(model, req)[0][1])


@torch.no_grad()
def test_least_recently_used_graph_is_dropped(model) -> None:
    graphs = GenGraphs(model, max_graphs=1, capture=rerun_capture)
    a, b = _request(model, [4], seed=4), _request(model, [7], seed=5)
    for req in (a, b, a):
        _graphed(graphs, model, req)
    assert graphs.captures == 3 and len(graphs.graphs) == 1
    with pytest.raises(ValueError, match="max_graphs must be >= 1, got 0"):
        GenGraphs(model, max_graphs=0)


@torch.no_grad()
def test_a_shape_that_cannot_be_captured_runs_eagerly(model, caplog) -> None:
    def failing_capture(fn, pool):
        raise RuntimeError("operation not permitted when stream is capturing")

    graphs = GenGraphs(model, capture=failing_capture)
    req = _request(model, [5], seed=6)
    v0, a0, _ = req["steps"][0]
    layout = _layout(model, req["text"], preallocate_kv=False)
    with caplog.at_level(logging.WARNING):
        bound = graphs.bind(req["text"], layout, v0, req["vision_noisy"], a0,
                            req["action_noisy"], req["domain_ids"])
    assert bound is None and "running this shape eagerly" in caplog.text
    assert graphs.bind(req["text"], layout, v0, req["vision_noisy"], a0, req["action_noisy"],
                       req["domain_ids"]) is None  # remembered: no second attempt
    assert graphs.captures == 0


@pytest.mark.parametrize("guidance_scale", [1.0, 3.0])
def test_denoise_stage_with_graphs_gives_the_eager_actions(guidance_scale) -> None:
    """The denoising stage replaying its GEN forward through GenGraphs (mixed prompt lengths,
    micro-batches, CFG's doubled batch) gives the eager stage's actions bit for bit."""
    import tempfile

    import numpy as np

    from cosmos3_gym import Cosmos3ActionPipeline
    from cosmos3_gym.tiny import write_tiny_checkpoint

    with tempfile.TemporaryDirectory() as folder:
        path = write_tiny_checkpoint(folder)
        eager = Cosmos3ActionPipeline.from_pretrained(path, max_batch_size=2)
        graphed = Cosmos3ActionPipeline.from_pretrained(path, max_batch_size=2)
    graphed.denoise.graphs = GenGraphs(graphed.transformer, capture=rerun_capture)
    images = np.random.default_rng(1).integers(0, 256, (3, 64, 64, 3), dtype=np.uint8)
    prompts = ["pick up the bowl", "open the top drawer and put the bowl inside", "push"]
    kwargs = dict(seed=[4, 5, 6], num_inference_steps=3, guidance_scale=guidance_scale,
                  progress=False)
    expected = eager(images, prompts, **kwargs).actions
    for _ in range(2):  # the second call reuses the captured shapes
        assert np.array_equal(graphed(images, prompts, **kwargs).actions, expected)
    assert graphed.denoise.graphs.captures == 2  # a batch of 2 and a batch of 1


def test_cuda_graphs_need_a_cuda_model() -> None:
    from cosmos3_gym.pipeline import InferenceOptions
    from cosmos3_gym.pipeline.stages import DenoiseStage

    with pytest.raises(ValueError, match="cuda_graphs needs the model on a CUDA device; found cpu"):
        DenoiseStage(random_transformer("tiny"), None, InferenceOptions(cuda_graphs=True))
    with pytest.raises(ValueError, match="cuda_graphs needs text_cache=True"):
        InferenceOptions(cuda_graphs=True, text_cache=False)
    with pytest.raises(ValueError, match="max_cuda_graphs must be an int >= 1; found 0"):
        InferenceOptions(max_cuda_graphs=0)
