"""The lines of a prompt that frame its documents instead of stating anything a question asks
about: labels ("Document 14:") and instructions on the answer. Passage evidence leaves them
out of its passages (`pflash.compress.evidence.passage_evidence.evidence_passages`)."""

from __future__ import annotations

import re

from pflash.compress.evidence.words import FORM_VERBS, answers_form

# a label line: at most 3 words, the first capitalised, closed by a colon ("Document 14:")
_LABEL = re.compile(r"[A-Z]\w*(?:[ \t]+[\w#()\[\].-]+){0,2}[ \t]*:")
_FRAME_WORDS = re.compile(r"\b(?:questions?|answers?)\b", re.IGNORECASE)
LABEL_MAX_CHARS = 64  # a longer line is no label; bounds the pattern on request text
_LINE = re.compile(r"[^\n]+")


def framing_lines(text: str, begin: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """Character ranges (stripped, source order) of the lines of `text[begin:end]` that frame
    the documents of a prompt instead of stating anything a question asks about:

    - a **label** introducing what follows: at most 3 words, the first capitalised, closed by
      a colon ("Document 14:", "Context:", "Passage 2:"); a label with text after its colon
      ("Title: Rhine") is a line of the document;
    - an **instruction on the answer**: a line that opens with "answer", "reply" or
      "respond" (after an optional "please"; `answers_form`), not as a label ("Answer:
      42"), and names the question or the answer again after it ("Answer the question
      based on the given documents. Only give me the answer and do not output any other
      words.").

    Why: the tap projection ranks such lines first for any question (on RULER's SQuAD
    prompts, the "Document N:" labels and the instruction, written before and after the
    documents, were its best passages while the answer came 33rd), and mixed half and half
    with the sentence embedder they took the room of the answer (docs/BENCHMARK_NOTEBOOK.md).
    They are left out of the passages: no signal lifts them, attention still scores them.
    The instruction's first sentence, when it opens the user's turn, is kept as a question
    by lexical evidence anyway (§4.2)."""
    stop = len(text) if end is None else end
    out = []
    for m in _LINE.finditer(text, begin, stop):
        line = m.group()
        b = m.start() + len(line) - len(line.lstrip())
        e = m.end() - (len(line) - len(line.rstrip()))
        if b >= e:
            continue
        body = text[b:e]
        if len(body) <= LABEL_MAX_CHARS and _LABEL.fullmatch(body):
            out.append((b, e))
        elif _instructs_answer(body):
            out.append((b, e))
    return out


def with_space(text: str, begin: int, end: int) -> tuple[int, int]:
    """`[begin, end)` grown over the whitespace on both sides: the blank lines around a
    label are no passage of their own."""
    while begin > 0 and text[begin - 1].isspace():
        begin -= 1
    while end < len(text) and text[end].isspace():
        end += 1
    return begin, end


def _instructs_answer(line: str) -> bool:
    """`line` opens with an answer-form imperative (not a label) and names the question or
    the answer after its opening word."""
    if not answers_form(line):
        return False
    words = line.split(maxsplit=2)
    if words[0].lower() == "please":
        words = words[1:]
    verb = words[0]
    if verb.endswith(":") or verb.strip(",.;!").lower() not in FORM_VERBS:
        return False
    rest = line[line.find(verb) + len(verb) :]
    return _FRAME_WORDS.search(rest) is not None
