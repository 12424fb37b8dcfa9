"""Which content words two texts share: the check behind every "asked in other words" case.

Why here and not only in the tests: the non-literal families (`pflash_lab.corpus.nonliteral`)
must *generate* questions that share no content word with their evidence — a function
description is usable only if no word of it occurs anywhere in that function's source —
and the tests must check the same property with the same rule, so the rule has one home.

The comparison is deliberately crude and errs towards "shared": a few suffixes are cut and
two words count as one when their first 4-6 letters agree ("located" ~ "locations",
"week" ~ "weekday"), so an inflection or a compound never slips through as a new word.
Every stop word here is one for the lexical anchors too (`pflash.compress.evidence.words`; a unit
test checks it): a word ignored here but not there ("among" once) let an anchor find a
docstring that "shares no content word" with its question.
"""

from __future__ import annotations

import re

STOPWORDS = frozenset(
    """
    a an the of in on at to for from by with about as into out up down over under after
    before between through during against off
    is are was were be been being am do does did doing has have had having will would
    shall should can could may might must it its itself this that these those there here what
    which who whom whose when where why how if than then so and or but not no nor
    each any all some both such more most few own other
    i me my you your he him his she her we us our they them their just only also
    very too again still one ones
    """.split()
)


def content_words(text: str, ignore: tuple[str, ...] = ()) -> set[str]:
    """Lower-case words of `text` (camelCase and snake_case split), minus stop words,
    single letters, numbers and the words of `ignore` (answer values a question may not
    contain anyway)."""
    text = re.sub(r"([a-z])([A-Z])", r"\1 \2", text)
    ignored = {w for v in ignore for w in re.findall(r"[a-z0-9]+", v.lower())}
    return {
        w
        for w in re.findall(r"[a-z0-9]+", text.lower())
        if len(w) > 1 and w not in STOPWORDS and not w.isdigit() and w not in ignored
    }


def _stem(word: str) -> str:
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and not word.endswith("ss") and len(word) - len(suffix) >= 3:
            return word[: -len(suffix)]
    return word


def same_word(a: str, b: str) -> bool:
    """Whether two words count as one: equal stems when a stem is under 4 letters, else the
    same first min(len, 6) letters of the stems ("employed" ~ "employees")."""
    a, b = _stem(a), _stem(b)
    k = min(len(a), len(b), 6)
    return a[:k] == b[:k] if k >= 4 else a == b


def shared_words(question: str, evidence: str, ignore: tuple[str, ...] = ()) -> set[tuple]:
    """The (question word, evidence word) pairs that count as the same word."""
    q, e = content_words(question, ignore), content_words(evidence, ignore)
    return {(x, y) for x in q for y in e if same_word(x, y)}
