"""Compression time of two checkouts on the same RULER cases, in interleaved pairs.

    python -m pflash_lab.bench.ruler_timing --cases DIR/cases.jsonl --base /tmp/base \\
        --out DIR [--tasks qa_1 niah_single_1 ...] [--lengths 4096 ...] [--threads 1]

Why pairs: this machine is shared, and its load moves by a factor of several within
minutes; two runs one after the other compare the load, not the code. Here each tree runs
in a process of its own (`--base`: another checkout, e.g. `git worktree add /tmp/base
5db9a4c`; the other is this checkout), each with its own serve_config.yaml at keep 0.1, and
every case is compressed by both back to back, the order alternating from case to case.
Reported per length: the median time of each tree and the median of the per-case ratios
(this tree / base). The first case is served once by both before timing (model loading,
the embedder's first call).

The child runs only what both trees have (`AblationEngine`, `serve_args`), so any commit
with the bench harness can be the base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

from pflash_lab.bench.ruler import TASKS, RulerCase, load_cases

CHILD = """
import json, sys
from pflash_lab.bench.ablation import AblationEngine, parse_variant
from pflash_lab.bench.harness import serve_args
keep, threads = float(sys.argv[1]), int(sys.argv[2])
engine = AblationEngine({**serve_args(), "keep_ratio": keep, "curve": ()},
                        [parse_variant("default:")], threads=threads)
print("ready", flush=True)
for line in sys.stdin:
    served = engine.serve(json.loads(line))["default"]
    print(json.dumps({"ms": served.compress_ms, "served": served.served_tokens,
                      "error": served.error}), flush=True)
"""


class Tree:
    """One checkout's engine in a child process, fed one case per line."""

    def __init__(self, root: Path, keep: float, threads: int):
        env = dict(os.environ, PYTHONPATH=str(root))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(keep), str(threads)],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the engine of {root} did not start")

    def serve(self, case: RulerCase) -> dict:
        self.proc.stdin.write(json.dumps(case.messages()) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def time_pairs(cases: list[RulerCase], trees: dict[str, Tree], out: Path) -> list[dict]:
    """Each case served by both trees back to back, the order alternating; rows appended
    to `out` as they come."""
    names = list(trees)
    for t in trees.values():  # warm-up, not timed
        t.serve(cases[0])
    rows = []
    for k, case in enumerate(cases):
        order = names if k % 2 == 0 else names[::-1]
        got = {name: trees[name].serve(case) for name in order}
        row = {"case": case.case_id, "task": case.task, "length": case.length}
        for name, r in got.items():
            row |= {
                f"{name}_ms": r["ms"],
                f"{name}_served": r["served"],
                f"{name}_error": r["error"],
            }
        row["ratio"] = row["head_ms"] / row["base_ms"]
        with open(out, "a") as fh:
            fh.write(json.dumps(row) + "\n")
        rows.append(row)
        print(f"[{k + 1}/{len(cases)}] {case.case_id} ratio {row['ratio']:.2f}", flush=True)
    return rows


def ratio_table(rows: list[dict]) -> str:
    """Markdown: per length, cases, median base / this tree seconds, median per-case ratio."""
    by = defaultdict(list)
    for r in rows:
        if not (r["base_error"] or r["head_error"]):
            by[r["length"]].append(r)
    lines = [
        "| length | cases | base s, median | this tree s, median | ratio, median (min-max) |",
        "|---|---|---|---|---|",
    ]
    for n in sorted(by):
        rs = by[n]
        ratios = [r["ratio"] for r in rs]
        lines.append(
            f"| {n // 1024}K | {len(rs)} | {statistics.median(r['base_ms'] for r in rs) / 1000:.1f}"
            f" | {statistics.median(r['head_ms'] for r in rs) / 1000:.1f}"
            f" | {statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f}) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=Path, required=True, help="cases.jsonl of a ruler run")
    parser.add_argument("--base", type=Path, required=True, help="the other checkout")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--lengths", type=int, nargs="+", default=None)
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    cases = [c for c in load_cases(args.cases) if c.task in args.tasks]
    if args.lengths:
        cases = [c for c in cases if c.length in args.lengths]
    if not cases:
        parser.error("no case of these tasks and lengths in --cases")
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "timing.jsonl"
    results.unlink(missing_ok=True)
    here = Path(__file__).resolve().parents[2]
    trees = {
        "base": Tree(args.base.resolve(), args.keep, args.threads),
        "head": Tree(here, args.keep, args.threads),
    }
    try:
        rows = time_pairs(cases, trees, results)
    finally:
        for t in trees.values():
            t.close()
    command = "python -m pflash_lab.bench.ruler_timing " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    text = f"# Compression time, this tree / {args.base}\n\n{ratio_table(rows)}\n\nCommand: `{command}`\n"
    (args.out / "summary.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
