"""What a call does when the device fails it: out of memory splits the batch, a fallible option
(CUDA graphs, the fused kernels) that raises is switched off. Each retry loses nothing.

The failures are injected on CPU (``checkpoint``: tests/conftest.py's tiny checkpoint);
tests/test_gpu.py runs the same paths on a GPU."""

from __future__ import annotations

import logging
from dataclasses import replace

import numpy as np
import pytest
import torch

from cosmos3_gym import Cosmos3ActionPipeline
from cosmos3_gym.model.cuda_graphs import GenGraphs, Graph
from cosmos3_gym.pipeline import InferenceOptions, stages

PROMPTS = ["pick up the red bowl", "open the top drawer and put the bowl inside", "go",
           "push the plate", "close the drawer"]
CALL = dict(num_inference_steps=2, progress=False)


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(2).integers(0, 256, size=(5, 64, 128, 3), dtype=np.uint8)


@pytest.fixture(scope="module")
def expected(checkpoint, images):
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    return pipe(images, PROMPTS, seed=list(range(5)), **CALL).actions


class _OutOfMemoryAbove:
    """The denoising stage, failing like CUDA when a micro-batch holds more than ``fits``."""

    def __init__(self, stage, fits: int) -> None:
        self.stage, self.fits, self.sizes = stage, fits, []
        self.name = stage.name

    def __call__(self, batch, params):
        self.sizes.append(batch.size)
        if batch.size > self.fits:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return self.stage(batch, params)


def test_out_of_memory_splits_the_batch_and_loses_nothing(
    checkpoint, images, expected, caplog
) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    failing = _OutOfMemoryAbove(pipe.denoise, fits=2)
    pipe.stages = tuple(failing if s is pipe.denoise else s for s in pipe.stages)
    with caplog.at_level(logging.WARNING):
        out = pipe(images, PROMPTS, seed=list(range(5)), **CALL)
    # 5 fails, then 3 of [3, 2] fails, then [2, 1] and the 2 run: every item, in order.
    assert failing.sizes == [5, 3, 2, 1, 2]
    np.testing.assert_allclose(out.actions, expected, rtol=1e-5, atol=1e-5)
    assert pipe.memory_batch_limit == 2
    warnings = [r.getMessage() for r in caplog.records if "out of device memory" in r.getMessage()]
    assert warnings == ["out of device memory with micro-batches of 5, 3 items; ran them as "
                        "micro-batches of at most 2 (later calls too), with the same results"]
    caplog.clear()
    failing.sizes.clear()
    with caplog.at_level(logging.WARNING):
        again = pipe(images, PROMPTS, seed=list(range(5)), **CALL)
    assert failing.sizes == [2, 2, 1] and not caplog.records  # the size that fits, remembered
    np.testing.assert_allclose(again.actions, expected, rtol=1e-5, atol=1e-5)


def test_one_item_that_does_not_fit_raises(checkpoint, images) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    failing = _OutOfMemoryAbove(pipe.denoise, fits=0)
    pipe.stages = tuple(failing if s is pipe.denoise else s for s in pipe.stages)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        pipe(images[:2], PROMPTS[:2], **CALL)
    assert failing.sizes == [2, 1]


def test_fused_kernels_that_cannot_load_are_switched_off_with_one_warning(
    checkpoint, images, expected, monkeypatch, caplog
) -> None:
    class NoTriton:
        def __init__(self) -> None:
            raise ImportError("No module named 'triton'")

    monkeypatch.setattr(stages, "TritonGenOps", NoTriton)
    with caplog.at_level(logging.WARNING):
        pipe = Cosmos3ActionPipeline.from_pretrained(
            checkpoint, options=InferenceOptions(triton_kernels=True)
        )
    assert pipe.options.triton_kernels is False
    assert pipe.disabled_options == {"triton_kernels": "ImportError: No module named 'triton'"}
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert "triton_kernels failed on cpu and is switched off" in caplog.text
    np.testing.assert_array_equal(pipe(images, PROMPTS, seed=list(range(5)), **CALL).actions,
                                  expected)


class _BrokenOps(stages.TORCH_OPS.__class__):
    """Kernels that compile but fail at their first launch."""

    name = "broken"

    def qkv(self, *args, **kwargs):
        raise RuntimeError("triton.compiler.errors.CompilationError: at 12:4")


def test_kernels_that_fail_in_a_call_are_switched_off_and_the_call_rerun(
    checkpoint, images, expected, caplog
) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    pipe.denoise.options = replace(pipe.options, triton_kernels=True)
    pipe.denoise.ops = _BrokenOps()
    with caplog.at_level(logging.WARNING):
        out = pipe(images, PROMPTS, seed=list(range(5)), **CALL)
    np.testing.assert_array_equal(out.actions, expected)
    assert pipe.options.triton_kernels is False and pipe.denoise.ops is stages.TORCH_OPS
    assert list(pipe.disabled_options) == ["triton_kernels"]
    assert caplog.text.count("switched off") == 1


class _ReplayFails(Graph):
    def replay(self) -> None:
        raise RuntimeError("CUDA error: operation failed due to a previous error during capture")


def test_graphs_that_fail_to_replay_are_switched_off_and_the_call_rerun(
    checkpoint, images, expected
) -> None:
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    pipe.denoise.options = replace(pipe.options, cuda_graphs=True)  # as on a GPU
    pipe.denoise.graphs = GenGraphs(pipe.transformer,
                                    capture=lambda fn, pool: (_ReplayFails(), fn()))
    out = pipe(images, PROMPTS, seed=list(range(5)), **CALL)
    np.testing.assert_array_equal(out.actions, expected)
    assert pipe.options.cuda_graphs is False and pipe.denoise.graphs is None
    assert pipe.disabled_options["cuda_graphs"].startswith("RuntimeError: CUDA error")


def test_an_error_of_the_eager_path_is_not_blamed_on_an_option(checkpoint, images) -> None:
    """With no fallible option on, a failure is the caller's to see, unchanged."""
    pipe = Cosmos3ActionPipeline.from_pretrained(checkpoint)
    pipe.denoise.ops = _BrokenOps()  # the options say eager: nothing to switch off
    with pytest.raises(RuntimeError, match="CompilationError"):
        pipe(images[:1], PROMPTS[:1], **CALL)
    assert pipe.disabled_options == {}


def test_auto_options_are_the_fast_path_on_cuda_only() -> None:
    auto = InferenceOptions()
    assert auto.cuda_graphs is None and auto.triton_kernels is None and not auto.resolved
    on_gpu, on_cpu = auto.resolve("cuda"), auto.resolve("cpu")
    assert (on_gpu.cuda_graphs, on_gpu.triton_kernels) == (True, True)
    assert (on_cpu.cuda_graphs, on_cpu.triton_kernels) == (False, False)
    # A switch set by hand stays as set; an auto one that lacks what it needs stays off.
    assert InferenceOptions(cuda_graphs=False).resolve("cuda").cuda_graphs is False
    assert InferenceOptions(text_cache=False).resolve("cuda").cuda_graphs is False
    assert InferenceOptions(fuse_projections=False).resolve("cuda").triton_kernels is False
