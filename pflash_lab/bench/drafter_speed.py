"""Drafter scorer speed, memory and the generic profile's head-layer choice.

Run: `python -m pflash_lab.bench.drafter_speed [--sections speed,memory,session,layers] [--threads N]`.

- speed: the embedded SmolLM2 at 2K, 4K and 7K drafter tokens: head scoring (early exit at
  the head layer, chunked) vs a full forward of the same model, and at 2K vs the naive
  approach (a full forward with `output_attentions`, eager attention).
- memory: peak RSS of a fresh process scoring 7K tokens with SmolLM2, and of a tiny random
  model at 8K/32K/64K tokens (linear growth: no S x S tensor anywhere).
- session: a conversation's second turn (+200 tokens) resumed from the first turn's
  session vs the first turn's forward.
- layers: for needle prompts in real prose (licenses in /usr/share/common-licenses and
  Python stdlib docstrings), the needle chunk's rank among context chunks at every layer
  of SmolLM2 (plain NoPE head at that layer), and the forward cost per layer. The
  generic profile default (`GENERIC_HEAD_FRACTION` in pflash/models/drafter/profile.py) is set
  from this table.

Needle prompts (`needle_prompt`) are also used by tests/unit/test_drafter_real_model.py.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from pflash.compress.plan.query import QueryWindow
from pflash.spans import Span
from pflash_lab.corpus.needles import (
    EMBEDDED,
    NEEDLES,
    NeedlePrompt,
    needle_prompt,
    needle_rank,
)
from pflash_lab.train.calibrate import layer_inputs as _layer_inputs

# --------------------------------------------------------------------------- layer sweep


def layer_sweep(scorer, prompts: list[NeedlePrompt], chunk: int = 64) -> np.ndarray:
    """Needle rank (as a fraction of context chunks) per prompt and layer: [P, n_layers].

    One full forward per prompt captures the residual stream entering every layer; each
    layer's own NoPE head then scores the windows (the same math as the scorer).
    """
    import torch

    from pflash.models.drafter.attention import (
        head_keys,
        head_queries,
        mix_window_masses,
        visible_keys,
        window_mass,
    )

    model = scorer.model
    layers = model.model.layers
    n_head, n_kv = model.config.num_attention_heads, model.config.num_key_value_heads
    out = np.zeros((len(prompts), len(layers)))
    for pi, p in enumerate(prompts):
        inputs = _layer_inputs(model, p.ids)
        with torch.inference_mode():
            for li, layer in enumerate(layers):
                keys = head_keys(layer, inputs[li], n_kv=n_kv)
                masses, weights = [], []
                for w in p.windows:
                    rows = inputs[li][w.span.begin : w.span.end]
                    q = head_queries(layer, rows, n_head=n_head, gated=False)
                    vis = visible_keys(len(p.ids), p.query, w, suffix_candidates=False)
                    masses.append(window_mass(q, keys, vis, float(layer.self_attn.scaling)))
                    weights.append(w.weight)
                rank, n = needle_rank(mix_window_masses(masses, weights).numpy(), p, chunk)
                out[pi, li] = rank / n
    return out


# --------------------------------------------------------------------------- timing helpers


def _timed(fn, repeats: int = 1) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _request(p: NeedlePrompt, **kw):
    from pflash.compress.scoring import ScoreRequest

    return ScoreRequest(ids=p.ids, windows=p.windows, query=p.query, **kw)


def full_forward(model, ids, *, output_attentions: bool = False) -> None:
    """All layers over `ids` [1, S] (the cost the head scorer's early exit is compared to)."""
    import torch

    with torch.inference_mode():
        model.model(input_ids=ids, output_attentions=output_attentions)


def naive_forward(model, ids) -> None:
    """The naive scorer's cost: eager attention with `output_attentions` (S x S per head)."""
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        full_forward(model, ids, output_attentions=True)
    finally:
        model.config._attn_implementation = impl


def bench_speed(scorer, tokenizer, sizes=(2048, 4096, 7168), repeats: int = 1) -> list[dict]:
    import torch

    rows = []
    for n in sizes:
        p = needle_prompt(tokenizer, n, 0.5)
        ids = torch.tensor([p.ids])
        head = functools.partial(scorer, _request(p))
        full = functools.partial(full_forward, scorer.model, ids)
        head_s, full_s = float("inf"), float("inf")
        for _ in range(repeats):  # interleaved, best of each: the CPU is shared
            head_s = min(head_s, _timed(head))
            full_s = min(full_s, _timed(full))
        row = {
            "tokens": len(p.ids),
            "head_s": round(head_s, 2),
            "full_forward_s": round(full_s, 2),
            "ratio": round(head_s / full_s, 3),
        }
        if n <= 2048:
            row["naive_output_attentions_s"] = round(
                _timed(functools.partial(naive_forward, scorer.model, ids)), 2
            )
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


def bench_session(scorer, tokenizer, repeats: int = 1) -> dict:
    """Turn 1 (about 4K tokens) with a session, then turn 2 = turn 1 without its generation
    prompt + an assistant reply + a new user question, about 200 tokens more."""
    p1 = needle_prompt(tokenizer, 4096, 0.3, needle=0)
    gen = tokenizer("<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
    suffix = "<|im_end|>\n<|im_start|>assistant\n"
    follow = (
        "<|im_start|>assistant\n"
        + "The access code for the north gate is 4719, as the text says. " * 8
        + "<|im_end|>\n<|im_start|>user\nAnd where is the spare key to the old lighthouse hidden?"
        + " Please answer in one short sentence."
        + suffix
    )
    ids2 = p1.ids[: len(p1.ids) - len(gen)] + tuple(
        tokenizer(follow, add_special_tokens=False)["input_ids"]
    )
    s2 = len(ids2)
    q_end = s2 - len(tokenizer(suffix, add_special_tokens=False)["input_ids"])
    q2 = Span(s2 - 1, s2)
    w2 = (
        QueryWindow(q2, 1.0, "main"),
        QueryWindow(Span(q_end - 8, q_end), 1.0, "turn"),
        QueryWindow(p1.query, 0.5, "history"),  # turn one's reply header, stored in the session
    )
    from pflash.compress.scoring import ScoreRequest

    first, second = float("inf"), float("inf")
    for _ in range(repeats):  # best of each: the CPU is shared
        scorer.sessions.drop("bench")
        t0 = time.perf_counter()
        scorer(_request(p1, session_key="bench"))
        first = min(first, time.perf_counter() - t0)
        t0 = time.perf_counter()
        r2 = scorer(ScoreRequest(ids=ids2, windows=w2, query=q2, session_key="bench"))
        second = min(second, time.perf_counter() - t0)
    scratch = scorer(ScoreRequest(ids=ids2, windows=w2, query=q2))
    row = {
        "turn1_tokens": len(p1.ids),
        "turn1_s": round(first, 2),
        "turn2_tokens": s2,
        "turn2_new_tokens": r2.scorer_new_tokens,
        "turn2_s": round(second, 3),
        "ratio": round(second / first, 3),
        "max_abs_diff_vs_scratch": float(np.abs(r2.mass - scratch.mass).max()),
    }
    print(json.dumps(row), flush=True)
    return row


def peak_rss_mb() -> float:
    """This process's peak resident set (VmHWM; reset by exec, unlike ru_maxrss)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _child(args: list[str]) -> dict:
    """Run one measurement in a fresh process so peak RSS is its own."""
    out = subprocess.run(
        [sys.executable, "-m", "pflash_lab.bench.drafter_speed", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure_memory_child(kind: str, n: int, threads: int) -> dict:
    """In a child process: load, score once at n tokens, report the peak RSS."""
    import torch

    torch.set_num_threads(threads)
    from pflash.config import build_config

    base = peak_rss_mb()
    if kind == "smollm2":
        from pflash.models.drafter.scorer import DrafterScorer
        from pflash.models.source import load_tokenizer

        scorer = DrafterScorer(build_config({}, env={}))
        p = needle_prompt(load_tokenizer(EMBEDDED), n, 0.5)
        loaded_mb = peak_rss_mb()
        t0 = time.perf_counter()
        scorer(_request(p))
    else:
        scorer, loaded_mb = _tiny_scorer(), peak_rss_mb()
        rng = np.random.default_rng(0)
        ids = tuple(int(i) for i in rng.integers(0, 300, n))
        q = Span(n - 1, n)
        from pflash.compress.scoring import ScoreRequest

        t0 = time.perf_counter()
        scorer(ScoreRequest(ids=ids, windows=(QueryWindow(q, 1.0, "main"),), query=q))
    return {
        "model": kind,
        "tokens": n,
        "seconds": round(time.perf_counter() - t0, 2),
        "rss_before_load_mb": round(base),
        "rss_loaded_mb": round(loaded_mb),
        "peak_rss_mb": round(peak_rss_mb()),
    }


def _tiny_scorer():
    from pflash.config import build_config
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.gguf_io import tiny_decoder
    from pflash.models.loading import LoadedModel
    from pflash.models.source import ModelSource

    model = tiny_decoder("llama", layers=8)
    loaded = LoadedModel(
        model, ModelSource("tiny", Path(".")), None, 0.0, False, architecture="llama"
    )
    return DrafterScorer(build_config({"drafter_head_layer": 4}, env={}), loaded)


# --------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sections", default="speed,memory,session,layers")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument(
        "--layer-prompts", type=int, default=9, help="needle prompts for the layer table"
    )
    ap.add_argument("--layer-tokens", type=int, default=2048)
    ap.add_argument("--child-memory", nargs=2, metavar=("KIND", "TOKENS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.child_memory:
        print(
            json.dumps(
                measure_memory_child(args.child_memory[0], int(args.child_memory[1]), args.threads)
            )
        )
        return

    import torch

    torch.set_num_threads(args.threads)
    from pflash.config import build_config
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.source import load_tokenizer

    sections = set(args.sections.split(","))
    tokenizer = load_tokenizer(EMBEDDED)
    scorer = None
    if sections & {"speed", "session", "layers"}:
        scorer = DrafterScorer(build_config({"drafter_sessions": 2}, env={}))
        print(
            f"# SmolLM2: profile {scorer.profile.name}, head layer {scorer.profile.head_layer} of {scorer.profile.n_layers}, threads {args.threads}"
        )
    if "speed" in sections:
        print("## speed: head scoring vs a full forward (and vs output_attentions at 2K)")
        bench_speed(scorer, tokenizer, repeats=args.repeats)
    if "session" in sections:
        print("## session: second turn (+~200 tokens) resumed vs the first turn")
        bench_session(scorer, tokenizer, repeats=args.repeats)
    if "memory" in sections:
        print("## memory: peak RSS in a fresh process")
        for kind, n in (("smollm2", 7168), ("tiny", 8192), ("tiny", 32768), ("tiny", 65536)):
            print(
                json.dumps(
                    _child(["--child-memory", kind, str(n), "--threads", str(args.threads)])
                ),
                flush=True,
            )
    if "layers" in sections:
        print(
            "## layers: needle chunk rank (fraction of 64-token context chunks, lower is better) per layer"
        )
        prompts = [
            needle_prompt(
                tokenizer, args.layer_tokens, depth, needle=k % len(NEEDLES), offset=37 * k
            )
            for k, depth in enumerate(np.linspace(0.1, 0.9, args.layer_prompts))
        ]
        ranks = layer_sweep(scorer, prompts)
        n_layers = ranks.shape[1]
        ids = torch.tensor([prompts[0].ids])
        per_layer = _timed(functools.partial(full_forward, scorer.model, ids)) / n_layers
        print("layer  median_rank  top10%_hits  cumulative_forward_s")
        for li in range(n_layers):
            col = ranks[:, li]
            print(
                f"{li:5d}  {statistics.median(col):11.3f}  {int((col <= 0.10).sum()):5d}/{len(col)}  {per_layer * li:8.2f}"
            )


if __name__ == "__main__":
    main()
