"""Probe training labels from real text: stdlib sources, docstrings, licenses, file joins."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np

from pflash_lab.train.probe import chat_prefix, token_labels
from pflash_lab.train.probe_corpus import (
    LICENSES,
    Piece,
    code_labels,
    documents,
    files_of,
    is_held_out,
    join_files,
    prose_labels,
)

STDLIB = Path(sysconfig.get_paths()["stdlib"])


def starts_of(text: str, offsets) -> list[str]:
    """The rest of the line at each offset."""
    return [text[o:].split("\n", 1)[0] for o in offsets]


def test_stdlib_units_are_top_level_definitions_and_methods():
    src = (STDLIB / "textwrap.py").read_text()
    units, subunits = code_labels(src)
    lines = starts_of(src, units)
    assert lines[:3] == [
        "class TextWrapper:",
        "def __init__(self,",
        "def _munge_whitespace(self, text):",
    ]
    assert "def dedent(text):" in lines and "def indent(text, prefix, predicate=None):" in lines
    assert len(lines) == 15  # 1 class, its 9 methods, 5 module functions
    assert set(units) <= set(subunits)
    assert "import re" in starts_of(src, subunits)  # a module-level statement


def test_a_decorated_definition_starts_at_its_first_decorator():
    src = (STDLIB / "functools.py").read_text()
    units, _ = code_labels(src)
    lines = starts_of(src, units)
    assert "@recursive_repr()" in lines  # partial.__repr__
    assert "def __repr__(self):" not in lines[lines.index("class partial:") :][:4]


def test_defs_inside_strings_and_nested_functions_are_not_units():
    src = 'X = """\ndef not_code():\n    pass\n"""\n\ndef outer():\n    def inner():\n        return 1\n\n    return inner\n'
    units, subunits = code_labels(src)
    assert starts_of(src, units) == ["def outer():"]
    assert "def inner():" in starts_of(src, subunits)  # a statement of outer's body
    assert "return inner" in starts_of(src, subunits)


def test_license_paragraphs_and_headings_are_units():
    text = (LICENSES / "Apache-2.0").read_text()
    units, subunits = prose_labels(text)
    lines = starts_of(text, units)
    assert lines[:4] == [
        "Apache License",
        "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION",
        "1. Definitions.",
        '"License" shall mean the terms and conditions for use, reproduction,',
    ]
    assert "END OF TERMS AND CONDITIONS" in lines
    assert (
        "and distribution as defined by Sections 1 through 9 of this document." not in lines
    )  # a wrapped line, not a paragraph
    assert len(subunits) > len(units)  # sentences inside paragraphs


def test_underlined_and_markdown_headings_are_units_without_blank_lines():
    text = "Intro line.\nParameters\n----------\nx : int\n# Notes\nMore. Second sentence.\n"
    units, subunits = prose_labels(text)
    assert starts_of(text, units) == ["Intro line.", "Parameters", "# Notes"]
    assert "Second sentence." in starts_of(text, subunits)


def test_joined_files_start_at_their_header():
    a = Piece("stdlib/a.py", "def f():\n    return 1\n", (0,), (0, 13), "code")
    b = Piece("licenses/BSD", "Text.\n\nMore text.\n", (0, 7), (0, 7), "prose")
    doc = join_files([a, b], style=0)
    assert doc.text.startswith("# File: a.py\ndef f():")
    assert starts_of(doc.text, doc.units) == ["# File: a.py", "# File: BSD", "More text."]
    bare = join_files([a, b], style=len(("",)) * 5)  # the header-less style
    assert starts_of(bare.text, bare.units) == ["def f():", "Text.", "More text."]


def test_held_out_files_are_chosen_by_name_and_never_trained_on():
    assert is_held_out("stdlib/functools.py") and is_held_out("licenses/GPL-3")
    assert not is_held_out("stdlib/textwrap.py") and not is_held_out("licenses/Apache-2.0")
    val = {f.name for f in files_of("val", "code")} | {f.name for f in files_of("val", "prose")}
    for doc in documents("train", 8, seed=0):
        assert not set(doc.sources) & val
    for doc in documents("val", 4, seed=0):
        assert set(doc.sources) <= val


def test_documents_are_reproducible_from_the_seed():
    first = [d.text for d in documents("train", 4, seed=3)]
    assert first == [d.text for d in documents("train", 4, seed=3)]
    assert first != [d.text for d in documents("train", 4, seed=4)]
    assert [d.kind for d in documents("train", 4, seed=3)] == ["files", "files", "prose", "files"]


def test_token_labels_mark_the_token_holding_the_first_character(smollm2_tokenizer):
    a = Piece(
        "stdlib/a.py", "class A:\n    def f(self):\n        return 1\n", (0, 13), (0, 13), "code"
    )
    doc = join_files([a], style=5)
    prefix = chat_prefix(smollm2_tokenizer)
    assert prefix.endswith("<|im_start|>user\n")
    t = token_labels(smollm2_tokenizer, doc, prefix)
    marked = [smollm2_tokenizer.decode([t.ids[i]]) for i in np.flatnonzero(t.unit)]
    assert marked == ["class", " def"]  # the indentation stays with the line before
    assert t.begin == len(smollm2_tokenizer(prefix, add_special_tokens=False)["input_ids"])
    assert not t.unit[: t.begin].any()
