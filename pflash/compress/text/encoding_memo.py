"""Encodings of a conversation's unchanged pieces, kept from one turn to the next.

Every turn of a chat renders the whole conversation again and encodes it: a tokenizer pass
that grows with the conversation, on every step of an agent, compressed or not. An
HF fast tokenizer takes control tokens out of the text first and encodes the pieces between
them on their own, so a piece an earlier turn sent encodes the same now. `EncodingMemo`
keeps the encodings of long pieces and encodes only the rest, in one batch.

- Exact, or not used: `piecewise` checks once per tokenizer, on probe texts with its own
  control tokens, that encoding piece by piece gives the ids and offsets of encoding the
  whole text (a tokenizer whose control tokens strip neighbouring spaces, or that adds a
  prefix space to every piece, fails it and is always encoded whole).
- Keyed by scope (the tenant) and the piece's text: one tenant never learns from a faster
  answer that another sent the same text.
- Bounded: least recently used pieces leave first once the pieces held exceed
  `max_chars` characters; pieces shorter than `min_chars` are encoded every time.
"""

from __future__ import annotations

import re
import threading
import weakref
from collections import OrderedDict
from collections.abc import Mapping, Sequence

import numpy as np

MAX_CHARS = 8_000_000  # characters of pieces held (~2M tokens, ~24 MB of int32 ids and offsets)
MIN_CHARS = 256  # shorter pieces cost less to encode than to look up and keep


class EncodingMemo:
    """Piece encodings per (scope, text); thread-safe (the ingress encodes in threads)."""

    def __init__(self, max_chars: int = MAX_CHARS, min_chars: int = MIN_CHARS):
        self.max_chars = max_chars
        self.min_chars = min_chars
        self._pieces: OrderedDict[tuple[str, str, bool], tuple[np.ndarray, np.ndarray]] = (
            OrderedDict()
        )
        self._chars = 0
        self._lock = threading.Lock()
        self.hits = 0  # pieces served from the memo (for tests and stats)

    def __len__(self) -> int:
        return len(self._pieces)

    def encode(
        self,
        tokenizer,
        text: str,
        controls: Sequence[tuple[int, int]],
        control_ids: Mapping[str, int],
        scope: str,
    ) -> tuple[list[int], list[tuple[int, int]]]:
        """`text` with its control tokens at `controls` (sorted, each a token of
        `control_ids`): ids and monotone character offsets, as `encode_with_offsets` gives
        them for the whole text."""
        parts: list[
            tuple[int, int] | tuple[int, int, int]
        ] = []  # pieces, and controls as (b, e, id)
        at = 0
        for b, e in controls:
            parts.append((at, b))
            parts.append((b, e, control_ids[text[b:e]]))
            at = e
        parts.append((at, len(text)))
        found: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        misses: list[int] = []
        with self._lock:
            for i, part in enumerate(parts):
                if len(part) == 2 and part[1] > part[0]:
                    got = (
                        self._get(scope, text, part)
                        if part[1] - part[0] >= self.min_chars
                        else None
                    )
                    if got is None:
                        misses.append(i)
                    else:
                        found[i] = got
        if misses:
            pieces = [text[parts[i][0] : parts[i][1]] for i in misses]
            batch = tokenizer(pieces, add_special_tokens=False, return_offsets_mapping=True)
            fresh = {}
            for i, ids, offsets in zip(
                misses, batch["input_ids"], batch["offset_mapping"], strict=True
            ):
                encoded = (np.asarray(ids, dtype=np.int32), _monotone_array(offsets))
                found[i] = encoded
                fresh[i] = encoded
            with self._lock:
                for i, encoded in fresh.items():
                    b, e = parts[i][0], parts[i][1]
                    if e - b >= self.min_chars:
                        self._put((scope, text[b:e], b == 0), encoded, e - b)
        out_ids: list[int] = []
        out_offsets: list[tuple[int, int]] = []
        for i, part in enumerate(parts):
            if len(part) == 3:
                out_ids.append(part[2])
                out_offsets.append((part[0], part[1]))
            elif i in found:
                ids, offsets = found[i]
                out_ids.extend(ids.tolist())
                shifted = offsets + part[0]  # two int lists zipped: no nested list per token
                out_offsets.extend(zip(shifted[:, 0].tolist(), shifted[:, 1].tolist(), strict=True))
        return out_ids, out_offsets

    def _get(self, scope: str, text: str, part) -> tuple[np.ndarray, np.ndarray] | None:
        b, e = part
        key = (scope, text[b:e], b == 0)
        got = self._pieces.get(key)
        if got is not None:
            self._pieces.move_to_end(key)
            self.hits += 1
        return got

    def _put(self, key, encoded, chars: int) -> None:
        if chars > self.max_chars or key in self._pieces:
            return
        self._pieces[key] = encoded
        self._chars += chars
        while self._chars > self.max_chars:
            (_, old, _), _ = self._pieces.popitem(last=False)
            self._chars -= len(old)


def _monotone_array(offsets) -> np.ndarray:
    """A piece's offsets [n, 2], made monotone as `encoding._monotone` makes them: a
    piece's first token starts at or after the piece, so this equals the whole text's."""
    arr = np.asarray(offsets, dtype=np.int32).reshape(-1, 2)
    if len(arr):
        arr[:, 0] = np.maximum.accumulate(np.maximum(arr[:, 0], 0))
        arr[:, 1] = np.maximum(arr[:, 1], arr[:, 0])
    return arr


_PIECEWISE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def piecewise(tokenizer, control_ids: Mapping[str, int]) -> bool:
    """Whether encoding piece by piece equals encoding the whole text for this tokenizer:
    checked once on probe texts around its own control tokens (cached per tokenizer)."""
    try:
        return _PIECEWISE[tokenizer]
    except (KeyError, TypeError):
        pass
    ok = _check_piecewise(tokenizer, control_ids)
    try:
        _PIECEWISE[tokenizer] = ok
    except TypeError:
        pass
    return ok


def _check_piecewise(tokenizer, control_ids: Mapping[str, int]) -> bool:
    names = sorted(control_ids, key=lambda t: (len(t), t))[:2]
    if not names or not hasattr(tokenizer, "backend_tokenizer"):
        return False
    a, b = names[0], names[-1]
    probes = [
        f"hello world{a}  user\n\nSome text  here.{b}\n{a}assistant\n",
        f"  leading space{a}{b}trailing  \n\n",
        f"{a}na\u00efve caf\u00e9 \u2014 \u6570\u5b57 \U0001f600 x{b} {a}\tend",
    ]
    marker = re.compile("|".join(re.escape(n) for n in sorted({a, b}, key=len, reverse=True)))
    probe_memo = EncodingMemo(min_chars=0)
    for probe in probes:
        controls = [m.span() for m in marker.finditer(probe)]
        whole = tokenizer(probe, add_special_tokens=False, return_offsets_mapping=True)
        want_ids = [int(i) for i in whole["input_ids"]]
        want_offsets = _monotone_array(whole["offset_mapping"])
        got_ids, got_offsets = probe_memo.encode(tokenizer, probe, controls, control_ids, "")
        if got_ids != want_ids or [tuple(o) for o in want_offsets.tolist()] != got_offsets:
            return False
    return True
