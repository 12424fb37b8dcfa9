"""Retrieval prompts with known evidence, for training and validating the scoring head.

Each example is a bench case (`pflash_lab.corpus.cases`: same families, same question
wording, same evidence strings) rendered as a chat with the drafter's template and planned
by `pipeline.prepare` exactly as serving plans it, so the query windows the head is trained
on are the ones it will score with. Spans are drafter tokens over `HeadExample.ids`.

Two held-out axes:

- **text**: the haystack paragraphs come from whole files of one split, by the same
  file-name hash as the segment probe's corpus (`probe_corpus.is_held_out`): license
  `licenses/GPL-3` and about one stdlib module in six are validation text. A generated
  case is re-hosted (`rehost`) on its split's paragraphs: its inserted statements
  (needles, chain statements) keep their relative depths, the prose around them changes.
- **family**: some families are never trained on (`VAL_ONLY_FAMILIES`). `code_retrieval`
  documents are whole stdlib modules, so its text is not split (`text="mixed"`).
- **wording**: `paraphrase_pairs` (`TRAINING_ONLY_FAMILIES`) is `paraphrased_needle` over the
  trainer's own word resource (`pflash_lab.train.paraphrase_pairs`): paraphrase-style pairs for
  the head, while the bench's non-literal families keep subjects, concepts and wordings no
  head has seen. It is not a bench family (`families.FAMILIES` does not list it).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pflash.compress.plan.query import QueryWindow
from pflash.spans import Span
from pflash_lab.corpus.cases import (
    BenchCase,
    CaseSpec,
    CountTokens,
    corpus_paragraphs,
    insert_at_depths,
    token_counter,
)
from pflash_lab.corpus.families import FAMILIES, generate
from pflash_lab.corpus.nonliteral import paraphrased_needle
from pflash_lab.train.paraphrase_pairs import TRAIN_SUBJECTS
from pflash_lab.train.probe_corpus import split_of

Split = Literal["train", "val"]
TextSplit = Literal["train", "val", "mixed"]

TRAIN_FAMILIES = ("single_needle", "multi_key", "multi_value", "variable_tracking")
VAL_ONLY_FAMILIES = ("multi_query", "code_retrieval")
UNSPLIT_FAMILIES = frozenset({"code_retrieval"})  # documents are whole stdlib modules
LENGTHS = (1024, 1536, 2048)  # target tokens of the rendered prompt, cycled


def _paraphrase_pairs(spec: CaseSpec, count: CountTokens) -> BenchCase:
    return paraphrased_needle(spec, count, TRAIN_SUBJECTS)


TRAINING_ONLY_FAMILIES = {"paraphrase_pairs": _paraphrase_pairs}
HEAD_FAMILIES = (*FAMILIES, *TRAINING_ONLY_FAMILIES)  # what `--families` may name


@dataclass(frozen=True)
class HeadExample:
    """One planned retrieval prompt (drafter tokens).

    - `windows`, `query`, `suffix_candidates`: the scorer request `pipeline.prepare` built;
    - `context`: the document's tokens, cut into fixed chunks for ranking;
    - `evidence`: one span per evidence string (needle sentence, chain statement, def line).
    """

    case_id: str
    family: str
    text: TextSplit
    ids: tuple[int, ...]
    windows: tuple[QueryWindow, ...]
    query: Span
    suffix_candidates: bool
    context: Span
    evidence: tuple[Span, ...]


# --------------------------------------------------------------------------- split text


def _in_train(name: str) -> bool:
    return split_of(name) == "train"


def _in_val(name: str) -> bool:
    return split_of(name) == "val"


def split_paragraphs(split: Split) -> tuple[str, ...]:
    """The generators' corpus (license paragraphs, then stdlib docstring paragraphs) restricted
    to the files of `split`, named as `probe_corpus` names them (`licenses/GPL-3`,
    `stdlib/textwrap.py`)."""
    return corpus_paragraphs(_in_train if split == "train" else _in_val)


def rehost(case: BenchCase, paragraphs: Sequence[str], count: CountTokens) -> BenchCase:
    """The same case on other prose: the generator's haystack paragraphs are replaced by a
    contiguous run of `paragraphs` of about the same token count (start fixed by the case's
    seed); the inserted items (every paragraph not from the generators' corpus) keep their
    relative depth and order."""
    corpus = set(corpus_paragraphs())
    parts = case.document.split("\n\n")
    hay_tokens, items, seen = 0, [], 0
    for p in parts:
        if p in corpus:
            hay_tokens += count(p) + 1
            seen += 1
        else:
            items.append((seen, p))
    if not items:
        raise ValueError(f"{case.case_id}: nothing inserted to re-host")
    rng = random.Random(f"rehost-{case.spec.seed}")
    i = rng.randrange(len(paragraphs))
    hay, total = [], 0
    while not hay or total + count(paragraphs[i % len(paragraphs)]) + 1 <= hay_tokens:
        p = paragraphs[i % len(paragraphs)]
        hay.append(p)
        total += count(p) + 1
        i += 1
    # the k-th of `seen` haystack paragraphs -> depth k/seen; ties keep their order
    depths = [(k / max(1, seen), n, p) for n, (k, p) in enumerate(items)]
    doc = insert_at_depths(hay, [(d + 1e-9 * n, p) for d, n, p in depths])
    return dataclasses.replace(case, document="\n\n".join(doc))


# --------------------------------------------------------------------------- planning


def plan_example(case: BenchCase, text: TextSplit, *, tokenizer, config) -> HeadExample:
    """Render turn 0 with the drafter's chat template, plan it with `pipeline.prepare` (the
    serving path), and locate the document and the evidence in drafter tokens."""
    from pflash.compress.pipeline import CompressionRequest, prepare
    from pflash.compress.render.chat import render_chat
    from pflash.compress.render.rendered import RenderedPrompt
    from pflash.compress.text.encoding import encode_as_written_with_offsets

    messages = case.messages(0)
    rendered = render_chat(tokenizer, messages)
    ids = tuple(tokenizer(rendered, add_special_tokens=False)["input_ids"])
    prepared = prepare(
        CompressionRequest(RenderedPrompt("chat", tuple(ids), tokenizer, messages=messages)),
        config=config,
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
    )
    req = prepared.score_request
    if req is None:
        raise ValueError(f"{case.case_id}: not compressed ({prepared.reason})")
    drafter = prepared.plan.drafter
    if drafter.ids != req.ids:  # the plan's encoding is the request's
        drafter = encode_as_written_with_offsets(tokenizer, drafter.text)
    doc_at = drafter.text.find(case.document)
    if doc_at < 0:
        raise ValueError(f"{case.case_id}: the document is not verbatim in the rendered prompt")
    doc_end = doc_at + len(case.document)
    evidence = []
    for e in case.turns[0].evidence:
        at = drafter.text.find(e, doc_at, doc_end)
        if at < 0:
            raise ValueError(f"{case.case_id}: evidence {e[:40]!r} not in the document")
        evidence.append(drafter.token_span(at, at + len(e)))
    return HeadExample(
        case_id=case.case_id,
        family=case.family,
        text=text,
        ids=tuple(req.ids),
        windows=tuple(req.windows),
        query=req.query,
        suffix_candidates=req.suffix_candidates,
        context=drafter.token_span(doc_at, doc_end),
        evidence=tuple(evidence),
    )


def case_for(family: str, seed: int, length: int, text: TextSplit, count: CountTokens) -> BenchCase:
    """A generated case of `family`, re-hosted on `text`'s paragraphs (not for unsplit
    families, whose documents are not paragraphs). A training-only family is built by its
    own generator, any other by the bench's."""
    spec = CaseSpec(family, seed, length)
    make = TRAINING_ONLY_FAMILIES.get(family)
    case = make(spec, count) if make else generate(spec, count)
    if text == "mixed":
        return case
    return rehost(case, split_paragraphs(text), count)


def examples(
    families: Sequence[str],
    n: int,
    *,
    text: Split,
    stream: int,
    seed: int,
    tokenizer,
    config,
    lengths: Sequence[int] = LENGTHS,
) -> list[HeadExample]:
    """`n` examples cycling over `families` (and `lengths`). Case seeds come from `seed` and
    `stream` (consecutive, skipping a seed the generator cannot build), so sets built with
    different streams (training, validation) never share a case. Deterministic."""
    count = token_counter(tokenizer)
    base = seed * 1_000_003 + stream * 100_000
    out = []
    attempt = 0
    while len(out) < n:
        i = len(out)
        family = families[i % len(families)]
        split: TextSplit = "mixed" if family in UNSPLIT_FAMILIES else text
        attempt += 1
        try:  # a seed whose case cannot be built (no distinctive function fits) is skipped
            case = case_for(family, base + attempt - 1, lengths[i % len(lengths)], split, count)
        except ValueError:
            continue
        out.append(plan_example(case, split, tokenizer=tokenizer, config=config))
    return out
