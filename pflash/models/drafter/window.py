"""Windowed drafter attention for long prompts: the layers below the scoring layer attend to the
first `sink` tokens and the last `window` tokens only, so a prompt's drafter pass costs time
linear in its length and a KV cache of bounded size.

Why this is enough for scoring: the scoring layer reads the residual stream entering it (the
tap) and computes its own NoPE Q/K from it for every token, so its few query rows still see
every key; only the trunk below it becomes local. Why sinks: softmax parks surplus mass on
the first tokens (StreamingLLM's attention sinks); dropping them shifts every later
attention distribution, keeping them costs `sink` keys per query.

Visibility, for a query at absolute position p and a key at position k:
`k <= p and (k < sink or p - k < window)`. With `window >= S` this is the dense causal mask,
so scores equal the dense scores up to float rounding.

Positions: queries and window keys keep their absolute RoPE positions (their distances are
below `window + chunk`, inside what the drafter trained on). The sink keys, at 0 … sink-1,
are read from ever farther away as the window moves on: at 128K tokens a distance the
drafter never saw. With `sink_positions: adjacent` (StreamingLLM's re-indexing) they are
read re-rotated to sit just before the window: `RopeShift` turns a key rotated at position
i into the key rotated at i + delta (rotations compose). One chunk reads one key tensor, so
delta is a function of the query's stride, `[kW, (k+1)W)` for window W, and chunks are cut
at stride boundaries (`stride_cuts`): the sinks then end just before `kW - W + 1`, the
oldest key a query of that stride reads, so every relative position stays below
`2W + sink`, and the scores do not depend on the chunking (a resumed session equals a fresh
pass). For queries before `W + sink` delta is 0, so a window covering the prompt is still
the dense computation.

Pieces: `WindowSpec` (the knobs), `window_mask` (the rule above as a bool matrix),
`SinkWindowLayer` (a transformers cache layer keeping only the sink and the tail the next
chunk needs, plus `slack` tokens so a session can still rewind a little), `windowed_cache`
(a model's cache with its attention layers windowed) and `chunk_mask` (the 4D mask for one
chunk against what the cache holds).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.cache_utils import DynamicLayer


@dataclass(frozen=True)
class WindowSpec:
    """Sliding-window-with-sinks attention for the drafter's trunk.

    - `sink`: the first tokens every query sees (attention sinks, usually the system prompt);
    - `window`: the last tokens every query sees, itself included;
    - `slack`: extra tail tokens the cache keeps so a session can rewind up to `slack`
      tokens (the next turn drops the previous generation prompt) without a full rescore.
    """

    sink: int
    window: int
    slack: int = 0
    sink_positions: str = "absolute"  # or "adjacent": re-rotated next to the window

    def __post_init__(self):
        if self.sink < 0 or self.window < 1 or self.slack < 0:
            raise ValueError(f"bad window spec {self}: sink >= 0, window >= 1, slack >= 0")
        if self.sink_positions not in ("absolute", "adjacent"):
            raise ValueError(f"bad window spec {self}: sink_positions absolute or adjacent")

    @property
    def tail(self) -> int:
        """Tail tokens a cache keeps after a chunk: the window minus the next query itself,
        plus the rewind slack."""
        return self.window - 1 + self.slack

    def cache_bound(self, chunk: int) -> int:
        """Most keys any layer holds during a chunk of `chunk` tokens (sink + tail + chunk)."""
        return self.sink + self.tail + chunk


def window_mask(q_pos: torch.Tensor, k_pos: torch.Tensor, spec: WindowSpec) -> torch.Tensor:
    """bool [n, K]: True where the query at position q_pos[i] may read the key at k_pos[j]."""
    q = q_pos.unsqueeze(1)
    k = k_pos.unsqueeze(0)
    return (k <= q) & ((k < spec.sink) | (q - k < spec.window))


def kept_positions(positions: torch.Tensor, total: int, spec: WindowSpec) -> torch.Tensor:
    """bool over `positions`: which a cache keeps once `total` tokens were seen."""
    return (positions < spec.sink) | (positions >= total - spec.tail)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass(frozen=True)
class RopeShift:
    """Moves RoPE-rotated keys along the position axis: `shift(k, delta)` of a key rotated at
    position i is the key rotated at i + delta. The model's rotary frequencies `inv_freq`
    rotate the first `2 * len(inv_freq)` dims (partial rotary rotates fewer than the head
    dim) in transformers' rotate-half layout. A pure rotation: the rotary module's
    `attention_scaling` is already in the key once."""

    inv_freq: torch.Tensor  # [rotary_dim / 2]

    @property
    def rotary_dim(self) -> int:
        return 2 * int(self.inv_freq.numel())

    def shift(self, keys: torch.Tensor, delta: int) -> torch.Tensor:
        if delta == 0:
            return keys
        freqs = delta * self.inv_freq.to(torch.float64)
        emb = torch.cat((freqs, freqs))
        cos, sin = emb.cos().to(keys.dtype), emb.sin().to(keys.dtype)
        rd = self.rotary_dim
        rot, rest = keys[..., :rd], keys[..., rd:]
        return torch.cat((rot * cos + rotate_half(rot) * sin, rest), dim=-1)


def rope_shift(model) -> RopeShift:
    """The model's rotary frequencies (its `rotary_emb` module), for `sink_positions:
    adjacent`; a model without one cannot re-index its sinks."""
    for name, module in model.named_modules():
        if name.endswith("rotary_emb") and isinstance(
            getattr(module, "inv_freq", None), torch.Tensor
        ):
            return RopeShift(module.inv_freq.detach().float().clone())
    raise ValueError("drafter_sink_positions adjacent needs a drafter with rotary embeddings")


def sink_delta(start: int, spec: WindowSpec) -> int:
    """How far the sink keys move for queries from `start` on (up to the stride's end): to
    end just before `kW - W + 1`, the oldest window key the stride's first query reads."""
    stride = start // spec.window
    return max(0, (stride - 1) * spec.window + 1 - spec.sink)


def stride_cuts(begin: int, end: int, spec: WindowSpec | None) -> tuple[int, ...]:
    """Where a forward over [begin, end) must cut its chunks so each reads one sink delta:
    the stride boundaries, with `sink_positions: adjacent`; none otherwise."""
    if spec is None or spec.sink_positions != "adjacent":
        return ()
    first = (begin // spec.window + 1) * spec.window
    return tuple(range(first, end, spec.window))


class SinkWindowLayer(DynamicLayer):
    """A cache layer holding the sink tokens and the last `spec.tail` tokens.

    `update` returns everything the current chunk may attend to (kept keys + the chunk) and
    then drops what no later query will read, so the layer never holds more than
    `spec.cache_bound(chunk)` keys. `positions` are the absolute positions of the held keys;
    `get_seq_length` is the number of tokens seen, so transformers' own position bookkeeping
    stays absolute. `peak` records the most keys returned by one update (tests assert it).
    """

    is_sliding = False  # transformers' sliding logic must not touch it: masks come from us

    def __init__(self, spec: WindowSpec, rope: RopeShift | None = None, **kwargs):
        super().__init__()
        self.spec = spec
        self.rope = rope  # set with sink_positions adjacent
        self.seen = 0
        self.positions = torch.zeros(0, dtype=torch.long)
        self.peak = 0

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        c = key_states.shape[-2]
        start = self.seen
        new = torch.arange(self.seen, self.seen + c)
        keys = torch.cat([self.keys, key_states], dim=-2)
        values = torch.cat([self.values, value_states], dim=-2)
        positions = torch.cat([self.positions, new])
        self.seen += c
        self.peak = max(self.peak, keys.shape[-2])
        keep = kept_positions(positions, self.seen, self.spec)
        if bool(keep.all()):
            self.keys, self.values, self.positions = keys, values, positions
        else:
            idx = keep.nonzero().squeeze(1)
            self.keys = keys.index_select(-2, idx)
            self.values = values.index_select(-2, idx)
            self.positions = positions[idx]
        return self.read_keys(keys, positions, start, c), values

    def read_keys(self, keys: torch.Tensor, positions: torch.Tensor, start: int, c: int):
        """The keys the chunk [start, start + c) reads: as held, or with the sinks moved next
        to the window (one delta per chunk: it must not straddle a stride, `stride_cuts`)."""
        if self.rope is None:
            return keys
        w = self.spec.window
        if start // w != (start + c - 1) // w:
            raise ValueError(f"chunk [{start}, {start + c}) straddles a {w}-token stride")
        delta = sink_delta(start, self.spec)
        n_sink = int((positions < self.spec.sink).sum())
        if delta == 0 or n_sink == 0:
            return keys
        moved = self.rope.shift(keys[..., :n_sink, :], delta)
        return torch.cat((moved, keys[..., n_sink:, :]), dim=-2)

    def get_seq_length(self) -> int:
        return self.seen

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.positions.numel() + query_length, 0

    def held(self) -> int:
        """Keys held now."""
        return int(self.positions.numel())

    def resume_floor(self) -> int:
        """The smallest length this layer can be cut back to exactly: queries at position
        p >= floor read nothing evicted. 0 while nothing beyond the sink was evicted."""
        spec = self.spec
        contiguous = self.positions.numel() == self.seen
        if contiguous:
            return 0
        tail_start = int(self.positions[self.positions >= spec.sink].min()) if self.held() else 0
        return tail_start + spec.window - 1

    def crop_to(self, length: int) -> None:
        """Forget tokens at positions >= length; refuses to go below `resume_floor`."""
        if length >= self.seen:
            return
        if length < self.resume_floor():
            raise ValueError(
                f"windowed cache cannot rewind to {length} tokens: earliest is {self.resume_floor()}"
            )
        keep = (self.positions < length).nonzero().squeeze(1)
        if self.is_initialized:
            self.keys = self.keys.index_select(-2, keep)
            self.values = self.values.index_select(-2, keep)
        self.positions = self.positions[keep]
        self.seen = length

    def crop(self, tokens_to_remove: int) -> None:
        self.crop_to(self.seen - abs(tokens_to_remove))

    def reset(self) -> None:
        super().reset()
        self.seen = 0
        self.positions = torch.zeros(0, dtype=torch.long)


def windowed_cache(model, spec: WindowSpec):
    """A DynamicCache for `model` whose plain attention layers are `SinkWindowLayer`s; other
    layers (Qwen3.5's linear attention: constant-size state already) stay as they are."""
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache(config=model.config)
    rope = rope_shift(model) if spec.sink_positions == "adjacent" else None
    for i, layer in enumerate(cache.layers):
        if type(layer) is DynamicLayer:
            cache.layers[i] = SinkWindowLayer(spec, rope)
    return cache


def window_layers(cache) -> list[SinkWindowLayer]:
    return [layer for layer in getattr(cache, "layers", ()) if isinstance(layer, SinkWindowLayer)]


def is_windowed(cache) -> bool:
    return bool(window_layers(cache))


def held_positions(cache) -> torch.Tensor:
    """Absolute positions the cache's windowed layers hold (the same for every layer that
    ran: each saw the same chunks)."""
    layers = window_layers(cache)
    return layers[0].positions if layers else torch.zeros(0, dtype=torch.long)


def chunk_mask(
    cache, start: int, length: int, spec: WindowSpec, *, additive: torch.dtype | None = None
) -> torch.Tensor:
    """The 4D attention mask [1, 1, c, held + c] for the chunk at [start, start+c) against the
    keys the cache holds, in the form the model's attention wants: bool (sdpa, True = read)
    or, with `additive` a float dtype, 0 / the most negative value (eager attention)."""
    held = held_positions(cache)
    if held.numel() and int(window_layers(cache)[0].seen) != start:
        raise ValueError(
            f"windowed cache holds {window_layers(cache)[0].seen} tokens, chunk at {start}"
        )
    q_pos = torch.arange(start, start + length)
    allowed = window_mask(q_pos, torch.cat([held, q_pos]), spec)[None, None]
    if additive is None:
        return allowed
    zero = torch.zeros((), dtype=additive)
    return torch.where(allowed, zero, torch.finfo(additive).min)
