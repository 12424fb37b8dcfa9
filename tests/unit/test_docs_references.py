"""The code's `§` citations resolve inside the clone, and the README points at the docs.

The code cites the algorithm by section number ("reference §5.3", "ALGORITHM.md §6.1",
"§10.1 item 15", "§3.3 step 6"). Every such number must be a heading of docs/ALGORITHM.md, and
every cited item or step must be a numbered entry of that section, so a newcomer with a clone
can follow each citation. Pure text checks: no model, no Ray, no import of the code under test.

Which document a citation belongs to: inside one docstring, string literal, run of adjacent
comment lines or Markdown/YAML paragraph, a citation belongs to the document named most
recently before it (`ALGORITHM`, or another working note such as `QWEN_GGUF.md` /
`RAY_SERVE.md`); with no name before it, to ALGORITHM.md. Citations of other notes are not
checked here.
"""

from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
ALGORITHM = DOCS / "ALGORITHM.md"
README = ROOT / "README.md"

SCANNED_DIRS = ("pflash", "pflash_lab", "deployments", "tests", "scripts")  # every *.py below these
SCANNED_FILES = ("README.md", "serve_config.yaml")
SECTION_SIGN = "\N{SECTION SIGN}"

# `§` + optional space + dotted digits (+ an optional letter, e.g. 1c). A dot must be followed by
# a digit to belong to the number, so the trailing dot of "see §5." is not part of it. An
# optional "item(s) N" / "step(s) N[-M, ...]" names entries of that section.
CITATION = re.compile(
    SECTION_SIGN
    + r" ?(?P<section>\d+(?:\.\d+)*[a-z]?)"
    + r"(?:\s+(?P<kind>items?|steps?)\s+(?P<numbers>\d+(?:\s*(?:-|–|,|and)\s*\d+)*))?"
)
DOC_NAME = re.compile(r"\b(?P<name>ALGORITHM|QWEN_GGUF|RAY_SERVE|DESIGN|STYLE)(?:\.md)?\b")
OWN_DOC = "ALGORITHM"
HEADING = re.compile(r"^(?P<hashes>#{1,6})\s")

_STRING_TOKENS = {
    getattr(tokenize, name)
    for name in ("STRING", "FSTRING_MIDDLE", "TSTRING_MIDDLE")
    if hasattr(tokenize, name)
}


@dataclass(frozen=True)
class Citation:
    """One citation of docs/ALGORITHM.md: `section` ("5.3"), the cited entry numbers of that
    section (items or steps; empty when none), and where it was found."""

    section: str
    entries: tuple[int, ...]
    where: str

    def __str__(self) -> str:
        entries = f" entries {list(self.entries)}" if self.entries else ""
        return f"{self.where}: {SECTION_SIGN}{self.section}{entries}"


# ----------------------------------------------------------------------------- text blocks


def _python_blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of every string literal, of every run of whole-line comments on
    adjacent lines, and of every comment after code (a block of its own). A file that does not
    tokenize (mid-edit) falls back to one block per line."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return [(i + 1, line) for i, line in enumerate(text.splitlines())]
    blocks: list[tuple[int, str]] = []
    run: list[tokenize.TokenInfo] = []
    for tok in tokens:
        if tok.type == tokenize.COMMENT and not tok.line.lstrip().startswith("#"):
            blocks.append((tok.start[0], tok.string))
        elif tok.type == tokenize.COMMENT:
            if run and tok.start[0] != run[-1].start[0] + 1:
                blocks.append((run[0].start[0], "\n".join(t.string for t in run)))
                run = []
            run.append(tok)
        elif tok.type in _STRING_TOKENS:
            blocks.append((tok.start[0], tok.string))
    if run:
        blocks.append((run[0].start[0], "\n".join(t.string for t in run)))
    return sorted(blocks)


def _paragraph_blocks(text: str) -> list[tuple[int, str]]:
    """(first line, text) of every blank-line-separated paragraph (Markdown, YAML)."""
    blocks: list[tuple[int, str]] = []
    start, lines = 0, []
    for i, line in enumerate(text.splitlines()):
        if line.strip():
            if not lines:
                start = i + 1
            lines.append(line)
        elif lines:
            blocks.append((start, "\n".join(lines)))
            lines = []
    if lines:
        blocks.append((start, "\n".join(lines)))
    return blocks


def citations_in(text: str, where: str, *, python: bool) -> list[Citation]:
    """The citations of docs/ALGORITHM.md in one file's text (see the module docstring)."""
    if SECTION_SIGN not in text:
        return []
    out = []
    for first_line, block in (_python_blocks if python else _paragraph_blocks)(text):
        if SECTION_SIGN not in block:
            continue
        events = [(m.start(), "doc", m) for m in DOC_NAME.finditer(block)]
        events += [(m.start(), "cite", m) for m in CITATION.finditer(block)]
        document = OWN_DOC
        for _, kind, m in sorted(events, key=lambda e: e[0]):
            if kind == "doc":
                document = m["name"]
                continue
            if document != OWN_DOC:
                continue
            numbers = tuple(int(n) for n in re.findall(r"\d+", m["numbers"] or ""))
            line = first_line + block.count("\n", 0, m.start())
            out.append(Citation(m["section"], numbers, f"{where}:{line}"))
    return out


def scanned_files() -> list[Path]:
    files = [p for d in SCANNED_DIRS for p in sorted((ROOT / d).rglob("*.py"))]
    files += [ROOT / name for name in SCANNED_FILES if (ROOT / name).is_file()]
    me = Path(__file__).resolve()
    return [p for p in files if p.resolve() != me]


def code_citations() -> list[Citation]:
    out = []
    for path in scanned_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        out += citations_in(text, str(path.relative_to(ROOT)), python=path.suffix == ".py")
    return out


# ----------------------------------------------------------------------------- the docs


@dataclass(frozen=True)
class Section:
    heading_line: int  # 1-based
    level: int
    body: tuple[str, ...]  # lines up to the next heading of the same or a higher level


def algorithm_sections(text: str) -> dict[str, list[Section]]:
    """Section number -> its headings in docs/ALGORITHM.md (the first `§` token of a line
    starting with '#'). Lines inside ``` fences are not headings."""
    lines = text.splitlines()
    headings: list[tuple[int, int, str | None]] = []  # (index, level, section)
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        h = HEADING.match(line)
        if h and not fenced:
            m = CITATION.search(line)
            headings.append((i, len(h["hashes"]), m["section"] if m else None))
    out: dict[str, list[Section]] = {}
    for k, (i, level, section) in enumerate(headings):
        if section is None:
            continue
        end = next((j for j, lv, _ in headings[k + 1 :] if lv <= level), len(lines))
        out.setdefault(section, []).append(Section(i + 1, level, tuple(lines[i + 1 : end])))
    return out


def numbered_entries(body: tuple[str, ...]) -> set[int]:
    """Numbers of the numbered list entries ("12. ...", indented or not) in a section body."""
    return {int(m[1]) for line in body if (m := re.match(r"\s*(\d+)\.\s", line))}


def _algorithm() -> dict[str, list[Section]]:
    assert ALGORITHM.is_file(), f"{ALGORITHM.relative_to(ROOT)} is missing"
    return algorithm_sections(ALGORITHM.read_text(encoding="utf-8"))


# ----------------------------------------------------------------------------- tests


def test_citation_scanner_reads_numbers_and_skips_other_notes():
    text = (
        '"""Budget (reference §5.7). See §5.\n'
        "Guards (spec/QWEN_GGUF.md): the decoder (§0, §7).\n"
        'Back to ALGORITHM.md §10.1 item 15 and §3.3 steps 3-7."""\n'
        "# a comment citing §4.7 step 2\n"
        "# and RAY_SERVE.md §1c on the next line\n"
        "x = 1  # §12 items 4, 11\n"
    )
    found = [(c.section, c.entries) for c in citations_in(text, "x.py", python=True)]
    assert found == [
        ("5.7", ()),
        ("5", ()),
        ("10.1", (15,)),
        ("3.3", (3, 7)),
        ("4.7", (2,)),
        ("12", (4, 11)),
    ]
    sections = algorithm_sections("## §5 Pipeline\n### §5.3 Chat\n1. a\n## §6 Views\n")
    assert set(sections) == {"5", "5.3", "6"}
    assert "5.4" not in sections  # a heading answers only its exact number, not a prefix
    assert numbered_entries(sections["5"][0].body) == {1}


def test_every_section_the_code_cites_resolves_in_docs_algorithm():
    citations = code_citations()
    assert citations, "no citations found: the scanner is broken or the code moved"
    sections = _algorithm()
    missing = sorted({str(c) for c in citations if c.section not in sections})
    assert not missing, (
        f"{len(missing)} citation(s) have no heading in docs/ALGORITHM.md (add a heading line "
        f"such as '### {SECTION_SIGN}N.N Title', or fix the citation):\n  " + "\n  ".join(missing)
    )


def test_every_item_and_step_the_code_cites_is_numbered_in_its_section():
    sections = _algorithm()
    missing = []
    for c in code_citations():
        if not c.entries or c.section not in sections:
            continue
        numbered = numbered_entries(sections[c.section][0].body)
        absent = [n for n in c.entries if n not in numbered]
        if absent:
            missing.append(f"{c} (not numbered there: {absent})")
    assert not missing, (
        "cited items/steps that are not numbered list entries of their docs/ALGORITHM.md "
        "section:\n  " + "\n  ".join(sorted(set(missing)))
    )


def test_algorithm_headings_number_each_section_once():
    twice = {s: [h.heading_line for h in hs] for s, hs in _algorithm().items() if len(hs) > 1}
    assert not twice, f"section numbers with several headings (lines): {twice}"


def test_readme_links_the_design_and_algorithm_docs():
    text = README.read_text(encoding="utf-8")
    for doc in ("docs/DESIGN.md", "docs/ALGORITHM.md"):
        link = re.compile(r"\]\((?:\./)?" + re.escape(doc) + r"(?:#[^)]*)?\)")
        assert link.search(text), f"README.md has no Markdown link to {doc}"


def test_relative_links_in_docs_resolve():
    broken = []
    for doc in sorted(DOCS.glob("*.md")):
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:|#", target):
                continue  # a URL or an anchor in the same file
            if not (doc.parent / target.split("#", 1)[0]).exists():
                broken.append(f"{doc.relative_to(ROOT)} -> {target}")
    assert not broken, "broken relative links: " + ", ".join(broken)
