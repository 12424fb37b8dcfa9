"""Segment probe quality and cost on held-out real files.

Run: `python -m pflash_lab.bench.probe_eval [--sections boundaries,cost,retention] [--cases 30]`.

- boundaries: cut-level boundary precision and recall of the committed probe at its own
  threshold and min_segment, on documents cut from held-out stdlib files and licenses
  (a different sample, `--seed`, from the one the threshold was chosen on).
- cost: probe wall time per 1K tokens against the drafter forward that produced the tap
  (the drafter runs up to its scoring layer; the probe reads that layer's input).
- retention: code retrieval. A multi-file context of held-out stdlib excerpts (~3K drafter
  tokens), a question asking for one real function by name; compressed at keep 0.1 once
  with probe segments and once with fixed chunks (64 tokens, the serve_config setting, and
  128), from the same drafter scores. Reported: how often the whole function (from its
  `def` or first decorator to its last line) survives, and the mean share of its tokens kept.
  `probe_sum` ranks probe segments by summed mass instead of density (for comparison only).
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pflash.config import UNTUNED_SCORING
from pflash_lab.train.probe_corpus import (
    FILE_STYLES,
    excerpt,
    files_of,
    join_files,
    line_starts,
)

EMBEDDED = "embedded:smollm2-135m"


# --------------------------------------------------------------------------- retrieval cases


@dataclass(frozen=True)
class Function:
    """A function or method in a file: `begin` is its first decorator or `def`, `end` the
    end of its last line (characters of the file)."""

    qualname: str
    name: str
    begin: int
    end: int


def functions_of(text: str) -> list[Function]:
    """Top-level functions and methods of a Python source."""
    tree = ast.parse(text)
    starts = line_starts(text)

    def span(node) -> tuple[int, int]:
        first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
        b = starts[first - 1]
        b += len(text[b:]) - len(text[b:].lstrip(" \t"))
        end = starts[node.end_lineno] - 1 if node.end_lineno < len(starts) else len(text)
        return b, end

    out = []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    for node in tree.body:
        if isinstance(node, defs):
            out.append(Function(node.name, node.name, *span(node)))
        if isinstance(node, ast.ClassDef):
            for child in node.body:
                if isinstance(child, defs):
                    out.append(Function(f"{node.name}.{child.name}", child.name, *span(child)))
    return out


@dataclass(frozen=True)
class RetrievalCase:
    """One question about one real function in a multi-file context."""

    context: str
    question: str
    function: str  # qualified name
    file: str
    source: str  # the function's text, exactly as in the context

    def messages(self) -> list[dict]:
        return [{"role": "user", "content": f"{self.context}\n{self.question}"}]


def retrieval_case(
    index: int, *, seed: int = 0, chars: int = 10_000, min_chars: int = 200, max_chars: int = 700
) -> RetrievalCase:
    """Case `index`: held-out stdlib excerpts (up to 8 files, about `chars` characters)
    under one header style, and a function of `min_chars`..`max_chars` (about 50-200
    tokens) whose name occurs once as a `def`."""
    rng = np.random.default_rng([seed, index])
    files = files_of("val", "code")
    while True:
        k = int(rng.integers(3, 6))
        chosen, pieces = [], []
        while sum(len(p.text) for p in pieces) < chars and len(pieces) < 8:
            f = files[int(rng.integers(len(files)))]
            piece = excerpt(f, rng, max(1500, chars // k), from_top=0.2)
            if piece is not None and f not in chosen:
                chosen.append(f)
                pieces.append(piece)
        doc = join_files(pieces, int(rng.integers(len(FILE_STYLES))))
        candidates = []
        for piece, body, f in zip(pieces, doc.bodies, chosen, strict=True):
            for fn in functions_of(f.read().replace("\r\n", "\n")):
                lo, hi = fn.begin - piece.origin, fn.end - piece.origin
                if lo >= 0 and hi <= len(piece.text) and min_chars <= hi - lo <= max_chars:
                    text = doc.text[body + lo : body + hi]
                    if doc.text.count(f"def {fn.name}(") == 1:
                        candidates.append((fn, f, text))
        if candidates:
            fn, f, text = candidates[int(rng.integers(len(candidates)))]
            question = (
                f"Quote the complete source code of the function `{fn.qualname}` "
                "from the files above."
            )
            return RetrievalCase(doc.text, question, fn.qualname, f.name, text)


@dataclass(frozen=True)
class Retention:
    """How much of the function one compression kept."""

    whole: bool
    kept_fraction: float
    served_tokens: int


def retention(result, plan, source: str) -> Retention:
    """The function's drafter tokens against the kept spans of one compression."""
    begin = plan.drafter.text.find(source)
    if begin < 0:
        raise ValueError("the function text is not in the prompt")
    fn = plan.drafter.token_span(begin, begin + len(source))
    kept = 0
    for s in result.kept_spans:
        kept += max(0, min(s.end, fn.end) - max(s.begin, fn.begin))
    return Retention(kept == len(fn), kept / len(fn), len(result.served_ids))


def compare_case(
    case: RetrievalCase, env, keep: float, chunks=(64, 128), segments: str = "probe"
) -> dict:
    """Compress one case from one drafter run with probe segments (`segments` probe, or
    auto: probe when the gate finds enough boundaries) and with fixed chunks."""
    from pflash.compress.render.rendered import render_chat_prompt
    from pflash.flow.in_process import ScoreOnce, compress_in_process

    # attention alone: segments are what attention ranks; passage evidence cuts candidates at
    # its own passages (ALGORITHM §4.10), which would make the two segmentations alike
    base = {
        "mode": "always",
        "keep_ratio": keep,
        "select_chunk_size": chunks[0],
        "select_semantic_weight": 0.0,
    }
    prompt = render_chat_prompt(env.tokenizer, case.messages())
    once = ScoreOnce(env.scorer)  # one drafter run serves every variant below
    kw = dict(target_tokenizer=env.tokenizer, drafter_tokenizer=env.tokenizer, scorer=once)
    out = {"function": case.function, "file": case.file}
    for name, score in (("probe", "auto"), ("probe_sum", "sum")):
        cfg = env.config(base | {"select_segments": segments, "select_score": score})
        result = compress_in_process(prompt, cfg, probe=env.probe, **kw)
        out["tokens"] = result.plan.n_tokens
        out[name] = retention(result, result.plan, case.source).__dict__
        out[f"{name}_segments"] = result.stats["segments"]
    for c in chunks:
        cfg = env.config(base | {"select_segments": "fixed", "select_chunk_size": c})
        result = compress_in_process(prompt, cfg, **kw)
        out[f"fixed{c}"] = retention(result, result.plan, case.source).__dict__
    return out


# --------------------------------------------------------------------------- environment


class Env:
    """The embedded drafter, its tokenizer and the committed probe, loaded once."""

    def __init__(
        self,
        drafter: str = EMBEDDED,
        probe_path: str | None = None,
        overrides: dict | None = None,
    ):
        from pflash.config import build_config
        from pflash.config.artefacts import resolve_artefact
        from pflash.models.drafter.scorer import DrafterScorer
        from pflash.models.probe import load_segment_probe, scorer_probe_identity
        from pflash.models.source import load_tokenizer

        self.drafter = drafter
        self.overrides = dict(overrides or {})  # applied last, over each section's own config
        self.probe_path = resolve_artefact("probe", probe_path or "embedded", drafter)
        self._build = build_config
        self.scorer = DrafterScorer(self.config({}))
        self.tokenizer = load_tokenizer(drafter)
        self.probe = load_segment_probe(self.probe_path, scorer_probe_identity(self.scorer))

    def config(self, extra: dict):
        # the probe's own layer (the profile default the committed probe was trained at)
        base = UNTUNED_SCORING | {
            "drafter": self.drafter,
            "segment_probe_gguf": str(self.probe_path),
        }
        return self._build(base | extra | self.overrides, env={})


# --------------------------------------------------------------------------- sections


def held_out_boundaries(env: Env, *, docs: int, seed: int) -> dict:
    """Boundary precision/recall of the probe at its own parameters on held-out documents."""
    from pflash_lab.train.probe import (
        assemble_features,
        chat_prefix,
        evaluate,
        extract_taps,
        token_labels,
    )
    from pflash_lab.train.probe_corpus import documents

    texts = list(documents("val", docs, seed=seed))
    prefix = chat_prefix(env.tokenizer)
    labelled = [token_labels(env.tokenizer, d, prefix) for d in texts]
    feats = assemble_features(
        extract_taps(env.scorer, labelled, desc="held-out tap"), labelled, [d.kind for d in texts]
    )
    prob = np.concatenate(
        [env.probe.boundaries(feats.x[feats.doc(d)])[0] for d in range(feats.n_docs)]
    )
    out = {"tokens": int(feats.mask.sum()), "params": env.probe.params.__dict__}
    # "files": stdlib code and licenses joined as files; "docstrings": stdlib docstring prose
    for name, kinds in (("all", None), ("files", {"files"}), ("docstrings", {"prose"})):
        s = evaluate(prob, feats, env.probe.params, kinds=kinds)
        out[name] = {
            "precision": round(s.precision, 4),
            "recall": round(s.recall, 4),
            "boundaries": s.actual,
        }
    return out


def probe_cost(env: Env, lengths=(1024, 2048, 4096), repeats: int = 3) -> list[dict]:
    """Probe time vs the drafter forward (to the scoring layer) on real text."""
    from pflash_lab.train.probe import tap_of
    from pflash_lab.train.probe_corpus import documents

    text = "".join(d.text for d in documents("val", 8, seed=7))
    ids = env.tokenizer(text, add_special_tokens=False)["input_ids"]
    rows = []
    for n in lengths:
        t0 = time.perf_counter()
        tap = tap_of(env.scorer, ids[:n])
        drafter_ms = (time.perf_counter() - t0) * 1000
        probe_ms = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            env.probe.boundaries(tap)
            probe_ms.append((time.perf_counter() - t0) * 1000)
        p = statistics.median(probe_ms)
        rows.append(
            {
                "tokens": n,
                "drafter_ms_per_1k": round(drafter_ms * 1000 / n, 1),
                "probe_ms_per_1k": round(p * 1000 / n, 2),
                "probe_over_drafter": round(p / drafter_ms, 4),
            }
        )
    return rows


def retention_table(env: Env, *, cases: int, keep: float, seed: int) -> dict:
    from tqdm import tqdm

    rows = [
        compare_case(retrieval_case(i, seed=seed), env, keep)
        for i in tqdm(range(cases), desc="retrieval cases")
    ]
    summary = {}
    for k in ("probe", "probe_sum", "fixed64", "fixed128"):
        summary[k] = {
            "whole_function": sum(r[k]["whole"] for r in rows),
            "mean_kept_fraction": round(statistics.mean(r[k]["kept_fraction"] for r in rows), 3),
        }
    return {"cases": len(rows), "keep_ratio": keep, "summary": summary, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sections", default="boundaries,cost,retention")
    p.add_argument("--probe", default=None, help="probe GGUF (default: the embedded one)")
    p.add_argument("--docs", type=int, default=24, help="held-out documents (boundaries)")
    p.add_argument("--seed", type=int, default=1, help="held-out sample (training used 0)")
    p.add_argument("--cases", type=int, default=30, help="retrieval cases (retention)")
    p.add_argument("--keep", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--attention",
        choices=("dense", "window", "block_sparse"),
        help="the drafter trunk's attention (default: the product's)",
    )
    p.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides over every section's own (retention runs attention alone unless"
        " e.g. select_semantic_weight=1.0 asks for the product's semantic evidence)",
    )
    p.add_argument("--out", default=None, help="also write the JSON report here")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    overrides = dict(kv.split("=", 1) for kv in args.set)
    if args.attention:
        overrides["drafter_attention"] = args.attention
    env = Env(probe_path=args.probe, overrides=overrides)
    report: dict = {"probe": str(env.probe_path), "overrides": overrides}
    sections = set(args.sections.split(","))
    if "boundaries" in sections:
        report["boundaries"] = held_out_boundaries(env, docs=args.docs, seed=args.seed)
        print(json.dumps(report["boundaries"]), flush=True)
    if "cost" in sections:
        report["cost"] = probe_cost(env)
        print(json.dumps(report["cost"]), flush=True)
    if "retention" in sections:
        report["retention"] = retention_table(env, cases=args.cases, keep=args.keep, seed=0)
        print(json.dumps(report["retention"]["summary"]), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
