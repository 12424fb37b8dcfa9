"""Span algebra and the tokenizer bridge between the target and drafter vocabularies.

A span is a half-open token range `[begin, end)`. A bare `Span` does not know its
vocabulary, so every field or argument that holds one says it in its name or docstring
(`*_drafter`, "target tokens"). Spans cross vocabularies only through text: the target's
prompt tokens are decoded to text, the drafter re-encodes that text, and character offsets
map a span from one side to the other (the two tokenizers may differ entirely).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

MAX_INSTRUCTION_SPANS = 64  # reference kPFlashMaxInstructionSpans


@dataclass(frozen=True, order=True)
class Span:
    """Half-open token range [begin, end). Ordered by (begin, end)."""

    begin: int
    end: int

    def __len__(self) -> int:
        return max(0, self.end - self.begin)

    @property
    def empty(self) -> bool:
        return self.end <= self.begin

    def overlaps(self, other: Span) -> bool:
        return self.begin < other.end and other.begin < self.end

    def contains(self, index: int) -> bool:
        return self.begin <= index < self.end

    def clip(self, begin: int, end: int) -> Span:
        return Span(max(self.begin, begin), min(self.end, end))

    def as_list(self) -> list[int]:
        return [self.begin, self.end]


def canonicalize(spans: Iterable[Span]) -> tuple[Span, ...]:
    """Sort, drop empty spans, and merge spans that overlap **or touch** (reference §5.5)."""
    out: list[Span] = []
    for s in sorted(s for s in spans if not s.empty):
        if out and s.begin <= out[-1].end:
            if s.end > out[-1].end:
                out[-1] = Span(out[-1].begin, s.end)
        else:
            out.append(s)
    return tuple(out)


def union(*groups: Iterable[Span]) -> tuple[Span, ...]:
    return canonicalize(s for g in groups for s in g)


def subtract(spans: Iterable[Span], minus: Iterable[Span]) -> tuple[Span, ...]:
    """Tokens of `spans` that are in no span of `minus`, canonical. Each span finds the
    first span of `minus` it meets by bisection, so a long view minus many spans stays cheap."""
    return SpanIndex(minus).subtract(spans)


class SpanIndex:
    """Spans made canonical once and searched by bisection: subtracting them from many single
    spans (recall's ranked candidates against a view), or asking which of many units they
    cover, costs O(log M) each, not a pass over all of them."""

    def __init__(self, spans: Iterable[Span]):
        self.spans = canonicalize(spans)
        self._ends = [m.end for m in self.spans]

    def subtract(self, spans: Iterable[Span]) -> tuple[Span, ...]:
        out: list[Span] = []
        for s in canonicalize(spans):
            begin = s.begin
            i = bisect.bisect_right(self._ends, begin)  # the first cut span ending after begin
            while i < len(self.spans) and self.spans[i].begin < s.end:
                m = self.spans[i]
                if m.begin > begin:
                    out.append(Span(begin, m.begin))
                begin = max(begin, m.end)
                if begin >= s.end:
                    break
                i += 1
            if begin < s.end:
                out.append(Span(begin, s.end))
        return tuple(out)

    def covers(self, span: Span) -> bool:
        """Whether one of the spans holds all of `span` (begin <= end; an empty span at a
        span's end counts as held, as `k.begin <= begin and end <= k.end` says)."""
        i = bisect.bisect_right(self._ends, span.begin)
        if i < len(self.spans) and self.spans[i].begin <= span.begin:
            return span.end <= self.spans[i].end
        return span.empty and i > 0 and self.spans[i - 1].end == span.begin


def intersect(a: Iterable[Span], b: Iterable[Span]) -> tuple[Span, ...]:
    bs = canonicalize(b)
    out = []
    for s in canonicalize(a):
        for t in bs:
            lo, hi = max(s.begin, t.begin), min(s.end, t.end)
            if lo < hi:
                out.append(Span(lo, hi))
    return canonicalize(out)


def total_tokens(spans: Iterable[Span]) -> int:
    return sum(len(s) for s in canonicalize(spans))


def validate_spans(
    spans: Sequence[Span], limit: int, max_count: int = MAX_INSTRUCTION_SPANS
) -> str | None:
    """Check spans are canonical-ready instruction spans over `limit` tokens.

    Returns None when valid, else the reason: negative, empty, reversed, out of range,
    unordered, overlapping, or more than `max_count` spans (reference §10.1 item 4).
    """
    if len(spans) > max_count:
        return f"{len(spans)} spans exceeds the limit of {max_count}"
    prev_end = -1
    for s in spans:
        if s.begin < 0:
            return f"span {s.as_list()} begins before 0"
        if s.end == s.begin:
            return f"span {s.as_list()} is empty"
        if s.end < s.begin:
            return f"span {s.as_list()} is reversed"
        if s.end > limit:
            return f"span {s.as_list()} ends past the input ({limit} tokens)"
        if prev_end > s.begin:
            return f"span {s.as_list()} overlaps or precedes the previous span"
        prev_end = s.end
    return None


# --------------------------------------------------------------------------- tokenizer bridge


class Tokenizer(Protocol):
    """The part of a Hugging Face fast tokenizer the bridge uses."""

    def __call__(self, text: str, **kwargs): ...

    def decode(self, ids: Sequence[int], **kwargs) -> str: ...


@dataclass(frozen=True)
class TokenizedText:
    """`text` encoded to `ids`, with each token's character range `offsets[i] = (b, e)`.

    `starts` is the sorted list of token start offsets, used for lower-bound lookups.
    Offsets of special/added tokens cover their literal text (HF fast tokenizers).
    `controls`: the character ranges of `text` that are control tokens of the prompt (the
    chat template's own markers, `pflash.compress.text.encoding`); None for a TokenizedText
    built by hand (every marker text then counts as a control token).
    """

    text: str
    ids: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]
    controls: tuple[tuple[int, int], ...] | None = field(default=None, compare=False)
    starts: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.offsets):
            raise ValueError("ids and offsets differ in length")
        object.__setattr__(self, "starts", tuple(b for b, _ in self.offsets))

    def __len__(self) -> int:
        return len(self.ids)

    def token_at_or_after(self, char: int) -> int:
        """First token whose start offset is >= `char` (len(ids) if none): a lower bound."""
        return bisect.bisect_left(self.starts, char)

    def token_containing(self, char: int) -> int:
        """The token whose character range holds `char` (the last token starting <= char)."""
        i = bisect.bisect_right(self.starts, char) - 1
        # byte tokens of one multi-byte character share its offsets: take the first of them
        while i > 0 and self.offsets[i - 1][1] > char:
            i -= 1
        return max(0, i)

    def char_span(self, span: Span) -> tuple[int, int]:
        """Character range covered by the token span (empty spans map to a point)."""
        if span.empty:
            c = self.offsets[span.begin][0] if span.begin < len(self.offsets) else len(self.text)
            return c, c
        return self.offsets[span.begin][0], self.offsets[span.end - 1][1]

    def token_span(self, char_begin: int, char_end: int) -> Span:
        """Token span covering [char_begin, char_end): from the token containing the first
        character to the first token starting at or after the end (reference §5.4)."""
        if char_end <= char_begin:
            t = self.token_at_or_after(char_begin)
            return Span(t, t)
        return Span(self.token_containing(char_begin), self.token_at_or_after(char_end))


def decode_ids(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Decode token ids to text exactly (no cleanup of spaces), keeping special tokens.

    A transformers fast tokenizer that does not change how it decodes is asked through its
    Rust tokenizer directly: what transformers' `decode` adds before that call, with these
    options, is a Python pass checking every id is a number, a large share of the decode of a
    long prompt, paid again on every later step of a long conversation; the text is the
    same."""
    backend = _plain_fast_backend(tokenizer)
    if backend is not None:
        return backend.decode(list(ids), skip_special_tokens=False)
    return tokenizer.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def _plain_fast_backend(tokenizer: Tokenizer):
    """The `tokenizers.Tokenizer` behind a transformers fast tokenizer whose `decode` and
    `_decode` are transformers' own (a subclass overriding either keeps its way), else
    None."""
    kind = type(tokenizer)
    try:
        from transformers import PreTrainedTokenizerBase
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - transformers is a dependency
        return None
    if (
        isinstance(tokenizer, TokenizersBackend)
        and kind.decode is PreTrainedTokenizerBase.decode
        and kind._decode is TokenizersBackend._decode
    ):
        return tokenizer.backend_tokenizer
    return None


def map_span(span: Span, src: TokenizedText, dst: TokenizedText) -> Span:
    """Map a token span between two tokenizations of the **same text** via characters.

    The result covers at least the source characters: it starts at the destination token
    containing the first character and ends at the first destination token starting at or
    after the last character's end.
    """
    if src.text != dst.text:
        raise ValueError("map_span needs two tokenizations of the same text")
    b, e = src.char_span(span)
    return dst.token_span(b, e)
