"""Per-conversation drafter scoring sessions (§6.4): resume a prompt that shares a prefix.

Why resuming is exact: the layers before the scoring layer are causal and left to right,
and the head's keys are NoPE, so the states and keys of a shared prefix never change. A
session keeps, for the prompt it last scored:

- `ids`: the drafter token ids it covers;
- `cache`: the transformers cache of the layers before the scoring layer (KV, and for
  Qwen3.5 the DeltaNet conv/recurrent states);
- `keys`: the scoring layer's NoPE keys for every token, fp32 [S, Hk, D];
- `tap`: the hidden states entering the scoring layer [S, hidden], when they were asked for;
- `rows`: the scoring-layer input rows of up to 8 recent query windows, most recent last;
- `checkpoint`: for caches that cannot be cut back (recurrent state), a copy of the
  recurrent state at `max(resume, S - 64)`, so the next turn, which shares the prompt up
  to where the previous generation prompt began, resumes there.

Attention-only caches are cut back to any shared prefix (`crop`); a windowed cache
(`drafter_attention: window`, `window.py`) to any shared prefix whose window it still holds
(it keeps `CHECKPOINT_TAIL` tokens of slack for that); recurrent caches resume only at
their full prefix or at the checkpoint. The resume decision (`plan_resume`) is a
pure function of the session and the request; the table is an LRU keyed by the
conversation key (`ScoreRequest.session_key`).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pflash.compress.plan.query import QueryWindow
from pflash.spans import Span

MAX_STORED_WINDOWS = 8
CHECKPOINT_TAIL = 64  # recurrent-state checkpoint this many tokens before the end


@dataclass
class RecurrentCheckpoint:
    """Recurrent (linear-attention) layer states after `position` tokens."""

    position: int
    states: dict  # layer index -> (conv_state, recurrent_state) clones


@dataclass
class DrafterSession:
    """One conversation's scoring state. Mutated only by the scorer that owns the table."""

    ids: tuple[int, ...]
    cache: object
    keys: object  # torch.Tensor [S, Hk, D] fp32
    keys_from_head: bool
    tap: object | None = None  # torch.Tensor [S, hidden] or None
    rows: OrderedDict = field(default_factory=OrderedDict)  # Span -> torch.Tensor [n, hidden]
    checkpoint: RecurrentCheckpoint | None = None
    pooled: dict = field(default_factory=dict)  # Span -> the tap projection's pooled row
    tap_id: str | None = None  # names `tap` (ScoreResult.tap_id)
    keys_buffer: object | None = None  # the storage `keys` views, with room to grow (`extend_rows`)
    tap_buffer: object | None = None  # the same for `tap`

    def remember_rows(self, span: Span, rows) -> None:
        """Store a window's rows as the most recent; keep at most MAX_STORED_WINDOWS."""
        self.rows.pop(span, None)
        self.rows[span] = rows
        while len(self.rows) > MAX_STORED_WINDOWS:
            self.rows.popitem(last=False)


def extend_rows(buffer, length: int, prefix: int, parts: list):
    """`buffer[:prefix]` followed by `parts` (along dim 0): returns (buffer, rows), rows a
    view of the buffer's first rows.

    A session's keys and tap grow by a turn's few rows while they cover the whole
    conversation: copying all of them each turn would make a later turn cost
    O(conversation). When the session resumes at its full length (`prefix == length`) and
    the buffer has room, the new rows are written after the used ones in place: rows past
    `length` belong to nobody (an earlier result or view ends at its own length), so nothing
    anyone holds changes. Otherwise a new buffer: exactly the rows on a first pass, a quarter
    more room once the conversation has grown (resumed) once.
    """
    import torch

    new = sum(int(p.shape[0]) for p in parts)
    need = prefix + new
    if buffer is None and prefix > 0:
        raise ValueError("rows to keep from a buffer that is not there")
    if buffer is None or prefix == 0:
        out = torch.cat(parts)
        return out, out
    if prefix != length or int(buffer.shape[0]) < need:
        grown = buffer.new_empty((need + need // 4, *buffer.shape[1:]))
        grown[:prefix] = buffer[:prefix]
        buffer = grown
    at = prefix
    for p in parts:
        buffer[at : at + p.shape[0]] = p
        at += int(p.shape[0])
    return buffer, buffer[:need]


V = TypeVar("V")


class SessionTable(Generic[V]):
    """At most `capacity` per-conversation states, least recently used evicted first;
    capacity 0 = none. Drafter sessions live here, and the embedder's memo keeps each
    conversation's vectors in one (`EmbeddingMemo`): one eviction rule for both."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._sessions: OrderedDict[str, V] = OrderedDict()

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, key: str) -> bool:
        return key in self._sessions

    def get(self, key: str) -> V | None:
        session = self._sessions.get(key)
        if session is not None:
            self._sessions.move_to_end(key)
        return session

    def put(self, key: str, session: V) -> None:
        if self.capacity <= 0:
            return
        self._sessions[key] = session
        self._sessions.move_to_end(key)
        while len(self._sessions) > self.capacity:
            self._sessions.popitem(last=False)

    def drop(self, key: str | None) -> None:
        if key is not None:
            self._sessions.pop(key, None)

    def keys(self) -> list[str]:
        """Session keys, least recently used first."""
        return list(self._sessions)


# --------------------------------------------------------------------------- resume decision


@dataclass(frozen=True)
class ResumePlan:
    """Where to resume and which window rows come from the session.

    - `resume`: tokens [0, resume) are reused; [resume, S) run through the drafter.
    - `restore_checkpoint`: resume is the session's recurrent checkpoint.
    - `stored`: windows whose rows come from the session (they begin before `resume`).
    - `skipped`: history windows whose rows are gone; they are not scored, and their weight
      slot is still consumed (§3.3).
    """

    resume: int
    restore_checkpoint: bool = False
    stored: tuple[Span, ...] = ()
    skipped: tuple[Span, ...] = ()


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def plan_resume(
    session: DrafterSession | None,
    ids: tuple[int, ...],
    windows: tuple[QueryWindow, ...],
    *,
    croppable: bool,
    want_tap: bool,
    keys_from_head: bool,
    floor: int = 0,
) -> ResumePlan:
    """Decide the resume point for `ids` (§6.4).

    croppable (attention-only cache): any shared prefix at or after `floor` (a windowed
    cache, `cache_resume_floor`, cannot return before what it evicted), else from scratch.
    Otherwise the full previous prompt when it is a prefix, else the recurrent checkpoint
    when it lies within the shared part (and at or after `floor`).
    A main or turn window that starts before the resume point needs its exact rows stored
    (computed on the shared prefix), else the resume point moves back to it; a history
    window without stored rows is skipped.
    """
    if session is None or session.keys_from_head != keys_from_head:
        return ResumePlan(0)
    shared = common_prefix(session.ids, ids)
    checkpoint = session.checkpoint
    on_checkpoint = False

    def fall_back(limit: int) -> int:
        """The furthest resume point at or before `limit` this cache can return to."""
        nonlocal on_checkpoint
        if croppable:
            on_checkpoint = False
            return limit if limit >= floor or limit >= len(session.ids) else 0
        if limit >= len(session.ids) and shared == len(session.ids):
            return len(session.ids)
        if checkpoint is not None and floor <= checkpoint.position <= min(limit, shared):
            on_checkpoint = True
            return checkpoint.position
        on_checkpoint = False
        return 0

    resume = fall_back(shared)
    if want_tap:
        covered = 0 if session.tap is None else min(shared, int(session.tap.shape[0]))
        if covered < resume:
            resume = fall_back(covered)

    def rows_usable(span: Span) -> bool:
        return span in session.rows and span.end <= shared

    for w in windows:  # main and turn windows must be scored: move back until they can be
        if w.kind != "history" and w.span.begin < resume and not rows_usable(w.span):
            resume = fall_back(w.span.begin)
    stored, skipped = [], []
    for w in windows:
        if w.span.begin >= resume:
            continue
        if rows_usable(w.span):
            stored.append(w.span)
        else:
            skipped.append(w.span)
    return ResumePlan(resume, on_checkpoint and resume > 0, tuple(stored), tuple(skipped))


# --------------------------------------------------------------------------- cache surgery


def cache_is_croppable(cache) -> bool:
    """True when every cache layer can be cut back to a prefix (plain full-attention KV)."""
    from transformers.cache_utils import (
        DynamicLayer,
        DynamicSlidingWindowLayer,
        LinearAttentionCacheLayerMixin,
    )

    for layer in cache.layers:
        if isinstance(layer, (LinearAttentionCacheLayerMixin, DynamicSlidingWindowLayer)):
            return False
        if not isinstance(layer, DynamicLayer):
            return False
    return True


def cache_has_recurrent_state(cache) -> bool:
    """True for linear-attention hybrids (Qwen3.5) whose other layers are plain KV: these
    resume at a recurrent-state checkpoint. Sliding-window caches cannot be rewound at all."""
    from transformers.cache_utils import DynamicSlidingWindowLayer, LinearAttentionCacheLayerMixin

    layers = cache.layers
    has_linear = any(isinstance(layer, LinearAttentionCacheLayerMixin) for layer in layers)
    return has_linear and not any(isinstance(layer, DynamicSlidingWindowLayer) for layer in layers)


def cache_resume_floor(cache) -> int:
    """The shortest prefix the cache can be cut back to exactly: 0 for a full KV cache; for
    a windowed one (`SinkWindowLayer`) the first position whose window it still holds."""
    from pflash.models.drafter.window import window_layers

    return max((layer.resume_floor() for layer in window_layers(cache)), default=0)


def crop_cache(cache, length: int) -> None:
    """Cut the attention KV of every layer back to the first `length` tokens."""
    from transformers.cache_utils import DynamicLayer, LinearAttentionCacheLayerMixin

    from pflash.models.drafter.window import SinkWindowLayer

    for layer in cache.layers:
        if isinstance(layer, LinearAttentionCacheLayerMixin):
            continue
        if isinstance(layer, SinkWindowLayer):
            layer.crop_to(length)
            continue
        if isinstance(layer, DynamicLayer) and layer.is_initialized and layer.keys is not None:
            extra = layer.keys.shape[-2] - length
            if extra > 0:
                layer.keys = layer.keys[..., :length, :]
                layer.values = layer.values[..., :length, :]


def snapshot_recurrent(cache, position: int) -> RecurrentCheckpoint:
    """Copy every linear-attention layer's conv and recurrent state (small: no sequence axis)."""
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    states = {}
    for i, layer in enumerate(cache.layers):
        if isinstance(
            layer, LinearAttentionCacheLayerMixin
        ) and layer.is_recurrent_states_initialized.get(0):
            states[i] = (layer.conv_states[0].clone(), layer.recurrent_states[0].clone())
    return RecurrentCheckpoint(position, states)


def restore_recurrent(cache, checkpoint: RecurrentCheckpoint) -> None:
    """Put the cache back to `checkpoint.position` tokens: recurrent states copied back,
    attention KV cut to the same length."""
    for i, (conv, recurrent) in checkpoint.states.items():
        layer = cache.layers[i]
        layer.conv_states[0].copy_(conv)
        layer.recurrent_states[0].copy_(recurrent)
    crop_cache(cache, checkpoint.position)
