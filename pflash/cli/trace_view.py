"""`pflash trace view TRACE.jsonl -o page.html`: see what a selection kept and why.

One self-contained HTML page per traced request (inline CSS, no scripts, no external
resources), so a page can be attached to an issue or opened offline:

- the stats on top: input tokens, keep ratio, budget, retained tokens and mass, stop
  reason, selector, scorer, segmentation, the scorer's query window;
- the prompt, segment by segment: kept segments on a green ground, dropped ones struck
  through on grey, each shaded by its score's rank among all candidates (darker = scored
  higher), mandatory (pinned / structural) segments outlined in orange with a pin mark;
  hovering a segment shows its index, tokens and exact score.

Selection traces (`trace_path`) hold drafter token ids, so their text is decoded with the
drafter tokenizer (`--tokenizer`, default the embedded model). View traces
(a record type nothing writes yet) hold the served text itself and are shown with their stats.
"""

from __future__ import annotations

import html
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pflash.spans import decode_ids
from pflash.trace import SelectionTrace, TraceRecord, ViewTrace, read_traces

CSS = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table.stats { border-collapse: collapse; margin-bottom: 1em; }
table.stats td { border: 1px solid #ccc; padding: 2px 8px; font-size: 13px; }
table.stats td.k { color: #555; }
.legend span { margin-right: 1.5em; padding: 1px 6px; }
pre.prompt { white-space: pre-wrap; word-break: break-word; font-size: 13px;
  line-height: 1.5; border: 1px solid #ddd; padding: 1em; }
.seg { border-radius: 2px; }
.kept { color: #000; }
.dropped { color: #777; text-decoration: line-through; text-decoration-color: #bbb; }
.mandatory { outline: 2px solid #f39c12; }
.pin { color: #f39c12; font-weight: bold; }
"""


@dataclass(frozen=True)
class SegmentView:
    """One candidate as the page shows it: its text, fate, mandatory flag and score rank."""

    index: int
    begin: int
    end: int
    text: str
    kept: bool
    mandatory: bool
    score: float
    rank: float  # in [0, 1]: 1 = the highest-scoring candidate


def _ranks(scores: Sequence[float]) -> list[float]:
    """Each score's rank among all, scaled to [0, 1] (ties share the lower rank)."""
    n = len(scores)
    if n <= 1:
        return [1.0] * n
    clean = [s if s == s else float("-inf") for s in scores]  # NaN ranks lowest
    order = sorted(range(n), key=lambda i: clean[i])
    ranks = [0.0] * n
    for pos, i in enumerate(order):
        ranks[i] = pos / (n - 1)
    return ranks


def segment_views(trace: SelectionTrace, tokenizer) -> list[SegmentView]:
    """The trace's candidates with their decoded text, in source order.

    Token ranges the segments do not cover (none with fixed chunks) are returned as
    index -1 pieces so the page shows the whole prompt.
    """
    ids = trace.input_ids
    kept = set(trace.selected_chunks)
    ranks = _ranks(trace.chunk_scores)
    out: list[SegmentView] = []
    pos = 0
    for i, span in enumerate(trace.segments):
        if span.begin > pos:
            text = decode_ids(tokenizer, ids[pos : span.begin])
            out.append(SegmentView(-1, pos, span.begin, text, False, False, float("nan"), 0.0))
        mandatory = bool(trace.forced_chunks[i]) if trace.forced_chunks else False
        score = trace.chunk_scores[i] if i < len(trace.chunk_scores) else float("nan")
        rank = ranks[i] if i < len(ranks) else 0.0
        text = decode_ids(tokenizer, ids[span.begin : span.end])
        out.append(SegmentView(i, span.begin, span.end, text, i in kept, mandatory, score, rank))
        pos = span.end
    if pos < len(ids):
        text = decode_ids(tokenizer, ids[pos:])
        out.append(SegmentView(-1, pos, len(ids), text, False, False, float("nan"), 0.0))
    return out


def _stats_table(rows: Sequence[tuple[str, object]]) -> str:
    cells = "".join(
        f'<tr><td class="k">{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>'
        for k, v in rows
    )
    return f'<table class="stats">{cells}</table>'


def _style(seg: SegmentView) -> str:
    alpha = 0.08 + 0.6 * seg.rank
    if seg.kept:
        return f"background: rgba(46, 160, 67, {alpha:.2f})"
    return f"background: rgba(120, 120, 120, {alpha * 0.5:.2f})"


def _page(title: str, body: str) -> str:
    return (
        "<!DOCTYPE html>\n"
        f'<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{CSS}</style></head><body>\n{body}\n</body></html>\n"
    )


def render_selection(trace: SelectionTrace, tokenizer, *, title: str = "PFlash selection") -> str:
    """One page for a selection trace: stats, legend, the prompt by segment."""
    views = segment_views(trace, tokenizer)
    candidates = [v for v in views if v.index >= 0]
    kept = [v for v in candidates if v.kept]
    stats = [
        ("input tokens (drafter)", trace.input_tokens),
        ("keep ratio (effective)", f"{trace.keep_ratio:.4f}"),
        ("token budget", trace.token_budget),
        ("retained tokens", trace.retained_tokens),
        (
            "retained mass",
            "–" if trace.retained_mass is None else f"{trace.retained_mass:.4f}",
        ),
        ("stop reason", trace.stop_reason),
        ("selector / scorer", f"{trace.selector_mode} / {trace.scorer}"),
        (
            "segmentation / score",
            f"{trace.segmentation} (chunk {trace.chunk_size}) / {trace.candidate_score}",
        ),
        ("candidates kept", f"{len(kept)} of {len(candidates)}"),
        ("mandatory candidates", sum(1 for v in candidates if v.mandatory)),
        ("query window", f"[{trace.query_begin}, {trace.query_end})"),
        (
            "pinned spans",
            ", ".join(f"[{s.begin}, {s.end})" for s in trace.required_instruction_spans) or "–",
        ),
        ("schema", trace.schema_version),
    ]
    pieces = []
    for v in views:
        if v.index < 0:
            pieces.append(f'<span class="seg dropped">{html.escape(v.text)}</span>')
            continue
        classes = ["seg", "kept" if v.kept else "dropped"] + (["mandatory"] if v.mandatory else [])
        tip = (
            f"#{v.index} tokens [{v.begin}, {v.end}) score {v.score!r}"
            f"{' mandatory' if v.mandatory else ''} {'kept' if v.kept else 'dropped'}"
        )
        pin = '<span class="pin">📌</span>' if v.mandatory else ""
        pieces.append(
            f'<span class="{" ".join(classes)}" data-index="{v.index}" '
            f'title="{html.escape(tip)}" style="{_style(v)}">{pin}{html.escape(v.text)}</span>'
        )
    legend = (
        '<p class="legend"><span class="kept" style="background: rgba(46,160,67,0.5)">kept</span>'
        '<span class="dropped" style="background: rgba(120,120,120,0.3)">dropped</span>'
        '<span class="mandatory">📌 mandatory</span>'
        "<span>darker = higher score rank</span></p>"
    )
    body = (
        f"<h1>{html.escape(title)}</h1>\n{_stats_table(stats)}\n{legend}\n"
        f'<pre class="prompt">{"".join(pieces)}</pre>'
    )
    return _page(title, body)


def render_view(trace: ViewTrace, *, title: str = "PFlash served prompt") -> str:
    """One page for a view trace: the stats and the exact served text."""
    stats = [("prompt tokens", trace.prompt_tokens), ("served tokens", trace.served_tokens)]
    for key, value in trace.pflash.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in value.items())
        stats.append((key, value))
    body = (
        f"<h1>{html.escape(title)}</h1>\n{_stats_table(stats)}\n"
        f'<pre class="prompt"><span class="seg kept">{html.escape(trace.served_text)}</span></pre>'
    )
    return _page(title, body)


def render_record(record: TraceRecord, tokenizer, *, title: str) -> str:
    if isinstance(record, ViewTrace):
        return render_view(record, title=title)
    return render_selection(record, tokenizer, title=title)


def page_paths(output: Path, n: int) -> list[Path]:
    """`output` for one record; `stem-1.html` ... `stem-n.html` for several."""
    if n == 1:
        return [output]
    return [
        output.with_name(f"{output.stem}-{i}{output.suffix or '.html'}") for i in range(1, n + 1)
    ]


def write_pages(
    records: Sequence[TraceRecord], output: Path, tokenizer, *, numbers: Sequence[int] | None = None
) -> list[Path]:
    """Write one page per record; returns the paths written."""
    numbers = list(numbers) if numbers is not None else list(range(1, len(records) + 1))
    paths = page_paths(output, len(records))
    for record, number, path in zip(records, numbers, paths, strict=True):
        path.write_text(
            render_record(record, tokenizer, title=f"PFlash trace record {number}"),
            encoding="utf-8",
        )
    return paths


def run_trace_view(args) -> int:
    """Entry point wired in pflash.cli; exit 0 on success, 2 on a bad trace or record."""
    from pflash.models.source import load_tokenizer

    try:
        records = read_traces(args.trace, skip_bad=True)
    except OSError as err:
        print(f"pflash trace view: {err}", file=sys.stderr)
        return 2
    numbers = list(range(1, len(records) + 1))
    if args.record is not None:
        if not 1 <= args.record <= len(records):
            print(
                f"pflash trace view: record {args.record} not in 1..{len(records)}", file=sys.stderr
            )
            return 2
        records, numbers = [records[args.record - 1]], [args.record]
    if not records:
        print(f"pflash trace view: no trace records in {args.trace}", file=sys.stderr)
        return 2
    tokenizer = None
    if any(isinstance(r, SelectionTrace) for r in records):
        tokenizer = load_tokenizer(args.tokenizer or "embedded:smollm2-135m")
    for path in write_pages(records, Path(args.output), tokenizer, numbers=numbers):
        print(path)
    return 0
