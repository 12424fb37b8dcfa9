"""Seeded long-context test cases over real text that this repository did not write.

Why real text: a drafter that scores attention learns nothing from a repeated filler line —
every chunk looks the same, so a needle stands out by construction. The haystacks here are
contiguous runs of paragraphs from the license texts in /usr/share/common-licenses and the
docstrings of the Python standard library (read with `ast`, never imported), so the
evidence competes with prose that is itself about numbers, names and conditions.

Families (RULER / SCBench shaped; all of them, by name: `pflash_lab.corpus.families`):

- `single_needle`: one "special magic number" needle at a depth in [0, 1] (§9.6 wording).
- `multi_key`: the asked needle plus three distractor needles with other keys.
- `multi_value`: one key with four values; all four are asked for.
- `multi_query`: four needles, two of them asked for in one question.
- `variable_tracking`: a multi-hop chain `VAR A = 12345`, `VAR B = VAR A`, ... plus a
  distractor chain; every name in the chain is the answer.
- `common_words`: keyword log lines spread over the text; three keywords occur eight times
  each, thirty others once; the three most frequent are asked for (aggregation: the
  evidence is every line of the frequent ones).
- `code_retrieval`: real top-level functions from several stdlib modules, one asked for
  by the first line of its docstring; the answer is its name.
- `multi_turn`: one shared document with three needles early, middle and late, asked in
  three follow-up turns (SCBench style: each turn's evidence lies elsewhere).
- `placement`: a single needle with the question before or inside the document.
- `system_document`: a single needle in a document that a RAG app put in the **system**
  message (`<documents>` tags around it, instructions before and after); the user message
  is only the question.

Families whose question does not name its evidence (`pflash_lab.corpus.nonliteral`; the
wordings are in `pflash_lab.corpus.paraphrase` and `pflash_lab.corpus.code_descriptions`):

- `paraphrased_needle`: one fact of an invented entity at a depth, asked in words that
  share no content word with the fact sentence, among distractor facts of the same shape
  (other concepts, any entity; their number grows with the length).
- `described_code`: as `code_retrieval`, but the question describes what the function does
  in words absent from its whole source.
- `multi_turn_paraphrase`: three facts early, middle and late among distractor facts, one
  paraphrased question per turn.
- `aggregation`: five facts about one organisation scattered over the text among
  distractor facts, all asked in one paraphrased question; the evidence is the five
  sentences.

Every generator is a pure function of its `CaseSpec` and a token counter: the same spec
gives the same case, byte for byte. Lengths are target-token counts of the rendered prompt
(approximate: paragraphs are counted one by one, the chat template adds a few tokens).

Why this module runs past 600 lines: the literal families, the haystack and code readers
they share, and `SuitePlan` are one contract (a case id names a family, a seed and a
length); the non-literal families and their wordings already live in their own modules.
"""

from __future__ import annotations

import ast
import random
import re
import string
import sysconfig
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache
from itertools import pairwise
from pathlib import Path
from typing import Literal

CountTokens = Callable[[str], int]
Placement = Literal["before", "inside", "after", "system"]

LICENSE_DIR = Path("/usr/share/common-licenses")
LICENSE_FILES = (
    "GPL-3",
    "LGPL-2.1",
    "Apache-2.0",
    "GPL-2",
    "Artistic",
    "MPL-2.0",
    "GFDL-1.3",
    "MPL-1.1",
    "CC0-1.0",
)
RESERVE_TOKENS = 64  # chat template, instructions and question around the document
MAX_PARAGRAPH_CHARS = 1500  # longer paragraphs are split at sentence ends

INSTRUCTION = "Read the document below and answer the question based only on it."
SYSTEM_RULES = (
    "You are a careful assistant. Answer the user's question using only the documents "
    "below, and say so when they do not contain the answer."
)
SYSTEM_CLOSING = "Answer in one short sentence."


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Turn:
    """One question to the target.

    - `answers`: gold strings; a reply scores the fraction of them it contains.
    - `evidence`: strings that must reach the target verbatim for the question to be
      answerable (needle sentences, chain statements, a function's `def` line).
    - `max_tokens`: the reply length the answer needs.
    """

    question: str
    answers: tuple[str, ...]
    evidence: tuple[str, ...]
    max_tokens: int = 24


@dataclass(frozen=True)
class CaseSpec:
    """What to generate: the family, the seed, the prompt length and (needles) the depth."""

    family: str
    seed: int
    length: int
    depth: float | None = None
    placement: Placement = "after"

    @property
    def case_id(self) -> str:
        depth = "" if self.depth is None else f"-d{round(100 * self.depth):03d}"
        place = "" if self.placement == "after" else f"-{self.placement}"
        return f"{self.family}-{self.length}-s{self.seed}{depth}{place}"


@dataclass(frozen=True)
class BenchCase:
    """A generated case: one document and one or more turns asked about it."""

    spec: CaseSpec
    document: str
    turns: tuple[Turn, ...]

    @property
    def case_id(self) -> str:
        return self.spec.case_id

    @property
    def family(self) -> str:
        return self.spec.family

    def user_content(self, turn: int, document: str | None = None) -> str:
        """The user message of `turn`; turn 0 carries the document (or a compressed one)."""
        question = self.turns[turn].question
        if turn > 0:
            return question
        doc = self.document if document is None else document
        if self.spec.placement == "before":
            return (
                f"Question: {question}\n\n{INSTRUCTION}\n\n{doc}\n\n"
                "Answer the question given before the document."
            )
        if self.spec.placement == "inside":
            head, tail = split_middle(doc)
            return (
                f"{INSTRUCTION}\n\n{head}\n\nQuestion: {question}\n\n{tail}\n\n"
                "Answer the question given inside the document."
            )
        return f"{INSTRUCTION}\n\n{doc}\n\nQuestion: {question}"

    def messages(
        self, turn: int, replies: Sequence[str] = (), document: str | None = None
    ) -> list[dict]:
        """The chat up to `turn`: earlier questions with the target's earlier `replies`."""
        if self.spec.placement == "system":
            doc = self.document if document is None else document
            system = f"{SYSTEM_RULES}\n\n<documents>\n{doc}\n</documents>\n\n{SYSTEM_CLOSING}"
            out = [{"role": "system", "content": system}]
            for t in range(turn + 1):
                out.append({"role": "user", "content": self.turns[t].question})
                if t < turn:
                    reply = replies[t] if t < len(replies) else ""
                    out.append({"role": "assistant", "content": reply})
            return out
        out: list[dict] = []
        for t in range(turn + 1):
            out.append({"role": "user", "content": self.user_content(t, document)})
            if t < turn:
                out.append({"role": "assistant", "content": replies[t] if t < len(replies) else ""})
        return out


def split_middle(text: str) -> tuple[str, str]:
    """Split a document at the paragraph break nearest its middle."""
    mid = len(text) // 2
    before, after = text.rfind("\n\n", 0, mid), text.find("\n\n", mid)
    candidates = [c for c in (before, after) if c > 0]
    if not candidates:
        return text[:mid], text[mid:]
    cut = min(candidates, key=lambda c: abs(c - mid))
    return text[:cut], text[cut + 2 :]


# --------------------------------------------------------------------------- corpus


def _split_long(paragraph: str) -> list[str]:
    if len(paragraph) <= MAX_PARAGRAPH_CHARS:
        return [paragraph]
    out, current = [], ""
    for sentence in re.split(r"(?<=[.;:])\s+", paragraph):
        if current and len(current) + len(sentence) > MAX_PARAGRAPH_CHARS:
            out.append(current)
            current = ""
        current = f"{current} {sentence}".strip()
    return out + ([current] if current else [])


def _paragraphs(text: str) -> list[str]:
    out = []
    for block in re.split(r"\n\s*\n", text.replace("\f", "\n")):
        block = "\n".join(line.rstrip() for line in block.strip("\n").splitlines())
        if len(block.strip()) >= 40:
            out.extend(_split_long(block.strip()))
    return out


def stdlib_modules() -> list[Path]:
    """The standard library's top-level modules, sorted (same list on every run)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py") if not p.name.startswith("_"))


def _parse(path: Path) -> ast.Module | None:
    try:
        return ast.parse(path.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError):
        return None


@lru_cache(maxsize=4)
def corpus_paragraphs(keep: Callable[[str], bool] | None = None) -> tuple[str, ...]:
    """License paragraphs, then stdlib docstring paragraphs (module, class, function).

    `keep(name)` restricts the files (names as `probe_corpus` gives them: `licenses/GPL-3`,
    `stdlib/textwrap.py`), so a training set and its held-out split read the same corpus.
    """
    out: list[str] = []
    for name in LICENSE_FILES:
        path = LICENSE_DIR / name
        if path.is_file() and (keep is None or keep(f"licenses/{name}")):
            out.extend(_paragraphs(path.read_text(encoding="utf-8", errors="replace")))
    for path in stdlib_modules():
        if keep is not None and not keep(f"stdlib/{path.name}"):
            continue
        tree = _parse(path)
        if tree is None:
            continue
        nodes = [
            tree,
            *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef)),
        ]
        for node in nodes:
            doc = ast.get_docstring(node)
            if doc:
                out.extend(_paragraphs(doc))
    if not out:
        raise RuntimeError("no corpus text: neither /usr/share/common-licenses nor stdlib found")
    return tuple(out)


@lru_cache(maxsize=1)
def corpus_words() -> tuple[str, ...]:
    """Distinct lower-case words of 6-10 letters from the corpus, sorted (keyword pool)."""
    words = set()
    for p in corpus_paragraphs():
        words.update(w.lower() for w in re.findall(r"\b[A-Za-z]{6,10}\b", p))
    return tuple(sorted(words))


@dataclass(frozen=True)
class CodeFunction:
    """A real top-level function: its module, name, source, and docstring summary line."""

    module: str
    name: str
    source: str
    summary: str

    @property
    def def_line(self) -> str:
        return self.source.splitlines()[0].strip()


@lru_cache(maxsize=1)
def code_functions() -> tuple[tuple[str, tuple[CodeFunction, ...]], ...]:
    """Per stdlib module, its top-level functions of 4-60 lines (module order, sorted)."""
    out = []
    for path in stdlib_modules():
        tree = _parse(path)
        if tree is None:
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        funcs = module_functions(tree, lines, path.stem)
        if len(funcs) >= 3:
            out.append((path.stem, tuple(funcs)))
    return tuple(out)


# --------------------------------------------------------------------------- building blocks


def module_functions(tree: ast.Module, lines: list[str], module: str) -> list[CodeFunction]:
    """The undecorated top-level functions of 4-60 lines of a parsed module, in order."""
    funcs = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:
            continue
        if not 4 <= node.end_lineno - node.lineno + 1 <= 60:
            continue
        source = "\n".join(lines[node.lineno - 1 : node.end_lineno])
        doc = ast.get_docstring(node) or ""
        summary = doc.strip().splitlines()[0].strip() if doc.strip() else ""
        funcs.append(CodeFunction(module, node.name, source, summary))
    return funcs


def haystack(rng: random.Random, n_tokens: int, count: CountTokens) -> list[str]:
    """A contiguous run of corpus paragraphs from a seeded start with about `n_tokens`."""
    paragraphs = corpus_paragraphs()
    i = rng.randrange(len(paragraphs))
    out, total = [], 0
    while True:
        p = paragraphs[i % len(paragraphs)]
        n = count(p) + 1
        if out and total + n > n_tokens:
            return out
        total += n
        out.append(p)
        i += 1


def insert_at_depths(paragraphs: list[str], items: Sequence[tuple[float, str]]) -> list[str]:
    """Insert each (depth, text) as its own paragraph; depth 0 = first, 1 = last."""
    out = list(paragraphs)
    for depth, text in sorted(items, key=lambda x: x[0], reverse=True):
        out.insert(round(min(max(depth, 0.0), 1.0) * len(paragraphs)), text)
    return out


def random_key(rng: random.Random, taken: set[str] | None = None) -> str:
    """Eight random lower-case letters (§9.6), distinct from `taken`."""
    while True:
        key = "".join(rng.choice(string.ascii_lowercase) for _ in range(8))
        if not taken or key not in taken:
            if taken is not None:
                taken.add(key)
            return key


def random_value(rng: random.Random, taken: set[str] | None = None) -> str:
    """Seven random digits, no leading zero, distinct from `taken`."""
    while True:
        value = str(rng.randrange(1_000_000, 10_000_000))
        if not taken or value not in taken:
            if taken is not None:
                taken.add(value)
            return value


def needle(key: str, value: str) -> str:
    return f"The special magic {key} number is: {value}."


def _body_tokens(spec: CaseSpec, count: CountTokens, extra: Sequence[str]) -> int:
    return max(64, spec.length - RESERVE_TOKENS - sum(count(x) + 2 for x in extra))


def _depth(spec: CaseSpec, rng: random.Random) -> float:
    return spec.depth if spec.depth is not None else rng.random()


# --------------------------------------------------------------------------- families


def single_needle(spec: CaseSpec, count: CountTokens) -> BenchCase:
    rng = random.Random(spec.seed)
    key, value = random_key(rng), random_value(rng)
    text = needle(key, value)
    hay = haystack(rng, _body_tokens(spec, count, [text]), count)
    doc = insert_at_depths(hay, [(_depth(spec, rng), text)])
    turn = Turn(f"What is the special magic {key} number?", (value,), (text,))
    return BenchCase(spec, "\n\n".join(doc), (turn,))


def multi_key(spec: CaseSpec, count: CountTokens) -> BenchCase:
    rng = random.Random(spec.seed)
    keys, values = set(), set()
    pairs = [(random_key(rng, keys), random_value(rng, values)) for _ in range(4)]
    texts = [needle(k, v) for k, v in pairs]
    hay = haystack(rng, _body_tokens(spec, count, texts), count)
    depths = [_depth(spec, rng)] + [rng.random() for _ in range(3)]
    doc = insert_at_depths(hay, list(zip(depths, texts, strict=True)))
    key, value = pairs[0]
    turn = Turn(f"What is the special magic {key} number?", (value,), (texts[0],))
    return BenchCase(spec, "\n\n".join(doc), (turn,))


def multi_value(spec: CaseSpec, count: CountTokens) -> BenchCase:
    rng = random.Random(spec.seed)
    key, values = random_key(rng), set()
    vals = [random_value(rng, values) for _ in range(4)]
    texts = [f"One of the special magic numbers for {key} is: {v}." for v in vals]
    hay = haystack(rng, _body_tokens(spec, count, texts), count)
    doc = insert_at_depths(hay, [(rng.random(), t) for t in texts])
    turn = Turn(
        f"What are all the special magic numbers for {key}? List every one of them.",
        tuple(vals),
        tuple(texts),
        max_tokens=48,
    )
    return BenchCase(spec, "\n\n".join(doc), (turn,))


def multi_query(spec: CaseSpec, count: CountTokens) -> BenchCase:
    rng = random.Random(spec.seed)
    keys, values = set(), set()
    pairs = [(random_key(rng, keys), random_value(rng, values)) for _ in range(4)]
    texts = [needle(k, v) for k, v in pairs]
    hay = haystack(rng, _body_tokens(spec, count, texts), count)
    doc = insert_at_depths(hay, [(rng.random(), t) for t in texts])
    asked = rng.sample(range(4), 2)
    (k1, v1), (k2, v2) = pairs[asked[0]], pairs[asked[1]]
    turn = Turn(
        f"What are the special magic {k1} number and the special magic {k2} number?",
        (v1, v2),
        (texts[asked[0]], texts[asked[1]]),
        max_tokens=40,
    )
    return BenchCase(spec, "\n\n".join(doc), (turn,))


def _var_name(rng: random.Random, taken: set[str]) -> str:
    while True:
        name = "".join(rng.choice(string.ascii_uppercase) for _ in range(5))
        if name not in taken:
            taken.add(name)
            return name


def variable_tracking(spec: CaseSpec, count: CountTokens, hops: int = 4) -> BenchCase:
    rng = random.Random(spec.seed)
    names: set[str] = set()
    values: set[str] = set()

    def chain(value: str) -> tuple[list[str], list[str]]:
        chain_names = [_var_name(rng, names) for _ in range(hops + 1)]
        statements = [f"VAR {chain_names[0]} = {value}."]
        statements += [f"VAR {b} = VAR {a}." for a, b in pairwise(chain_names)]
        return chain_names, statements

    value = random_value(rng, values)
    gold, statements = chain(value)
    _, distractor = chain(random_value(rng, values))
    hay = haystack(rng, _body_tokens(spec, count, statements + distractor), count)
    depths = sorted(rng.random() for _ in statements)  # the chain reads in order
    items = list(zip(depths, statements, strict=True))
    items += [
        (d, s) for d, s in zip(sorted(rng.random() for _ in distractor), distractor, strict=True)
    ]
    doc = insert_at_depths(hay, items)
    turn = Turn(
        f"Which variables are assigned the value {value}, directly or through other "
        "variables? List all their names.",
        tuple(gold),
        tuple(statements),
        max_tokens=48,
    )
    return BenchCase(spec, "\n\n".join(doc), (turn,))


def common_words(spec: CaseSpec, count: CountTokens, top: int = 3, times: int = 8) -> BenchCase:
    rng = random.Random(spec.seed)
    pool = rng.sample(corpus_words(), top + 30)
    frequent, rare = pool[:top], pool[top:]
    lines = [f"Keyword log entry: {w}." for w in frequent for _ in range(times)]
    rare_lines = [f"Keyword log entry: {w}." for w in rare]
    everything = lines + rare_lines
    hay = haystack(rng, _body_tokens(spec, count, everything), count)
    doc = insert_at_depths(hay, [(rng.random(), t) for t in everything])
    turn = Turn(
        f"Which {top} keywords appear most often in the keyword log entries? Name them.",
        tuple(frequent),
        tuple(lines),  # every occurrence counts: retention is the share of them kept
        max_tokens=32,
    )
    return BenchCase(spec, "\n\n".join(doc), (turn,))


def _code_summary_ok(f: CodeFunction) -> bool:
    words = f.summary.split()
    return len(words) >= 5 and f.name.lower() not in f.summary.lower()


CODE_ATTEMPTS = 32  # module orders code_retrieval tries before it gives up


def _code_files(
    modules: Sequence[tuple[str, tuple[CodeFunction, ...]]], budget: int, count: CountTokens
) -> tuple[list[str], list[CodeFunction]]:
    """Module files packed in order into `budget`, and the functions of them that can be
    asked for: a summary of five words or more without the name, the name defined once
    and the summary given once."""
    files, total, packed, names = [], 0, [], Counter()
    for module, funcs in modules:
        text = f"# File: {module}.py\n\n" + "\n\n\n".join(f.source for f in funcs)
        n = count(text)
        if total + n > budget:
            if total > budget * 0.8:
                break
            continue
        files.append(text)
        packed += funcs
        total += n
        names.update(f.name for f in funcs)
    candidates = [f for f in packed if _code_summary_ok(f) and names[f.name] == 1]
    summaries = Counter(f.summary for f in candidates)
    return files, [f for f in candidates if summaries[f.summary] == 1]


def code_retrieval(spec: CaseSpec, count: CountTokens) -> BenchCase:
    """Whole stdlib modules in a seeded order; one function asked for by its docstring.

    A short document can happen to hold no askable function (every packed one lacks a
    distinctive summary), so the modules are reshuffled, from the same seeded generator,
    until one does: the first order is the one earlier versions used, so cases that never
    needed a retry are unchanged."""
    rng = random.Random(spec.seed)
    modules = list(code_functions())
    budget = _body_tokens(spec, count, [])
    for _ in range(CODE_ATTEMPTS):
        rng.shuffle(modules)
        files, candidates = _code_files(modules, budget, count)
        if candidates:
            break
    else:
        raise ValueError(f"{spec.case_id}: no function with a distinctive docstring fits")
    target = rng.choice(candidates)
    turn = Turn(
        f'Which function in the files above has a docstring that begins "{target.summary}"? '
        "Answer with the function name.",
        (target.name,),
        (target.def_line,),
        max_tokens=16,
    )
    return BenchCase(spec, "\n\n\n".join(files), (turn,))


def multi_turn(spec: CaseSpec, count: CountTokens) -> BenchCase:
    rng = random.Random(spec.seed)
    keys, values = set(), set()
    pairs = [(random_key(rng, keys), random_value(rng, values)) for _ in range(3)]
    texts = [needle(k, v) for k, v in pairs]
    hay = haystack(rng, _body_tokens(spec, count, texts), count)
    depths = [0.1 + 0.1 * rng.random(), 0.45 + 0.1 * rng.random(), 0.8 + 0.1 * rng.random()]
    doc = insert_at_depths(hay, list(zip(depths, texts, strict=True)))
    order = rng.sample(range(3), 3)
    turns = tuple(
        Turn(f"What is the special magic {pairs[i][0]} number?", (pairs[i][1],), (texts[i],))
        for i in order
    )
    return BenchCase(spec, "\n\n".join(doc), turns)


def placement(spec: CaseSpec, count: CountTokens) -> BenchCase:
    """A single needle; the spec's placement puts the question before or inside the text."""
    return single_needle(spec, count)


def system_document(spec: CaseSpec, count: CountTokens) -> BenchCase:
    """A single needle in a document inside the system message (a RAG app's layout)."""
    return single_needle(replace(spec, placement="system"), count)


@dataclass(frozen=True)
class SuitePlan:
    """Which cases to run: families × cases, lengths cycled, needle depths spread 0..1."""

    families: tuple[str, ...]
    cases: int
    lengths: tuple[int, ...]
    seed: int = 0
    placements: tuple[Placement, ...] = field(default=("before", "inside"))

    def specs(self) -> list[CaseSpec]:
        out = []
        for f_index, family in enumerate(self.families):
            for i in range(self.cases):
                depth = i / (self.cases - 1) if self.cases > 1 else 0.5
                place: Placement = "after"
                if family == "placement":
                    place = self.placements[i % len(self.placements)]
                with_depth = family in (
                    "single_needle",
                    "multi_key",
                    "placement",
                    "system_document",
                    "paraphrased_needle",
                )
                out.append(
                    CaseSpec(
                        family,
                        self.seed + 1000 * f_index + i,
                        self.lengths[i % len(self.lengths)],
                        depth if with_depth else None,
                        place,
                    )
                )
        return out


def token_counter(tokenizer) -> CountTokens:
    """Count target tokens of a text (no special tokens added)."""

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    return count
