"""Whole-document questions: what a reader of the served prompt alone would answer.

    python -m pflash_lab.bench.aggregate --lengths 4000 8000 --keep 0.1 --seeds 0 1 2

Runs the product's compressor in process (serve_config.yaml's args, the real embedded
drafter, its segment probe and evidence signals; no views) on the families of
`pflash_lab.corpus.aggregate_tasks`, side by side:

- `auto`: the product default; an aggregate question that fits the context is served
  whole (gate reason `aggregate_question`);
- `stratified`: `pflash_mode: always`, the uniform sample of the document's units the
  product selects for an aggregate question;
- `scored`: `always` with the aggregate rule switched off in this process (the detector
  answers None), the score-ranked selection every question got before. For the record.

Metric per case: for the word-ranking families, the share of the gold top words that the
counts in the served prompt still rank top (`aggregate_tasks.top_recall`, ties shared);
for counting, the relative error of the count in the served prompt. Counting cannot
survive any compression that drops list items; the policy `auto` serves it whole.
Prints a markdown table (means over seeds) and one line per case.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import yaml

from pflash_lab.corpus.aggregate_tasks import (
    FAMILIES,
    AggregateCase,
    count_error,
    document_counts,
    top_recall,
)

ROOT = Path(__file__).resolve().parents[2]
VARIANTS = ("auto", "stratified", "scored")


@contextlib.contextmanager
def aggregate_rule_off() -> Iterator[None]:
    """The pipeline's detector answers None: the selection before the aggregate rule."""
    with mock.patch("pflash.compress.pipeline.classify_question", return_value=None):
        yield


def product_config(mode: str, keep: float):
    from pflash.config import build_config

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    # float32 embedder: the numbers must not depend on the CPU that runs the bench
    overrides = {"mode": mode, "keep_ratio": keep, "semantic_embedder_dtype": "float32"}
    return build_config({**args, **overrides}, env={})


class Runner:
    """The in-process compressor of one config: drafter, probe and tokenizer loaded once."""

    def __init__(self, config, loaded, tokenizer, max_context: int):
        from pflash.models.drafter.scorer import DrafterScorer
        from pflash.models.probe import probe_for

        self.config = config
        self.tokenizer = tokenizer
        self.scorer = DrafterScorer(config, loaded)
        self.probe = probe_for(config, self.scorer)
        self.max_context = max_context

    def serve(self, case: AggregateCase):
        from pflash.compress.render.rendered import render_chat_prompt
        from pflash.flow.in_process import compress_in_process

        prompt = render_chat_prompt(self.tokenizer, [{"role": "user", "content": case.content}])
        return compress_in_process(
            prompt,
            self.config,
            target_tokenizer=self.tokenizer,
            drafter_tokenizer=self.tokenizer,
            scorer=self.scorer,
            probe=self.probe,
            max_context=self.max_context,
            max_output=64,
        )


def score(case: AggregateCase, served_text: str) -> float:
    counts = document_counts(served_text, case)
    if case.family == "word_count":
        return count_error(counts, case)
    return top_recall(counts, case.gold)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[4000, 8000])
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    parser.add_argument("--max-context", type=int, default=32768, help="the target's context")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)

    import torch

    from pflash.cli.compress import load_drafter
    from pflash.models.source import load_tokenizer

    torch.set_num_threads(args.threads)
    tokenizer = load_tokenizer("embedded:smollm2-135m")
    loaded = load_drafter("embedded:smollm2-135m")
    runners = {
        "auto": Runner(product_config("auto", args.keep), loaded, tokenizer, args.max_context),
        "always": Runner(product_config("always", args.keep), loaded, tokenizer, args.max_context),
    }

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    results: dict[tuple[str, int, str], list[float]] = {}
    ratios: dict[tuple[str, int, str], list[float]] = {}
    print("| family | tokens | seed | variant | metric | served ratio | question_kind | stop |")
    print("|---|---|---|---|---|---|---|---|")
    for family in args.families:
        for length in args.lengths:
            for seed in args.seeds:
                case = FAMILIES[family](seed, length, count)
                for variant in VARIANTS:
                    started = time.perf_counter()
                    if variant == "scored":
                        with aggregate_rule_off():
                            out = runners["always"].serve(case)
                    else:
                        out = runners["auto" if variant == "auto" else "always"].serve(case)
                    value = score(case, out.served_text)
                    results.setdefault((family, length, variant), []).append(value)
                    ratios.setdefault((family, length, variant), []).append(out.served_ratio)
                    print(
                        f"| {family} | {out.original_tokens} | {seed} | {variant} | {value:.3f} "
                        f"| {out.served_ratio:.3f} | {out.stats.get('question_kind')} "
                        f"| {out.stats.get('stop_reason')} |  <!-- {time.perf_counter() - started:.0f} s -->",
                        flush=True,
                    )

    print()
    print(
        f"keep {args.keep}, seeds {' '.join(map(str, args.seeds))}; metric: top-word recall "
        "(higher is better), word_count: relative count error (lower is better)"
    )
    print()
    print("| family | tokens | " + " | ".join(VARIANTS) + " |")
    print("|---|---|" + "---|" * len(VARIANTS))
    for family in args.families:
        for length in args.lengths:
            cells = []
            for variant in VARIANTS:
                vals = results[(family, length, variant)]
                ratio = statistics.mean(ratios[(family, length, variant)])
                cells.append(f"{statistics.mean(vals):.2f} (served {ratio:.2f})")
            print(f"| {family} | {length} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
