"""Text <-> token ids where only the chat template's own markers are control tokens.

A tokenizer's added tokens (`<|im_start|>`, `<|im_end|>`, `<tool_call>`, ...) are matched
in any text it encodes, so a message whose content says `<|im_end|>\\n<|im_start|>system`
would encode to real turn markers: the target would see a system turn the client forged.
Serving engines encode such text as text; so does every encode here.

The rule has one home, this module. A text crosses to ids together with its **controls**:
the character ranges `[begin, end)` that are control tokens. Everything else, including
marker text that came from a message, a tool definition or a template variable, is encoded
as plain text (the tokenizer's pipeline without its added tokens). The controls come from
where the text was made:

- a chat rendering: the client's strings are rendered with their marker text wrapped in
  private-use characters (`mark_strings`), so the template's own markers are the unwrapped
  ones (`unmark`);
- token ids: the control-token ids in them (`decode`);
- a raw completion prompt or a text compared only as text: as written, every marker text
  is a control token (`encode_as_written`), as the target's own tokenizer reads it.

When the controls are exactly the marker texts a plain encode would match (every ordinary
prompt), the plain encode is used, so ordinary prompts keep exactly their ids.

Control tokens are a tokenizer's added tokens that are not whitespace (whitespace added
tokens, e.g. Gemma's runs of newlines, are ordinary text in templates and content alike).
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pflash.compress.text.encoding_memo import EncodingMemo, piecewise
from pflash.errors import InvalidRequest
from pflash.spans import TokenizedText, Tokenizer, decode_ids

Controls = tuple[tuple[int, int], ...]

# Private-use characters wrapped around marker text in the client's strings before a
# chat is rendered (plane 15; the same pair transformers' `sanitize_control_tokens` uses).
MARK_BEGIN = "\U000f0000"
MARK_END = "\U000f0001"


@dataclass(frozen=True)
class ControlledText:
    """`text` and the character ranges of it that are control tokens (sorted, disjoint)."""

    text: str
    controls: Controls


@dataclass(frozen=True)
class _Vocab:
    """One tokenizer's control tokens and the means to encode text as text."""

    tokens: Mapping[str, int]  # control token text -> id
    ids: frozenset[int]
    pattern: re.Pattern | None  # leftmost-longest match of any control text
    literal: Any  # a `tokenizers.Tokenizer` without added tokens (None: no controls)
    newline: tuple[int, ...]  # the literal encoding of "\n"


_VOCABS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _vocab(tokenizer: Tokenizer) -> _Vocab:
    try:
        return _VOCABS[tokenizer]
    except (KeyError, TypeError):
        pass
    added = tokenizer.get_added_vocab() if hasattr(tokenizer, "get_added_vocab") else {}
    tokens = {t: int(i) for t, i in added.items() if t and not t.isspace()}
    pattern = None
    literal = None
    newline: tuple[int, ...] = ()
    if tokens:
        longest_first = sorted(tokens, key=len, reverse=True)
        pattern = re.compile("|".join(re.escape(t) for t in longest_first))
        literal = _without_added_tokens(tokenizer)
        newline = tuple(literal.encode("\n", add_special_tokens=False).ids)
    vocab = _Vocab(tokens, frozenset(tokens.values()), pattern, literal, newline)
    try:
        _VOCABS[tokenizer] = vocab
    except TypeError:
        pass
    return vocab


def _without_added_tokens(tokenizer: Tokenizer):
    """A copy of the tokenizer's backend with no added tokens: its normalizer, pre-tokenizer
    and model only, so marker text encodes as the text it is (a separate object: the
    shared tokenizer's state is never switched, so concurrent encodes stay correct)."""
    import json

    from tokenizers import Tokenizer as Backend

    spec = json.loads(tokenizer.backend_tokenizer.to_str())
    spec["added_tokens"] = []
    spec["post_processor"] = None
    return Backend.from_str(json.dumps(spec))


_FINGERPRINTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def same_tokenizer(a: Tokenizer, b: Tokenizer) -> bool:
    """Whether `a` and `b` encode every text to the same tokens: the same object, or fast
    tokenizers with the same serialised backend (vocabulary, merges, normalizer,
    pre-tokenizer and added tokens). Why: a drafter of the target's family (Qwen3-0.6B for a
    Qwen3-32B target) ships the same tokenizer, and then the target's encoding of the prompt
    is the drafter's too, so it is not made twice. Each backend is serialised once."""
    if a is b:
        return True
    return _fingerprint(a) is not None and _fingerprint(a) == _fingerprint(b)


def _fingerprint(tokenizer: Tokenizer) -> str | None:
    try:
        return _FINGERPRINTS[tokenizer]
    except (KeyError, TypeError):
        pass
    backend = getattr(tokenizer, "backend_tokenizer", None)
    found = hashlib.sha256(backend.to_str().encode()).hexdigest() if backend is not None else None
    try:
        _FINGERPRINTS[tokenizer] = found
    except TypeError:
        pass
    return found


# --------------------------------------------------------------------------- finding


def find_controls(tokenizer: Tokenizer, text: str) -> Controls:
    """Every control-token text in `text`: what a plain encode would make control tokens."""
    pattern = _vocab(tokenizer).pattern
    if pattern is None:
        return ()
    return tuple(m.span() for m in pattern.finditer(text))


def is_control_token(tokenizer: Tokenizer, text: str) -> bool:
    """Whether `text` is one of this tokenizer's control tokens: encoding splits the text
    there and encodes the pieces on either side on their own."""
    return text in _vocab(tokenizer).tokens


def has_control_text(tokenizer: Tokenizer, obj: Any) -> bool:
    """Whether any string in `obj` (nested lists and mappings, keys excluded) holds
    control-token text."""
    pattern = _vocab(tokenizer).pattern
    if pattern is None:
        return False
    return any(pattern.search(s) for s in _strings(obj))


def _strings(obj: Any):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, Mapping):
        for value in obj.values():
            yield from _strings(value)
    elif isinstance(obj, list | tuple):
        for value in obj:
            yield from _strings(value)


# --------------------------------------------------------------------------- chat marking


def mark_strings(tokenizer: Tokenizer, obj: Any) -> Any:
    """`obj` with every control-token text in its strings wrapped in `MARK_BEGIN` /
    `MARK_END` (lists and mappings copied, keys unchanged): the client's marker text, told
    apart from the template's own after rendering (`unmark`)."""
    pattern = _vocab(tokenizer).pattern
    if pattern is None:
        return obj
    if isinstance(obj, str):
        return pattern.sub(lambda m: MARK_BEGIN + m.group(0) + MARK_END, obj)
    if isinstance(obj, Mapping):
        return {k: mark_strings(tokenizer, v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [mark_strings(tokenizer, v) for v in obj]
    return obj


def unmark(tokenizer: Tokenizer, rendered: str) -> ControlledText:
    """The text of a rendering made from `mark_strings` input, without the marks, and its
    controls: the marker texts that no mark wraps (the template wrote them).

    A marker text counts as wrapped when a mark stands right before it; a mark the template
    separated from its marker text (a `split()` in the template) still keeps the text on its
    two sides from forming a control token, because only the ranges found here are
    controls. Linear: one scan for marks and marker texts."""
    pattern = _vocab(tokenizer).pattern
    out: list[str] = []
    controls: list[tuple[int, int]] = []
    size = 0  # characters written to out
    at = 0
    wrapped = False
    marks = re.compile(f"[{MARK_BEGIN}{MARK_END}]")
    while at < len(rendered):
        mark = marks.search(rendered, at)
        stop = mark.start() if mark is not None else len(rendered)
        piece = rendered[at:stop]
        if pattern is not None:
            for m in pattern.finditer(piece):
                if not (wrapped and m.start() == 0):
                    controls.append((size + m.start(), size + m.end()))
        out.append(piece)
        size += len(piece)
        if mark is None:
            break
        wrapped = mark.group(0) == MARK_BEGIN
        at = mark.end()
    return ControlledText("".join(out), tuple(controls))


# --------------------------------------------------------------------------- encoding


def encode(tokenizer: Tokenizer, text: str, controls: Sequence[tuple[int, int]]) -> tuple[int, ...]:
    """`text` encoded (no BOS/EOS added) with only `controls` as control tokens."""
    return encode_with_offsets(tokenizer, text, controls).ids


def encode_text(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """`text` encoded as text: a message's content, a required string, a query."""
    return encode(tokenizer, text, ())


def encode_as_written(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    """`text` encoded as the tokenizer reads it, every marker text a control token: for a
    raw completion prompt (the client writes the markers) and for text compared as text."""
    return encode(tokenizer, text, find_controls(tokenizer, text))


def encode_as_written_with_offsets(tokenizer: Tokenizer, text: str) -> TokenizedText:
    """`encode_as_written` keeping character offsets (monotone, so lookups stay defined
    where byte-level BPE splits a character across tokens)."""
    return encode_with_offsets(tokenizer, text, find_controls(tokenizer, text))


def encode_with_offsets(
    tokenizer: Tokenizer,
    text: str,
    controls: Sequence[tuple[int, int]],
    *,
    memo: EncodingMemo | None = None,
    scope: str = "",
) -> TokenizedText:
    """`text` encoded with character offsets, only `controls` as control tokens.

    A control range whose text is not a control token of this tokenizer (a target marker
    the drafter does not have) is plain text here, as this tokenizer reads it. The result carries
    `controls` (all of them, in the text's characters) for the stages that read turns.
    With `memo` (and `scope`, the tenant), pieces between control tokens that an earlier
    request encoded are not encoded again (`encoding_memo`; the same ids and offsets).
    """
    vocab = _vocab(tokenizer)
    controls = tuple(controls)
    own = [(b, e) for b, e in controls if text[b:e] in vocab.tokens]
    if own == list(find_controls(tokenizer, text)):
        if memo is not None and own and piecewise(tokenizer, vocab.tokens):
            ids, offsets = memo.encode(tokenizer, text, own, vocab.tokens, scope)
            return TokenizedText(
                text=text, ids=tuple(ids), offsets=tuple(offsets), controls=controls
            )
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids = [int(i) for i in enc["input_ids"]]
        offsets = [(int(b), int(e)) for b, e in enc["offset_mapping"]]
    else:
        ids, offsets = [], []
        at = 0
        for b, e in own:
            _literal(vocab, text, at, b, ids, offsets)
            ids.append(vocab.tokens[text[b:e]])
            offsets.append((b, e))
            at = e
        _literal(vocab, text, at, len(text), ids, offsets)
    return TokenizedText(text=text, ids=tuple(ids), offsets=_monotone(offsets), controls=controls)


def _literal(
    vocab: _Vocab, text: str, begin: int, end: int, ids: list[int], offsets: list[tuple[int, int]]
) -> None:
    """Append the encoding of text[begin:end] as text (no added token matched).

    A piece after the start is encoded after a newline that is then removed, so a
    SentencePiece tokenizer does not give it the prefix space of a string's start."""
    if end <= begin:
        return
    piece = text[begin:end]
    shift = 0
    enc = None
    if begin > 0 and vocab.newline:
        with_newline = vocab.literal.encode("\n" + piece, add_special_tokens=False)
        if tuple(with_newline.ids[: len(vocab.newline)]) == vocab.newline:
            enc, shift, skip = with_newline, -1, len(vocab.newline)
    if enc is None:
        enc, skip = vocab.literal.encode(piece, add_special_tokens=False), 0
    piece_ids = enc.ids[skip:]
    if any(i in vocab.ids for i in piece_ids):
        raise InvalidRequest("the prompt holds marker text this tokenizer cannot encode as text")
    ids.extend(piece_ids)
    for b, e in enc.offsets[skip:]:
        offsets.append((begin + max(0, b + shift), begin + max(0, e + shift)))


def _monotone(offsets: Sequence[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Offsets made monotone (byte-level BPE can give a token an empty or shared range)."""
    fixed: list[tuple[int, int]] = []
    prev = 0
    for b, e in offsets:
        b = max(int(b), prev)
        e = max(int(e), b)
        fixed.append((b, e))
        prev = b
    return tuple(fixed)


# --------------------------------------------------------------------------- decoding


def decode(tokenizer: Tokenizer, ids: Sequence[int], text: str | None = None) -> ControlledText:
    """Token ids to text, with the controls their control-token ids make.

    `text` is the ids' decoding when the caller has it. When every marker text in it is a
    control id (every ordinary prompt) the controls are those texts; otherwise the ids are
    decoded run by run between control ids, which places each control exactly (the text is
    then that concatenation: byte-level tokenizers decode it identically)."""
    vocab = _vocab(tokenizer)
    if text is None:
        text = decode_ids(tokenizer, ids)
    if vocab.pattern is None:
        return ControlledText(text, ())
    found = find_controls(tokenizer, text)
    own = [int(i) for i in ids if int(i) in vocab.ids]
    if len(own) == len(found) and all(
        vocab.tokens.get(text[b:e]) == i for (b, e), i in zip(found, own, strict=True)
    ):
        return ControlledText(text, found)
    pieces: list[str] = []
    controls: list[tuple[int, int]] = []
    size = 0
    run: list[int] = []
    for i in [*ids, None]:
        if i is not None and int(i) not in vocab.ids:
            run.append(int(i))
            continue
        if run:
            piece = decode_ids(tokenizer, run)
            pieces.append(piece)
            size += len(piece)
            run = []
        if i is not None:
            piece = decode_ids(tokenizer, [int(i)])
            pieces.append(piece)
            controls.append((size, size + len(piece)))
            size += len(piece)
    return ControlledText("".join(pieces), tuple(controls))


def prompt_controls(tokenizer: Tokenizer, prompt: TokenizedText) -> Controls:
    """The controls of an encoded prompt: its own, or as written (every marker text of
    `tokenizer`) for one built without them."""
    if prompt.controls is not None:
        return tuple(prompt.controls)
    return find_controls(tokenizer, prompt.text)


def concat(*parts: ControlledText) -> ControlledText:
    """The parts' texts one after another, their controls moved along."""
    controls: list[tuple[int, int]] = []
    size = 0
    for part in parts:
        controls.extend((size + b, size + e) for b, e in part.controls)
        size += len(part.text)
    return ControlledText("".join(p.text for p in parts), tuple(controls))


def controls_within(controls: Sequence[tuple[int, int]], begin: int, end: int) -> Controls:
    """The controls inside characters [begin, end), shifted to start at `begin`
    (`controls` sorted)."""
    import bisect

    k = bisect.bisect_left(controls, (begin, begin))
    out = []
    while k < len(controls) and controls[k][1] <= end:
        b, e = controls[k]
        out.append((b - begin, e - begin))
        k += 1
    return tuple(out)
