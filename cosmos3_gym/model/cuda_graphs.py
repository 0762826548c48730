"""CUDA graphs of the GEN forward: launch a whole denoising step's kernels with one call.

At small batch a GEN step is bound by the host launching ~50 kernels per layer, not by the GPU.
A CUDA graph records the step's kernels once and replays them with one launch. A graph works on
fixed memory, so each captured shape owns static input buffers: per request the text K/V prefix,
RoPE tables, key mask, masks and domains are copied in once; per step the sampler state and the
timestep. The outputs are cloned out at once, because the next replay overwrites them (the
sampler keeps earlier steps' outputs).

Graphs are keyed by everything that fixes the kernels' shapes and arguments (batch, text and
GEN lengths, latent grid, dtypes, masked or not). ``GenGraphs`` keeps the ``max_graphs`` most
recently used; all share one memory pool, which is safe because replays never overlap and
outputs are cloned before the next one. A shape whose capture fails runs eagerly from then on.

Only the model's forward is captured: the sampler update (a handful of small elementwise ops on
the latent and action state) stays eager, since its coefficients change with the step index.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from cosmos3_gym.model.kernels import TORCH_OPS, GenOps
from cosmos3_gym.model.transformer import Cosmos3Transformer, GenLayout, TextKVCache

logger = logging.getLogger(__name__)

GenStep = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


class Graph:
    """What a capture returns: ``replay()`` reruns the recorded work on the static buffers."""

    def replay(self) -> None:
        raise NotImplementedError


def cuda_capture(fn: Callable[[], Any], pool: Any) -> tuple[Graph, Any]:
    """Record ``fn`` into a ``torch.cuda.CUDAGraph`` (after one warm-up run on a side stream,
    which initialises cuBLAS workspaces and compiles any Triton kernel) and return the graph
    and the outputs it writes to."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = fn()
    return graph, outputs


@dataclass
class _Static:
    """One captured shape: its input buffers, the layout and text views over them, and (once
    captured) the graph and the outputs it writes."""

    text: TextKVCache
    layout: GenLayout
    vision: torch.Tensor
    vision_noisy: torch.Tensor
    actions: torch.Tensor
    action_noisy: torch.Tensor
    domain_ids: torch.Tensor
    timesteps: torch.Tensor
    graph: Graph | None = None
    outputs: tuple[torch.Tensor, torch.Tensor] | None = None


class GenGraphs:
    """``Cosmos3Transformer.forward_gen`` as CUDA graphs, one per shape, least recently used
    dropped beyond ``max_graphs``.

    ``bind(text, layout, ...)`` sets up one request and returns ``step(vision, actions,
    timesteps) -> (v_vision, v_action)`` with the same results as ``forward_gen`` with those
    arguments (tested bit for bit against the eager forward on the GPU). ``ops`` is what the
    captured forward runs its elementwise work with (eager or fused kernels). ``capture`` replaces
    the CUDA recorder (the tests run the buffer logic on CPU with a recorder that re-runs the
    function).
    """

    def __init__(
        self,
        model: Cosmos3Transformer,
        max_graphs: int = 8,
        ops: GenOps = TORCH_OPS,
        capture: Callable[[Callable[[], Any], Any], tuple[Graph, Any]] = cuda_capture,
    ) -> None:
        if max_graphs < 1:
            raise ValueError(f"max_graphs must be >= 1, got {max_graphs}")
        self.model, self.max_graphs, self.ops, self.capture = model, max_graphs, ops, capture
        self.graphs: OrderedDict[tuple, _Static] = OrderedDict()
        self.uncapturable: set[tuple] = set()
        self.pool: Any = None  # one memory pool for all graphs, made at the first capture
        self.captures = 0  # how many shapes were recorded (a cache miss each)
        self.hits = 0  # requests that replayed a graph captured for an earlier one

    def bind(
        self,
        text: TextKVCache,
        layout: GenLayout,
        vision: torch.Tensor,
        vision_noisy: torch.Tensor,
        actions: torch.Tensor,
        action_noisy: torch.Tensor,
        domain_ids: torch.Tensor,
    ) -> GenStep | None:
        """Prepare the graph for this request's shapes; ``None`` if it cannot be captured
        (the caller then runs ``forward_gen`` eagerly). ``vision``/``actions`` give the
        shapes and dtypes of the per-step inputs."""
        key = self._key(text, layout, vision, actions)
        if key in self.uncapturable:
            return None
        static = self.graphs.get(key)
        if static is not None:
            self.graphs.move_to_end(key)
            self.hits += 1
        else:
            static = self._allocate(text, layout, vision, actions)
        self._fill_request(static, text, layout, vision_noisy, action_noisy, domain_ids)
        if key not in self.graphs:
            try:
                static.vision.copy_(vision)
                static.actions.copy_(actions)
                if self.pool is None and self.capture is cuda_capture:
                    self.pool = torch.cuda.graph_pool_handle()
                graph, outputs = self.capture(lambda: self._forward(static), self.pool)
            except Exception as error:  # noqa: BLE001 - any capture failure falls back
                logger.warning("CUDA graph capture failed for shape %s (%s); running this "
                               "shape eagerly", key, error)
                self.uncapturable.add(key)
                return None
            static.graph, static.outputs = graph, outputs
            self.graphs[key] = static
            self.captures += 1
            while len(self.graphs) > self.max_graphs:
                self.graphs.popitem(last=False)

        def step(
            vision: torch.Tensor, actions: torch.Tensor, timesteps: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            static.vision.copy_(vision)
            static.actions.copy_(actions)
            static.timesteps.copy_(timesteps)
            static.graph.replay()
            return static.outputs[0].clone(), static.outputs[1].clone()

        return step

    # ------------------------------------------------------------------ internals

    def _forward(self, static: _Static) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.forward_gen(
            static.text, static.layout, static.vision, static.vision_noisy, static.actions,
            static.action_noisy, static.domain_ids, static.timesteps, ops=self.ops,
        )

    @staticmethod
    def _key(text: TextKVCache, layout: GenLayout, vision: torch.Tensor,
             actions: torch.Tensor) -> tuple:
        k = text.keys[0]
        return (
            tuple(k.shape), k.dtype, str(k.device), layout.grid, layout.latent_hw,
            layout.num_actions, layout.key_mask is not None, tuple(vision.shape), vision.dtype,
            tuple(actions.shape), actions.dtype,
        )

    def _allocate(self, text: TextKVCache, layout: GenLayout, vision: torch.Tensor,
                  actions: torch.Tensor) -> _Static:
        b, hkv, length, d = text.keys[0].shape
        n = layout.grid[0] * layout.grid[1] * layout.grid[2] + layout.num_actions
        buffers = [
            (k.new_empty(b, hkv, length + n, d), v.new_empty(b, hkv, length + n, d))
            for k, v in zip(text.keys, text.values, strict=True)
        ]
        static_text = TextKVCache(
            [kb[:, :, :length] for kb, _ in buffers], [vb[:, :, :length] for _, vb in buffers],
            text.lengths.clone(), text.text_mask.clone(),
        )
        key_mask = None if layout.key_mask is None else torch.empty_like(layout.key_mask)
        static_layout = replace(
            layout, cos=torch.empty_like(layout.cos), sin=torch.empty_like(layout.sin),
            key_mask=key_mask, kv_buffers=buffers,
        )
        t, h = vision.shape[2], actions.shape[1]
        return _Static(
            text=static_text, layout=static_layout,
            vision=torch.empty_like(vision),
            vision_noisy=torch.empty(b, t, dtype=torch.bool, device=vision.device),
            actions=torch.empty_like(actions),
            action_noisy=torch.empty(b, h, dtype=torch.bool, device=vision.device),
            domain_ids=torch.empty(b, dtype=torch.long, device=vision.device),
            timesteps=torch.empty(b, dtype=torch.float32, device=vision.device),
        )

    @staticmethod
    def _fill_request(static: _Static, text: TextKVCache, layout: GenLayout,
                      vision_noisy: torch.Tensor, action_noisy: torch.Tensor,
                      domain_ids: torch.Tensor) -> None:
        """Copy what stays fixed over one request's steps into the static buffers."""
        for dst, src in zip(static.text.keys + static.text.values, text.keys + text.values,
                            strict=True):
            dst.copy_(src)
        static.text.lengths.copy_(text.lengths)
        static.text.text_mask.copy_(text.text_mask)
        static.layout.cos.copy_(layout.cos)
        static.layout.sin.copy_(layout.sin)
        if layout.key_mask is not None:
            static.layout.key_mask.copy_(layout.key_mask)
        static.vision_noisy.copy_(vision_noisy)
        static.action_noisy.copy_(action_noisy)
        static.domain_ids.copy_(domain_ids)
