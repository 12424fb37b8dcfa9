"""Kept drafter runs -> the compressed prompt the target prefills (ALGORITHM.md §4.8, §4.9,
§5.8, §6.2).

The selector hands over canonical **drafter** spans over the drafter's encoding of the prompt
text. They cross to the target's vocabulary only through text: each kept run is decoded with
the drafter tokenizer, the runs are joined, and the joined text is re-encoded with the target
tokenizer. The result is an ordinary prompt with contiguous positions; chat markers inside
kept runs are re-encoded as the target's marker tokens, exactly as the target would see them.

Why a paragraph join: selection cuts mid-line, and gluing two runs can fuse unrelated lines
("...other bands.Document 1:"). The join restores a line break at each cut. Its target-token
cost (`join_overhead`) is not the selector's doing, so the ceiling check excludes it (§4.8).

Everything here is pure (tokenizers are only read) except `fit_ceiling`, which calls the
attempt function it is given.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, NamedTuple, Protocol, TypeVar

from pflash.compress.text.encoding import (
    ControlledText,
    controls_within,
    decode,
    encode,
    find_controls,
)
from pflash.errors import CompressionFailed
from pflash.spans import Span, TokenizedText, Tokenizer, canonicalize, decode_ids

RECALL_HEADER = "[Earlier in this conversation]\n"
RECALL_FOOTER = "\n[End of earlier excerpts]\n\n"
RECALL_SEPARATOR = "\n\n"
CEILING_ATTEMPTS = 3
EXTRA_CEILING_ATTEMPTS = 6  # past the reference's: the overflow doubled each time


# --------------------------------------------------------------------------- paragraph join


def _junction(left: str, right: str) -> str:
    """Separator between two consecutive non-empty pieces (§4.8).

    - neither side has a newline at the junction -> "\\n\\n";
    - exactly one side has one and the junction is not already a double break -> "\\n";
    - otherwise (both sides have one, or one side already carries "\\n\\n") -> "".
    """
    left_nl = left.endswith("\n")
    right_nl = right.startswith("\n")
    if not left_nl and not right_nl:
        return "\n\n"
    if left_nl != right_nl and not (left.endswith("\n\n") or right.startswith("\n\n")):
        return "\n"
    return ""


def paragraph_join(pieces: Sequence[str]) -> str:
    """Join decoded kept runs so each cut falls on a paragraph break (§4.8).

    The junction rule looks at the text on both sides of each cut (see `_junction`). Empty
    pieces contribute nothing and make no junction: the next piece is joined to the text
    before them.
    """
    out = ""
    for piece in pieces:
        if not piece:
            continue
        out = out + _junction(out, piece) + piece if out else piece
    return out


_paragraph_join_text = paragraph_join  # `assemble` shadows the name with its flag


# --------------------------------------------------------------------------- assembly


@dataclass(frozen=True)
class Assembly:
    """One assembled compressed prompt.

    - `kept_spans`: canonical **drafter** spans that were kept, in source order.
    - `run_texts`: each kept run decoded on its own with the drafter tokenizer.
    - `text`: the prompt text served to the target (runs joined as configured).
    - `target_ids`: `text` encoded with the **target** tokenizer, no special tokens added,
      only `controls` as control tokens.
    - `controls`: character ranges of `text` that are the prompt's control tokens.
    - `join_overhead`: target tokens of `text` minus target tokens of the plain text (the
      kept drafter ids decoded as one stream), when the paragraph join is used; else 0.
      Excluded from the ceiling check (§4.8). May be negative when a tokenizer merges
      across a cut.
    """

    kept_spans: tuple[Span, ...]
    run_texts: tuple[str, ...]
    text: str
    target_ids: tuple[int, ...]
    join_overhead: int = 0
    controls: tuple[tuple[int, int], ...] = ()

    @property
    def n_target_tokens(self) -> int:
        return len(self.target_ids)

    @property
    def ceiling_tokens(self) -> int:
        """Target tokens that count against the ceiling: |final| - join_overhead (§5.8)."""
        return len(self.target_ids) - self.join_overhead


def _run(
    drafter_tokenizer: Tokenizer, ids: Sequence[int], span: Span, prompt: TokenizedText | None
) -> ControlledText:
    """One kept run decoded, with the prompt's controls it holds whole.

    The run's text is the prompt's characters under it (byte-level tokenizers); when it is
    not (a run that cuts a multi-byte character), the drafter's control ids in it say
    where the controls are. Without `prompt` the text is read as written."""
    text = decode_ids(drafter_tokenizer, ids[span.begin : span.end])
    if prompt is None or prompt.controls is None:
        return ControlledText(text, ())
    begin, end = prompt.char_span(span)
    if prompt.text[begin:end] == text:
        return ControlledText(text, controls_within(prompt.controls, begin, end))
    return decode(drafter_tokenizer, ids[span.begin : span.end], text)


def _joined(runs: Sequence[ControlledText], separator, *, skip_empty: bool) -> ControlledText:
    """The runs joined with `separator(text so far, next run)` between them, their controls
    moved along. Linear: the separator sees the last two characters written."""
    parts: list[str] = []
    controls: list[tuple[int, int]] = []
    size = 0
    tail = ""
    for run in runs:
        if skip_empty and not run.text:
            continue
        if parts:
            sep = separator(tail, run.text)
            parts.append(sep)
            size += len(sep)
            tail = (tail + sep)[-2:]
        controls.extend((size + b, size + e) for b, e in run.controls)
        parts.append(run.text)
        size += len(run.text)
        tail = (tail + run.text)[-2:]
    return ControlledText("".join(parts), tuple(controls))


def _check_kept_spans(kept_spans: Sequence[Span], n_drafter: int) -> tuple[Span, ...]:
    spans = tuple(kept_spans)
    if not spans:
        raise CompressionFailed("assembly", "selection kept no tokens")
    if spans != canonicalize(spans):
        raise CompressionFailed(
            "assembly", f"kept spans are not canonical: {[s.as_list() for s in spans]}"
        )
    if spans[0].begin < 0 or spans[-1].end > n_drafter:
        raise CompressionFailed(
            "assembly",
            f"kept spans {spans[0].as_list()}..{spans[-1].as_list()} leave the "
            f"{n_drafter} drafter tokens",
        )
    return spans


def assemble(
    drafter_tokenizer: Tokenizer,
    target_tokenizer: Tokenizer,
    drafter_ids: Sequence[int],
    kept_spans: Sequence[Span],
    *,
    paragraph_join: bool,
    prompt: TokenizedText | None = None,
) -> Assembly:
    """Decode the kept **drafter** runs, join them, re-encode with the **target** tokenizer.

    `kept_spans` must be canonical drafter spans (sorted, non-empty, non-touching) inside
    `drafter_ids`; anything else, or no span at all, fails closed with
    `CompressionFailed("assembly")`. Pass the config's `select_paragraph_join`.

    `prompt`: the drafter encoding `drafter_ids` came from (the plan's), whose controls say
    which marker texts in the kept runs are control tokens; the rest is encoded as text.
    Without it the assembled text is read as written (every marker text a control token).

    Joining:
    - `paragraph_join`: the §4.8 junction rule; its tokens are `join_overhead`.
    - neither: the kept drafter ids decoded as one stream (the reference's plain decode).
    """
    spans = _check_kept_spans(kept_spans, len(drafter_ids))
    runs = tuple(_run(drafter_tokenizer, drafter_ids, s, prompt) for s in spans)
    kept_ids = [int(i) for s in spans for i in drafter_ids[s.begin : s.end]]
    plain = _joined(runs, lambda _left, _right: "", skip_empty=False)
    if plain.text != decode_ids(drafter_tokenizer, kept_ids):
        plain = decode(drafter_tokenizer, kept_ids)

    if paragraph_join and len(spans) > 1:
        joined = _joined(runs, _junction, skip_empty=True)
    else:
        joined = plain
    if prompt is None or prompt.controls is None:  # read as written
        joined = ControlledText(joined.text, find_controls(target_tokenizer, joined.text))
        plain = ControlledText(plain.text, find_controls(target_tokenizer, plain.text))
    target_ids = encode(target_tokenizer, joined.text, joined.controls)
    extra = (
        0
        if joined.text == plain.text
        else len(target_ids) - len(encode(target_tokenizer, plain.text, plain.controls))
    )
    return Assembly(
        kept_spans=spans,
        run_texts=tuple(r.text for r in runs),
        text=joined.text,
        target_ids=target_ids,
        join_overhead=extra,
        controls=joined.controls,
    )


def joined_runs(
    drafter_tokenizer: Tokenizer, prompt: TokenizedText, spans: Sequence[Span], *, paragraph: bool
) -> ControlledText:
    """Drafter spans of `prompt` as text with the prompt's controls they keep: the paragraph
    join of their runs, or one plain decode of their ids ("" for no span). What a view
    appends to its cached prefix is made here, as an assembly is."""
    spans = [s for s in spans if not s.empty]
    if not spans:
        return ControlledText("", ())
    runs = [_run(drafter_tokenizer, prompt.ids, s, prompt) for s in spans]
    if paragraph:
        return _joined(runs, _junction, skip_empty=True)
    kept_ids = [int(i) for s in spans for i in prompt.ids[s.begin : s.end]]
    plain = _joined(runs, lambda _left, _right: "", skip_empty=False)
    if plain.text != decode_ids(drafter_tokenizer, kept_ids):
        return decode(drafter_tokenizer, kept_ids)
    return plain


class CeilingMeasured(Protocol):
    @property
    def ceiling_tokens(self) -> int: ...

    @property
    def n_target_tokens(self) -> int: ...


A = TypeVar("A", bound=CeilingMeasured)


class CeilingFit(NamedTuple, Generic[A]):
    """The accepted attempt, the keep ratio it was made with, and attempts used (1-based)."""

    assembly: A
    r_used: float
    attempts: int


def fit_ceiling(
    attempt: Callable[[float], A],
    r_requested: float,
    ceiling: int,
    max_attempts: int = CEILING_ATTEMPTS,
    extra_attempts: int = EXTRA_CEILING_ATTEMPTS,
    limit: int | None = None,
) -> CeilingFit[A]:
    """Run `attempt(keep_ratio)` until its prompt fits the target-token ceiling (§5.8 2-10).

    `attempt` selects and assembles at the given keep ratio and returns something with
    `ceiling_tokens` (an `Assembly`: target tokens minus join overhead). Accept when
    `ceiling_tokens <= ceiling`. Otherwise overflow = ceiling_tokens - ceiling and
    tightened = ceiling - overflow * scale - 1; stop when this was the last attempt or
    tightened <= 0, else retry with r = r_requested * tightened / ceiling (always scaled
    from the requested ratio, not the previous one). The retry absorbs tokenizer mismatch:
    the drafter budget is in drafter tokens, the ceiling in target tokens.

    The first `max_attempts` are the reference's (scale 1). A one-token overflow then
    lowers r by ~1/ceiling, too little to drop a 64-token chunk, so every retry would rebuild
    the same prompt and the request would fail with a 500. Up to `extra_attempts` more follow with the overflow doubled each time
    (scale 2, 4, 8, ...), until a chunk goes.

    `limit` caps the whole served prompt (`n_target_tokens`, join overhead included): the
    target's context minus `max_tokens`. The ceiling leaves the join overhead out (the
    reference's rule), and with many kept spans (a long prompt fitted to a small context)
    that overhead alone can overflow the context; an attempt over `limit` is retried
    like one over the ceiling.

    Contract: the returned attempt is never over the ceiling; when no attempt fits,
    `CompressionFailed("ceiling", "final prompt exceeds target-token ceiling (a > b)")` is
    raised with the last attempt's count. Errors raised by `attempt` propagate.
    """
    if max_attempts < 1:
        raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
    total = max_attempts + max(0, extra_attempts)
    r = r_requested
    measured = 0
    for index in range(total):
        result = attempt(r)
        measured = int(result.ceiling_tokens)
        over = measured - ceiling
        if limit is not None:
            over = max(over, int(result.n_target_tokens) - limit)
        if over <= 0:
            return CeilingFit(result, r, index + 1)
        tightened = ceiling - over * ceiling_retry_scale(index, max_attempts) - 1
        if index >= total - 1 or tightened <= 0:
            break
        r = r_requested * tightened / ceiling
    if limit is not None and measured <= ceiling:
        raise CompressionFailed(
            "ceiling", f"final prompt exceeds the context left for max_tokens ({limit} tokens)"
        )
    raise CompressionFailed(
        "ceiling", f"final prompt exceeds target-token ceiling ({measured} > {ceiling})"
    )


def ceiling_retry_scale(index: int, max_attempts: int) -> int:
    """How many times the overflow of attempt `index` (0-based) the next retry removes:
    1 within the reference's attempts, then doubling."""
    return 1 if index < max_attempts - 1 else 2 ** (index - max_attempts + 2)


# --------------------------------------------------------------------------- recall block


def clean_excerpt(
    text: str,
    *,
    role_markers: Sequence[str] = (),
    end_markers: Sequence[str] = (),
    generic_role: bool = False,
) -> str:
    """One recalled excerpt, stripped of chat structure (§6.2).

    Every role marker (e.g. "<|im_start|>") and end marker (e.g. "<|im_end|>") becomes
    "\\n". For generic-role families (ChatML/Qwen, Gemma) the role name that follows a role
    marker ("user\\n", or a bare name cut off at the excerpt's end) is removed too. The
    result is trimmed; "" means the excerpt is empty and `recall_block` skips it.
    """
    markers = sorted({m for m in (*role_markers, *end_markers) if m}, key=len, reverse=True)
    if not markers:
        return text.strip()
    roles = {m for m in role_markers if m}
    pattern = "|".join(
        re.escape(m) + (r"(?:[^\s<]*(?:\n|\Z))?" if generic_role and m in roles else "")
        for m in markers
    )
    return re.sub(pattern, lambda _: "\n", text).strip()


def recall_block(excerpts: Sequence[str]) -> str:
    """The recall block that opens a new user turn's content (§6.2), or "" if no excerpt.

    ```
    [Earlier in this conversation]
    <excerpt>

    <excerpt>
    [End of earlier excerpts]

    ```
    Excerpts should be `clean_excerpt` output; empty or blank ones are skipped.
    """
    kept = [e for e in excerpts if e.strip()]
    if not kept:
        return ""
    return RECALL_HEADER + RECALL_SEPARATOR.join(kept) + RECALL_FOOTER


def recall_text(
    drafter_tokenizer: Tokenizer,
    drafter_ids: Sequence[int],
    recalled_spans: Sequence[Span],
    *,
    role_markers: Sequence[str] = (),
    end_markers: Sequence[str] = (),
    generic_role: bool = False,
) -> str:
    """Recall block for recalled **drafter** spans: each span decoded and cleaned (§6.2)."""
    excerpts = [
        clean_excerpt(
            decode_ids(drafter_tokenizer, drafter_ids[s.begin : s.end]),
            role_markers=role_markers,
            end_markers=end_markers,
            generic_role=generic_role,
        )
        for s in canonicalize(recalled_spans)
    ]
    return recall_block(excerpts)
