"""Needle prompts over real prose that ships on the machine (license texts, Python stdlib
docstrings): the drafter's layer and calibration measurements, the calibration command and
the real-model tests all score the same prompts.
"""

from __future__ import annotations

import ast
import bisect
import sysconfig
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from pflash.compress.plan.query import QueryWindow
from pflash.spans import Span

EMBEDDED = "embedded:smollm2-135m"
LICENSES = Path("/usr/share/common-licenses")
SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

NEEDLES = (
    (
        "The access code for the north gate of the Riverside warehouse is 4719.",
        "What is the access code for the north gate of the Riverside warehouse?",
    ),
    (
        "Marguerite told the committee that her favourite fruit is the yellow quince from Anatolia.",
        "What is Marguerite's favourite fruit?",
    ),
    (
        "The spare key to the old lighthouse is hidden under the third blue flowerpot by the door.",
        "Where is the spare key to the old lighthouse hidden?",
    ),
)


# --------------------------------------------------------------------------- needle prompts


@lru_cache(maxsize=1)
def haystack_paragraphs() -> tuple[str, ...]:
    """Real prose that ships on the machine: license paragraphs interleaved with stdlib
    module docstrings, in a fixed order."""
    licenses = []
    if LICENSES.is_dir():
        for p in sorted(LICENSES.iterdir()):
            if p.is_file():
                text = p.read_text(encoding="utf-8", errors="replace")
                licenses += [
                    " ".join(b.split()) for b in text.split("\n\n") if len(b.split()) >= 12
                ]
    docs = []
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(root.glob("*.py")):
        try:
            doc = ast.get_docstring(ast.parse(p.read_text(encoding="utf-8", errors="replace")))
        except (SyntaxError, ValueError):
            continue
        if doc:
            docs += [" ".join(b.split()) for b in doc.split("\n\n") if len(b.split()) >= 12]
    out = []
    for i in range(max(len(licenses), len(docs))):
        if i < len(licenses):
            out.append(licenses[i])
        if i < len(docs):
            out.append(docs[i])
    return tuple(out)


@dataclass(frozen=True)
class NeedlePrompt:
    """A ChatML prompt in drafter tokens with one needle sentence in the context."""

    ids: tuple[int, ...]
    query: Span  # main window: the generation prompt's last token (prompt_end)
    windows: tuple[QueryWindow, ...]  # main + the user question's last 8 tokens
    context: Span  # the haystack tokens (the candidates)
    needle: Span  # the needle sentence's tokens


def encode_with_positions(tokenizer, text: str) -> tuple[tuple[int, ...], Callable[[int], int]]:
    """Token ids of `text` and `token_at(char)`: the first token starting at or after `char`."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    starts = [b for b, _ in enc["offset_mapping"]]

    def token_at(char: int) -> int:
        return bisect.bisect_left(starts, char)

    return tuple(enc["input_ids"]), token_at


def needle_prompt(
    tokenizer, n_tokens: int, depth: float, needle: int = 0, offset: int = 0
) -> NeedlePrompt:
    """About `n_tokens` tokens of chat prompt; the needle sits at `depth` (0..1) of the context.

    `offset` rotates the haystack so different prompts use different prose.
    """
    fact, question = NEEDLES[needle % len(NEEDLES)]
    paragraphs = haystack_paragraphs()
    head = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n"
    tail_q = f"\n\nQuestion: {question}"
    tail = f"{tail_q}<|im_end|>\n<|im_start|>assistant\n"
    budget = n_tokens - len(tokenizer(head + tail + fact)["input_ids"])
    chosen, used, i = [], 0, offset
    while used < budget:
        p = paragraphs[i % len(paragraphs)]
        used += len(tokenizer(" " + p)["input_ids"]) + 1
        chosen.append(p)
        i += 1
    at = round(depth * len(chosen))
    body = "\n\n".join(chosen[:at] + [fact] + chosen[at:])
    text = head + body + tail
    ids, token_at = encode_with_positions(tokenizer, text)

    fb = text.index(fact)
    needle_span = Span(token_at(fb), token_at(fb + len(fact)))
    context = Span(token_at(len(head)), token_at(len(head) + len(body)))
    q_end = token_at(len(head) + len(body) + len(tail_q))
    s = len(ids)
    query = Span(s - 1, s)
    turn = Span(q_end - 8, q_end)
    return NeedlePrompt(
        ids,
        query,
        (QueryWindow(query, 1.0, "main"), QueryWindow(turn, 1.0, "turn")),
        context,
        needle_span,
    )


def needle_rank(mass: np.ndarray, prompt: NeedlePrompt, chunk: int = 64) -> tuple[int, int]:
    """(rank, chunks): 1-based rank by summed mass of the best chunk holding needle tokens
    among the fixed chunks of the context."""
    c = prompt.context
    bounds = [(b, min(b + chunk, c.end)) for b in range(c.begin, c.end, chunk)]
    sums = np.array([mass[b:e].sum(dtype=np.float64) for b, e in bounds])
    order = np.argsort(-sums, kind="stable")
    rank = {int(k): r + 1 for r, k in enumerate(order)}
    best = min(
        rank[k]
        for k, (b, e) in enumerate(bounds)
        if b < prompt.needle.end and prompt.needle.begin < e
    )
    return best, len(bounds)
