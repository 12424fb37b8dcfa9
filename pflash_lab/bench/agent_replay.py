"""Agent sessions replayed in process: is each question's evidence in what is served?

Run: `python -m pflash_lab.bench.agent_replay [--lengths 4000 8000] [--seeds 7021 7022]
[--set KEY=VALUE ...] [--json FILE]`.

The traces of the agent benchmark (`agent_trace.generate`: tool outputs of real source, logs
and diffs with planted lines, questions about them, literal and in other words) go step by
step through the server's own `Compressor` with serve_config.yaml's args (`mode: always`,
keep 0.1; `--set` changes any), a view store and drafter sessions, as one conversation per
session. No target runs: this measures what the views serve, not how fast, so a run over
many sessions takes minutes where the app bench takes an hour, and two settings compare
case by case (the same steps, deterministic). Per session and in all it reports evidence
kept at question steps by class, the view modes of question steps (rebuilds), the tokens
recalled, the planted lines still served after they were planted, and the target tokens
served over all steps.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pflash_lab.bench import agent_trace
from pflash_lab.bench.harness import parse_overrides


def replay(trace: agent_trace.Trace, parts: dict, max_context: int = 1 << 20) -> list[dict]:
    """One row per step of `trace`, served through a fresh `Compressor` (its own store)."""
    from pflash.flow.request import compression_request, render_request
    from pflash.serving.admission import request_params
    from pflash.serving.chat_completion.serving import parse_chat_request
    from pflash_lab.bench.later_steps import in_process_flow

    config, tokenizer = parts["config"], parts["tokenizer"]
    flow = in_process_flow(parts, max_context)
    session = f"replay-{trace.target_tokens}-{trace.seed}"
    rows = []
    for step in trace.steps:
        body = {
            "messages": trace.request(step.index),
            "tools": list(trace.tools),
            "max_tokens": 16,
            "session_id": session,
        }
        req = parse_chat_request(body)
        prompt = render_request(req, "chat", tokenizer, scope="tenant")
        served = flow.run_sync(
            compression_request(req, prompt, config, "tenant", request_params(req, config))
        )
        text = served.served_text
        view = served.stats.get("view") or {}
        planted = trace.planted_before(step.index)
        row = {
            "length": trace.target_tokens,
            "seed": trace.seed,
            "step": step.index,
            "kind": step.kind,
            "question_class": step.question_class,
            "prompt_tokens": len(prompt.ids),
            "served_tokens": len(served.served_ids),
            "view": view.get("mode"),
            "recalled_tokens": view.get("recalled_tokens") or 0,
            "held": sum(f.line in text for f in planted),
            "planted": len(planted),
        }
        if step.kind == "question":
            row["evidence_kept"] = step.evidence in text
        rows.append(row)
    return rows


def summary(rows: list[dict]) -> dict:
    """What a run's notes quote: evidence kept by class, rebuilds, recall, lines held."""
    questions = [r for r in rows if r["kind"] == "question"]

    def kept(cls: str) -> str:
        of = [r for r in questions if r["question_class"] == cls]
        return f"{sum(r['evidence_kept'] for r in of)}/{len(of)}"

    return {
        "sessions": len({(r["length"], r["seed"]) for r in rows}),
        "literal": kept("literal"),
        "paraphrase": kept("paraphrase"),
        "questions_rebuilt": f"{sum(r['view'] in ('rebuild', 'fresh') for r in questions)}"
        f"/{len(questions)}",
        "recalled_tokens": sum(r["recalled_tokens"] for r in questions),
        "held": f"{sum(r['held'] for r in rows)}/{sum(r['planted'] for r in rows)}",
        "served_tokens": sum(r["served_tokens"] for r in rows),
        "missed": [
            f"{r['length']}/{r['seed']} step {r['step']} ({r['question_class']})"
            for r in questions
            if not r["evidence_kept"]
        ],
    }


def main(argv: list[str] | None = None) -> None:
    from pflash_lab.bench.later_steps import load_parts

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4000, 8000])
    parser.add_argument("--seeds", type=int, nargs="+", default=[7021, 7022, 7023, 7024])
    parser.add_argument("--question-every", type=int, default=2)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path, help="write every step here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    parts = load_parts(parse_overrides(args.set))
    tokenizer = parts["tokenizer"]

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    rows = []
    for seed in args.seeds:
        for length in args.lengths:
            trace = agent_trace.generate(count, length, seed, args.question_every)
            session = replay(trace, parts)
            rows += session
            print(json.dumps(summary(session)), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(json.dumps(summary(rows), indent=1))


if __name__ == "__main__":
    main()
