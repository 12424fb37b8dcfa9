"""The harness's smoke mode: a few small cases against the embedded app over HTTP (CI).

Starts serve_config.yaml's application (`ServeCluster`, `pflash_return_prompt` allowed),
runs one short single-needle case, one question-before-the-document case and one
three-turn case through PFlash, full prefill and the two cheap baselines (tail, random)
with the official `openai` client, and writes results.jsonl, summary.md and the plots.
LongLLMLingua is left out here: it needs about a minute per case on a shared CPU, which
the CI budget (about 3 minutes with app start) cannot carry; `pflash bench run` has it.
"""

from __future__ import annotations

import json
from pathlib import Path

from pflash_lab.bench.runner import Baselines, RunPlan, TurnResult, run_suite
from pflash_lab.corpus.cases import CaseSpec, token_counter
from pflash_lab.corpus.families import generate

SMOKE_SPECS = (
    CaseSpec("single_needle", 11, 1024, 0.5),
    CaseSpec("placement", 12, 1024, 0.3, "before"),
    CaseSpec("multi_turn", 13, 1024),
)
SMOKE_METHODS = ("pflash", "full", "tail", "random")


def run_smoke(out: Path, *, base_url: str | None = None, keep: float = 0.2) -> list[TurnResult]:
    """Run the smoke cases; returns the results (also written under `out`)."""
    from pflash.models.source import load_tokenizer
    from pflash_lab.bench.harness import RESULTS, http_engine, serve_args, write_report

    out.mkdir(parents=True, exist_ok=True)
    (out / RESULTS).unlink(missing_ok=True)
    tokenizer = load_tokenizer(serve_args()["target"])
    count = token_counter(tokenizer)
    cases = [generate(spec, count) for spec in SMOKE_SPECS]
    plan = RunPlan(SMOKE_METHODS, keep)
    meta = {"command": "pflash bench smoke", "engine": "http", "keep": keep}
    (out / "run.json").write_text(json.dumps(meta, indent=2))
    with http_engine(tokenizer, base_url, out, cpus=0.5) as engine:
        results = run_suite(cases, engine, Baselines(tokenizer), plan, out_path=out / RESULTS)
    write_report(out)
    return results
