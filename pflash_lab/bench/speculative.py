"""Speculative greedy decoding in `TransformersTarget`: decode speed and acceptance.

Run: `python -m pflash_lab.bench.speculative [--tokens 64] [--draft 2,4,8] [--repeats 2]`.

The target is the embedded SmolLM2-135M. Two assistants bound what speculation can do:

- **same**: SmolLM2 itself drafts (shared weights). Every draft is accepted (acceptance
  ~1.0, the upper bound), but a draft costs as much as a target step, so this measures the
  bookkeeping at perfect acceptance, not a speed-up.
- **random**: a tiny random-weight llama with SmolLM2's vocabulary. Almost every draft is
  rejected (acceptance ~0, the lower bound), and drafting is nearly free, so this measures
  the overhead of verifying k+1 tokens per step for one kept token.

Every row also checks that the answer equals plain greedy decoding token for token. Decode
speed is `predicted_n / predicted_ms` (tokens/s, median over prompts and repeats, runs
interleaved so background load hits all configurations alike).

A last section measures the assistant's prefix snapshots: a conversation's second turn
(prompt ~1K tokens) prefilled with the assistant's snapshot store on vs off (`prompt_ms`
covers target and assistant prefill).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sysconfig
from pathlib import Path
from typing import Any

EMBEDDED = "embedded:smollm2-135m"
QUESTIONS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "List three uses of Python, with one sentence each.",
    "Explain how a refrigerator keeps food cold.",
)


def random_assistant(vocab_size: int, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Any:
    """A tiny random-weight llama over `vocab_size` tokens (eval mode, float32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config).eval()


def chat_ids(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    return list(
        tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )


def _generate(target: Any, prompt_ids: list[int], params: Any, **kw: Any) -> Any:
    from pflash.models.target.protocol import collect_generation

    return asyncio.run(collect_generation(target.generate(prompt_ids, params, **kw)))


def bench_decode(
    model: Any, tokenizer: Any, tokens: int, drafts: list[int], repeats: int, threads: int
) -> None:
    from pflash.models.target.hf import TransformersTarget
    from pflash.models.target.protocol import SamplingParams

    tiny = random_assistant(len(tokenizer))
    configs = {"plain": TransformersTarget(model, tokenizer, num_threads=threads)}
    for k in drafts:
        configs[f"same k={k}"] = TransformersTarget(
            model,
            tokenizer,
            num_threads=threads,
            assistant=model,
            assistant_tokenizer=tokenizer,
            speculative_tokens=k,
        )
        configs[f"random k={k}"] = TransformersTarget(
            model, tokenizer, num_threads=threads, assistant=tiny, speculative_tokens=k
        )
    params = SamplingParams(max_tokens=tokens, temperature=0)
    prompts = [chat_ids(tokenizer, [{"role": "user", "content": q}]) for q in QUESTIONS]
    speed: dict[str, list[float]] = {name: [] for name in configs}
    accept: dict[str, list[float]] = {name: [] for name in configs}
    identical = dict.fromkeys(configs, True)
    produced = 0
    for _ in range(repeats):
        for prompt in prompts:
            reference = None
            for name, target in configs.items():
                result = _generate(target, prompt, params)
                t = result.timings
                speed[name].append(t.predicted_n / t.predicted_ms * 1000)
                if result.accept_rate is not None:
                    accept[name].append(result.accept_rate)
                if reference is None:
                    reference = result.token_ids
                    produced += t.predicted_n
                identical[name] &= result.token_ids == reference
    print(
        f"## decode: {len(prompts)} prompts x {repeats} repeats, up to {tokens} tokens "
        f"({produced / repeats:.0f} tokens per pass), greedy, {threads} thread(s)"
    )
    print(f"{'config':<14} {'tokens/s':>9} {'vs plain':>9} {'accept':>7}  same answer")
    base = statistics.median(speed["plain"])
    for name in configs:
        tps = statistics.median(speed[name])
        rate = f"{statistics.mean(accept[name]):.3f}" if accept[name] else "-"
        print(f"{name:<14} {tps:>9.1f} {tps / base:>8.2f}x {rate:>7}  {identical[name]}")
    for target in configs.values():
        asyncio.run(target.aclose())


def long_document(tokenizer: Any, target_tokens: int = 1000) -> str:
    """Real prose from the stdlib sources, about `target_tokens` SmolLM2 tokens."""
    text = Path(sysconfig.get_paths()["stdlib"], "textwrap.py").read_text(encoding="utf-8")
    ids = tokenizer.encode(text)[:target_tokens]
    return tokenizer.decode(ids)


def bench_assistant_snapshots(model: Any, tokenizer: Any, repeats: int, threads: int) -> None:
    from pflash.models.target.hf import TransformersTarget
    from pflash.models.target.protocol import SamplingParams

    params = SamplingParams(max_tokens=16, temperature=0)
    doc = long_document(tokenizer)
    turn1 = [{"role": "user", "content": doc + "\n\nWhat does this module do?"}]
    print("## assistant prefix snapshots: second turn of a ~1K-token conversation (same model)")
    print(f"{'assistant snapshots':<20} {'turn-2 prompt_ms':>17} {'target cache_n':>15}")
    for capacity in (4, 0):
        times, cache_n = [], 0
        for _ in range(repeats):
            target = TransformersTarget(
                model,
                tokenizer,
                num_threads=threads,
                assistant=model,
                assistant_tokenizer=tokenizer,
                speculative_tokens=4,
                assistant_snapshot_capacity=capacity,
            )
            ids1 = chat_ids(tokenizer, turn1)
            first = _generate(target, ids1, params, snapshot_cut=len(ids1) - 3)
            turn2 = [
                *turn1,
                {"role": "assistant", "content": first.text},
                {"role": "user", "content": "Give one example."},
            ]
            ids2 = chat_ids(tokenizer, turn2)
            second = _generate(target, ids2, params, snapshot_cut=len(ids2) - 3)
            times.append(second.timings.prompt_ms)
            cache_n = second.timings.cache_n
            asyncio.run(target.aclose())
        label = f"on ({capacity})" if capacity else "off"
        print(f"{label:<20} {statistics.median(times):>17.1f} {cache_n:>15}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", type=int, default=64, help="max_tokens per answer")
    ap.add_argument("--draft", default="2,4,8", help="draft tokens per step, comma-separated")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--sections", default="decode,snapshots")
    args = ap.parse_args(argv)

    import torch

    from pflash.models.loading import load_causal_lm
    from pflash.models.source import load_tokenizer

    torch.set_num_threads(args.threads)
    model = load_causal_lm(EMBEDDED).model
    tokenizer = load_tokenizer(EMBEDDED)
    sections = set(args.sections.split(","))
    if "decode" in sections:
        drafts = [int(k) for k in args.draft.split(",")]
        bench_decode(model, tokenizer, args.tokens, drafts, args.repeats, args.threads)
    if "snapshots" in sections:
        bench_assistant_snapshots(model, tokenizer, args.repeats, args.threads)


if __name__ == "__main__":
    main()
