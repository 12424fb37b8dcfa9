"""Labelled text for the segment probe: where units and sub-units start in real text.

The probe learns boundaries from text that ships on every machine and that this repository
did not write, so its labels are facts about the text, not about our own generator:

- **Python sources** of the standard library. A unit starts at each top-level `def`/`class`
  (at its first decorator when decorated) and at each method; sub-units start at every
  statement directly in a module, class or function body, and at the first line after a
  blank line. Read with `ast`, so a `def` inside a string is never a boundary.
- **Prose**: the stdlib's docstrings and the license texts in /usr/share/common-licenses.
  A unit starts at each paragraph (the first line after a blank line) and each heading
  (a line underlined with `===`/`---`, or a `#` heading); sub-units at sentence starts.
- **Concatenated files**: a multi-file context puts several file excerpts one after the
  other, each under a header in one of the styles prompts use; a unit starts at each file
  (its header's first character).

Every offset is a character offset into `LabelledText.text` and points at the first
non-blank character of the line or sentence that starts the unit, so the newline and the
indentation before a boundary stay with the previous segment.

Held-out files are chosen by a hash of the file's name (`is_held_out`), so the split does
not depend on which files a Python version happens to ship or on their order.
"""

from __future__ import annotations

import ast
import bisect
import hashlib
import re
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

import numpy as np

LICENSES = Path("/usr/share/common-licenses")
HELD_OUT_ONE_IN = 5  # one file in five (by name hash) is held out for validation
SKIP_DIRS = frozenset({"test", "tests", "idlelib", "site-packages", "turtledemo", "__pycache__"})

Split = Literal["train", "val"]

_UNDERLINE = re.compile(r"^\s*([=\-~^*#+])\1{2,}\s*$")
_MD_HEADING = re.compile(r"^\s{0,3}#{1,6}\s+\S")
_SENTENCE = re.compile(r"[.!?][\"')\]]?\s+(?=[A-Z\"'(\[])")


@dataclass(frozen=True)
class LabelledText:
    """Text with the character offsets where units and sub-units start (sorted, unique).

    `subunits` includes every unit start: a unit boundary is also a finer one.
    `sources` names the files the text was cut from, for reports.
    """

    text: str
    units: tuple[int, ...]
    subunits: tuple[int, ...]
    sources: tuple[str, ...] = ()
    kind: str = ""
    bodies: tuple[int, ...] = ()  # where each source's text begins (after its header)


@dataclass(frozen=True)
class SourceFile:
    """A real file the corpus draws from: `name` is stable across machines
    (`stdlib/json/decoder.py`, `licenses/GPL-3`), `path` where it is here."""

    name: str
    path: Path
    kind: Literal["code", "prose"]

    def read(self) -> str:
        return self.path.read_text(encoding="utf-8", errors="replace")


# ---------------------------------------------------------------------------- the split


def is_held_out(name: str) -> bool:
    """Whole files are held out for validation: one in `HELD_OUT_ONE_IN` by name hash."""
    return hashlib.sha256(name.encode()).digest()[0] % HELD_OUT_ONE_IN == 0


def split_of(name: str) -> Split:
    return "val" if is_held_out(name) else "train"


@lru_cache(maxsize=1)
def stdlib_files() -> tuple[SourceFile, ...]:
    """Python sources of the running interpreter's standard library, tests excluded, that
    parse and hold at least one function or class."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for p in sorted(root.rglob("*.py")):
        rel = p.relative_to(root)
        if SKIP_DIRS.intersection(rel.parts[:-1]) or not p.is_file():
            continue
        if not 2_000 <= p.stat().st_size <= 400_000:
            continue
        out.append(SourceFile(f"stdlib/{rel.as_posix()}", p, "code"))
    return tuple(out)


@lru_cache(maxsize=1)
def license_files() -> tuple[SourceFile, ...]:
    """The license texts under /usr/share/common-licenses (symlinked aliases skipped)."""
    if not LICENSES.is_dir():
        return ()
    return tuple(
        SourceFile(f"licenses/{p.name}", p, "prose")
        for p in sorted(LICENSES.iterdir())
        if p.is_file() and not p.is_symlink()
    )


def files_of(split: Split, kind: str) -> tuple[SourceFile, ...]:
    files = stdlib_files() if kind == "code" else license_files()
    return tuple(f for f in files if split_of(f.name) == split)


# ---------------------------------------------------------------------------- labels


def line_starts(text: str) -> list[int]:
    """Character offset of each line (lines split at "\\n" only, as `ast` counts them)."""
    return [0] + [m.end() for m in re.finditer("\n", text)]


def _first_char(text: str, offset: int) -> int:
    """The first non-blank character at or after `offset` on its line (or `offset`)."""
    end = text.find("\n", offset)
    end = len(text) if end < 0 else end
    for i in range(offset, end):
        if not text[i].isspace():
            return i
    return offset


def _block_starts(text: str, starts: Sequence[int]) -> list[int]:
    """The first non-blank line after each run of blank lines (and the first line)."""
    out = []
    blank_before = True
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(text)
        blank = not text[s:end].strip()
        if not blank and blank_before:
            out.append(_first_char(text, s))
        blank_before = blank
    return out


def _def_start(node: ast.stmt) -> int:
    """1-based line where a definition starts: its first decorator, else the def itself."""
    lines = [d.lineno for d in getattr(node, "decorator_list", ())]
    return min([node.lineno, *lines])


_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def code_labels(source: str) -> tuple[list[int], list[int]]:
    """(unit offsets, sub-unit offsets) of a Python source; raises SyntaxError if it does
    not parse."""
    tree = ast.parse(source)
    starts = line_starts(source)

    def at(lineno: int) -> int:
        return _first_char(source, starts[lineno - 1])

    units: set[int] = set()
    subunits: set[int] = set()
    for node in tree.body:
        subunits.add(at(_def_start(node) if isinstance(node, _DEFS) else node.lineno))
        if isinstance(node, _DEFS):
            units.add(at(_def_start(node)))
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, _DEFS):
                    units.add(at(_def_start(child)))
    for node in ast.walk(tree):
        if isinstance(node, _DEFS):
            for child in node.body:
                line = _def_start(child) if isinstance(child, _DEFS) else child.lineno
                subunits.add(at(line))
    subunits.update(_block_starts(source, starts))
    subunits |= units
    return sorted(units), sorted(subunits)


def prose_labels(text: str) -> tuple[list[int], list[int]]:
    """(unit offsets, sub-unit offsets) of prose: paragraphs and headings; sentences."""
    starts = line_starts(text)
    units = set(_block_starts(text, starts))
    lines = [
        text[s : (starts[i + 1] - 1 if i + 1 < len(starts) else len(text))]
        for i, s in enumerate(starts)
    ]
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        underlined = i + 1 < len(lines) and _UNDERLINE.match(lines[i + 1]) is not None
        if (underlined and not _UNDERLINE.match(line)) or _MD_HEADING.match(line):
            units.add(_first_char(text, starts[i]))
    subunits = set(units)
    subunits.update(m.end() for m in _SENTENCE.finditer(text))
    return sorted(units), sorted(u for u in subunits if u < len(text))


# ---------------------------------------------------------------------------- excerpts


@dataclass(frozen=True)
class Piece:
    """A labelled excerpt of one file, before it is placed in a document."""

    name: str
    text: str
    units: tuple[int, ...]
    subunits: tuple[int, ...]
    kind: str
    origin: int = 0  # where `text` begins in the file


def _shift(offsets: Sequence[int], lo: int, hi: int) -> list[int]:
    """The offsets in [lo, hi), relative to lo."""
    i, j = bisect.bisect_left(offsets, lo), bisect.bisect_left(offsets, hi)
    return [o - lo for o in offsets[i:j]]


def excerpt(
    f: SourceFile, rng: np.random.Generator, max_chars: int, *, from_top: float
) -> Piece | None:
    """Whole units of one file, starting at a random unit (or the file's top with
    probability `from_top`) and ending at a unit start, at most `max_chars` (a single unit
    longer than that is cut at a line end)."""
    text = f.read().replace("\r\n", "\n")
    try:
        units, subunits = code_labels(text) if f.kind == "code" else prose_labels(text)
    except (SyntaxError, ValueError):
        return None
    if not units:
        return None
    starts = line_starts(text)
    if f.kind == "code":  # start at the file's top or at a top-level definition
        tops = [u for u in units if text[starts[bisect.bisect_right(starts, u) - 1]] == text[u]]
        begin = 0 if not tops or rng.random() < from_top else tops[int(rng.integers(len(tops)))]
    else:
        begin = starts[bisect.bisect_right(starts, units[int(rng.integers(len(units)))]) - 1]
    later = [starts[bisect.bisect_right(starts, u) - 1] for u in units if u > begin]
    fitting = [s for s in later if s - begin <= max_chars]
    if len(text) - begin <= max_chars:
        end = len(text)
    elif fitting:
        end = fitting[-1]
    else:  # one long unit: cut it at a line end
        cut = text.rfind("\n", begin, begin + max_chars)
        end = cut + 1 if cut > begin else begin + max_chars
    body = text[begin:end].rstrip() + "\n"
    return Piece(
        f.name,
        body,
        tuple(_shift(units, begin, begin + len(body))),
        tuple(_shift(subunits, begin, begin + len(body))),
        f.kind,
        begin,
    )


# ---------------------------------------------------------------------------- documents

# How prompts put files one after the other: (header, footer) with {name} the file's path.
FILE_STYLES: tuple[tuple[str, str], ...] = (
    ("# File: {name}\n", ""),
    ("### {name}\n```{lang}\n", "```\n"),
    ("--- {name} ---\n", ""),
    ('<file path="{name}">\n', "</file>\n"),
    ("{name}\n{rule}\n", ""),
    ("", ""),
)


def _display_name(name: str) -> str:
    return name.split("/", 1)[1] if name.startswith(("stdlib/", "licenses/")) else name


def join_files(pieces: Sequence[Piece], style: int) -> LabelledText:
    """Files one after the other under a header style from `FILE_STYLES`; each file start
    (its header's first character) is a unit, and every unit of a file stays a unit."""
    header_t, footer_t = FILE_STYLES[style % len(FILE_STYLES)]
    parts: list[str] = []
    units: list[int] = []
    subunits: list[int] = []
    bodies: list[int] = []
    pos = 0
    for piece in pieces:
        name = _display_name(piece.name)
        header = header_t.format(
            name=name, lang="python" if piece.kind == "code" else "text", rule="=" * len(name)
        )
        body_at = pos + len(header)
        bodies.append(body_at)
        first = body_at + len(piece.text) - len(piece.text.lstrip())  # first non-blank char
        start = pos if header else first  # a file starts at its header when it has one
        units.append(start)
        subunits.append(start)
        units += [u + body_at for u in piece.units if u + body_at != first]  # the file's own
        subunits += [u + body_at for u in piece.subunits]
        chunk = header + piece.text + footer_t + "\n"
        parts.append(chunk)
        pos += len(chunk)
    return LabelledText(
        "".join(parts),
        tuple(sorted(set(units))),
        tuple(sorted(set(subunits))),
        tuple(p.name for p in pieces),
        "files",
        tuple(bodies),
    )


@lru_cache(maxsize=4)
def docstring_texts(
    files: tuple[SourceFile, ...], min_chars: int = 400
) -> tuple[tuple[str, str], ...]:
    """(file name, docstring) for every module/class/function docstring of at least
    `min_chars` with at least two paragraphs, cleaned (dedented) as `inspect` shows them."""
    out = []
    for f in files:
        try:
            tree = ast.parse(f.read())
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, *_DEFS)):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= min_chars and "\n\n" in doc.strip():
                    out.append((f.name, doc.strip() + "\n"))
    return tuple(out)


def join_prose(items: Sequence[tuple[str, str]]) -> LabelledText:
    """Prose passages separated by blank lines; each passage and paragraph starts a unit."""
    text = "\n\n".join(t.rstrip("\n") for _, t in items) + "\n"
    units, subunits = prose_labels(text)
    return LabelledText(text, tuple(units), tuple(subunits), tuple(n for n, _ in items), "prose")


def documents(
    split: Split, n_docs: int, *, seed: int, chars: int = 5_000
) -> Iterator[LabelledText]:
    """`n_docs` labelled documents of about `chars` characters from `split`'s files.

    Mix (fixed by `seed`): half multi-file code contexts (2-4 stdlib excerpts, sometimes a
    license as one of the files), a quarter docstring prose, a quarter license excerpts
    joined as files. The same (split, n_docs, seed, chars) gives the same documents.
    """
    rng = np.random.default_rng([seed, 0 if split == "train" else 1])
    code = files_of(split, "code")
    prose = files_of(split, "prose")
    docs = docstring_texts(code)
    if not code or not prose or not docs:
        raise RuntimeError(
            f"the {split} split has {len(code)} stdlib files, {len(prose)} license files and "
            f"{len(docs)} long docstrings; the probe corpus needs all three"
        )
    for i in range(n_docs):
        kind = ("code", "code", "docs", "license")[i % 4]
        if kind == "docs":
            picked, total = [], 0
            while total < chars:
                name, doc = docs[int(rng.integers(len(docs)))]
                picked.append((name, doc))
                total += len(doc)
            yield join_prose(picked)
            continue
        pieces: list[Piece] = []
        total = 0
        want = int(rng.integers(2, 5)) if kind == "code" else 1
        while total < chars:
            pool = prose if kind == "license" or (pieces and rng.random() < 0.1) else code
            f = pool[int(rng.integers(len(pool)))]
            room = max(600, min(chars - total, chars // want + 400))
            piece = excerpt(f, rng, room, from_top=0.3)
            if piece is None or not piece.units:
                continue
            pieces.append(piece)
            total += len(piece.text)
        yield join_files(pieces, int(rng.integers(len(FILE_STYLES))))
