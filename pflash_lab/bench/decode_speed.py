"""The target's decode step over a long cache: transformers' cache vs the in-place buffer.

Run: `python -m pflash_lab.bench.decode_speed [--spec 24:1536:5632] [--lengths 8192 16384
32768] [--steps 16] [--runs 3] [--threads 2]`.

A decode step of `TransformersTarget` over a cache of N tokens, with the cache as
transformers builds it (`DynamicCache`: every step concatenates, copying the whole cache)
and as the target builds it now (`pflash.models.kv_buffer`: the token written in place).
The cache is filled with random keys and values instead of a prefill: a decode step's time
does not depend on their values, and a 32K prefill of the big target takes an hour here.
The model is the agent benchmark's random-weight llama (`--spec` layers:hidden:ffn, GQA as
`ttft.random_target` builds it; speed does not depend on weight values). Per length the two
caches alternate, `--runs` times each; medians of the per-step times and their ratio.
"""

from __future__ import annotations

import argparse
import statistics
import time


def model_of(spec: str):
    """The agent benchmark's random-weight target (`ttft.random_llama`), in eval mode."""
    from pflash.models.source import load_tokenizer
    from pflash_lab.bench.ttft import random_llama

    tok = load_tokenizer("embedded:smollm2-135m")
    return random_llama(spec, tok, max_positions=1 << 17).eval()


def filled(model, n: int, buffered: bool):
    """A cache of `n` tokens of random keys and values, of either kind."""
    import torch
    from transformers import DynamicCache

    from pflash.models.kv_buffer import buffered_cache

    c = model.config
    shape = (1, c.num_key_value_heads, n, c.hidden_size // c.num_attention_heads)
    layers = [(torch.randn(shape), torch.randn(shape)) for _ in range(c.num_hidden_layers)]
    if buffered:
        return buffered_cache(model, layers)
    return DynamicCache(ddp_cache_data=layers, config=c)


def step_ms(model, n: int, buffered: bool, steps: int) -> float:
    """Median milliseconds of `steps` decode steps over a cache of `n` tokens."""
    import torch

    cache = filled(model, n, buffered)
    token = torch.tensor([[1]])
    times = []
    with torch.inference_mode():
        for _ in range(steps):
            t0 = time.perf_counter()
            out = model(input_ids=token, cache=cache, use_cache=True)
            times.append((time.perf_counter() - t0) * 1000)
            token = out.logits[:, -1:].argmax(-1)
    del cache
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default="24:1536:5632", metavar="L:H:F")
    parser.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    model = model_of(args.spec)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    print(f"random llama {args.spec} ({params:.0f}M parameters), {args.threads} threads")
    print("| cached tokens | transformers' cache, ms/token | in-place buffer | ratio |")
    print("|---|---|---|---|")
    for n in args.lengths:
        plain, buffered = [], []
        for run in range(args.runs):  # alternate which goes first
            for kind in (False, True) if run % 2 == 0 else (True, False):
                (buffered if kind else plain).append(step_ms(model, n, kind, args.steps))
        a, b = statistics.median(plain), statistics.median(buffered)
        print(f"| {n:,} | {a:.0f} | {b:.0f} | **{a / b:.2f}x** |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
