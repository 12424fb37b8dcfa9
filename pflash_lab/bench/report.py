"""Turn per-turn results into the tables an operator reads to pick a keep ratio.

Every number is computed from `TurnResult` rows:

- retention: mean share of evidence kept verbatim in the served prompt;
- in prompt: mean share of gold answers present in the served prompt (LLMLingua may keep
  a value while cutting its sentence, so this is the kinder measure);
- accuracy: mean answer score; "vs full" subtracts full prefill's accuracy on the same
  turns (points);
- TTFT ratio: the median over turns of method TTFT / full-prefill TTFT on the same turn;
- compression: median wall time of compression (drafter + selection for PFlash, the
  whole `compress_prompt` for LLMLingua).

Only rows at the main keep ratio (and full prefill) enter the main tables; the sweep table
uses every ratio.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pflash_lab.bench.runner import METHODS, TurnResult

GOALS = (  # (family or "all", minimum PFlash retention)
    ("single_needle", 0.98),
    ("multi_key", 0.90),
    ("multi_value", 0.90),
    ("variable_tracking", 0.90),
    ("code_retrieval", 0.85),
)
LLMLINGUA_MARGIN = 0.20
SPEEDUP_GOAL = 5.0


@dataclass(frozen=True)
class MethodSummary:
    """One method on one family (or "all") at the main keep ratio."""

    family: str
    method: str
    turns: int
    retention: float
    in_prompt: float
    question_kept: float
    accuracy: float
    full_accuracy: float
    ttft_ratio: float
    ttft_ms: float
    compress_ms: float
    served_tokens: float

    @property
    def accuracy_vs_full(self) -> float:
        return self.accuracy - self.full_accuracy


def main_keep(results: Sequence[TurnResult]) -> float:
    """The keep ratio every case ran at: the most frequent non-full ratio."""
    ratios = Counter(r.keep_ratio for r in results if r.method != "full")
    return ratios.most_common(1)[0][0] if ratios else 1.0


def _mean(xs: Iterable[float]) -> float:
    xs = list(xs)
    return sum(xs) / len(xs) if xs else math.nan


def _median(xs: Iterable[float]) -> float:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def at_keep(results: Sequence[TurnResult], keep: float) -> list[TurnResult]:
    return [r for r in results if r.method == "full" or math.isclose(r.keep_ratio, keep)]


def summarise(results: Sequence[TurnResult], keep: float | None = None) -> list[MethodSummary]:
    """Per (family, method) and per method over all families ("all"), at `keep`."""
    keep = main_keep(results) if keep is None else keep
    rows = at_keep(results, keep)
    full = {(r.case_id, r.turn): r for r in rows if r.method == "full"}
    groups: dict[tuple[str, str], list[TurnResult]] = defaultdict(list)
    for r in rows:
        groups[(r.family, r.method)].append(r)
        groups[("all", r.method)].append(r)
    out = []
    for (family, method), rs in groups.items():
        paired = [(r, full.get((r.case_id, r.turn))) for r in rs]
        with_full = [(r, f) for r, f in paired if f is not None]
        out.append(
            MethodSummary(
                family=family,
                method=method,
                turns=len(rs),
                retention=_mean(r.retention for r in rs),
                in_prompt=_mean(r.answers_in_prompt / max(1, r.answers_total) for r in rs),
                question_kept=_mean(float(r.question_kept) for r in rs),
                accuracy=_mean(r.answer_score for r in rs),
                full_accuracy=_mean(f.answer_score for _, f in with_full),
                ttft_ratio=_median(r.ttft_ms / f.ttft_ms for r, f in with_full if f.ttft_ms > 0),
                ttft_ms=_median(r.ttft_ms for r in rs),
                compress_ms=_median(r.compress_ms for r in rs),
                served_tokens=_median(r.served_tokens for r in rs),
            )
        )
    order = {m: i for i, m in enumerate(METHODS)}
    families = list(dict.fromkeys(r.family for r in results)) + ["all"]
    return sorted(out, key=lambda s: (families.index(s.family), order.get(s.method, 99)))


# --------------------------------------------------------------------------- markdown


def _pct(x: float) -> str:
    return "–" if math.isnan(x) else f"{100 * x:.0f}%"


def _ms(x: float) -> str:
    if math.isnan(x):
        return "–"
    return f"{x / 1000:.1f} s" if x >= 1000 else f"{x:.0f} ms"


def _methods(summaries: Sequence[MethodSummary]) -> list[str]:
    present = {s.method for s in summaries}
    return [m for m in METHODS if m in present]


def _grid(summaries: Sequence[MethodSummary], value, methods: Sequence[str]) -> list[str]:
    by = {(s.family, s.method): s for s in summaries}
    families = list(dict.fromkeys(s.family for s in summaries))
    lines = ["| family | turns | " + " | ".join(methods) + " |", "|---" * (len(methods) + 2) + "|"]
    for f in families:
        cells = [value(by[(f, m)]) if (f, m) in by else "–" for m in methods]
        turns = max(by[(f, m)].turns for m in methods if (f, m) in by)
        name = f"**{f}**" if f == "all" else f
        lines.append(f"| {name} | {turns} | " + " | ".join(cells) + " |")
    return lines


def family_tables(summaries: Sequence[MethodSummary]) -> list[str]:
    methods = _methods(summaries)
    compressed = [m for m in methods if m != "full"]
    out = ["### Evidence retention (kept verbatim in the served prompt)", ""]
    out += _grid(summaries, lambda s: _pct(s.retention), compressed)
    out += ["", "### Gold answer present in the served prompt", ""]
    out += _grid(summaries, lambda s: _pct(s.in_prompt), compressed)
    out += [
        "",
        "### Answer accuracy (greedy reply contains the gold answer; full = no compression)",
    ]
    out += [""]
    out += _grid(summaries, lambda s: _pct(s.accuracy), methods)
    out += ["", "### TTFT ratio (median of method TTFT / full-prefill TTFT on the same turn)", ""]
    out += _grid(
        summaries, lambda s: "–" if math.isnan(s.ttft_ratio) else f"{s.ttft_ratio:.2f}", compressed
    )
    out += ["", "### Compression wall time (median per turn)", ""]
    out += _grid(summaries, lambda s: _ms(s.compress_ms), compressed)
    return out


def length_table(results: Sequence[TurnResult], keep: float) -> list[str]:
    """Median compression time and TTFT per method and requested length."""
    rows = at_keep(results, keep)
    methods = [m for m in METHODS if any(r.method == m for r in rows)]
    lengths = sorted({r.length for r in rows})
    out = [
        "| method | " + " | ".join(f"{n} compress / TTFT" for n in lengths) + " |",
        "|---" * (len(lengths) + 1) + "|",
    ]
    for m in methods:
        cells = []
        for n in lengths:
            rs = [r for r in rows if r.method == m and r.length == n]
            cells.append(
                f"{_ms(_median(r.compress_ms for r in rs))} / {_ms(_median(r.ttft_ms for r in rs))}"
            )
        out.append(f"| {m} | " + " | ".join(cells) + " |")
    return out


def sweep_table(results: Sequence[TurnResult]) -> list[str]:
    """Retention and accuracy by keep ratio, on the cases that ran the sweep."""
    swept = {r.case_id for r in results if r.method == "pflash"}
    ratios_by_case: dict[str, set[float]] = defaultdict(set)
    for r in results:
        if r.method == "pflash":
            ratios_by_case[r.case_id].add(r.keep_ratio)
    swept = {c for c in swept if len(ratios_by_case[c]) > 1}
    if not swept:
        return []
    rows = [r for r in results if r.case_id in swept and r.method != "full"]
    ratios = sorted({r.keep_ratio for r in rows})
    out = [
        "| family | method | " + " | ".join(f"r={x:g}" for x in ratios) + " |",
        "|---" * (len(ratios) + 2) + "|",
    ]
    for family in dict.fromkeys(r.family for r in rows):
        for m in METHODS:
            cells = []
            for x in ratios:
                rs = [
                    r
                    for r in rows
                    if r.family == family and r.method == m and math.isclose(r.keep_ratio, x)
                ]
                cells.append(
                    f"{_pct(_mean(r.retention for r in rs))} / {_pct(_mean(r.answer_score for r in rs))}"
                    if rs
                    else "–"
                )
            if any(c != "–" for c in cells):
                out.append(f"| {family} | {m} | " + " | ".join(cells) + " |")
    return out


def goal_lines(summaries: Sequence[MethodSummary]) -> list[str]:
    """The issue's goals, each with the measured value and the miss, if any."""
    by = {(s.family, s.method): s for s in summaries}
    out = []
    for family, goal in GOALS:
        s = by.get((family, "pflash"))
        if s is None:
            continue
        verdict = (
            "met" if s.retention >= goal else f"missed by {100 * (goal - s.retention):.0f} points"
        )
        out.append(f"- {family} retention ≥ {100 * goal:.0f}%: {_pct(s.retention)} ({verdict})")
    p, ll = by.get(("all", "pflash")), by.get(("all", "llmlingua"))
    if p and ll:
        margin = p.retention - ll.retention
        verdict = (
            "met"
            if margin >= LLMLINGUA_MARGIN
            else f"missed by {100 * (LLMLINGUA_MARGIN - margin):.0f} points"
        )
        out.append(
            f"- retention ≥ LLMLingua + 20 points: PFlash {_pct(p.retention)} vs LLMLingua "
            f"{_pct(ll.retention)} ({100 * margin:+.0f} points; {verdict})"
        )
        speed = ll.compress_ms / p.compress_ms if p.compress_ms > 0 else math.nan
        verdict = "met" if speed >= SPEEDUP_GOAL else f"missed ({speed:.1f}× < {SPEEDUP_GOAL:.0f}×)"
        out.append(
            f"- compression ≥ 5× faster than LLMLingua: median {_ms(p.compress_ms)} vs "
            f"{_ms(ll.compress_ms)} = {speed:.1f}× ({verdict})"
        )
    return out


def summary_markdown(
    results: Sequence[TurnResult], *, meta: dict | None = None, plots: Sequence[str] = ()
) -> str:
    """The whole summary.md: setup, per-family tables, lengths, sweep, goals, plots."""
    meta = meta or {}
    if not results:
        return "# PFlash bench\n\nNo results.\n"
    keep = main_keep(results)
    summaries = summarise(results, keep)
    cases = len({r.case_id for r in results})
    engine = ", ".join(sorted({r.engine for r in results}))
    out = [
        "# PFlash bench summary",
        "",
        f"- engine: {engine}; keep ratio {keep:g}; {cases} cases, {len(results)} turn results",
    ]
    if meta.get("command"):
        out.append(f"- command: `{meta['command']}`")
    if meta.get("wall_s"):
        out.append(f"- wall time: {meta['wall_s'] / 60:.1f} min")
    out += ["", "## Per family (main keep ratio)", ""] + family_tables(summaries)
    out += ["", "## By prompt length (median compression / TTFT)", ""] + length_table(results, keep)
    sweep = sweep_table(results)
    if sweep:
        out += ["", "## Keep-ratio sweep (retention / accuracy)", ""] + sweep
    goals = goal_lines(summaries)
    if goals:
        out += ["", "## Goals", ""] + goals
    if plots:
        out += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    return "\n".join(out) + "\n"
