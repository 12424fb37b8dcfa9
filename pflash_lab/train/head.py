"""Train the scoring head for a drafter: `pflash head train --drafter SRC --out FILE`.

(~600 lines: data, loss, optimisation and validation of one small network in the order they
run.) The head (§3.4) replaces the scoring layer's q_proj/k_proj; everything else (the layer's
input_layernorm, q_norm/k_norm when the model has them, no rotary, softmax over the visible
keys, mean over heads and rows, window mix) stays exactly as serving computes it. Stages:

1. `head_corpus.examples`: retrieval prompts over real text with known evidence spans,
   planned by `compress.pipeline.prepare` (the serving query windows). Training uses
   `TrainOptions.families` (default `TRAIN_FAMILIES`; `--families` may add the training-only
   `paraphrase_pairs`) on training-split text; validation uses held-out text files over those
   families and the held-out families `VAL_ONLY_FAMILIES`, plus a few new prompts on
   training text.
2. `extract`: one drafter pass per prompt through the scorer contract
   (`ScoreRequest.want_tap`): the tap (residual stream entering the scoring layer) and the
   untrained head's mass.
3. `train_head`: trainable Wq/Wk initialised from the layer's own projections. The mass is
   computed by drafter.py's own `head_keys` / `head_queries` / `window_mass` /
   `mix_window_masses` (they are differentiable), so training scores what serving scores.
   Loss (`ranking_loss`): each evidence item's best 64-token chunk should beat the k-th best
   non-evidence chunk (k = the top-`top_fraction` budget) by a margin in log-mass, plus a
   listwise -log(share of the context mass on evidence), plus a pull toward the initial
   weights. Adam; the epoch with the lowest held-out loss wins (the initial weights compete).
4. write the GGUF (§7.1) bound to the drafter (`DrafterScorer.head_identity()`), then
   validate end to end: a fresh `DrafterScorer` loads the file via `scoring_head_gguf` and
   scores the validation prompts; ranks are compared with the untrained scorer's.

Deterministic: prompts, batch order and initial weights come from `seed`; torch runs
single-threaded with deterministic algorithms.
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

from pflash_lab.train.head_corpus import (
    HEAD_FAMILIES,
    TRAIN_FAMILIES,
    VAL_ONLY_FAMILIES,
    HeadExample,
    examples,
)
from pflash_lab.train.options import options_from_args

EMBEDDED = "embedded:smollm2-135m"


@dataclass(frozen=True)
class TrainOptions:
    """Everything that determines the trained file (the defaults made the shipped one)."""

    drafter: str = EMBEDDED
    layer: int | None = None  # scoring layer; None = the drafter profile's default
    seed: int = 0
    families: tuple[str, ...] = TRAIN_FAMILIES  # trained on, cycled
    train_prompts: int = 150
    val_prompts: int = 30  # held-out text, every family
    val_train_text_prompts: int = 10  # new prompts on training text
    epochs: int = 8
    lr: float = 1e-3
    batch_prompts: int = 4
    margin: float = 1.0  # log-mass margin of evidence over the k-th negative chunk
    listwise_weight: float = 0.5
    anchor_weight: float = 1.0  # relative squared distance to the initial weights
    top_fraction: float = 0.1
    chunk: int = 64  # drafter tokens per ranking chunk
    threads: int = 1


# ---------------------------------------------------------------------------- config


def scoring_config(drafter: str, layer: int | None, **extra):
    """The config prompts are planned and scored with: strict head scorer, always compress
    (so `prepare` builds the request), fixed 64-token chunks."""
    from pflash.config import UNTUNED_SCORING, build_config

    values = {
        **UNTUNED_SCORING,  # the layer's own q_proj/k_proj: what the head is trained against
        "drafter": drafter,
        "drafter_head_layer": layer,
        "mode": "always",
        "keep_ratio": 0.1,
        "curve": (),
        "select_chunk_size": 64,
    }
    return build_config(values | extra, env={})


# ---------------------------------------------------------------------------- features


@dataclass(frozen=True, eq=False)
class Sample:
    """One example with the drafter's tap float32 [S, hidden] and the untrained scorer's mass
    float32 [S] (both from the real `DrafterScorer`)."""

    example: HeadExample
    tap: object  # torch.Tensor [S, hidden]
    base_mass: np.ndarray


def score_request(ex: HeadExample, *, want_tap: bool = False):
    from pflash.compress.scoring import ScoreRequest

    return ScoreRequest(
        ids=ex.ids,
        windows=ex.windows,
        query=ex.query,
        suffix_candidates=ex.suffix_candidates,
        scorer="head",
        want_tap=want_tap,
    )


def extract(scorer, exs: Sequence[HeadExample], *, desc: str = "tap") -> list[Sample]:
    """Run the drafter over every example once: its tap and its (untrained) mass."""
    import torch
    from tqdm import tqdm

    out = []
    with tqdm(total=sum(len(e.ids) for e in exs), desc=desc, unit="tok") as bar:
        for ex in exs:
            result = scorer(score_request(ex, want_tap=True))
            tap = torch.from_numpy(np.asarray(result.tap, dtype=np.float32))
            out.append(Sample(ex, tap, np.asarray(result.mass, dtype=np.float32)))
            bar.update(len(ex.ids))
    return out


# ---------------------------------------------------------------------------- the head


def initial_head_weights(scorer):
    """The scoring layer's own projections in head layout: q_proj's query rows (the query
    half per head when q_proj is gated), k_proj. Float32 copies [H*D, hidden], [Hk*D, hidden]."""
    attn = scorer.layer.self_attn
    q = attn.q_proj.weight.detach().float()
    if scorer.profile.gated_q:  # per head [query (D) ; gate (D)]
        q = q.view(scorer.n_head, 2 * scorer.head_dim, -1)[:, : scorer.head_dim]
        q = q.reshape(scorer.n_head * scorer.head_dim, -1)
    return q.clone(), attn.k_proj.weight.detach().float().clone()


class TrainableHead:
    """Wq, Wk as leaf tensors; duck-types `ScoringHead` (q_weight, k_weight) so drafter.py's
    `head_queries` / `head_keys` use them as they use a loaded head file."""

    def __init__(self, q_weight, k_weight):
        self.q_weight = q_weight.clone().requires_grad_(True)
        self.k_weight = k_weight.clone().requires_grad_(True)

    def parameters(self):
        return [self.q_weight, self.k_weight]


def head_mass(scorer, head, tap, ex: HeadExample):
    """The mass [S] the scorer computes for `ex` from its tap [S, hidden] with `head`
    (None = the layer's own projections); differentiable in the head's weights."""
    from pflash.models.drafter.attention import (
        head_keys,
        head_queries,
        mix_window_masses,
        visible_keys,
        window_mass,
    )

    keys = head_keys(scorer.layer, tap, n_kv=scorer.n_kv, head=head)  # [S, Hk, D]
    masses, weights = [], []
    for w in ex.windows:
        q = head_queries(
            scorer.layer,
            tap[w.span.begin : w.span.end],
            n_head=scorer.n_head,
            gated=scorer.profile.gated_q,
            head=head,
        )  # [n, H, D]
        visible = visible_keys(len(ex.ids), ex.query, w, suffix_candidates=ex.suffix_candidates)
        masses.append(window_mass(q, keys, visible, scorer.scale))
        weights.append(w.weight)
    return mix_window_masses(masses, weights)  # [S]


# ---------------------------------------------------------------------------- chunks and ranks


@dataclass(frozen=True, eq=False)
class ChunkLayout:
    """The example's context cut into fixed chunks (drafter tokens).

    - `bounds`: [(begin, end)] per chunk; `token_chunk`: int64 [len(context)], chunk per
      context token; `evidence`: per evidence item, the chunks it overlaps;
    - `negative`: bool [n_chunks], chunks holding no evidence token.
    """

    context_begin: int
    bounds: tuple[tuple[int, int], ...]
    token_chunk: np.ndarray
    evidence: tuple[tuple[int, ...], ...]
    negative: np.ndarray

    @property
    def n_chunks(self) -> int:
        return len(self.bounds)


def chunk_layout(ex: HeadExample, chunk: int) -> ChunkLayout:
    c = ex.context
    bounds = tuple((b, min(b + chunk, c.end)) for b in range(c.begin, c.end, chunk))
    token_chunk = (np.arange(c.begin, c.end) - c.begin) // chunk
    evidence = tuple(
        tuple(k for k, (b, e) in enumerate(bounds) if b < span.end and span.begin < e)
        for span in ex.evidence
    )
    negative = np.ones(len(bounds), dtype=bool)
    for ks in evidence:
        negative[list(ks)] = False
    return ChunkLayout(c.begin, bounds, token_chunk, evidence, negative)


def chunk_sums(mass, layout: ChunkLayout):
    """Mass per chunk [n_chunks] (torch in, torch out; numpy in, numpy out)."""
    import torch

    lo = layout.context_begin
    hi = lo + len(layout.token_chunk)
    if isinstance(mass, np.ndarray):
        return np.bincount(
            layout.token_chunk, weights=mass[lo:hi].astype(np.float64), minlength=layout.n_chunks
        )
    out = torch.zeros(layout.n_chunks, dtype=mass.dtype)
    return out.index_add(0, torch.from_numpy(layout.token_chunk), mass[lo:hi])


def evidence_ranks(mass: np.ndarray, layout: ChunkLayout) -> list[int]:
    """Per evidence item, the 1-based rank (by summed mass, ties in order) of its best chunk
    among all context chunks."""
    sums = chunk_sums(np.asarray(mass, dtype=np.float64), layout)
    order = np.argsort(-sums, kind="stable")
    rank = np.empty(layout.n_chunks, dtype=np.int64)
    rank[order] = np.arange(1, layout.n_chunks + 1)
    return [int(min(rank[k] for k in ks)) for ks in layout.evidence]


def top_budget(n_chunks: int, fraction: float) -> int:
    """How many chunks the top-`fraction` budget keeps (at least one)."""
    return max(1, math.ceil(fraction * n_chunks))


def ranking_loss(mass, layout: ChunkLayout, opts: TrainOptions):
    """Budget-aware ranking loss of one example (scalar tensor).

    margin: mean over evidence items of softplus(margin - (log m_e - log m_neg_k)), m_e the
    item's best chunk mass and m_neg_k the k-th largest non-evidence chunk mass, k the
    top-`top_fraction` budget; listwise: -log(evidence chunks' mass / context mass).
    """
    import torch
    import torch.nn.functional as F

    sums = chunk_sums(mass, layout)  # [n_chunks]
    logm = torch.log(sums + 1e-12)
    negative = torch.from_numpy(layout.negative)
    negs = logm[negative]
    k = min(top_budget(layout.n_chunks, opts.top_fraction), negs.numel())
    kth = torch.topk(negs, k).values[-1]
    best = torch.stack([logm[list(ks)].max() for ks in layout.evidence])  # [items]
    margin = F.softplus(opts.margin - (best - kth)).mean()
    listwise = -torch.log(sums[~negative].sum() / sums.sum() + 1e-12)
    return margin + opts.listwise_weight * listwise


# ---------------------------------------------------------------------------- metrics


@dataclass(frozen=True)
class RankMetrics:
    """Ranking quality over prompts, at the top-`fraction` budget of context chunks.

    - `all_top`: prompts whose every evidence item's best chunk is within the budget;
    - `items_top` / `items`: evidence items within the budget;
    - `mean_rank`: mean 1-based rank of an item's best chunk; `mean_rank_fraction`: the same
      divided by the prompt's chunk count (0 = first, 1 = last).
    """

    prompts: int
    all_top: int
    items: int
    items_top: int
    mean_rank: float
    mean_rank_fraction: float


def rank_metrics(masses: Sequence[np.ndarray], layouts: Sequence[ChunkLayout], fraction: float):
    all_top, items, items_top, ranks, fracs = 0, 0, 0, [], []
    for mass, layout in zip(masses, layouts, strict=True):
        r = evidence_ranks(mass, layout)
        k = top_budget(layout.n_chunks, fraction)
        all_top += all(x <= k for x in r)
        items += len(r)
        items_top += sum(x <= k for x in r)
        ranks += r
        fracs += [x / layout.n_chunks for x in r]
    return RankMetrics(
        prompts=len(layouts),
        all_top=all_top,
        items=items,
        items_top=items_top,
        mean_rank=round(float(np.mean(ranks)), 3) if ranks else 0.0,
        mean_rank_fraction=round(float(np.mean(fracs)), 4) if fracs else 0.0,
    )


def groups(samples: Sequence[Sample]) -> dict[str, list[int]]:
    """Indices of samples per (family, text) group, e.g. `multi_key/val`, plus `all`."""
    out: dict[str, list[int]] = {"all": list(range(len(samples)))}
    for i, s in enumerate(samples):
        out.setdefault(f"{s.example.family}/{s.example.text}", []).append(i)
    return dict(sorted(out.items()))


def grouped_metrics(samples, masses, opts: TrainOptions) -> dict[str, dict]:
    layouts = [chunk_layout(s.example, opts.chunk) for s in samples]
    return {
        name: asdict(
            rank_metrics([masses[i] for i in idx], [layouts[i] for i in idx], opts.top_fraction)
        )
        for name, idx in groups(samples).items()
    }


# ---------------------------------------------------------------------------- training


def _anchor(head: TrainableHead, init: tuple) -> object:
    """Squared distance to the initial weights, relative to their squared norm."""
    return sum(
        ((w - w0) ** 2).sum() / (w0**2).sum() for w, w0 in zip(head.parameters(), init, strict=True)
    )


def _evaluate(scorer, head, samples, layouts, opts: TrainOptions) -> tuple[float, list]:
    """Mean ranking loss and masses (numpy) over `samples`, no gradient."""
    import torch

    total, masses = 0.0, []
    with torch.no_grad():
        for s, layout in zip(samples, layouts, strict=True):
            m = head_mass(scorer, head, s.tap, s.example)
            total += float(ranking_loss(m, layout, opts))
            masses.append(m.numpy())
    return total / max(1, len(samples)), masses


def train_head(
    scorer, train: Sequence[Sample], val: Sequence[Sample], opts: TrainOptions, *, progress=True
) -> tuple[TrainableHead, list[dict]]:
    """Fit Wq/Wk on `train`; returns the head of the epoch with the lowest `val` loss
    (epoch 0 = the initial weights) and the per-epoch history."""
    import torch
    from tqdm import tqdm

    torch.manual_seed(opts.seed)
    for p in scorer.layer.parameters():  # the frozen part of the head: norms
        p.requires_grad_(False)
    init = initial_head_weights(scorer)
    head = TrainableHead(*init)
    optim = torch.optim.Adam(head.parameters(), lr=opts.lr)
    steps_per_epoch = -(-len(train) // opts.batch_prompts)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optim, T_max=opts.epochs * steps_per_epoch)
    rng = np.random.default_rng(opts.seed)
    train_layouts = [chunk_layout(s.example, opts.chunk) for s in train]
    val_layouts = [chunk_layout(s.example, opts.chunk) for s in val]

    def snapshot(epoch: int, train_loss: float | None) -> dict:
        vloss, vmass = _evaluate(scorer, head, val, val_layouts, opts)
        m = rank_metrics(vmass, val_layouts, opts.top_fraction)
        with torch.no_grad():
            drift = float(_anchor(head, init))
        return {
            "epoch": epoch,
            "train": train_loss,
            "val": round(vloss, 5),
            "val_all_top": m.all_top,
            "val_items_top": m.items_top,
            "val_mean_rank": m.mean_rank,
            "drift": round(drift, 6),
        }

    history = [snapshot(0, None)]
    best = (history[0]["val"], [w.detach().clone() for w in head.parameters()])
    bar = tqdm(range(1, opts.epochs + 1), desc="train head", unit="epoch", disable=not progress)
    for epoch in bar:
        order = rng.permutation(len(train))
        total = 0.0
        for i in range(0, len(order), opts.batch_prompts):
            batch = order[i : i + opts.batch_prompts].tolist()
            loss = sum(
                ranking_loss(
                    head_mass(scorer, head, train[j].tap, train[j].example), train_layouts[j], opts
                )
                for j in batch
            ) / len(batch)
            total += float(loss.detach())
            loss = loss + opts.anchor_weight * _anchor(head, init)
            optim.zero_grad()
            loss.backward()
            optim.step()
            sched.step()
        h = snapshot(epoch, round(total / steps_per_epoch, 5))
        history.append(h)
        bar.set_postfix(
            train=f"{h['train']:.4f}",
            val=f"{h['val']:.4f}",
            top=f"{h['val_all_top']}/{len(val)}",
            rank=f"{h['val_mean_rank']:.2f}",
        )
        if h["val"] < best[0]:
            best = (h["val"], [w.detach().clone() for w in head.parameters()])
    return TrainableHead(*best[1]), history


# ---------------------------------------------------------------------------- the command


def validation_examples(opts: TrainOptions, *, tokenizer, config) -> list[HeadExample]:
    """Held-out text over the trained and the held-out families, then new prompts on
    training text over the trained families and multi_query."""
    families = tuple(dict.fromkeys(opts.families + VAL_ONLY_FAMILIES))
    held_out = examples(
        families,
        opts.val_prompts,
        text="val",
        stream=1,
        seed=opts.seed,
        tokenizer=tokenizer,
        config=config,
    )
    seen = examples(
        tuple(dict.fromkeys(opts.families + ("multi_query",))),
        opts.val_train_text_prompts,
        text="train",
        stream=2,
        seed=opts.seed,
        tokenizer=tokenizer,
        config=config,
    )
    return held_out + seen


def train_to_file(opts: TrainOptions, out: Path, *, progress: bool = True) -> dict:
    """Build prompts, extract taps, train, write `out`, validate end to end. Returns the
    report that is also printed."""
    import torch
    from tqdm import tqdm

    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.drafter.scoring_head import save_scoring_head
    from pflash.models.loading import load_causal_lm
    from pflash.models.source import load_tokenizer

    torch.set_num_threads(opts.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    config = scoring_config(opts.drafter, opts.layer)
    loaded = load_causal_lm(opts.drafter)
    scorer = DrafterScorer(config, loaded)
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
    t1 = time.perf_counter()
    train = extract(scorer, train_ex, desc="tap train")
    val = extract(scorer, val_ex, desc="tap val")
    t2 = time.perf_counter()
    with torch.no_grad():  # the training math is the serving math: same mass at the init
        parity = max(
            float(np.abs(head_mass(scorer, None, s.tap, s.example).numpy() - s.base_mass).max())
            for s in val[:3]
        )
    head, history = train_head(scorer, train, val, opts, progress=progress)
    t3 = time.perf_counter()
    identity = scorer.head_identity()
    out.parent.mkdir(parents=True, exist_ok=True)
    save_scoring_head(out, identity, head.q_weight, head.k_weight)

    trained = DrafterScorer(
        scoring_config(opts.drafter, opts.layer, scoring_head_gguf=str(out)), loaded
    )
    trained_mass = [
        np.asarray(trained(score_request(s.example)).mass)
        for s in tqdm(val, desc="validate", unit="prompt", disable=not progress)
    ]
    t4 = time.perf_counter()
    train_masses = [s.base_mass for s in train]
    with torch.no_grad():
        train_trained = [head_mass(scorer, head, s.tap, s.example).numpy() for s in train]
    return {
        "out": str(out),
        "bytes": out.stat().st_size,
        "schema": identity.schema,
        "feature_tap": identity.feature_tap,
        "layer": scorer.profile.head_layer,
        "best_epoch": min(history, key=lambda h: h["val"])["epoch"],
        "init_parity_max_abs": parity,
        "history": history,
        "validation": {
            "untrained": grouped_metrics(val, [s.base_mass for s in val], opts),
            "trained": grouped_metrics(val, trained_mass, opts),
        },
        "train_set": {
            "untrained": grouped_metrics(train, train_masses, opts)["all"],
            "trained": grouped_metrics(train, train_trained, opts)["all"],
        },
        "prompts": {"train": len(train), "val": len(val)},
        "tokens": {
            "train": sum(len(s.example.ids) for s in train),
            "val": sum(len(s.example.ids) for s in val),
        },
        "prompts_s": round(t1 - t0, 1),
        "features_s": round(t2 - t1, 1),
        "train_s": round(t3 - t2, 1),
        "validate_s": round(t4 - t3, 1),
        "options": asdict(opts),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainOptions()
    p.add_argument("--drafter", default=d.drafter, help="drafter source the head binds to")
    p.add_argument("--out", required=True, help="scoring head GGUF to write")
    p.add_argument(
        "--layer",
        type=int,
        default=None,
        help="scoring layer (default: the drafter profile's; serving then needs drafter_head_layer)",
    )
    p.add_argument(
        "--families",
        nargs="+",
        choices=HEAD_FAMILIES,
        default=list(d.families),
        help="families trained on (paraphrase_pairs: paraphrase-style pairs over the "
        "trainer's own wordings, never the bench's)",
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
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads (determinism)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def _line(name: str, m: dict) -> str:
    return (
        f"{m['all_top']:3d}/{m['prompts']:<3d} all evidence in top, items {m['items_top']:3d}/{m['items']:<3d}"
        f" mean rank {m['mean_rank']:6.2f} ({m['mean_rank_fraction']:.3f})"
    )


def run_train(args: argparse.Namespace) -> int:
    opts = options_from_args(TrainOptions, args)
    report = train_to_file(opts, Path(args.out))
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(
        f"wrote {report['out']} ({report['bytes']} bytes, {report['schema']}, {report['feature_tap']})"
    )
    if args.layer is not None:
        print(f"serving needs drafter_head_layer: {report['layer']}")
    print(
        f"best epoch {report['best_epoch']}; init parity max |dmass| {report['init_parity_max_abs']:.2e}"
    )
    for h in report["history"]:
        print(
            f"  epoch {h['epoch']}: train {h['train']} val {h['val']} top {h['val_all_top']} rank {h['val_mean_rank']}"
        )
    print(
        f"validation, end to end (top {TrainOptions().top_fraction:.0%} of {opts.chunk}-token chunks):"
    )
    for name in report["validation"]["untrained"]:
        print(f"  {name:28s} untrained {_line(name, report['validation']['untrained'][name])}")
        print(f"  {'':28s} trained   {_line(name, report['validation']['trained'][name])}")
    ts = report["train_set"]
    print(f"  {'train set':28s} untrained {_line('train', ts['untrained'])}")
    print(f"  {'':28s} trained   {_line('train', ts['trained'])}")
    print(
        f"prompts {report['prompts_s']} s, features {report['features_s']} s, "
        f"training {report['train_s']} s, validation {report['validate_s']} s"
    )
    return 0
