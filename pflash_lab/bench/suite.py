"""`pflash bench run|report|smoke`: generate cases, run them, write JSONL + summary + plots.

    pflash bench run --out bench-out [--engine inprocess|http] [--families ...]
                     [--cases 4] [--lengths 2048 4096 7168] [--keep 0.1]
                     [--sweep 0.05 0.1 0.2 0.3] [--sweep-families single_needle ...]
                     [--methods pflash full llmlingua tail random] [--seed 0]
    pflash bench report bench-out          # summary.md and plots from results.jsonl
    pflash bench smoke --out DIR           # a few small cases against the embedded app
    pflash bench ablate --out DIR          # retention per scoring variant (no target)

The in-process engine uses the PFlash settings of serve_config.yaml's application (the
embedded default); the HTTP engine starts that application (`ServeCluster`) unless
`--base-url` points at a running one (which must allow `pflash_return_prompt`).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

from pflash_lab.bench.ablation import add_arguments as add_ablation
from pflash_lab.bench.ablation import run_ablation
from pflash_lab.bench.harness import (
    RESULTS,
    SUMMARY,
    http_engine,
    inprocess_config,
    parse_overrides,
    serve_args,
    write_report,
)
from pflash_lab.bench.runner import METHODS, Baselines, RunPlan, run_suite
from pflash_lab.bench.smoke import run_smoke
from pflash_lab.corpus.cases import SuitePlan, token_counter
from pflash_lab.corpus.families import FAMILIES, generate


def add_arguments(sub) -> None:
    """The `bench` subcommand tree: `pflash bench` (registered in pyproject.toml under the
    `pflash.commands` entry points) and `python -m pflash_lab.bench`."""
    bench = sub.add_parser("bench", help="quality and speed harness: run, report, smoke")
    bsub = bench.add_subparsers(dest="bench_command", required=True)

    run = bsub.add_parser("run", help="run generated cases through PFlash and the baselines")
    run.add_argument("--out", required=True, help="output directory (results.jsonl appended)")
    run.add_argument("--engine", choices=("inprocess", "http"), default="http")
    run.add_argument("--base-url", default=None, help="http engine: a running server's …/v1")
    run.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    run.add_argument("--cases", type=int, default=4, help="cases per family")
    run.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 7168])
    run.add_argument("--keep", type=float, default=0.1)
    run.add_argument("--sweep", type=float, nargs="*", default=[0.05, 0.1, 0.2, 0.3])
    run.add_argument(
        "--sweep-families",
        nargs="*",
        default=["single_needle", "variable_tracking"],
        help="families whose cases at --sweep-length also run the ratio sweep",
    )
    run.add_argument("--sweep-length", type=int, default=2048)
    run.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--threads", type=int, default=None, help="torch threads (in process)")
    run.add_argument(
        "--set",
        action="append",
        default=None,
        metavar="KEY=VALUE",
        help="override a PFlash config key for the run (in process; repeatable)",
    )
    run.add_argument("--no-progress", action="store_true")

    report = bsub.add_parser("report", help="summary.md and plots from a results directory")
    report.add_argument("out", help="directory holding results.jsonl")

    smoke = bsub.add_parser("smoke", help="a few small cases against the embedded app (CI)")
    smoke.add_argument("--out", default=None, help="output directory (default: a temp dir)")
    smoke.add_argument("--base-url", default=None, help="use a running server instead")

    add_ablation(bsub)


def run_bench(args) -> int:
    if args.bench_command == "run":
        return _run(args)
    if args.bench_command == "report":
        write_report(Path(args.out))
        print(Path(args.out) / SUMMARY)
        return 0
    if args.bench_command == "ablate":
        return run_ablation(args)
    if args.bench_command == "smoke":
        out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="pflash-smoke-"))
        run_smoke(out, base_url=args.base_url)
        print((out / SUMMARY).read_text())
        return 0
    return 2


def _run(args) -> int:
    from pflash.models.source import load_tokenizer

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    overrides = parse_overrides(args.set)
    if overrides and args.engine == "http" and args.base_url is None:
        raise SystemExit("--set applies to the in-process engine (or put it in serve_config)")
    config = inprocess_config(args.keep, overrides)
    tokenizer = load_tokenizer(config.target_tokenizer or config.target)
    count = token_counter(tokenizer)
    plan = SuitePlan(tuple(args.families), args.cases, tuple(args.lengths), seed=args.seed)
    cases = [generate(spec, count) for spec in plan.specs()]
    sweep_cases = frozenset(
        c.case_id
        for c in cases
        if c.family in args.sweep_families and c.spec.length == args.sweep_length
    )
    run_plan = RunPlan(tuple(args.methods), args.keep, tuple(args.sweep), sweep_cases)
    llm = None
    if "llmlingua" in args.methods:
        from pflash_lab.bench.baselines import LongLLMLingua

        llm = LongLLMLingua(config.drafter, tokenizer)
    baselines = Baselines(tokenizer, llmlingua=llm)
    meta = {
        "command": "pflash " + " ".join(getattr(args, "argv", []) or []),
        "engine": args.engine,
        "keep": args.keep,
        "cases": len(cases),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "config": {**serve_args(), **overrides},
    }
    (out / "run.json").write_text(json.dumps(meta, indent=2))
    t0 = time.perf_counter()
    if args.engine == "inprocess":
        from pflash_lab.bench.runner import InProcessEngine

        engine = InProcessEngine(config, threads=args.threads)
        run_suite(
            cases,
            engine,
            baselines,
            run_plan,
            out_path=out / RESULTS,
            progress=not args.no_progress,
        )
    else:
        with http_engine(tokenizer, args.base_url, out) as engine:
            run_suite(
                cases,
                engine,
                baselines,
                run_plan,
                out_path=out / RESULTS,
                progress=not args.no_progress,
            )
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "run.json").write_text(json.dumps(meta, indent=2))
    write_report(out)
    print((out / SUMMARY).read_text())
    return 0


# The `pflash.commands` entry point's protocol: `add_arguments(subparsers)` and `run(args)`.
run = run_bench
