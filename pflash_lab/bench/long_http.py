"""A long prompt through the HTTP API of the real app, with where its time goes.

`python -m pflash_lab.bench.long_http --lengths 32768 131072 [--attention window]`

Starts the shipped `serve_config.yaml` app (the embedded drafter at its CPU share, the
embedded 8K target) with `drafter_attention` set, then per length sends one chat with a
needle at mid-depth in real text (the long-context benchmark's haystack, whose
three-fact projects stay unasked) and the question
last, `pflash_mode: always`, keep 0.1, and `max_tokens` 16. A prompt over the target's 8K
context is compressed to fit it (the ceiling lowers the keep ratio). Reported per length:
the wall time of the request, the time to first token, and the stages from
`usage.timings.pflash`: planning (`plan_ms`), the drafter forward (`scorer_forward_ms`),
the drafter's queue and transfer, selection and assembly (`select_ms`), the target's
prefill of the served prompt (`usage.timings.prompt_ms`); the rest of the time to first
token is the ingress (reading, rendering, tokenizing) and the hops between deployments. Whether the needle's number is in the served prompt (kept)
and in the answer (the 135M target often misses it even when kept) is counted too.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import yaml

from pflash_lab.bench.launch import ROOT, ServeCluster, free_port
from pflash_lab.bench.long_context import EMBEDDED, build_haystack, haystack, question_messages


def _config(
    tmp: Path,
    port: int,
    attention: str,
    max_prompt: int,
    drafter_cpus: float | None,
    target_threads: int | None = None,
) -> Path:
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    base["http_options"]["port"] = port
    for dep in base["applications"][0]["deployments"]:
        options = dep["ray_actor_options"]
        if drafter_cpus is not None:  # the rest of the 2 CPUs go to the others
            rest = max(0.05, (2.0 - drafter_cpus) / 3)
            share = drafter_cpus if dep["name"] == "DrafterScorer" else rest
            options["num_cpus"] = round(share, 3)
        if target_threads is not None and dep["name"] == "TargetModel":
            # one request at a time, the target prefills after the drafter is done
            env = options.setdefault("runtime_env", {}).setdefault("env_vars", {})
            env["PFLASH_TORCH_THREADS"] = str(target_threads)
    args = base["applications"][0]["args"]
    args.update(
        drafter_attention=attention, max_prompt_tokens=max_prompt, return_prompt_enabled=True
    )
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def _stream(url: str, messages, timeout_s: float) -> dict:
    """One streamed chat: wall time, time to first content, the text and the usage."""
    body = {
        "messages": list(messages),
        "max_tokens": 16,
        "temperature": 0,
        "pflash_mode": "always",
        "stream": True,
        "stream_options": {"include_usage": True},
        "pflash_return_prompt": True,
    }
    started = time.perf_counter()
    ttft, text, usage, served = None, [], None, ""
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=timeout_s) as r:
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code}: {r.read()[:500]!r}")
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"in-band error: {event['error']}")
            if event.get("usage"):
                usage = event["usage"]
            served = event.get("pflash_prompt") or served
            for choice in event.get("choices", ()):
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - started
                    text.append(piece)
    return {
        "wall_s": time.perf_counter() - started,
        "ttft_s": ttft,
        "text": "".join(text),
        "served": served,
        "usage": usage,
    }


def run(
    lengths: list[int],
    attention: str,
    runs: int,
    drafter_cpus: float | None = None,
    target_threads: int | None = None,
) -> list[dict]:
    from pflash.models.source import load_tokenizer

    tokenizer = load_tokenizer(EMBEDDED)
    results = []
    with tempfile.TemporaryDirectory(prefix="pflh") as tmp:
        port = free_port()
        max_prompt = max(131072, max(lengths) + 8192)
        config = _config(Path(tmp), port, attention, max_prompt, drafter_cpus, target_threads)
        cluster = ServeCluster(config, Path(tmp))
        url = f"http://127.0.0.1:{port}"
        try:
            cluster.start(f"{url}/v1/completions", {"prompt": "Hi", "max_tokens": 1})
            for length in lengths:
                paragraphs = haystack(tokenizer, length)
                rows = []
                for i in range(runs):
                    stack = build_haystack(paragraphs, (0.5,), seed=length + i)
                    needle = stack.questions[0]  # the one at mid-depth; the rest unasked
                    number = needle.answers[0]
                    out = _stream(url, question_messages(stack, needle), timeout_s=3600)
                    p = out["usage"]["timings"]["pflash"]
                    rows.append(
                        {
                            "prompt_tokens": out["usage"]["prompt_tokens"],
                            "served_tokens": p["compressed_tokens"],
                            "wall_s": out["wall_s"],
                            "ttft_s": out["ttft_s"],
                            "plan_s": p["plan_ms"] / 1000,
                            "drafter_forward_s": p["scorer_forward_ms"] / 1000,
                            "drafter_queue_s": (
                                p["compress_ms"] - p["scorer_forward_ms"] - p["select_ms"]
                            )
                            / 1000,
                            "select_s": p["select_ms"] / 1000,
                            "target_prefill_s": out["usage"]["timings"]["prompt_ms"] / 1000,
                            "needle_kept": number in out["served"],
                            "needle_in_answer": number in out["text"],
                        }
                    )
                    print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
                med = {
                    k: statistics.median(r[k] for r in rows)
                    for k in rows[0]
                    if not k.startswith("needle")
                }
                for k in ("needle_kept", "needle_in_answer"):
                    med[k] = sum(r[k] for r in rows)
                med["runs"] = runs
                med["attention"] = attention
                results.append(med)
        finally:
            cluster.stop()
    return results


def table(results: list[dict]) -> str:
    head = (
        "| prompt tokens | served | wall | TTFT | plan | drafter forward | drafter queue |"
        " select | target prefill | rest of TTFT (ingress) | needle kept / answered |\n"
        "|---|---|---|---|---|---|---|---|---|---|---|"
    )
    lines = [head]
    for r in results:
        rest = r["ttft_s"] - r["plan_s"] - r["drafter_forward_s"] - r["drafter_queue_s"]
        rest -= r["select_s"] + r["target_prefill_s"]
        lines.append(
            f"| {r['prompt_tokens']:,.0f} | {r['served_tokens']:,.0f} | {r['wall_s']:.1f} s |"
            f" {r['ttft_s']:.1f} s | {r['plan_s']:.2f} s | {r['drafter_forward_s']:.1f} s |"
            f" {r['drafter_queue_s']:.2f} s | {r['select_s']:.2f} s |"
            f" {r['target_prefill_s']:.1f} s | {rest:.1f} s |"
            f" {r['needle_kept']}/{r['runs']} / {r['needle_in_answer']}/{r['runs']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32768, 131072])
    parser.add_argument(
        "--attention", choices=("dense", "window", "block_sparse"), default="window"
    )
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument(
        "--drafter-cpus",
        type=float,
        help="the DrafterScorer's CPU share (torch threads = its ceiling); default: the shipped",
    )
    parser.add_argument(
        "--target-threads",
        type=int,
        help="torch threads of the embedded target (PFLASH_TORCH_THREADS); one request at a"
        " time, the target prefills after the drafter is done, so both may use every core",
    )
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    results = run(args.lengths, args.attention, args.runs, args.drafter_cpus, args.target_threads)
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
