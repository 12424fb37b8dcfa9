"""BENCHMARKS.md stays the current-results page: short, and every table with its command.

History belongs in docs/BENCHMARK_NOTEBOOK.md. A table's command sits in its section, between
the heading the table is under and the table itself. Pure text checks.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "BENCHMARKS.md"
MAX_LINES = 300

HEADING = re.compile(r"#{1,6} ")
TABLE_RULE = re.compile(r"\|\s*:?-{3,}")  # the |---|---| line under a table's header row
COMMAND = re.compile(r"python -m |pflash bench|scripts/")


def tables_without_command(text: str) -> list[str]:
    """The header row of every table whose section, up to the table, names no command."""
    missing = []
    section: list[str] = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if HEADING.match(line):
            section = []
        elif line.startswith("|") and i + 1 < len(lines) and TABLE_RULE.match(lines[i + 1]):
            if not any(COMMAND.search(prior) for prior in section):
                missing.append(line)
        section.append(line)
    return missing


def test_the_page_stays_under_the_line_bound():
    lines = PAGE.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, (
        f"BENCHMARKS.md has {len(lines)} lines (bound {MAX_LINES}): move history to "
        "docs/BENCHMARK_NOTEBOOK.md"
    )


def test_every_table_has_its_command_above_it_in_its_section():
    missing = tables_without_command(PAGE.read_text(encoding="utf-8"))
    assert not missing, f"tables with no command between their heading and them: {missing}"


def test_a_table_with_its_command_only_below_it_is_caught():
    page = "## TTFT\n\n| a | b |\n|---|---|\n| 1 | 2 |\n\nCommand: `python -m x`.\n"
    assert tables_without_command(page) == ["| a | b |"]
    fixed = "## TTFT\n\nCommand: `python -m x`.\n\n| a | b |\n|---|---|\n| 1 | 2 |\n"
    assert tables_without_command(fixed) == []


def test_a_command_of_the_section_before_does_not_count():
    page = "## A\n\n`pflash bench ablate`\n\n## B\n\n| a |\n|---|\n| 1 |\n"
    assert tables_without_command(page) == ["| a |"]
