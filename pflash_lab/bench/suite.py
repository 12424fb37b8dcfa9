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

import yaml

from pflash_lab.bench.launch import ROOT, ServeCluster, free_port
from pflash_lab.bench.runner import METHODS, Baselines, RunPlan, read_jsonl, run_suite
from pflash_lab.corpus.cases import FAMILIES, SuitePlan, generate, token_counter

RESULTS = "results.jsonl"
SUMMARY = "summary.md"


def serve_args() -> dict:
    """The PFlash settings of serve_config.yaml's application (the product default)."""
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    return dict(cfg["applications"][0]["args"])


def inprocess_config(keep: float, overrides: dict | None = None):
    """serve_config.yaml's settings at `keep`, then `--set` overrides (no PFLASH_* env)."""
    from pflash.config import build_config

    return build_config({**serve_args(), "keep_ratio": keep, **(overrides or {})}, env={})


def parse_overrides(items: list[str] | None) -> dict:
    """`KEY=VALUE` pairs, values read as YAML (so numbers, booleans and null work)."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


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

    from pflash_lab.bench.ablation import add_arguments as add_ablation

    add_ablation(bsub)


def run_bench(args) -> int:
    if args.bench_command == "run":
        return _run(args)
    if args.bench_command == "report":
        write_report(Path(args.out))
        print(Path(args.out) / SUMMARY)
        return 0
    if args.bench_command == "ablate":
        from pflash_lab.bench.ablation import run_ablation

        return run_ablation(args)
    if args.bench_command == "smoke":
        from pflash_lab.bench.smoke import run_smoke

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


class http_engine:  # noqa: N801 - a context manager used like a function
    """An `HttpEngine` on `base_url`, or on the embedded app started here (and stopped)."""

    def __init__(self, tokenizer, base_url: str | None, workdir: Path, **app_args):
        self.tokenizer, self.base_url, self.workdir = tokenizer, base_url, workdir
        self.app_args = app_args
        self.cluster: ServeCluster | None = None

    def __enter__(self):
        from pflash_lab.bench.runner import HttpEngine

        if self.base_url is None:
            self.cluster, self.base_url = start_app(self.workdir, **self.app_args)
        return HttpEngine(self.base_url, self.tokenizer)

    def __exit__(self, *exc) -> None:
        if self.cluster is not None:
            self.cluster.stop()


def start_app(workdir: Path, *, cpus: float = 0.9, **args) -> tuple[ServeCluster, str]:
    """serve_config.yaml's app on a free port with `pflash_return_prompt` allowed."""
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    cfg["http_options"]["port"] = port
    app = cfg["applications"][0]
    app["args"].update(return_prompt_enabled=True, threshold=1_000_000, **args)
    for dep in app["deployments"]:
        if dep["name"] in ("DrafterScorer", "TargetModel"):
            dep["ray_actor_options"]["num_cpus"] = cpus
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "serve_config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cluster = ServeCluster(path, workdir)
    base = f"http://127.0.0.1:{port}"
    cluster.start(
        f"{base}/v1/completions",
        {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"},
        timeout_s=600,
    )
    return cluster, f"{base}/v1"


def write_report(out: Path) -> None:
    """summary.md and the PNG plots from `out/results.jsonl`."""
    from pflash_lab.bench.plots import write_plots
    from pflash_lab.bench.report import summary_markdown

    results = read_jsonl(out / RESULTS)
    meta_path = out / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    plots = write_plots(results, out)
    (out / SUMMARY).write_text(summary_markdown(results, meta=meta, plots=plots))


# The `pflash.commands` entry point's protocol: `add_arguments(subparsers)` and `run(args)`.
run = run_bench
