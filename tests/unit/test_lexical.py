"""Lexical evidence (pflash/compress/evidence/: lexical.py, anchors.py, words.py): anchors, the
question pool, the cascade, headers, the words and units they read.

Prompts are built the way users send them (chat messages rendered and planned by
`prepare` with the real SmolLM2 tokenizer); what is asserted is which text gets anchored.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pflash.compress.evidence.anchors import quoted_patterns
from pflash.compress.evidence.lexical import LexicalParams, find_lexical_evidence
from pflash.compress.evidence.words import (
    is_question_like,
    key_words,
    names_something,
    normalize,
    split_units,
    units_before,
    words,
)
from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.config import build_config

NEEDLE = "The special magic quokka number is: 7318842."
QUESTION = "What is the special magic quokka number?"


def _filler(chars: int = 12000) -> str:
    return open("/usr/share/common-licenses/GPL-3").read()[:chars]


def _prepared(tokenizer, content: str, *, earlier: tuple[dict, ...] = (), **cfg):
    config = build_config(
        {"mode": "always", "keep_ratio": 0.1, "select_chunk_size": 64, **cfg}, env={}
    )
    messages = [
        {"role": "system", "content": "Answer briefly."},
        *earlier,
        {"role": "user", "content": content},
    ]
    ids = tuple(tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"])
    inp = CompressionRequest(
        RenderedPrompt("chat", tuple(ids), tokenizer, messages=messages),
        max_output=64,
        max_context=16384,
    )
    prepared = prepare(inp, config=config, target_tokenizer=tokenizer, drafter_tokenizer=tokenizer)
    assert prepared.compress
    return prepared


def _evidence(prepared, mode="anchors", query="question", cap_tokens=None, **params):
    return find_lexical_evidence(
        prepared.plan,
        pinned=prepared.budget.pinned,
        params=LexicalParams(mode=mode, query=query, cap_tokens=cap_tokens, **params),
        pflash_query=prepared.input.pflash_query,
    )


def _text(prepared, span) -> str:
    d = prepared.plan.drafter
    b, e = d.char_span(span)
    return d.text[b:e].strip()


def _with_needle(doc: str, needle: str = NEEDLE) -> str:
    mid = doc.index("\n\n", len(doc) // 2)
    return doc[:mid] + "\n\n" + needle + doc[mid:]


# ----------------------------------------------------------------------------- words


def test_plural_and_case_variants_normalize_to_one_word():
    assert normalize("Entries") == normalize("entry") == "entry"
    assert normalize("numbers") == normalize("Number") == "number"
    assert normalize("class") == "class" and normalize("status") == "status"
    assert normalize("7318842") == "7318842"


def test_words_carry_offsets_and_flag_stopwords():
    text = "What is the quokka_id of Zoë?"
    ws = words(text)
    assert [text[w.begin : w.end] for w in ws] == ["What", "is", "the", "quokka_id", "of", "Zoë"]
    assert [w.stop for w in ws] == [True, True, True, False, True, False]


def test_units_split_at_lines_and_sentence_ends():
    text = "First one. Second one!\n  indented line\n\nlast? tail"
    units = [text[b:e] for b, e in split_units(text)]
    assert units == ["First one.", "Second one!", "indented line", "last?", "tail"]


@pytest.mark.parametrize(
    ("sentence", "asks"),
    [
        ("What is the special magic quokka number?", True),
        ("the value please?", True),
        ("List every port the server opens.", True),
        ("When we speak of free software, we are referring to freedom, not", False),
        ("return total / count", False),
        ("What we call freedom is the freedom to", False),
    ],
)
def test_question_like_sentences(sentence, asks):
    assert is_question_like(sentence) is asks


# ----------------------------------------------------------------------------- anchors


@pytest.mark.parametrize("where", ["after", "before", "middle"])
def test_needle_sharing_a_rare_key_with_the_question_is_the_top_anchor(smollm2_tokenizer, where):
    doc = _with_needle(_filler())
    if where == "after":
        content = doc + "\n\n" + QUESTION
    elif where == "before":
        content = QUESTION + "\n\n" + doc
    else:
        cut = doc.index("\n\n", len(doc) // 4)
        content = doc[:cut] + "\n\n" + QUESTION + "\n\n" + doc[cut:]
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    assert ev.units, "the needle shares 'quokka' with the question"
    assert _text(prepared, ev.units[0].span) == NEEDLE
    assert ev.units[0].hop == 0 and ev.units[0].reason == "anchor"
    assert [_text(prepared, s) for s in ev.question] == [QUESTION]
    scores = [u.score for u in ev.units]
    assert scores == sorted(scores, reverse=True)


def test_a_question_inside_the_document_is_found_among_docstring_orders(smollm2_tokenizer):
    """Pasted docstrings open with imperatives and ask their own "?" questions; only the
    turn's edges and a question set as its own paragraph make the pool."""
    lines = [f"Return the {w} of the turtle pen. Does it support {w} mode?" for w in _WORDS]
    head, tail = "\n".join(lines[:20]), "\n".join(lines[20:])
    content = (
        f"Read the document below.\n\n{head}\n{NEEDLE}\n{tail}\n\n{QUESTION}\n\n"
        f"{tail}\n\nAnswer the question given inside the document."
    )
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    assert [_text(prepared, s) for s in ev.question] == [
        QUESTION,
        "Answer the question given inside the document.",
    ]
    assert _text(prepared, ev.units[0].span) == NEEDLE


_WORDS = (
    "colour width shape speed heading position stretch outline tilt fill visibility "
    "undo buffer delay tracer mode screen canvas title cursor radius extent steps angle "
    "origin scale stamp marker trail shadow ink brush"
).split()


def test_tail_query_misses_a_question_placed_before_the_document(smollm2_tokenizer):
    """The reference's pool (the last tokens of the turn) cannot see an early question."""
    prepared = _prepared(smollm2_tokenizer, QUESTION + "\n\n" + _with_needle(_filler()))
    tail = _evidence(prepared, query="tail")
    assert tail.question == ()
    assert not any(_text(prepared, u.span) == NEEDLE for u in tail.units)
    assert _text(prepared, _evidence(prepared).units[0].span) == NEEDLE


def test_explicit_pflash_query_words_anchor(smollm2_tokenizer):
    doc = _with_needle(_filler(), "The wombat registry code is 55120.")
    prepared = _prepared(smollm2_tokenizer, doc + "\n\nPlease help.")
    assert not any("wombat" in _text(prepared, u.span) for u in _evidence(prepared).units)
    ev = find_lexical_evidence(
        prepared.plan,
        pinned=prepared.budget.pinned,
        params=LexicalParams(),
        pflash_query="wombat registry",
    )
    assert _text(prepared, ev.units[0].span) == "The wombat registry code is 55120."


def test_stopword_only_overlap_anchors_nothing(smollm2_tokenizer):
    doc = "\n".join(
        f"Line {i}: it is what they were about to do, and so it was." for i in range(60)
    )
    prepared = _prepared(smollm2_tokenizer, doc + "\n\nWhat is it that they were about to do?")
    ev = _evidence(prepared, mode="cascade")
    assert ev.units == ()
    assert ev.query_pool  # the question itself is still found


def test_a_word_in_many_units_is_no_anchor(smollm2_tokenizer):
    doc = "\n".join(f"Record {i}: the ledger balance moved by {i * 7} units." for i in range(80))
    prepared = _prepared(smollm2_tokenizer, doc + "\n\nWhat does the ledger say?")
    assert _evidence(prepared).units == ()


def test_several_values_under_one_key_are_all_anchored(smollm2_tokenizer):
    doc = _filler(16000)
    values = ["4417", "9023", "1188", "6650"]
    paras = doc.split("\n\n")
    step = len(paras) // (len(values) + 1)
    for k, v in enumerate(values, start=1):
        paras.insert(
            k * step + k - 1, f"One of the special magic numbers for ochre-lantern is: {v}."
        )
    content = "\n\n".join(paras) + "\n\nWhat are all the special magic numbers for ochre-lantern?"
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    top = {_text(prepared, u.span) for u in ev.units[: len(values)]}
    assert top == {f"One of the special magic numbers for ochre-lantern is: {v}." for v in values}


def test_lines_repeating_a_question_phrase_anchor_in_the_lowest_tier(smollm2_tokenizer):
    """A counting question names the log lines it is about; they are many, so no single
    line is a key, but they still rank before attention (after any key anchor)."""
    paras = _filler(12000).split("\n\n")
    words_ = ["amber", "birch", "cedar", "delta"] * 5
    for k, w in enumerate(words_):
        paras.insert(1 + k * (len(paras) // len(words_)), f"Keyword log entry: {w}.")
    paras.insert(len(paras) // 2, NEEDLE)
    content = "\n\n".join(paras) + (
        "\n\nWhich keywords appear most often in the keyword log entries? " + QUESTION
    )
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    texts = [_text(prepared, u.span) for u in ev.units]
    assert texts[0] == NEEDLE  # the key anchor first
    logs = [t for t in texts if t.startswith("Keyword log entry:")]
    assert len(logs) == len(words_)
    needle_score = ev.units[0].score
    assert all(
        u.score < needle_score / 100 for u in ev.units[1:] if _text(prepared, u.span) in logs
    )


def test_repeated_phrase_lines_rank_before_singletons_in_the_lowest_tier(smollm2_tokenizer):
    """When more lines share the question's phrase than the budget holds, the lines repeated
    word for word come first (document order used to decide), the singletons after them."""
    paras = _filler(12000).split("\n\n")
    frequent = ["amber", "birch", "cedar"] * 4
    singles = ["delta", "ember", "fjord", "grove", "heath", "inlet", "jetty", "knoll"]
    lines = [f"Keyword log entry: {w}." for w in singles[:4] + frequent + singles[4:]]
    for k, line in enumerate(lines):
        paras.insert(1 + k * (len(paras) // len(lines)), line)
    content = "\n\n".join(paras) + (
        "\n\nWhich 3 keywords appear most often in the keyword log entries? Name them."
    )
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    logs = [_text(prepared, u.span) for u in ev.units]
    logs = [t for t in logs if t.startswith("Keyword log entry:")]
    assert len(logs) == len(lines)
    assert {t.split(": ")[1][:-1] for t in logs[: len(frequent)]} == set(frequent[:3])
    assert logs[len(frequent) :] == [f"Keyword log entry: {w}." for w in singles]


# ----------------------------------------------------------------------------- cascade

CHAIN = [
    "VAR ABCDE = 12345.",
    "VAR FGHIJ = VAR ABCDE.",
    "VAR KLMNO = VAR FGHIJ.",
    "VAR PQRTU = VAR KLMNO.",
]
DISTRACTOR = [
    "VAR ZYXWV = 67890.",
    "VAR UTRQP = VAR ZYXWV.",
    "VAR ONMLK = VAR UTRQP.",
    "VAR JIHGF = VAR ONMLK.",
]
CHAIN_QUESTION = "Find all variables that are assigned the value 12345."


def _spread_prompt(tokenizer, lines, question: str, chars: int = 16000):
    """`lines` spread evenly through licence filler, then `question`."""
    paras = _filler(chars).split("\n\n")
    step = len(paras) // (len(lines) + 1)
    for k, line in enumerate(lines, start=1):
        paras.insert(k * step + k - 1, line)
    return _prepared(tokenizer, "\n\n".join(paras) + "\n\n" + question)


def _chain_prompt(tokenizer):
    lines = [x for pair in zip(CHAIN, DISTRACTOR, strict=True) for x in pair]
    return _spread_prompt(tokenizer, lines, CHAIN_QUESTION)


def test_cascade_follows_a_three_hop_chain_and_leaves_the_distractor(smollm2_tokenizer):
    prepared = _chain_prompt(smollm2_tokenizer)
    ev = _evidence(prepared, mode="cascade", rare_max_freq=2, cascade_iters=3)
    hops = {_text(prepared, u.span): u.hop for u in ev.units}
    assert [hops.get(line) for line in CHAIN] == [0, 1, 2, 3]
    assert not set(DISTRACTOR) & set(hops)
    by_line = {_text(prepared, u.span): u.score for u in ev.units}
    assert by_line[CHAIN[0]] > by_line[CHAIN[1]] > by_line[CHAIN[2]] > by_line[CHAIN[3]]


def test_anchors_alone_keep_only_the_first_hop(smollm2_tokenizer):
    prepared = _chain_prompt(smollm2_tokenizer)
    texts = {_text(prepared, u.span) for u in _evidence(prepared, mode="anchors").units}
    assert CHAIN[0] in texts and not set(CHAIN[1:]) & texts


def test_cascade_stops_after_the_configured_rounds(smollm2_tokenizer):
    prepared = _chain_prompt(smollm2_tokenizer)
    texts = {
        _text(prepared, u.span) for u in _evidence(prepared, mode="cascade", cascade_iters=1).units
    }
    assert set(CHAIN[:2]) <= texts and not set(CHAIN[2:]) & texts


def test_a_cascade_round_over_the_cap_is_reverted(smollm2_tokenizer):
    prepared = _chain_prompt(smollm2_tokenizer)
    direct = _evidence(prepared, mode="anchors")
    anchored = sum(len(u.span) for u in direct.units)
    capped = _evidence(prepared, mode="cascade", cap_tokens=anchored)
    assert {u.span for u in capped.units} == {u.span for u in direct.units}


# ----------------------------------------------------------------------------- code headers

CODE = '''
class Archive:
    """A bundle of stored files."""

    def open_member(self, name):
        """Open one stored file of the bundle for reading."""
        return self._members[name].open()

    def rolling_checksum(self, data):
        """Compute the rolling adler checksum of one block.

        The window slides by one byte at a time.
        """
        total = 1
        for byte in data:
            total = (total + byte) % 65521
        return total

    def close(self):
        """Release the file handle."""
        self._handle.close()


def parse_header(line):
    """Split a raw header line into its name and value."""
    name, _, value = line.partition(":")
    return name.strip(), value.strip()


def merge_settings(base, extra):
    """Overlay user settings on the defaults, key by key."""
    out = dict(base)
    out.update(extra)
    return out
'''


def test_header_rule_keeps_the_def_line_above_a_matched_docstring_line(smollm2_tokenizer):
    filler = "\n".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(40))
    content = (
        filler
        + CODE
        + '\nWhich function says "The window slides by one byte at a time"? Give its name.'
    )
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    texts = [_text(prepared, u.span) for u in ev.units]
    hit = texts.index("The window slides by one byte at a time.")
    header = texts.index("def rolling_checksum(self, data):")
    assert ev.units[header].reason == "header"
    assert ev.units[header].score < ev.units[hit].score
    assert header == hit + 1  # ranked right after its hit


# ----------------------------------------------------------------------------- keys


@pytest.mark.parametrize(
    "raw, opens, expected",
    [
        ("Zeinka", False, True),  # a name inside a sentence
        ("Zeinka", True, False),  # ... or a sentence's first word: cannot tell, so no
        ("ABCDE", True, True),
        ("McAllister", True, True),
        ("12345", False, True),
        ("get_data", False, True),
        ("sites", False, False),
        ("When", True, False),
    ],
)
def test_a_key_word_names_something(raw, opens, expected):
    assert names_something(raw, opens_sentence=opens) is expected


def test_key_words_of_a_question_skip_the_words_opening_its_sentences():
    text = "Who founded Zeinka? Where is get_data used: Lyon, or in Paris, or sites near 12345?"
    assert key_words(text, [(0, len(text))]) == {"zeinka", "get_data", "paris", "12345"}


PLAIN_CHAIN = [
    "This feature is similar to the pth files (see site.py), it is a feature.",
    "The feature also reads files beginning where the pkg name matches.",
    "Every pkg file found is added to the path as well.",
]
PLAIN_QUESTION = "How many sites serving customers does the business maintain?"


def test_a_plain_word_anchors_its_unit_but_starts_no_cascade(smollm2_tokenizer):
    # "sites" meets "site.py" by the plural strip: rare in this text, but no key; a cascade
    # from it followed "pkg" through a docstring and filled an aggregation prompt's budget
    prepared = _spread_prompt(smollm2_tokenizer, PLAIN_CHAIN, PLAIN_QUESTION, chars=8000)
    ev = _evidence(prepared, mode="cascade", rare_max_freq=2, cascade_iters=3)
    by_text = {_text(prepared, u.span): u for u in ev.units}
    assert PLAIN_CHAIN[0] in by_text and by_text[PLAIN_CHAIN[0]].hop == 0
    assert not by_text[PLAIN_CHAIN[0]].named
    assert not {PLAIN_CHAIN[1], PLAIN_CHAIN[2]} & set(by_text)


PLAIN_LINE = "Such variables are assigned once, at start."


def test_units_the_question_names_are_promoted_alone_when_asked(smollm2_tokenizer):
    prepared = _spread_prompt(smollm2_tokenizer, [*CHAIN, PLAIN_LINE], CHAIN_QUESTION)
    ev = _evidence(prepared, mode="cascade", rare_max_freq=2, cascade_iters=3)
    named = {_text(prepared, u.span) for u in ev.units if u.named}
    assert set(CHAIN) <= named  # the value 12345 names the root; its hops descend from it
    plain = [u.span for u in ev.units if not u.named]
    assert PLAIN_LINE in {_text(prepared, s) for s in plain}  # shares plain words only
    everything, only_named = ev.promotion_order(), ev.promotion_order(named_only=True)
    assert only_named[: len(ev.question)] == ev.question  # the question still comes first
    assert set(only_named) == set(everything) - set(plain)


# several short articles, as a RAG prompt retrieves them: each of the first sentence's rare
# words ("Quarnby", "1871") also stands in one other article
ARTICLES = [
    "The Velmora Arms is a public house in Quarnby, built in 1871.",
    "Quarnby is a market town on the river Ouse.",
    "The bridge at Ferrow was finished in 1871 by a local mason.",
]
ARTICLES_QUESTION = "When was the Velmora Arms built?"


def test_the_cascade_spreads_from_no_sentence_of_prose_with_several_rare_words(
    smollm2_tokenizer,
):
    # a link of a chain names one new unit ("VAR FGHIJ = VAR ABCDE."); a sentence about a pub
    # names a town and a year that two unrelated articles also hold, and following both
    # led the cascade through whole RULER prompts
    prepared = _spread_prompt(smollm2_tokenizer, ARTICLES, ARTICLES_QUESTION, chars=8000)
    ev = _evidence(prepared, mode="cascade", rare_max_freq=2, cascade_iters=3)
    hops = {_text(prepared, u.span): u.hop for u in ev.units}
    assert hops.get(ARTICLES[0]) == 0
    assert not set(ARTICLES[1:]) & set(hops)


TOWN_LINES = [
    "The Velmora Arms has a small garden in Quarnby.",
    "The Crown Arms in Quarnby serves cider.",
    "The Fleece Arms in Quarnby has rooms.",
    "The Lamb Arms in Quarnby was rebuilt.",
    "The Swan Arms in Quarnby is the oldest.",
]
TOWN_QUESTION = "Which pub of Quarnby has a garden?"


def test_a_name_many_units_repeat_anchors_them_but_does_not_name_them(smollm2_tokenizer):
    # "Quarnby" is what these lines are about, not a key to one of them: with passage
    # evidence, units sharing only such a name compete by their mixed score
    prepared = _spread_prompt(smollm2_tokenizer, TOWN_LINES, TOWN_QUESTION, chars=8000)
    ev = _evidence(prepared, mode="cascade", rare_max_freq=2, cascade_iters=3)
    by_text = {_text(prepared, u.span): u for u in ev.units}
    assert set(TOWN_LINES) <= set(by_text)
    assert not any(by_text[line].named for line in TOWN_LINES)
    rare = _spread_prompt(smollm2_tokenizer, TOWN_LINES[:2], TOWN_QUESTION, chars=8000)
    named = {_text(rare, u.span) for u in _evidence(rare, rare_max_freq=2).units if u.named}
    assert set(TOWN_LINES[:2]) <= named  # in two units, the name is a key


# ----------------------------------------------------------------------------- quotes

OPERATORS = [("iadd", "+="), ("isub", "-="), ("imul", "*="), ("imatmul", "@="), ("ipow", "**=")]
OPERATORS += [("ifloordiv", "//="), ("itruediv", "/="), ("imod", "%="), ("iand", "&=")]
OPERATORS += [("ior", "|="), ("ixor", "^="), ("ilshift", "<<="), ("irshift", ">>=")]


def _operator_module() -> str:
    return "".join(
        f'def {name}(a, b):\n    "Same as a {op} b."\n    a {op} b\n    return a\n\n\n'
        for name, op in OPERATORS
    )


def test_a_quoted_line_is_found_by_its_symbols_among_lines_of_the_same_words(smollm2_tokenizer):
    """Thirteen docstrings share every word ("Same as a ... b."); only the quoted symbols
    tell them apart. The quoted line is the top anchor, named, and its def line follows."""
    filler = "\n".join(f"def helper_{i}(x):\n    return x + {i}\n" for i in range(30))
    content = (
        filler
        + _operator_module()
        + 'Which function has a docstring that begins "Same as a *= b."? Answer with its name.'
    )
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    texts = [_text(prepared, u.span) for u in ev.units]
    assert texts[:2] == ['"Same as a *= b."', "def imul(a, b):"]
    assert ev.units[0].named and ev.units[1].named
    assert not any("**=" in t or "+=" in t for t in texts)


@pytest.mark.parametrize(
    "question, found",
    [
        ('Where does it say "Same as a *= b."?', ["Same as a *= b"]),
        ("Which line logs `conn reset`?", ["conn reset"]),
        ("Which line logs 'conn   reset by peer'?", ["conn reset by peer"]),
        ("Which line logs “conn reset”?", ["conn reset"]),
        ("Isn't it the user's 'tail' that matters?", ["tail"]),
        ("Isn't it the user's choice? It's fine.", []),  # apostrophes are no quotes
        ('Is it "what it is"?', []),  # stopwords alone name nothing
        ('Is it "ab"?', []),
    ],
)
def test_quotes_of_a_question_become_patterns(question, found):
    patterns = quoted_patterns(question, [(0, len(question))])
    samples = {
        "Same as a *= b": 'x "SAME as a *= b." y',
        "conn reset": "10:02 conn\treset",
        "conn reset by peer": "conn reset by peer (104)",
        "tail": "the Tail end",
    }
    assert len(patterns) == len(found)
    for pattern, key in zip(patterns, found, strict=True):
        assert pattern.search(samples[key])
    if found == ["Same as a *= b"]:
        assert not patterns[0].search("Same as a **= b.")


def test_a_quote_many_lines_repeat_anchors_them_in_the_lowest_tier(smollm2_tokenizer):
    """A counting question quotes what its lines say; they are many, so each is a phrase-tier
    unit (named, below any key), and lines of the same words but other symbols are not."""
    lines = [f"route {k}: a -> b dropped" for k in range(12)]
    others = [f"route {k}: a <- b dropped" for k in range(12)]
    prepared = _spread_prompt(
        smollm2_tokenizer,
        [x for pair in zip(lines, others, strict=True) for x in pair] + [NEEDLE],
        f'How many routes say "a -> b"? {QUESTION}',
        chars=20000,
    )
    ev = _evidence(prepared)
    texts = [_text(prepared, u.span) for u in ev.units]
    assert texts[0] == NEEDLE
    quoted = [u for u in ev.units if "->" in _text(prepared, u.span)]
    assert len(quoted) == len(lines)
    assert all(u.named and u.score < ev.units[0].score / 100 for u in quoted)
    assert not any("<-" in t for t in texts)


def test_a_quote_is_not_matched_in_the_question_itself(smollm2_tokenizer):
    prepared = _spread_prompt(
        smollm2_tokenizer, [NEEDLE], 'Which paragraph says "zqxj wvut frobnicates"?'
    )
    assert _evidence(prepared).units == ()


# ----------------------------------------------------------------------------- later turns

_PIECES = ("Foo bar.", "baz? ", "\n", "\n\n", " ", "x_y", "3.5", "e.g.", "quokka", "Q! ", "a" * 450)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.sampled_from(_PIECES), max_size=120),
    st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
)
def test_units_of_a_growing_text_reused_from_its_earlier_prefix_equal_units_cut_again(pieces, cuts):
    text = "".join(pieces)
    previous = None
    for c in sorted(int(f * len(text)) for f in cuts):
        prefix = units_before(text, c, previous)
        assert list(prefix.units) == split_units(text, 0, c)
        assert prefix == units_before(text, c)  # units, words, sets and counts
        previous = prefix


def test_a_prefix_the_text_no_longer_starts_with_is_not_reused():
    old = units_before("The quokka sleeps.\nIt eats leaves.\n", 30)
    edited = "The wombat sleeps.\nIt eats leaves.\nMore text here.\n"
    prefix = units_before(edited, len(edited), old)
    assert prefix.reused == 0
    assert list(prefix.units) == split_units(edited, 0, len(edited))


def test_lexical_evidence_of_later_turns_with_the_earlier_units_equals_it_from_scratch(
    smollm2_tokenizer,
):
    """Three turns of one chat: each turn's evidence, given the turn before's prefix, is the
    evidence computed from its whole text (units, scores, query pool), and reuse happened.
    The second question repeats words of the first, which is in the context by then."""
    doc = _with_needle(_filler(8000))
    earlier: list[dict] = []
    previous = None
    turns = (
        doc + "\n\nSummarize this license.",
        QUESTION,
        "Which magic quokka number did the document give, and where?",
    )
    for i, content in enumerate(turns):
        prepared = _prepared(smollm2_tokenizer, content, earlier=tuple(earlier))
        params = LexicalParams(mode="cascade", query="question", cap_tokens=None)
        fresh = find_lexical_evidence(prepared.plan, pinned=prepared.budget.pinned, params=params)
        reused = find_lexical_evidence(
            prepared.plan, pinned=prepared.budget.pinned, params=params, previous=previous
        )
        assert reused == fresh, f"turn {i}"
        assert (reused.prefix.reused > 0) == (i > 0)
        previous = reused.prefix
        earlier += [{"role": "user", "content": content}, {"role": "assistant", "content": "Ok."}]
    assert any("7318842" in _text(prepared, u.span) for u in reused.units)


def test_the_turn_memo_keeps_each_conversations_latest_value_within_its_bound():
    from pflash.compress.turn_memo import TurnMemo

    memo = TurnMemo(max_chars=100)
    a, b = units_before("a" * 60, 60), units_before("b" * 50, 50)
    memo.put("tenant-a/one", "units", a, 60)
    memo.put(None, "units", b, 50)  # no conversation: nothing kept
    assert len(memo) == 1 and memo.get("tenant-a/one", "units") is a
    assert memo.get("tenant-a/one", "passages") is None
    assert memo.get("tenant-b/one", "units") is None and memo.get(None, "units") is None
    memo.put("tenant-a/two", "units", b, 50)  # 110 characters: the least recently used goes
    assert memo.get("tenant-a/one", "units") is None and memo.get("tenant-a/two", "units") is b
    memo.put("tenant-a/three", "units", a, 101)  # larger than the memo: not kept
    assert memo.get("tenant-a/three", "units") is None
    assert memo.get("tenant-a/two", "units") is b


# ----------------------------------------------------------------------------- long sentences

LONG_SENTENCE = (
    "It has been used in many nonviolent resistance movements in India (Gandhi's campaigns "
    "for independence from the British Empire), in Czechoslovakia's Velvet Revolution and in "
    "East Germany to oust their communist governments, in South Africa in the fight against "
    "apartheid, in the American Civil Rights Movement, in the Singing Revolution to bring "
    "independence to the Baltic countries from the Soviet Union, recently with the 2003 Rose "
    "Revolution in Georgia and the 2004 Orange Revolution in Ukraine, among other movements."
)


def test_a_hit_in_a_long_sentence_anchors_the_whole_sentence_just_below_it(smollm2_tokenizer):
    content = (
        _with_needle(_filler(), LONG_SENTENCE)
        + "\n\nWhat is an example of major civil disobedience in South Africa?"
    )
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    texts = [_text(prepared, u.span) for u in ev.units]
    whole = texts.index(LONG_SENTENCE)
    assert ev.units[whole].reason == "sentence"
    piece = next(i for i, t in enumerate(texts) if "South Africa" in t and i != whole)
    assert len(texts[piece]) < len(LONG_SENTENCE)  # the hit is a piece of it
    assert whole == piece + 1 and ev.units[whole].named == ev.units[piece].named


def test_a_hit_in_a_line_longer_than_three_pieces_anchors_only_its_piece(smollm2_tokenizer):
    line = (
        " ".join(["the ledger of payments and receipts"] * 40)
        + " in South Africa "
        + (" ".join(["with entries for every month"] * 10))
    )
    content = _with_needle(_filler(), line) + "\n\nWhat was paid in South Africa?"
    prepared = _prepared(smollm2_tokenizer, content)
    ev = _evidence(prepared)
    assert all(u.reason != "sentence" for u in ev.units)
    assert any("South Africa" in _text(prepared, u.span) for u in ev.units)
