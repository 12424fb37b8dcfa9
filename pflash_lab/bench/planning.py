"""Planning time against the number of messages and the prompt length (no model runs).

Run: `python -m pflash_lab.bench.planning [--messages 250 500 1000 2000] [--system 0 8 64]`.

What a request costs before the drafter: render once (`render_chat_prompt`), plan
(`compress.pipeline.prepare`: drafter encoding, chat parsing, query windows, pinned spans,
budget) and the view keys (`views.keys.view_keys`), with the embedded SmolLM2 tokenizer as
both vocabularies. Prompts: N short user/assistant messages with a question at the end, and
the same chat with S system messages spread through it (they are located together by one
wrapped rendering, so S should not change the plan time). Prints one JSON line per shape and a ratio line:
time(2N)/time(N) near 2 is linear.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def chat(n_messages: int, n_system: int, words: int = 12) -> list[dict]:
    text = " ".join(f"word{i % 97}" for i in range(words))
    out: list[dict] = []
    every = max(1, n_messages // max(1, n_system)) if n_system else 0
    for i in range(n_messages):
        if n_system and i % every == 0 and sum(m["role"] == "system" for m in out) < n_system:
            out.append({"role": "system", "content": f"Rule {i}: answer in English."})
        out.append({"role": "user" if i % 2 == 0 else "assistant", "content": f"{i}: {text}"})
    out.append({"role": "user", "content": "Which rule applies to message 7?"})
    return out


def plan_chat(tokenizer, messages: list[dict]):
    """Render, plan and key one chat as a request does before the drafter: the prepared
    plan and the seconds each step took."""
    from pflash.compress.pipeline import CompressionRequest, prepare
    from pflash.compress.render.rendered import render_chat_prompt
    from pflash.config import build_config
    from pflash.views.keys import view_keys

    config = build_config({"mode": "always", "keep_ratio": 0.1, "select_chunk_size": 64}, env={})
    t0 = time.perf_counter()
    prompt = render_chat_prompt(tokenizer, messages)
    t1 = time.perf_counter()
    inp = CompressionRequest(prompt)
    prepared = prepare(inp, config=config, target_tokenizer=tokenizer, drafter_tokenizer=tokenizer)
    t2 = time.perf_counter()
    view_keys(prepared, tokenizer, tokenizer)
    t3 = time.perf_counter()
    return prepared, {"render": t1 - t0, "plan": t2 - t1, "keys": t3 - t2}


def measure(tokenizer, messages: list[dict], repeats: int) -> dict:
    times: dict[str, list[float]] = {"render": [], "plan": [], "keys": []}
    for _ in range(repeats):
        prepared, took = plan_chat(tokenizer, messages)
        for k, v in took.items():
            times[k].append(v)
    med = {k: round(statistics.median(v) * 1000, 1) for k, v in times.items()}
    return {"tokens": len(prepared.input.prompt.ids), **{f"{k}_ms": v for k, v in med.items()}}


def main(argv: list[str] | None = None) -> None:
    from pflash.models.source import load_tokenizer

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, nargs="+", default=[250, 500, 1000, 2000])
    ap.add_argument("--system", type=int, nargs="+", default=[0, 8, 64])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    tokenizer = load_tokenizer("embedded:smollm2-135m")
    for s in args.system:
        rows = []
        for n in args.messages:
            row = {"messages": n, "system": s, **measure(tokenizer, chat(n, s), args.repeats)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        total = [r["render_ms"] + r["plan_ms"] + r["keys_ms"] for r in rows]
        ratios = [round(b / a, 2) for a, b in zip(total, total[1:], strict=False) if a > 0]
        print(json.dumps({"system": s, "time_ratio_per_doubling": ratios}), flush=True)


if __name__ == "__main__":
    main()
