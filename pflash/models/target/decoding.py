"""The model-free steps of decoding: logits to a token (`sample_token`), a speculative
step's drafts to the tokens greedy decoding keeps (`accept_drafts`), and token ids to
streamed text that never shows a stop string (`StreamingDecoder`, over `StopScanner`).

They read tokens, logits and text only, so they are tested without a model;
`TransformersTarget` (`hf.py`) calls them from its decode loop. Torch is imported lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

from pflash.models.target.protocol import SamplingParams

# ---------------------------------------------------------------------- detokenising


class StopScanner:
    """Streamed text in, text safe to emit out: everything before the first stop string,
    holding back the longest tail that could still start one.

    One Aho-Corasick automaton over all stop strings reads each new character once, so a
    piece costs O(len(piece)) whatever the number and length of the stops, and only the
    held tail (shorter than the longest stop) is kept. The state after a piece is the
    longest suffix of the text that begins some stop string: exactly the tail to hold. Of
    the stops found in a piece the one that starts first wins, as `str.find` per stop would
    choose: a longer stop ending later may start earlier, so the scan goes on until no stop
    ending further could start before the best so far.
    """

    def __init__(self, stop: Sequence[str] = ()):
        self._always = "" in stop  # an empty stop string matches before any text
        self._longest = max(map(len, stop), default=0)
        # trie of the stop strings: per node its children, failure link, depth, and the
        # length of the longest stop string that ends there (0: none)
        self._next: list[dict[str, int]] = [{}]
        self._depth = [0]
        self._ends = [0]
        for s in filter(None, stop):
            node = 0
            for c in s:
                if c not in self._next[node]:
                    self._next[node][c] = len(self._next)
                    self._next.append({})
                    self._depth.append(self._depth[node] + 1)
                    self._ends.append(0)
                node = self._next[node][c]
            self._ends[node] = len(s)
        self._fail = [0] * len(self._next)
        queue = list(self._next[0].values())
        for node in queue:  # breadth first: a failure link points to a shallower node
            for c, child in self._next[node].items():
                self._fail[child] = self._step(self._fail[node], c)
                self._ends[child] = self._ends[child] or self._ends[self._fail[child]]
                queue.append(child)
        self._state = 0
        self._held = ""
        self.stopped = False

    def _step(self, node: int, c: str) -> int:
        while node and c not in self._next[node]:
            node = self._fail[node]
        return self._next[node].get(c, 0)

    def feed(self, piece: str) -> str:
        """Add `piece`; return what may now be emitted (after a stop string: the text before
        it, and `stopped` turns true)."""
        if self.stopped:
            return ""
        if self._always:
            self.stopped = True
            return ""
        text, base = self._held + piece, len(self._held)
        first = -1  # the earliest start of a stop string in `text`
        for j, c in enumerate(piece):
            if first >= 0 and base + j - first >= self._longest:
                break
            self._state = self._step(self._state, c)
            if self._ends[self._state]:
                begin = base + j + 1 - self._ends[self._state]
                first = begin if first < 0 else min(first, begin)
        if first >= 0:
            self.stopped = True
            self._held = ""
            return text[:first]
        cut = len(text) - self._depth[self._state]
        self._held = text[cut:]
        return text[:cut]

    def rest(self) -> str:
        """End of text: the held tail, which no stop string completed."""
        out, self._held = self._held, ""
        return "" if self.stopped else out


class StreamingDecoder:
    """Token ids in, safe text out: complete UTF-8 only, stop strings cut, never emitted.

    Incremental detokenisation decodes a short window of recent tokens twice (with and
    without the newest) and emits the difference, holding it back while it ends in a
    replacement character (a multi-byte character split across tokens). The last prompt
    tokens seed the window so tokenizers that drop a leading space at the start of a
    decode still render the first answer token right.

    Stop strings: text is emitted only up to the longest suffix that could still start a
    stop string, so a stop string is cut cleanly even when it spans several tokens
    (`StopScanner`; the answer text itself is not kept).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), *, context: Sequence[int] = ()):
        self._tok = tokenizer
        self._stops = StopScanner(stop)
        self._ids: list[int] = list(context)[-5:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)

    @property
    def stopped(self) -> bool:
        return self._stops.stopped

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now safe to emit (may be empty)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        piece = ""
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            piece = full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._stops.feed(piece)

    def finish(self) -> str:
        """End of generation: return the rest, including text held back for stop strings."""
        if self.stopped:
            return ""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        self._prefix_offset = self._read_offset = len(self._ids)
        # the last piece (held while it ended inside a character) is scanned like any other:
        # with the scanner's held tail it may complete a stop string
        text = self._stops.feed(full[len(prefix) :])
        return text + self._stops.rest()


# ---------------------------------------------------------------------- sampling, acceptance


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """Greedy at temperature 0; otherwise temperature, then nucleus (top_p), then a draw."""
    import torch

    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)  # [V]
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > params.top_p
        sorted_probs[outside] = 0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def accept_drafts(drafts: Sequence[int], verified: Sequence[int]) -> list[int]:
    """Greedy speculative acceptance: the longest prefix of `drafts` the target agrees with,
    then the target's own token after it (the correction, or a bonus when all agree).

    `verified[i]` is the target's greedy token after the committed tokens plus `drafts[:i]`
    (`len(drafts) + 1` of them), so the result is exactly what greedy decoding emits next;
    `len(result) - 1` drafts were accepted.
    """
    if len(verified) != len(drafts) + 1:
        raise ValueError(f"need {len(drafts) + 1} verified tokens, got {len(verified)}")
    n = 0
    while n < len(drafts) and drafts[n] == verified[n]:
        n += 1
    return [*drafts[:n], verified[n]]
