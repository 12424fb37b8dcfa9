"""TTFT through the HTTP API: full prefill vs PFlash, side by side in one run.

    python -m pflash_lab.bench.ttft [--lengths 2048 4096 7168] [--keep 0.1] [--runs 3]
                                [--target embedded:smollm2-135m | --random-target L:H:F]

Starts the real app (`ray start` + `serve run` on a copy of serve_config.yaml), then for
each prompt length alternates `pflash_mode=off` and `always` streaming chat requests and
measures time to the first content token at the client. Each request's document starts
with a unique line, so neither the target's prefix snapshots nor the drafter's sessions can
reuse an earlier request (the numbers are cold prefills, as a new long prompt is).

The compressed TTFT is split with the server's own stats: drafter forward
(`scorer_forward_ms`), selection (the rest of `compress_ms`: plan, select, assemble), target
prefill (`timings.prompt_ms`), and the rest (TTFT minus those: Ray hops, tokenization,
HTTP, the first decode step).

`--random-target L:H:F` builds a random-weight llama target (L layers, hidden H, FFN F, the
embedded tokenizer) in a temporary directory: real deployments pair a small drafter with a
10-100x larger target, and speed does not depend on weight values.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import yaml

from pflash_lab.bench.launch import ROOT, ServeCluster, free_port, scratch_dir

FILLER_FILES = ("GPL-3", "LGPL-3", "Apache-2.0", "GPL-2", "Artistic", "MPL-2.0", "GFDL-1.3")


def corpus() -> str:
    root = Path("/usr/share/common-licenses")
    return "\n\n".join((root / f).read_text() for f in FILLER_FILES if (root / f).is_file())


def make_messages(tokenizer, text: str, n_tokens: int, run: int) -> list[dict]:
    """A chat whose rendered prompt has about `n_tokens` target tokens, needle at 50%."""
    needle = f"The special magic code for run {run} is: {7300000 + run}."
    question = f"What is the special magic code for run {run}?"
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    start = (run * 997) % max(1, len(ids) - n_tokens)
    body = tokenizer.decode(ids[start : start + n_tokens - 60])
    mid = body.index("\n", len(body) // 2) if "\n" in body[len(body) // 2 :] else len(body) // 2
    doc = (
        f"Document {run}-{time.time_ns() % 100000}\n"
        + body[:mid]
        + "\n"
        + needle
        + "\n"
        + body[mid:]
    )
    return [{"role": "user", "content": doc + "\n\n" + question}]


def random_llama(spec: str, tok, max_positions: int = 8192):
    """A random-weight llama of `spec` (layers:hidden:ffn, GQA) over `tok`'s vocabulary."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, ffn = (int(x) for x in spec.split(":"))
    heads = max(1, hidden // 64)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden,
        intermediate_size=ffn,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 4),  # GQA; heads must be a multiple
        max_position_embeddings=max_positions,
        rope_theta=100000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config)


def random_target(spec: str, out: Path) -> str:
    """Save a random-weight llama with the embedded tokenizer; return its directory."""
    from pflash.models.source import load_tokenizer

    layers, hidden, ffn = (int(x) for x in spec.split(":"))
    tok = load_tokenizer("embedded:smollm2-135m")
    model = random_llama(spec, tok)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"random target: {layers} layers, hidden {hidden}, ffn {ffn}: {params:.0f}M parameters")
    return str(out)


def stream_once(client, messages, mode: str, keep: float) -> dict:
    t0 = time.perf_counter()
    first = None
    usage = None
    stream = client.chat.completions.create(
        model="pflash",
        messages=messages,
        max_tokens=4,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"pflash_mode": mode, "pflash_keep_ratio": keep},
    )
    for chunk in stream:
        if first is None and chunk.choices and chunk.choices[0].delta.content:
            first = time.perf_counter() - t0
        if chunk.usage is not None:
            usage = chunk.usage
    timings = usage.model_extra["timings"]
    return {
        "ttft_ms": (first or time.perf_counter() - t0) * 1000,
        "prompt_tokens": usage.prompt_tokens,
        **timings,
    }


def run(args) -> list[dict]:
    from openai import OpenAI

    from pflash.models.source import load_tokenizer

    work = scratch_dir("pflash-ttft-")
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    cfg["http_options"]["port"] = port
    app = cfg["applications"][0]
    app["args"].update(threshold=1_000_000, keep_ratio=args.keep)
    if args.random_target:
        app["args"]["target"] = random_target(args.random_target, work / "target")
    elif args.target:
        app["args"]["target"] = args.target
    for dep in app["deployments"]:  # serve_config's shares fit 2 CPUs (guarded by a test)
        if args.cpus is not None and dep["name"] in ("DrafterScorer", "TargetModel"):
            dep["ray_actor_options"]["num_cpus"] = args.cpus
    path = work / "serve_config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cluster = ServeCluster(path, work)
    base = f"http://127.0.0.1:{port}"
    cluster.start(
        f"{base}/v1/completions",
        {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"},
        timeout_s=600,
    )
    rows = []
    try:
        client = OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=1800)
        tok = load_tokenizer("embedded:smollm2-135m")
        text = corpus()
        stream_once(client, make_messages(tok, text, 512, 999), "always", args.keep)  # warm up
        for n in args.lengths:
            results = {"off": [], "always": []}
            for r in range(args.runs):
                for mode in ("off", "always"):
                    res = stream_once(
                        client, make_messages(tok, text, n, r * 10 + len(mode)), mode, args.keep
                    )
                    results[mode].append(res)
                    print(
                        json.dumps(
                            {
                                "length": n,
                                "mode": mode,
                                **{k: v for k, v in res.items() if k != "pflash"},
                                "pflash": res["pflash"],
                            }
                        ),
                        flush=True,
                    )
            rows.append(summarise(n, results))
    finally:
        cluster.stop()
    return rows


def summarise(n: int, results: dict) -> dict:
    med = lambda xs: statistics.median(xs)  # noqa: E731
    off = med([r["ttft_ms"] for r in results["off"]])
    on = results["always"]
    ttft = med([r["ttft_ms"] for r in on])
    drafter = med([r["pflash"]["scorer_forward_ms"] for r in on])
    compress = med([r["pflash"]["compress_ms"] for r in on])
    prefill = med([r["prompt_ms"] for r in on])
    return {
        "target_tokens": med([r["prompt_tokens"] for r in on]),
        "served_tokens": med([r["pflash"]["compressed_tokens"] for r in on]),
        "ttft_off_ms": off,
        "ttft_pflash_ms": ttft,
        "speedup": off / ttft,
        "drafter_ms": drafter,
        "selection_ms": compress - drafter,
        "prefill_ms": prefill,
        "rest_ms": ttft - compress - prefill,
        "rest_share": (ttft - compress - prefill) / ttft,
        "full_prefill_ms": med([r["prompt_ms"] for r in results["off"]]),
    }


def table(rows: list[dict]) -> str:
    head = "| prompt tokens | served | TTFT off (ms) | TTFT PFlash (ms) | speedup | drafter | selection | target prefill | rest (share) |"
    lines = [head, "|" + "---|" * 9]
    for r in rows:
        lines.append(
            f"| {r['target_tokens']:.0f} | {r['served_tokens']:.0f} | {r['ttft_off_ms']:.0f} | {r['ttft_pflash_ms']:.0f} "
            f"| {r['speedup']:.2f}x | {r['drafter_ms']:.0f} | {r['selection_ms']:.0f} | {r['prefill_ms']:.0f} "
            f"| {r['rest_ms']:.0f} ({100 * r['rest_share']:.0f}%) |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096, 7168])
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--runs", type=int, default=3, help="requests per mode and length (median)")
    parser.add_argument(
        "--target", default=None, help="target model source (default: serve_config.yaml's)"
    )
    parser.add_argument(
        "--random-target", default=None, metavar="L:H:F", help="random-weight llama target"
    )
    parser.add_argument(
        "--cpus",
        type=float,
        default=None,
        help="num_cpus of the drafter and target replicas (default: serve_config.yaml's, "
        "which fit 2 CPUs with the ingress and the segment probe)",
    )
    args = parser.parse_args(argv)
    rows = run(args)
    print()
    print(table(rows))


if __name__ == "__main__":
    main()
