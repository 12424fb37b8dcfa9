"""A sentence that refers back: read, and kept, with the sentence its pronoun stands for.

Why: in documents written the way encyclopedias and reports are, the sentence that answers
often names its subject only by a pronoun: "Homer Jay Simpson is a fictional character of
"The Simpsons". He is voiced by Dan Castellaneta ...". Read alone, the second sentence is
about nobody, so the sentence embedder ranks it below five look-alikes that repeat the
question's words ("a fictional character in the animated television series"), and when it is
kept anyway ("Noted for his role as Homer Simpson, he also voices ..."), the served prompt
has a "he" that points at nothing, the sentence naming him being cut (RULER's qa_2, seed
52902, traced in docs/BENCHMARK_NOTEBOOK.md). Two pure steps fix both ends, the way the code
blocks' header is read with their body:

- `passage_antecedents` (prepare and finish): for each passage, where the sentence it refers
  back to starts, or -1. A passage refers back when it opens a sentence that is not the
  first of its line and the first `LEAD_WORDS` words of that sentence hold a third-person
  pronoun before any name ("He is voiced by", "Noted for his role as Homer Simpson"); its
  antecedent is the sentence naming the subject: the nearest before it in the same line
  that does not refer back itself, at most `MAX_HOPS` sentences back. The embedder reads
  the passage after the antecedent's first `ANTECEDENT_MAX_CHARS` characters
  (`antecedent_prefix`).
- `lift_antecedents` (finish): the passages of the antecedent score at least the referring
  passage's score, so a kept "he" comes with the sentence naming him.

Lexical evidence (`lexical._referents`) anchors the antecedent of a referring best hit just
below it.

Bounded: each passage reads back at most `MAX_HOPS` sentences of at most `MAX_BACK`
characters, each character once (a scan back that stops at the first sentence end), so the
steps are linear in the text; scores only rise.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Sequence

import numpy as np

from pflash.compress.text.sentences import ends_sentence

LEAD_WORDS = 6  # a pronoun this early is the sentence's subject or its possessor
ANTECEDENT_MAX_CHARS = 200  # of the antecedent, read before the passage: its subject is first
MAX_BACK = 1000  # characters a passage reads back for its antecedent, per sentence
MAX_HOPS = 3  # sentences back, over those that refer back themselves
HEAD_CHARS = 80  # of a sentence, read for its first `LEAD_WORDS` words
PRONOUNS = frozenset("he she it they his her its their him them".split())
_WORD = re.compile(r"[A-Za-z][A-Za-z'-]*")


def refers_back(sentence_head: str) -> bool:
    """Whether a sentence opening with `sentence_head` names its subject by a third-person
    pronoun: one of its first `LEAD_WORDS` words is a pronoun, and no capitalised word other
    than the opening one comes before it (a name stated first is the subject: "Voiced by Dan
    Castellaneta, he ...")."""
    for k, m in enumerate(_WORD.finditer(sentence_head)):
        if k >= LEAD_WORDS:
            return False
        word = m.group()
        if word.lower() in PRONOUNS:
            return True
        if k > 0 and word[0].isupper():
            return False
    return False


def _follows_sentence(text: str, at: int) -> int:
    """Where the sentence ending just before `at` (the first visible character of a
    passage) ends, when only spaces stand between it and `at` and `at` opens a sentence of the
    same line; -1 otherwise."""
    j = at
    while j > 0 and text[j - 1] in " \t":
        j -= 1
    if j == 0 or j == at or not text[at].isupper():
        return -1
    return j if _ends_at(text, j) else -1


def _ends_at(text: str, j: int) -> bool:
    """A sentence mark, maybe closed by a few `CLOSERS`, ends just before `j` (a bounded
    window: the scans call it once per word they pass)."""
    return j > 0 and not text[j - 1].isspace() and ends_sentence(text[max(0, j - 4) : j])


def _sentence_start(text: str, end: int) -> int:
    """The first visible character of the sentence ending at `end`, within its line and at
    most `MAX_BACK` characters back. A mark followed by a lower-case word ends nothing ("Ned
    Flanders, Jr. is a recurring character"). A scan back that stops at the first sentence
    end, each character read once: the sentence is usually short."""
    lo = max(0, end - MAX_BACK)
    i, start = end - 1, lo
    while i > lo:
        c = text[i]
        if c == "\n":
            start = i + 1
            break
        if not (c.isspace() and not text[i + 1].isspace()):
            i -= 1
            continue
        j = i  # the start of the run of spaces before the word at i + 1
        while j > lo and text[j - 1] in " \t":
            j -= 1
        if not text[i + 1].islower() and _ends_at(text, j):
            start = i + 1
            break
        i = j - 1
    while start < end and text[start].isspace():
        start += 1
    return start


def passage_antecedents(text: str, spans: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
    """For each passage (char spans, source order), the char span of the sentence its
    opening pronoun stands for (`refers_back`), or (-1, -1): the nearest sentence before it
    in its line that does not refer back itself, at most `MAX_HOPS` sentences back ("The
    Morpeth Arms is a public house. It was built in 1845. It now contains a Spying Room":
    the first, not the second)."""
    out = []
    for b, e in spans:
        first = b + len(text[b:e]) - len(text[b:e].lstrip())
        end = _follows_sentence(text, first) if first < e else -1
        if end < 0 or not refers_back(text[first : min(e, first + HEAD_CHARS)]):
            out.append((-1, -1))
            continue
        start = _sentence_start(text, end)
        for _ in range(MAX_HOPS - 1):
            before = _follows_sentence(text, start) if start < end else -1
            if before < 0 or not refers_back(text[start : min(end, start + HEAD_CHARS)]):
                break
            start, end = _sentence_start(text, before), before
        out.append((start, end) if start < end else (-1, -1))
    return out


def antecedent_prefix(text: str, antecedent: tuple[int, int]) -> str:
    """What the embedder reads before a referring passage: the antecedent's first
    `ANTECEDENT_MAX_CHARS` characters (its subject comes first), or nothing."""
    a, end = antecedent
    return text[a : min(end, a + ANTECEDENT_MAX_CHARS)].strip() + " " if a >= 0 else ""


def lift_antecedents(
    spans: Sequence[tuple[int, int]], values: np.ndarray, found: Sequence[tuple[int, int]]
) -> np.ndarray:
    """Per-passage scores where every passage of a referring passage's antecedent (`found`:
    `passage_antecedents` of `spans`, found once for every signal over these passages)
    scores at least the referring passage's (the latest referring passage first: a lifted
    antecedent's own score is what lifts further). Without referring passages, unchanged."""
    out = np.asarray(values, dtype=np.float64).copy()
    begins = [b for b, _ in spans]
    for i in range(len(spans) - 1, -1, -1):
        a, end = found[i]
        if a < 0:
            continue
        first = max(0, bisect.bisect_right(begins, a) - 1)
        for h in range(first, i):
            if spans[h][1] > a and spans[h][0] < end:
                out[h] = max(out[h], out[i])
    return out
