"""Selection speed: budget + candidates + strict selection, probe segmentation, legacy selector.

Run: `python -m pflash_lab.bench.selection_speed [--runs N]`. Random per-token scores over S = 8K,
32K and 128K drafter tokens with chat-shaped pins (system prompt, tools, role headers, the
generation prompt, a prompt_end query). Prints the median wall time of each path in ms.
Targets on a 2-core CPU: < 10 / 25 / 50 ms for the strict path at 8K / 32K / 128K.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np

from pflash.compress.plan.budget import plan_budget
from pflash.compress.plan.segments import (
    ProbeParams,
    scheduled_chunk_size,
    segment,
    smooth_boundary_logits,
)
from pflash.compress.selection import (
    LegacyParams,
    build_candidates,
    kept_spans,
    legacy_smooth,
    select_candidates,
    select_legacy,
)
from pflash.spans import Span

SIZES = (8192, 32768, 131072)
VOCAB = 151_000


def chat_pins(n: int) -> dict:
    """Pins of a chat prompt of n drafter tokens: system, tools, role headers, generation prompt."""
    headers = tuple(Span(b, b + 3) for b in range(2000, n - 100, max(500, n // 40)))
    return {
        "query": Span(n - 1, n),
        "required": (Span(n - 60, n - 57), Span(n - 5, n)),
        "system": (Span(0, 300),),
        "instruction_role": (Span(300, 1500), *headers),
    }


def strict_path(n: int, mass: np.ndarray, pins: dict) -> Callable[[], object]:
    def run():
        plan = plan_budget(
            n_tokens=n,
            prompt_tokens=n,
            r0=0.05,
            chunk_size=scheduled_chunk_size(n),
            mode="always",
            **pins,
        )
        seg = segment(
            n,
            mode="fixed",
            chunk_size=plan.chunk_size,
            query=pins["query"],
            pinned=plan.pinned,
            suffix_candidates=False,
        )
        cands = build_candidates(
            seg, mass, query=pins["query"], pinned=plan.pinned, suffix_candidates=False, kind="sum"
        )
        result = select_candidates(cands, budget=plan.budget, mode="budget_only")
        return kept_spans(cands, result.ordinals)

    return run


def probe_path(n: int, mass: np.ndarray, raw: np.ndarray, pins: dict) -> Callable[[], object]:
    params = ProbeParams(threshold=0.9, min_segment=8, max_segment=2048)
    taps = np.array([0.05, 0.15, 0.3, 0.15, 0.05])

    def run():
        boundary = smooth_boundary_logits(raw, taps, -0.1)
        pinned = (*pins["required"], *pins["system"], *pins["instruction_role"])
        seg = segment(
            n,
            mode="auto",
            chunk_size=scheduled_chunk_size(n),
            query=pins["query"],
            pinned=pinned,
            suffix_candidates=False,
            boundary=boundary,
            params=params,
        )
        cands = build_candidates(
            seg, mass, query=pins["query"], pinned=pinned, suffix_candidates=False, kind="density"
        )
        result = select_candidates(
            cands, budget=int(0.1 * n), mode="budget_only", skip_oversized=True
        )
        return len(seg), kept_spans(cands, result.ordinals)

    return run


def legacy_path(ids: np.ndarray, score: np.ndarray) -> Callable[[], object]:
    params = LegacyParams(repeat_rule=True)

    def run():
        return select_legacy(ids, legacy_smooth(score, 13), 0.05, params)

    return run


def median_ms(fn: Callable[[], object], runs: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=25, help="timed runs per cell (median)")
    parser.add_argument("--no-assembly", action="store_true", help="skip the assembly timings")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{'S (drafter tokens)':>18} | {'strict ms':>9} | {'probe ms':>8} | {'legacy ms':>9}")
    print("-" * 54)
    for n in SIZES:
        mass = (rng.random(n) ** 4).astype(np.float32)
        mass /= mass.sum()
        raw = rng.normal(-4.0, 2.5, n).astype(np.float32)  # ~1 boundary per 60 tokens
        ids = rng.integers(0, VOCAB, n)
        ids[n - 40 : n - 36] = ids[n // 3 : n // 3 + 4]  # one needle the question repeats
        pins = chat_pins(n)
        strict = median_ms(strict_path(n, mass, pins), args.runs)
        probe = median_ms(probe_path(n, mass, raw, pins), args.runs)
        legacy = median_ms(legacy_path(ids, mass), args.runs)
        print(f"{n:>18} | {strict:>9.2f} | {probe:>8.2f} | {legacy:>9.2f}")
    if not args.no_assembly:
        assembly_table(args.runs)


def assembly_table(runs: int) -> None:
    """Assembly (decode kept runs, paragraph join, re-encode with the target tokenizer) on
    real text with the embedded SmolLM2 tokenizer as drafter and target, keep ~10%."""
    from pflash.compress.assemble import assemble
    from pflash.models.source import load_tokenizer
    from pflash.spans import Span

    tok = load_tokenizer("embedded:smollm2-135m")
    text = "".join(
        p.read_text()
        for p in sorted(Path("/usr/share/common-licenses").glob("*"))[:40]
        if p.is_file()
    )
    all_ids = tok(text * 8, add_special_tokens=False)["input_ids"]
    print()
    print(f"{'S (drafter tokens)':>18} | {'assembly ms':>11} | kept runs")
    print("-" * 44)
    for n in SIZES:
        ids = all_ids[:n]
        spans = [Span(b, b + 64) for b in range(0, n - 64, 640)]
        ms = median_ms(
            partial(assemble, tok, tok, ids, spans, paragraph_join=True), max(3, runs // 5)
        )
        print(f"{len(ids):>18} | {ms:>11.1f} | {len(spans)}")


if __name__ == "__main__":
    main()
