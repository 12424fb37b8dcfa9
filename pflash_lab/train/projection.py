"""Train the tap projection: `pflash projection train --drafter SRC --out FILE`.

The projection (`pflash.models.projection`) scores passages by the cosine of their pooled,
projected tap rows to the question's. Stages, in the order they run:

1. `head_corpus.examples`: the scoring head's retrieval prompts over real text with known
   evidence (same families, splits and validation sets as `pflash head train`; the default
   families add the training-only `paraphrase_pairs`, so the pairs the projection learns
   are not all literal).
2. `passage_layout`: the question and passages serving would score for that prompt. The
   prompt is planned again from its text (`plan_prompt`), the question is
   `evidence_question(plan, SEMANTIC_QUESTION_TOKENS)` (the line closing the user turn,
   not the one-token query window) and the document is cut by `evidence_passages` at
   sentence and line starts; a passage overlapping an evidence span is a positive.
3. `extract`: one drafter pass per prompt through the scorer contract
   (`ScoreRequest.want_tap`, as `head.extract`), keeping only each span's mean of
   RMS-normalised rows (`pooled_rows`): W is linear, so that is all the loss needs.
4. `train_projection`: W [dim, hidden] from a seeded orthogonal init; per prompt a
   multi-positive InfoNCE over its passages, `-(logsumexp(s_pos/τ) - logsumexp(s_all/τ))`,
   with `projected_cosines`, the serving formula; Adam. The epoch with the best
   validation recall at the top 10% of passages (then mean reciprocal rank) wins; the init
   competes.
5. write the GGUF bound to the drafter (`scorer_probe_identity`), then validate end to end:
   the file is read back and bound (`load_tap_projection`), a new drafter pass gives each
   validation prompt's tap and `TapProjection.similarity` scores its passages; the scores
   and metrics must match training's (`consistent` in the report). The report is printed
   and written next to the file (`FILE.json`).

Deterministic: prompts, batch order and the initial weight come from `seed`; torch runs
single-threaded by default with deterministic algorithms.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pflash.models.projection import RMS_EPS, pooled_rows, projected_cosines
from pflash.spans import Span
from pflash_lab.train.head import (
    EMBEDDED,
    score_request,
    scoring_config,
    validation_examples,
)
from pflash_lab.train.head_corpus import HEAD_FAMILIES, HeadExample, examples
from pflash_lab.train.options import options_from_args

DEFAULT_FAMILIES = (
    "paraphrase_pairs",
    "single_needle",
    "multi_key",
    "multi_value",
    "variable_tracking",
)
PARITY_TOLERANCE = 1e-4  # serving (float64 numpy) vs training (float32 torch) cosines
RECALL_TOLERANCE = 0.01  # a near-tie may rank differently in float32 and float64


@dataclass(frozen=True)
class TrainOptions:
    """Everything that determines the trained file (the defaults made the shipped one)."""

    drafter: str = EMBEDDED
    layer: int | None = 8  # the layer whose input is the tap: the embedded drafter's serving one
    seed: int = 0
    families: tuple[str, ...] = DEFAULT_FAMILIES  # trained on, cycled
    train_prompts: int = 120
    val_prompts: int = 30  # held-out text, every family (head.validation_examples)
    val_train_text_prompts: int = 10  # new prompts on training text
    epochs: int = 30
    lr: float = 1e-2
    batch_prompts: int = 8
    dim: int = 128
    temperature: float = 0.05
    passage_tokens: int = 24  # serving's semantic_passage_tokens default
    top_fraction: float = 0.1
    threads: int = 1


# ---------------------------------------------------------------------------- passages


@dataclass(frozen=True, eq=False)
class PassageLayout:
    """What one prompt is scored on (drafter tokens): the `question`, the document's
    `passages` (source order) and `positive`, bool [len(passages)], those overlapping an
    evidence span."""

    question: Span
    passages: tuple[Span, ...]
    positive: np.ndarray


def positives(passages: Sequence[Span], evidence: Sequence[Span]) -> np.ndarray:
    """bool [len(passages)]: the passage overlaps some evidence span."""
    return np.array([any(p.overlaps(e) for e in evidence) for p in passages], dtype=bool)


def passage_layout(
    ex: HeadExample, *, tokenizer, config, passage_tokens: int
) -> PassageLayout | None:
    """The question and passages serving scores for `ex`: the prompt re-planned from its
    text, the question as `evidence_request` takes it, the document (only) cut into
    passages. None when the document has no passage holding evidence."""
    from pflash.compress.evidence.passage_evidence import (
        SEMANTIC_QUESTION_TOKENS,
        evidence_passages,
        evidence_question,
    )
    from pflash.compress.plan.query import plan_prompt
    from pflash.spans import decode_ids

    plan = plan_prompt(
        prompt_text=decode_ids(tokenizer, ex.ids),
        drafter_tokenizer=tokenizer,
        target_tokenizer=tokenizer,
        config=config,
    )
    if plan.drafter.ids != ex.ids:
        raise ValueError(f"{ex.case_id}: the prompt does not re-encode to its own ids")
    question = evidence_question(plan, SEMANTIC_QUESTION_TOKENS)
    if question is None:
        raise ValueError(f"{ex.case_id}: no question to score passages against")
    end = min(question.begin, plan.query.begin, ex.context.end)
    passages = evidence_passages(
        plan.drafter, end, [Span(0, ex.context.begin)], max_tokens=passage_tokens
    )
    positive = positives(passages, ex.evidence)
    return PassageLayout(question, passages, positive) if positive.any() else None


# ---------------------------------------------------------------------------- features


@dataclass(frozen=True, eq=False)
class PromptFeatures:
    """One prompt's pooled tap rows (`pooled_rows`): `question` float64 [hidden] and
    `passages` float64 [n, hidden], with its `layout`; `family` / `text` name its group."""

    family: str
    text: str
    layout: PassageLayout
    question: np.ndarray
    passages: np.ndarray


def features_from_tap(
    family: str, text: str, tap: np.ndarray, layout: PassageLayout, eps: float = RMS_EPS
) -> PromptFeatures:
    """Pool the rows training reads from a tap float32 [S, hidden]."""
    q = pooled_rows(tap, [layout.question], eps)[0]
    return PromptFeatures(family, text, layout, q, pooled_rows(tap, layout.passages, eps))


def extract(
    scorer, exs: Sequence[HeadExample], layouts: Sequence[PassageLayout], *, desc: str = "tap"
) -> list[PromptFeatures]:
    """Run the drafter over every example once (as `head.extract`) and pool its tap."""
    from tqdm import tqdm

    out = []
    with tqdm(total=sum(len(e.ids) for e in exs), desc=desc, unit="tok") as bar:
        for ex, layout in zip(exs, layouts, strict=True):
            result = scorer(score_request(ex, want_tap=True))
            tap = np.asarray(result.tap, dtype=np.float32)  # [S, hidden]
            out.append(features_from_tap(ex.family, ex.text, tap, layout))
            bar.update(len(ex.ids))
    return out


# ---------------------------------------------------------------------------- loss


def initial_weight(dim: int, hidden: int, seed: int):
    """A random W float32 [dim, hidden] with orthonormal rows (QR of a seeded Gaussian):
    at the init, cosines are those of a random `dim`-dimensional view of the tap."""
    import torch

    if not 1 <= dim <= hidden:
        raise ValueError(f"dim must be in [1, {hidden}], got {dim}")
    g = torch.Generator().manual_seed(seed)
    q, r = torch.linalg.qr(torch.randn(hidden, dim, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(r))  # a unique QR: the same W on every machine
    return q.T.contiguous().float()


def info_nce(scores, positive, temperature: float):
    """Multi-positive InfoNCE of one prompt (scalar tensor): -log of the softmax mass the
    positives take, `-(logsumexp(s_pos/τ) - logsumexp(s_all/τ))`, scores [n], positive
    bool [n]."""
    import torch

    logits = scores / temperature
    return -(torch.logsumexp(logits[positive], 0) - torch.logsumexp(logits, 0))


def torch_scores(weight, feats: PromptFeatures):
    """The serving cosines [n] of one prompt in torch (float32, differentiable in W)."""
    import torch

    q = torch.from_numpy(feats.question).float()
    p = torch.from_numpy(feats.passages).float()
    return projected_cosines(weight, q, p)


# ---------------------------------------------------------------------------- metrics


def evidence_ranks(scores: np.ndarray, positive: np.ndarray) -> np.ndarray:
    """1-based rank (by score, ties in source order) of each positive passage, int64."""
    order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(1, len(order) + 1)
    return rank[np.asarray(positive, dtype=bool)]


def top_budget(n: int, fraction: float) -> int:
    """Passages the top-`fraction` budget keeps: ceil(fraction * n), at least one."""
    return max(1, math.ceil(fraction * n))


@dataclass(frozen=True)
class RankMetrics:
    """Ranking quality over prompts at the top-`fraction` budget of passages.

    - `positives_top` / `positives`: evidence passages ranked within the budget, and
      `recall_top` their ratio (over all prompts' evidence passages);
    - `all_top`: prompts whose every evidence passage is within the budget;
    - `mrr`: mean over prompts of 1 / the best evidence passage's rank.
    """

    prompts: int
    positives: int
    positives_top: int
    recall_top: float
    all_top: int
    mrr: float


def rank_metrics(
    scores: Sequence[np.ndarray], positive: Sequence[np.ndarray], fraction: float
) -> RankMetrics:
    n_pos = n_top = all_top = 0
    rr = []
    for s, pos in zip(scores, positive, strict=True):
        r = evidence_ranks(s, pos)
        k = top_budget(len(pos), fraction)
        n_pos += len(r)
        n_top += int((r <= k).sum())
        all_top += bool((r <= k).all())
        rr.append(1.0 / r.min() if len(r) else 0.0)
    return RankMetrics(
        prompts=len(rr),
        positives=n_pos,
        positives_top=n_top,
        recall_top=round(n_top / n_pos, 4) if n_pos else 0.0,
        all_top=all_top,
        mrr=round(float(np.mean(rr)), 4) if rr else 0.0,
    )


def grouped_metrics(
    feats: Sequence[PromptFeatures], scores: Sequence[np.ndarray], fraction: float
) -> dict[str, dict]:
    """`rank_metrics` for `all` and per `family/text` group (e.g. `multi_key/val`)."""
    names = {"all": list(range(len(feats)))}
    for i, f in enumerate(feats):
        names.setdefault(f"{f.family}/{f.text}", []).append(i)
    return {
        name: asdict(
            rank_metrics(
                [scores[i] for i in idx], [feats[i].layout.positive for i in idx], fraction
            )
        )
        for name, idx in sorted(names.items())
    }


# ---------------------------------------------------------------------------- training


def all_scores(weight, feats: Sequence[PromptFeatures]) -> list[np.ndarray]:
    """Training's cosines per prompt, float32 numpy (no gradient)."""
    import torch

    with torch.no_grad():
        return [torch_scores(weight, f).numpy() for f in feats]


def train_projection(
    train: Sequence[PromptFeatures],
    val: Sequence[PromptFeatures],
    opts: TrainOptions,
    *,
    progress: bool = True,
) -> tuple[np.ndarray, list[dict]]:
    """Fit W on `train`; returns W float32 [dim, hidden] of the epoch with the best `val`
    (recall at the top budget, then MRR; epoch 0 = the init) and the per-epoch history."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(opts.seed)
    hidden = train[0].passages.shape[1]
    weight = initial_weight(opts.dim, hidden, opts.seed).requires_grad_(True)
    optim = torch.optim.Adam([weight], lr=opts.lr)
    rng = np.random.default_rng(opts.seed)
    masks = [torch.from_numpy(f.layout.positive) for f in train]

    def snapshot(epoch: int, train_loss: float | None) -> dict:
        m = rank_metrics(
            all_scores(weight, val), [f.layout.positive for f in val], opts.top_fraction
        )
        return {
            "epoch": epoch,
            "train_loss": train_loss,
            "val_recall_top": m.recall_top,
            "val_all_top": m.all_top,
            "val_mrr": m.mrr,
        }

    def key(h: dict) -> tuple[float, float]:
        return h["val_recall_top"], h["val_mrr"]

    history = [snapshot(0, None)]
    best = (key(history[0]), weight.detach().clone())
    bar = tqdm(
        range(1, opts.epochs + 1), desc="train projection", unit="epoch", disable=not progress
    )
    for epoch in bar:
        order = rng.permutation(len(train))
        total, steps = 0.0, 0
        for i in range(0, len(order), opts.batch_prompts):
            batch = order[i : i + opts.batch_prompts].tolist()
            loss = sum(
                info_nce(torch_scores(weight, train[j]), masks[j], opts.temperature) for j in batch
            ) / len(batch)
            optim.zero_grad()
            loss.backward()
            optim.step()
            total += float(loss.detach())
            steps += 1
        h = snapshot(epoch, round(total / max(1, steps), 5))
        history.append(h)
        bar.set_postfix(loss=f"{h['train_loss']:.4f}", recall=h["val_recall_top"], mrr=h["val_mrr"])
        if key(h) > best[0]:
            best = (key(h), weight.detach().clone())
    return best[1].numpy(), history


# ---------------------------------------------------------------------------- the command


def trained_on(opts: TrainOptions) -> str:
    """The file's `trained_on` note."""
    return (
        f"pflash projection train: {'+'.join(opts.families)}, {opts.train_prompts} prompts, "
        f"seed {opts.seed}"
    )


def _laid_out(exs, *, tokenizer, config, passage_tokens: int):
    """The examples that have a passage holding evidence, with their layouts."""
    kept, layouts = [], []
    for ex in exs:
        layout = passage_layout(
            ex, tokenizer=tokenizer, config=config, passage_tokens=passage_tokens
        )
        if layout is not None:
            kept.append(ex)
            layouts.append(layout)
    return kept, layouts


def end_to_end_scores(scorer, projection, exs: Sequence[HeadExample], layouts, *, progress: bool):
    """Each prompt's scores as serving computes them from the written file: a new drafter
    pass for the tap (the call `extract` makes), then `TapProjection.similarity` (float64
    [n] per prompt)."""
    from tqdm import tqdm

    out = []
    pairs = list(zip(exs, layouts, strict=True))
    for ex, layout in tqdm(pairs, desc="validate", unit="prompt", disable=not progress):
        tap = scorer(score_request(ex, want_tap=True)).tap  # [S, hidden]
        out.append(projection.similarity(tap, layout.question, layout.passages))
    return out


def train_to_file(opts: TrainOptions, out: Path, *, progress: bool = True) -> dict:
    """Build prompts, extract pooled taps, train, write `out`, validate end to end, write
    `out.json`. Returns the report."""
    import torch

    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.loading import load_causal_lm
    from pflash.models.probe import scorer_probe_identity
    from pflash.models.projection import (
        ProjectionFile,
        load_tap_projection,
        read_projection_gguf,
        write_projection_gguf,
    )
    from pflash.models.source import load_tokenizer

    torch.set_num_threads(opts.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    config = scoring_config(opts.drafter, opts.layer)
    loaded = load_causal_lm(opts.drafter)
    # no sentence embedder: the tap does not depend on it (head.py's scorer loads it)
    scorer = DrafterScorer(
        scoring_config(opts.drafter, opts.layer, select_semantic_weight=0.0), loaded
    )
    tokenizer = load_tokenizer(config.drafter_tokenizer or opts.drafter)
    train_ex = examples(
        opts.families,
        opts.train_prompts,
        text="train",
        stream=0,
        seed=opts.seed,
        tokenizer=tokenizer,
        config=config,
    )
    val_ex = validation_examples(opts, tokenizer=tokenizer, config=config)
    laid = dict(tokenizer=tokenizer, config=config, passage_tokens=opts.passage_tokens)
    train_kept, train_layouts = _laid_out(train_ex, **laid)
    val_kept, val_layouts = _laid_out(val_ex, **laid)
    t1 = time.perf_counter()
    train = extract(scorer, train_kept, train_layouts, desc="tap train")
    val = extract(scorer, val_kept, val_layouts, desc="tap val")
    t2 = time.perf_counter()
    init = initial_weight(opts.dim, train[0].passages.shape[1], opts.seed)
    weight, history = train_projection(train, val, opts, progress=progress)
    t3 = time.perf_counter()

    identity = scorer_probe_identity(scorer)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_projection_gguf(
        out,
        ProjectionFile(
            family=identity.family,
            base_model=identity.base_model,
            feature_tap=identity.feature_tap,
            runtime_gguf_sha256=identity.runtime_gguf_sha256,
            n_embd=identity.n_embd,
            weight=weight,
            temperature=opts.temperature,
            trained_on=trained_on(opts),
        ),
    )
    written = read_projection_gguf(out)
    projection = load_tap_projection(out, identity)
    served = end_to_end_scores(scorer, projection, val_kept, val_layouts, progress=progress)
    t4 = time.perf_counter()

    w = torch.from_numpy(weight)
    trained_val = all_scores(w, val)
    parity = max(float(np.abs(a - b).max()) for a, b in zip(served, trained_val, strict=True))
    f = opts.top_fraction
    validation = {
        "init": grouped_metrics(val, all_scores(init, val), f),
        "trained": grouped_metrics(val, trained_val, f),
        "end_to_end": grouped_metrics(val, served, f),
    }
    recall_gap = abs(
        validation["end_to_end"]["all"]["recall_top"] - validation["trained"]["all"]["recall_top"]
    )
    report = {
        "out": str(out),
        "bytes": out.stat().st_size,
        "schema": written.schema,
        "feature_tap": written.feature_tap,
        "layer": scorer.profile.head_layer,
        "dim": written.dim,
        "best_epoch": max(history, key=lambda h: (h["val_recall_top"], h["val_mrr"]))["epoch"],
        "history": history,
        "serving_parity_max_abs": parity,
        "consistent": parity <= PARITY_TOLERANCE and recall_gap <= RECALL_TOLERANCE,
        "validation": validation,
        "train_set": {
            "init": grouped_metrics(train, all_scores(init, train), f),
            "trained": grouped_metrics(train, all_scores(w, train), f),
        },
        "prompts": {"train": len(train), "val": len(val)},
        "dropped_without_evidence_passage": {
            "train": len(train_ex) - len(train_kept),
            "val": len(val_ex) - len(val_kept),
        },
        "prompts_s": round(t1 - t0, 1),
        "features_s": round(t2 - t1, 1),
        "train_s": round(t3 - t2, 1),
        "validate_s": round(t4 - t3, 1),
        "options": asdict(opts),
    }
    Path(f"{out}.json").write_text(json.dumps(report, indent=1) + "\n")
    return report


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainOptions()
    p.add_argument("--drafter", default=d.drafter, help="drafter source the projection binds to")
    p.add_argument("--out", required=True, help="projection GGUF to write (and FILE.json)")
    p.add_argument(
        "--layer",
        type=int,
        default=TrainOptions.layer,
        help="scoring layer whose input tap is read (default 8: the embedded drafter's "
        "serving layer, what the shipped file reads)",
    )
    p.add_argument(
        "--families",
        nargs="+",
        choices=HEAD_FAMILIES,
        default=list(d.families),
        help="families trained on (paraphrase_pairs: the trainer's own paraphrase wordings)",
    )
    p.add_argument("--train-prompts", type=int, default=d.train_prompts)
    p.add_argument("--val-prompts", type=int, default=d.val_prompts, help="held-out-text prompts")
    p.add_argument(
        "--val-train-text-prompts",
        type=int,
        default=d.val_train_text_prompts,
        help="validation prompts on training text",
    )
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--batch-prompts", type=int, default=d.batch_prompts)
    p.add_argument("--dim", type=int, default=d.dim, help="projected width")
    p.add_argument("--temperature", type=float, default=d.temperature, help="InfoNCE τ")
    p.add_argument(
        "--passage-tokens",
        type=int,
        default=d.passage_tokens,
        help="longest passage (drafter tokens; serving's semantic_passage_tokens)",
    )
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads (determinism)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _line(m: dict) -> str:
    return (
        f"recall@top {m['positives_top']:4d}/{m['positives']:<4d} ({m['recall_top']:.3f}), "
        f"all in top {m['all_top']:3d}/{m['prompts']:<3d}, MRR {m['mrr']:.3f}"
    )


def run_train(args: argparse.Namespace) -> int:
    opts = options_from_args(TrainOptions, args)
    report = train_to_file(opts, Path(args.out))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0 if report["consistent"] else 1
    print(
        f"wrote {report['out']} ({report['bytes']} bytes, {report['schema']}, "
        f"{report['feature_tap']}, dim {report['dim']}) and {report['out']}.json"
    )
    if report["layer"] != TrainOptions.layer:
        print(f"serving needs drafter_head_layer: {report['layer']}")
    print(f"best epoch {report['best_epoch']}")
    for h in report["history"]:
        print(
            f"  epoch {h['epoch']}: loss {h['train_loss']} val recall@top {h['val_recall_top']} "
            f"MRR {h['val_mrr']}"
        )
    print(f"validation (top {opts.top_fraction:.0%} of passages; end to end = served scores):")
    v = report["validation"]
    for name in v["init"]:
        print(f"  {name:28s} init       {_line(v['init'][name])}")
        print(f"  {'':28s} end to end {_line(v['end_to_end'][name])}")
    ts = report["train_set"]
    print(f"  {'train set':28s} init       {_line(ts['init']['all'])}")
    print(f"  {'':28s} trained    {_line(ts['trained']['all'])}")
    print(f"serving parity max |d cosine| {report['serving_parity_max_abs']:.2e}")
    print(
        f"prompts {report['prompts_s']} s, features {report['features_s']} s, "
        f"training {report['train_s']} s, validation {report['validate_s']} s"
    )
    if not report["consistent"]:
        print("INCONSISTENT: the served scores differ from training's (see the report)")
        return 1
    return 0
