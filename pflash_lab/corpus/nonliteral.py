"""Bench families whose question does not name its evidence.

Why: in every family of `pflash_lab.corpus.cases` the question repeats the rare words of its
evidence ("the special magic {key} number", a docstring quoted verbatim), so lexical
anchors keep the evidence by string match and the drafter's attention is never tested on
meaning. Here the evidence is stated with one wording and asked with another that shares
no content word with it (`pflash_lab.corpus.paraphrase` and `pflash_lab.corpus.code_descriptions`
hold the wordings; unit tests check every pair); the wording is drawn from the seed.

Why so many distractor facts: with only the asked fact inserted, one short fact sentence
among license and docstring paragraphs stands out whatever the question is — re-served
with an unrelated question, 6/6 asked facts and 29/30 aggregated ones were still kept. So
every fact family spreads `distractor_count(length)` facts of the same templates, values
and invented entities over the document, and a scorer that does not connect the question
to its evidence keeps the asked fact only about as often as any other fact. Distractors
state only concepts nobody asks about (for any entity), so each asked concept is stated
exactly once and the question stays unambiguous.

- `paraphrased_needle`: one asked fact of an invented entity at a depth.
- `described_code`: real stdlib functions as in `code_retrieval`; the question describes
  what one of them does in words absent from its whole source.
- `described_library_code`: as `described_code` over the files of a third-party library
  (Jinja2, `pflash_lab.corpus.library_descriptions`) that no other family reads; the
  evidence is the asked function whole, not only its `def` line.
- `multi_turn_paraphrase`: three facts of one entity early, middle and late, asked one per
  turn.
- `aggregation`: five facts of one organisation scattered through the text, all asked in
  one question.

Values are unique in the document (a value the license text already holds, such as a year,
is redrawn), so an answer occurs only in its evidence. Every generator is a pure function
of its `CaseSpec` and token counter, like those of `pflash_lab.corpus.cases`.
"""

from __future__ import annotations

import ast
import importlib.util
import itertools
import random
import re
from collections.abc import Iterator
from dataclasses import replace
from functools import lru_cache
from pathlib import Path

from pflash_lab.corpus.cases import (
    BenchCase,
    CaseSpec,
    CodeFunction,
    CountTokens,
    Turn,
    _body_tokens,
    _depth,
    code_functions,
    haystack,
    insert_at_depths,
    module_functions,
)
from pflash_lab.corpus.code_descriptions import (
    CODE_QUESTION_FRAMES,
    DESCRIBED_FUNCTIONS,
    FunctionDescription,
    usable_descriptions,
)
from pflash_lab.corpus.library_descriptions import LIBRARY_FUNCTIONS, LIBRARY_PACKAGE
from pflash_lab.corpus.paraphrase import (
    AGGREGATE_FRAMES,
    ORGANISATION,
    SUBJECTS,
    Fact,
    Subject,
    draw_fact,
    draw_value,
    entity_name,
)

AGGREGATED_FACTS = 5
# One distractor fact per this many tokens of the request (about a third of the document
# is then fact sentences). Measured with the attention scorer at keep 0.1, 2K-4K, a control
# question: at one per 100 tokens it kept about 16 facts a document whatever their number,
# 45% of all facts and 25-50% of the asked ones; at one per 50, 24% of all facts and 13-17%
# of the asked ones, close to the 14% of tokens it served.
TOKENS_PER_DISTRACTOR = 50
MIN_DISTRACTORS = 12
FACT_TOKENS = 20  # about one fact sentence and its paragraph break, for filling a gap


# --------------------------------------------------------------------------- facts


def distractor_count(length: int) -> int:
    """How many distractor facts a case of `length` tokens carries: a fixed density, so
    the share of fact sentences in the document does not change with its length."""
    return max(MIN_DISTRACTORS, round(length / TOKENS_PER_DISTRACTOR))


def draw_facts(
    rng: random.Random,
    n: int,
    subject: Subject | None = None,
    noun: str | None = None,
    subjects: tuple[Subject, ...] = SUBJECTS,
) -> tuple[list[Fact], set[str]]:
    """`n` facts of distinct concepts about one invented entity, and the values taken.

    Without `subject` one of `subjects` is drawn; without `noun` each question picks its own."""
    subject = subject or rng.choice(subjects)
    entity = entity_name(rng)
    taken = {entity}
    facts = [
        draw_fact(concept, entity, noun or rng.choice(subject.nouns), rng, taken)
        for concept in rng.sample(subject.concepts, n)
    ]
    return facts, taken


def distractor_stream(
    rng: random.Random,
    asked: list[Fact],
    taken: set[str],
    subjects: tuple[Subject, ...] = SUBJECTS,
) -> Iterator[Fact]:
    """Facts of the concepts no question of the case asks about, over `subjects`, for as
    long as they are drawn (a stream, so a document can take more to fill its length).

    Round r states each such concept once, in a shuffled order, for the r-th entity of its
    subject (round 0 of the asked subject: the asked entity itself), so no entity states a
    concept twice and no asked concept is stated again. Values are distinct from `taken`."""
    asked_keys = {f.concept.key for f in asked}
    pool = [(s, c) for s in subjects for c in s.concepts if c.key not in asked_keys]
    entities: dict[str, list[str]] = {s.key: [] for s in subjects}
    entities[_subject_of(asked[0], subjects).key].append(asked[0].entity)
    for round_ in itertools.count():
        for subject, concept in rng.sample(pool, len(pool)):
            names = entities[subject.key]
            while len(names) <= round_:
                names.append(entity_name(rng, taken))
            yield draw_fact(concept, names[round_], rng.choice(subject.nouns), rng, taken)


def _subject_of(fact: Fact, subjects: tuple[Subject, ...]) -> Subject:
    return next(s for s in subjects if fact.concept in s.concepts)


def unseen_values(facts: list[Fact], text: str, rng: random.Random, taken: set[str]) -> list[Fact]:
    """The facts with every value that `text` already contains redrawn, so the answer to a
    question occurs only in its evidence sentence."""
    out = []
    for fact in facts:
        while re.search(rf"\b{re.escape(fact.value)}\b", text):
            fact = replace(fact, value=draw_value(fact.concept, rng, taken))
        out.append(fact)
    return out


def facts_document(
    spec: CaseSpec,
    count: CountTokens,
    rng: random.Random,
    asked: list[Fact],
    depths: list[float],
    taken: set[str],
    questions: list[str],
    subjects: tuple[Subject, ...] = SUBJECTS,
) -> tuple[str, list[Fact]]:
    """The document of a fact family and the asked facts with their final values.

    The asked facts go at `depths`, distractors at random depths, each fact its own
    paragraph. The haystack is sized for `distractor_count` distractors and the
    `questions`; when it stops short (its next paragraph did not fit), more distractors
    fill the gap, so the document reaches its length. Distractors are facts of `subjects`
    (the asked facts' own resource)."""
    stream = distractor_stream(rng, asked, taken, subjects)
    distractors = list(itertools.islice(stream, distractor_count(spec.length)))
    extra = [f.statement for f in asked + distractors] + questions
    hay = haystack(rng, _body_tokens(spec, count, extra), count)
    hay_text = "\n\n".join(hay)
    facts = unseen_values(asked + distractors, hay_text, rng, taken)
    items = list(zip(depths, (f.statement for f in facts[: len(asked)]), strict=True))
    items += [(rng.random(), f.statement) for f in facts[len(asked) :]]
    doc = "\n\n".join(insert_at_depths(hay, items))
    target = _body_tokens(spec, count, questions)
    while (gap := target - count(doc)) >= FACT_TOKENS:
        more = unseen_values(
            list(itertools.islice(stream, gap // FACT_TOKENS)), hay_text, rng, taken
        )
        items += [(rng.random(), f.statement) for f in more]
        doc = "\n\n".join(insert_at_depths(hay, items))
    return doc, facts[: len(asked)]


def _fact_turn(fact: Fact) -> Turn:
    return Turn(fact.question, (fact.value,), (fact.statement,))


# --------------------------------------------------------------------------- families


def paraphrased_needle(
    spec: CaseSpec, count: CountTokens, subjects: tuple[Subject, ...] = SUBJECTS
) -> BenchCase:
    """One asked fact among distractors. `subjects` is the word resource: the bench's
    (`paraphrase.SUBJECTS`), or the head trainer's own (`pflash_lab.train.paraphrase_pairs`)."""
    rng = random.Random(spec.seed)
    asked, taken = draw_facts(rng, 1, subjects=subjects)
    depths = [_depth(spec, rng)]
    questions = [asked[0].question]
    doc, (fact,) = facts_document(spec, count, rng, asked, depths, taken, questions, subjects)
    return BenchCase(spec, doc, (_fact_turn(fact),))


def multi_turn_paraphrase(spec: CaseSpec, count: CountTokens) -> BenchCase:
    rng = random.Random(spec.seed)
    asked, taken = draw_facts(rng, 3)
    depths = [0.1 + 0.1 * rng.random(), 0.45 + 0.1 * rng.random(), 0.8 + 0.1 * rng.random()]
    doc, facts = facts_document(spec, count, rng, asked, depths, taken, [])
    turns = tuple(_fact_turn(facts[i]) for i in rng.sample(range(3), 3))
    return BenchCase(spec, doc, turns)


def aggregation(spec: CaseSpec, count: CountTokens) -> BenchCase:
    rng = random.Random(spec.seed)
    noun = rng.choice(ORGANISATION.nouns)
    frame = rng.choice(AGGREGATE_FRAMES)
    asked, taken = draw_facts(rng, AGGREGATED_FACTS, ORGANISATION, noun)
    question = frame.format(noun=noun, questions=" ".join(f.question for f in asked))
    depths = [rng.random() for _ in asked]
    doc, facts = facts_document(spec, count, rng, asked, depths, taken, [question])
    turn = Turn(
        question,
        tuple(f.value for f in facts),
        tuple(f.statement for f in facts),
        max_tokens=64,
    )
    return BenchCase(spec, doc, (turn,))


# --------------------------------------------------------------------------- described code

FILE_SEPARATOR = "\n\n\n"


def _module_text(module: str, funcs: tuple[CodeFunction, ...]) -> str:
    return f"# File: {module}.py\n\n" + FILE_SEPARATOR.join(f.source for f in funcs)


@lru_cache(maxsize=1)
def described_functions() -> tuple[tuple[FunctionDescription, CodeFunction], ...]:
    """The entries of `DESCRIBED_FUNCTIONS` that this interpreter's stdlib still has
    (modules come and go between Python versions), with their parsed functions, each
    reduced to its descriptions that share no word with that function's source here
    (`usable_descriptions`); an entry with none left is dropped."""
    found = {(m, f.name): f for m, funcs in code_functions() for f in funcs}
    out = []
    for desc in DESCRIBED_FUNCTIONS:
        func = found.get((desc.module, desc.name))
        usable = usable_descriptions(desc, func.source) if func else ()
        if usable:
            out.append((replace(desc, descriptions=usable), func))
    return tuple(out)


def _fitting_target(
    spec: CaseSpec, count: CountTokens, rng: random.Random, modules: dict
) -> tuple[CodeFunction, str, str, int]:
    """A described function whose whole module fits the length: the function, its module's
    text, the question and the body budget (the question counted in)."""
    frame = rng.choice(CODE_QUESTION_FRAMES)
    described = described_functions()
    for desc, target in rng.sample(described, len(described)):
        question = frame.format(description=rng.choice(desc.descriptions))
        budget = _body_tokens(spec, count, [question])
        own = _module_text(desc.module, modules[desc.module])
        if count(own) <= budget:
            return target, own, question, budget
    raise ValueError(f"{spec.case_id}: no described function's module fits the length")


def pack_modules(
    modules: list[tuple[str, tuple[CodeFunction, ...]]], budget: int, count: CountTokens
) -> list[str]:
    """Module files, in the given order, that fill `budget` tokens: every whole module that
    still fits, then the longest leading run of functions of one more module that fits
    what is left (so the document reaches its length instead of stopping at the first
    module too large for the gap). Two tokens per file are counted for the separator; a
    run's size is its functions' sizes summed, checked once on the joined text."""
    files, total, rest = [], 0, []
    for module, funcs in modules:
        text = _module_text(module, funcs)
        n = count(text) + 2
        if total + n <= budget:
            files.append(text)
            total += n
        else:
            rest.append((module, funcs))
    for module, funcs in rest:
        sizes = itertools.accumulate(count(f.source) + 2 for f in funcs[:-1])
        head = count(_module_text(module, ())) + 2
        k = sum(1 for n in sizes if total + head + n <= budget)
        text = _module_text(module, funcs[:k])
        if k and total + count(text) + 2 <= budget:
            return [*files, text]
    return files


def described_code(spec: CaseSpec, count: CountTokens) -> BenchCase:
    """Whole stdlib modules as in `code_retrieval` (the last one possibly cut short to fill
    the length); the target's module is always one of them, whole, and no other module
    defines a function of the same name."""
    rng = random.Random(spec.seed)
    modules = dict(code_functions())
    target, own, question, budget = _fitting_target(spec, count, rng, modules)
    others = [
        (m, funcs)
        for m, funcs in modules.items()
        if m != target.module and all(f.name != target.name for f in funcs)
    ]
    rng.shuffle(others)
    files = pack_modules(others, budget - count(own) - 2, count)
    files.insert(rng.randrange(len(files) + 1), own)
    turn = Turn(question, (target.name,), (target.source,), max_tokens=16)
    return BenchCase(spec, FILE_SEPARATOR.join(files), (turn,))


# --------------------------------------------------------------------------- described library code


@lru_cache(maxsize=1)
def library_functions() -> tuple[tuple[str, tuple[CodeFunction, ...]], ...]:
    """Per module of `LIBRARY_PACKAGE` (named `package/stem`), its top-level undecorated
    functions of 4-60 lines, by the rule of `code_functions`; modules with fewer than 3 are
    left out. Empty when the package is not installed."""
    spec = importlib.util.find_spec(LIBRARY_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        return ()
    root = Path(next(iter(spec.submodule_search_locations)))
    out = []
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        lines = text.splitlines()
        module = f"{LIBRARY_PACKAGE}/{path.stem}"
        funcs = module_functions(tree, lines, module)
        if len(funcs) >= 3:
            out.append((module, tuple(funcs)))
    return tuple(out)


@lru_cache(maxsize=1)
def described_library_functions() -> tuple[tuple[FunctionDescription, CodeFunction], ...]:
    """The entries of `LIBRARY_FUNCTIONS` the installed library still has, each reduced to
    its descriptions that share no word with that function's source (`usable_descriptions`);
    an entry with none left is dropped."""
    found = {(m, f.name): f for m, funcs in library_functions() for f in funcs}
    out = []
    for desc in LIBRARY_FUNCTIONS:
        func = found.get((f"{LIBRARY_PACKAGE}/{desc.module}", desc.name))
        usable = usable_descriptions(desc, func.source) if func else ()
        if usable:
            out.append((replace(desc, descriptions=usable), func))
    return tuple(out)


def _window(
    module: str, funcs: tuple[CodeFunction, ...], i: int, cap: int, count: CountTokens
) -> tuple[CodeFunction, ...]:
    """The longest run of `funcs` around `funcs[i]` whose file fits `cap` tokens, grown one
    function at a time on alternate sides (the target alone when nothing more fits)."""
    lo, hi = i, i + 1
    grown = True
    while grown:
        grown = False
        for lo2, hi2 in ((lo, hi + 1), (lo - 1, hi)):
            if 0 <= lo2 and hi2 <= len(funcs):
                if count(_module_text(module, funcs[lo2:hi2])) <= cap:
                    lo, hi, grown = lo2, hi2, True
    return funcs[lo:hi]


def described_library_code(spec: CaseSpec, count: CountTokens) -> BenchCase:
    """Library files, as `described_code` packs stdlib modules: the target's file holds the
    longest run of its module's functions around the target that fits half the body, the
    other library modules (none defining a function of the target's name) fill the rest,
    and stdlib modules only what the library cannot. The evidence is the target's whole
    source: an answer needs the function, not its name alone."""
    rng = random.Random(spec.seed)
    described = described_library_functions()
    if not described:
        raise ValueError(f"{spec.case_id}: {LIBRARY_PACKAGE} is not installed")
    frame = rng.choice(CODE_QUESTION_FRAMES)
    desc, target = rng.choice(described)
    question = frame.format(description=rng.choice(desc.descriptions))
    budget = _body_tokens(spec, count, [question])
    modules = dict(library_functions())
    funcs = modules[target.module]
    own_funcs = _window(target.module, funcs, funcs.index(target), budget // 2, count)
    own = _module_text(target.module, own_funcs)
    others = [
        (m, fs)
        for m, fs in modules.items()
        if m != target.module and all(f.name != target.name for f in fs)
    ]
    rng.shuffle(others)
    rest = budget - count(own) - 2
    files = pack_modules(others, rest, count)
    left = rest - sum(count(f) + 2 for f in files)
    if left > budget // 10:
        names = {f.name for f in own_funcs}
        stdlib = [(m, fs) for m, fs in code_functions() if all(f.name not in names for f in fs)]
        rng.shuffle(stdlib)
        files += pack_modules(stdlib, left, count)
    rng.shuffle(files)
    files.insert(rng.randrange(len(files) + 1), own)
    turn = Turn(question, (target.name,), (target.source,), max_tokens=16)
    return BenchCase(spec, FILE_SEPARATOR.join(files), (turn,))
