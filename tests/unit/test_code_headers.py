"""The two code-header questions read indentation by one rule and differ only in what
counts as a header (`pflash.compress.text.code_headers`)."""

from __future__ import annotations

from pflash.compress.text.code_headers import block_header, code_lines, indent_width


def _header_of(text: str, line: str) -> int:
    starts, headers = code_lines(text, 0, len(text))
    return headers[starts.index(text.index(line))]


def test_a_tab_counts_four_columns_for_both_header_rules():
    text = "  def shorten(text):\n\treturn text[:9]\n"
    body = text.index("\treturn")
    assert indent_width(text, body) == 4
    assert block_header(text, body) == (2, text.index("\n"))
    assert _header_of(text, "\treturn") == 0


def test_any_block_opener_heads_an_anchored_line_but_only_a_definition_a_passage():
    text = "def check(rows):\n    if rows:\n        return rows[0]\n"
    body = text.index("        return")
    assert block_header(text, body) == (text.index("if rows"), text.index("if rows") + 8)
    assert _header_of(text, "        return") == 0  # the def, not the `if`


def test_a_block_header_is_looked_for_within_the_window_only():
    far = "def f():\n" + "        x = 1\n" * 40 + "    y = 2\n"
    assert block_header(far, far.index("    y")) is None
    near = "def f():\n" + "        x = 1\n" * 3 + "    y = 2\n"
    assert block_header(near, near.index("    y")) == (0, 8)
