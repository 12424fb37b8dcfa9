"""PNG plots of a bench run (matplotlib, Agg backend, no display needed).

- `retention_vs_keep.png`: per family, mean evidence retention against the keep ratio for
  each compressing method (the sweep cases; families without a sweep show one point);
- `ttft_vs_length.png`: TTFT against the original prompt length, full prefill vs each
  compressing method, one point per turn and a median line per requested length.

matplotlib is an optional dependency (`pip install matplotlib`); without it no plot is
written and the summary says so by listing none.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from pflash_lab.bench.runner import METHODS, TurnResult

COLORS = {
    "pflash": "#1f77b4",
    "full": "#444444",
    "llmlingua": "#d62728",
    "tail": "#2ca02c",
    "random": "#9467bd",
}


def write_plots(results: Sequence[TurnResult], out: Path) -> list[str]:
    """Write both plots into `out`; return their file names (empty without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    if not results:
        return []
    names = []
    names.append(_retention_vs_keep(plt, results, out / "retention_vs_keep.png"))
    names.append(_ttft_vs_length(plt, results, out / "ttft_vs_length.png"))
    return [n for n in names if n]


def _retention_vs_keep(plt, results: Sequence[TurnResult], path: Path) -> str:
    families = list(dict.fromkeys(r.family for r in results))
    ratios: dict[str, set[float]] = defaultdict(set)
    for r in results:
        if r.method != "full":
            ratios[r.case_id].add(r.keep_ratio)
    swept = {c for c, rs in ratios.items() if len(rs) > 1}
    swept_families = {r.family for r in results if r.case_id in swept}
    # a family with sweep cases is drawn from those cases only, so every point of a curve
    # averages the same cases; other families show their one keep ratio over all cases
    results = [r for r in results if r.family not in swept_families or r.case_id in swept]
    xmax = max(r.keep_ratio for r in results if r.method != "full") if results else 1.0
    cols = min(3, len(families))
    rows = math.ceil(len(families) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, family in zip(axes.flat, families, strict=False):
        for method in METHODS:
            if method == "full":
                continue
            by_ratio: dict[float, list[float]] = defaultdict(list)
            for r in results:
                if r.family == family and r.method == method:
                    by_ratio[r.keep_ratio].append(r.retention)
            if not by_ratio:
                continue
            xs = sorted(by_ratio)
            ys = [100 * sum(by_ratio[x]) / len(by_ratio[x]) for x in xs]
            ax.plot(xs, ys, marker="o", label=method, color=COLORS.get(method))
        ax.set_title(family, fontsize=10)
        ax.set_ylim(-5, 105)
        ax.set_xlim(0, xmax * 1.1)
        ax.set_xlabel("keep ratio")
        ax.set_ylabel("retention %")
        ax.grid(alpha=0.3)
    for ax in list(axes.flat)[len(families) :]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels))
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _ttft_vs_length(plt, results: Sequence[TurnResult], path: Path) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.5))
    keep_rows = [r for r in results if r.method == "full" or r.keep_ratio == _main(results)]
    for method in METHODS:
        rs = [r for r in keep_rows if r.method == method]
        if not rs:
            continue
        color = COLORS.get(method)
        ax.scatter(
            [r.prompt_tokens for r in rs],
            [r.ttft_ms / 1000 for r in rs],
            s=12,
            alpha=0.35,
            color=color,
        )
        by_len: dict[int, list[TurnResult]] = defaultdict(list)
        for r in rs:
            by_len[r.length].append(r)
        xs = sorted(by_len)
        med_x = [_median([r.prompt_tokens for r in by_len[n]]) for n in xs]
        med_y = [_median([r.ttft_ms / 1000 for r in by_len[n]]) for n in xs]
        ax.plot(med_x, med_y, marker="o", label=method, color=color)
    ax.set_xlabel("original prompt tokens")
    ax.set_ylabel("TTFT (s)")
    ax.set_title("TTFT vs prompt length (points: turns; lines: medians)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path.name


def _main(results: Sequence[TurnResult]) -> float:
    from pflash_lab.bench.report import main_keep

    return main_keep(results)


def _median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2
