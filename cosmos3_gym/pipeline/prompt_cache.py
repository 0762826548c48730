"""Text keys/values kept across calls: an episode pays for its prompt once.

In an evaluation or a rollout an env's prompt is the same for its whole episode, and the text
(UND) pathway's keys/values depend on the prompt's tokens alone. :class:`PromptCache` keeps them
per distinct token sequence, least recently used first out beyond a byte budget, and builds each
call's :class:`~cosmos3_gym.model.TextKVCache` from them: rows it has seen are copied in, rows it
has not are encoded (each alone, so that an entry depends on its own tokens only, never on the
batch that first asked for it) and kept.

Each entry is one tensor ``[layers, 2, Hkv, len, D]`` (keys and values of every layer of one
prompt, unpadded), so a call's text cache is assembled with one copy per row into one buffer
``[layers, 2, B, Hkv, L, D]`` whose per-layer slices are the ``[B, Hkv, L, D]`` keys/values the
GEN pathway reads. Positions past a row's prompt are zeros: they are padding, which the GEN
attention masks, so what they hold never reaches an output (an all-equal-length batch has none).

The entries are the model's keys/values for the weights that computed them. Any in-place change
of a text-pathway parameter (an optimiser step, ``load_state_dict``) bumps that tensor's version
counter, and a replaced parameter has a new identity: either empties the cache before the next
lookup, so fine-tuning never reads stale keys.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

import torch

from cosmos3_gym.model import Cosmos3Transformer, TextKVCache

Key = tuple[int, ...]


class PromptCache:
    """Per-token-sequence text K/V of ``model``, at most ``max_bytes`` of them.

    ``encode(input_ids, text_mask)`` returns what ``model.encode_text(input_ids, text_mask)``
    returns for the real tokens of every row. ``hits`` / ``misses`` count rows (a prompt seen
    twice in one call is encoded once: one miss, one hit).
    """

    def __init__(self, model: Cosmos3Transformer, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1; found {max_bytes}")
        self.model, self.max_bytes = model, max_bytes
        self.entries: OrderedDict[Key, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = 0
        self._weights: tuple[tuple[int, int], ...] | None = None

    def __len__(self) -> int:
        return len(self.entries)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def encode(
        self, input_ids: torch.Tensor, text_mask: torch.Tensor,
        encode_text: Callable[[torch.Tensor, torch.Tensor], TextKVCache] | None = None,
    ) -> TextKVCache:
        """The text cache of right-padded prompts ``[B, L]`` (host tensors: the lookup reads
        them without waiting for the device), on the model's device, from stored entries where
        there are some (``encode_text`` defaults to the model's, for the rows that are new)."""
        self._check_weights()
        text_mask = text_mask.to(torch.bool)
        lengths = text_mask.sum(1)
        keys = [tuple(row[:n].tolist()) for row, n in zip(input_ids.cpu(), lengths.tolist(),
                                                          strict=True)]
        new = list(dict.fromkeys(k for k in keys if k not in self.entries))
        self.misses += len(new)
        self.hits += len(keys) - len(new)
        stored = {k: self.entries[k] for k in keys if k in self.entries}
        if new:
            stored.update(self._encode_new(new, encode_text or self.model.encode_text))
        for key in keys:  # most recently used last, in the call's order
            if key in self.entries:
                self.entries.move_to_end(key)

        first = stored[keys[0]]  # [layers, 2, Hkv, len, D]
        layers, _, hkv, _, d = first.shape
        buffer = first.new_zeros(layers, 2, len(keys), hkv, text_mask.shape[1], d)
        for row, key in enumerate(keys):
            buffer[:, :, row, :, : len(key)] = stored[key]
        device = buffer.device
        return TextKVCache([buffer[i, 0] for i in range(layers)],
                           [buffer[i, 1] for i in range(layers)],
                           lengths.to(device), text_mask.to(device))

    def _encode_new(
        self, new: list[Key], encode_text: Callable[[torch.Tensor, torch.Tensor], TextKVCache]
    ) -> dict[Key, torch.Tensor]:
        """Each new prompt through the UND pathway alone, unpadded, and kept (within the
        budget): an entry is a function of its tokens (and the weights) only, never of the
        batch that first asked for it, so what a call gets does not depend on earlier calls."""
        device = self.model.device
        out = {}
        for key in new:
            ids = torch.tensor([key], dtype=torch.long, device=device)  # [1, len]
            text = encode_text(ids, torch.ones_like(ids, dtype=torch.bool))
            entry = torch.stack([torch.stack([k[0], v[0]])
                                 for k, v in zip(text.keys, text.values, strict=True)])
            out[key] = entry  # [layers, 2, Hkv, len, D]
            self._store(key, entry)
        return out

    def _store(self, key: Key, entry: torch.Tensor) -> None:
        size = entry.numel() * entry.element_size()
        if size > self.max_bytes:
            return  # larger than the whole budget: used for this call only
        self.entries[key] = entry
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.numel() * dropped.element_size()

    def _check_weights(self) -> None:
        """Empty the cache when a text-pathway parameter changed since the entries were made."""
        weights = tuple((id(p), p._version) for p in self.model.text_parameters())
        if weights != self._weights:
            self.clear()
            self._weights = weights
