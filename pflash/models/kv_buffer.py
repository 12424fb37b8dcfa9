"""A full-attention KV cache that appends in place.

Why: transformers' `DynamicLayer` appends by `torch.cat`, which copies the whole layer's keys
and values for every token decoded. On a CPU that copy, not attention, was most of a decode
step at long context: for the benchmark's 840M target at 14K cached tokens each step moved
~4 GB (24 layers' keys and values), several times what attention itself reads. The same copy
ran per prefill chunk, so a long prefill paid it quadratically. `BufferLayer` keeps the keys
and values in a buffer with headroom (`headroom`) and writes new tokens into it; the cache
hands attention a view of the filled part, so a decode step copies one token, and the buffer
is copied only when it grows (amortized: a few tokens' worth per token appended).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

GROWTH = 8  # the buffer grows by at least 1/GROWTH of what it holds: memory +12.5% at most
MIN_HEADROOM = 256  # tokens: a decode step of a short prompt does not reallocate every step


def headroom(needed: int) -> int:
    """The capacity to allocate when `needed` tokens do not fit: `needed` plus an eighth of
    it (at least `MIN_HEADROOM`), so copies on growth sum to a constant per token."""
    return needed + max(MIN_HEADROOM, needed // GROWTH)


class BufferLayer(DynamicLayer):
    """`DynamicLayer` with in-place appends. `keys` / `values` are views of the filled part
    of the buffers, so everything that reads or crops them (attention, snapshots, `crop`)
    works as with the plain layer; a view replaced from outside (crop, batch ops) is adopted
    at the next update."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._key_buffer: torch.Tensor | None = None
        self._value_buffer: torch.Tensor | None = None

    def _filled(self) -> int:
        """Tokens held: the length of the current view (0 before the first update)."""
        keys = self.keys
        return 0 if keys is None or keys.dim() < 2 else int(keys.shape[-2])

    def _is_view_of_buffer(self) -> bool:
        buffer = self._key_buffer
        return buffer is not None and self.keys.data_ptr() == buffer.data_ptr()

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, c = self._filled(), key_states.shape[-2]
        own = self._is_view_of_buffer()
        if not own or n + c > self._key_buffer.shape[-2]:
            self._key_buffer = _grown(self.keys if n else None, key_states, headroom(n + c))
            self._value_buffer = _grown(self.values if n else None, value_states, headroom(n + c))
        self._key_buffer[..., n : n + c, :].copy_(key_states)
        self._value_buffer[..., n : n + c, :].copy_(value_states)
        self.keys = self._key_buffer[..., : n + c, :]
        self.values = self._value_buffer[..., : n + c, :]
        return self.keys, self.values

    def reset(self) -> None:
        self._key_buffer = self._value_buffer = None
        super().reset()


def _grown(held: torch.Tensor | None, like: torch.Tensor, capacity: int) -> torch.Tensor:
    """A buffer of `capacity` tokens shaped as `like`, holding `held` at its start."""
    buffer = like.new_empty((*like.shape[:-2], capacity, like.shape[-1]))
    if held is not None:
        buffer[..., : held.shape[-2], :].copy_(held)
    return buffer


def buffered_cache(model: Any, layers: Any = None) -> DynamicCache:
    """A `DynamicCache` for `model` whose plain full-attention layers append in place
    (`BufferLayer`); other layer kinds (sliding windows, linear attention) stay as
    transformers builds them. `layers`: (keys, values) per layer to start from (a prefix
    snapshot), copied into the buffers, never written."""
    cache = DynamicCache(config=model.config)
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            cache.layers[i] = BufferLayer()
    if layers is not None:
        for layer, (keys, values) in zip(cache.layers, layers, strict=True):
            layer.update(keys, values)
    return cache
