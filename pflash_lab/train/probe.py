"""Train the segment probe on the drafter's tap: `pflash probe train --drafter SRC --out FILE`.

Stages, top-down:

1. `documents` (pflash_lab/train/probe_corpus.py): labelled real text, whole files held out.
2. `token_labels`: character boundaries -> drafter-token labels, inside the drafter's chat
   prefix (the tap of a context token depends on what precedes it, and in serving that is
   the chat template's system and user header).
3. `extract_features`: the drafter's tap for every token, through the scorer contract
   (`ScoreRequest.want_tap`), so training reads exactly what serving will. This is the
   cost (the drafter runs up to its scoring layer); features are cached on disk.
4. `train_probe`: whole documents per batch, logits masked to the document, binary
   cross-entropy on the smoothed unit and sub-unit logits; the epoch with the lowest
   validation loss wins.
5. `choose_cut_params`: on the held-out files, the (min_segment, threshold) whose cuts
   reach the target boundary precision with the highest recall.
6. write the GGUF (§7.2), bound to the drafter file by sha256.

Deterministic: the corpus, batch order and initial weights come from `seed`, torch runs
single-threaded by default with deterministic algorithms, so the same drafter file and
stdlib give the same probe file.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from pflash.compress.plan.segments import ProbeParams, probe_cuts
from pflash_lab.train.options import options_from_args
from pflash_lab.train.probe_corpus import LabelledText, documents

log = logging.getLogger(__name__)

SENTINEL = "\x00PFLASH_DOCUMENT\x00"


@dataclass(frozen=True)
class TrainOptions:
    """Everything that determines the trained file (the defaults made the committed one)."""

    drafter: str = "embedded:smollm2-135m"
    layer: int | None = None  # the tap the probe reads: this scoring layer's input (None = profile)
    seed: int = 0
    train_docs: int = 120
    val_docs: int = 24
    doc_chars: int = 5_000
    width: int = 256
    taps: int = 5
    epochs: int = 24
    lr: float = 2e-3
    weight_decay: float = 1e-4
    batch_docs: int = 4
    pos_weight: float = 2.0
    subunit_weight: float = 0.5
    target_precision: float = 0.95
    min_segments: tuple[int, ...] = (1, 2, 4, 8, 12, 16)
    max_segment: int = 512
    threads: int = 1


# ---------------------------------------------------------------------------- labels


def chat_prefix(tokenizer) -> str:
    """The text a user message's content follows in the drafter's chat template ("" without
    one): the context tokens' tap is computed after it, as in serving."""
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": SENTINEL}], tokenize=False
        )
    except Exception:
        return ""
    return text.split(SENTINEL, 1)[0] if SENTINEL in text else ""


@dataclass(frozen=True)
class TokenLabels:
    """One document in drafter tokens: ids [S] (chat prefix + document), unit/subunit
    labels bool [S], `begin`: the first document token (earlier ones are the prefix)."""

    ids: tuple[int, ...]
    unit: np.ndarray
    subunit: np.ndarray
    begin: int


def token_labels(tokenizer, doc: LabelledText, prefix: str = "") -> TokenLabels:
    """Label the token holding each boundary character (the first non-blank character of
    the unit), so the newline and indentation before it stay in the previous segment."""
    enc = tokenizer(prefix + doc.text, return_offsets_mapping=True, add_special_tokens=False)
    ids = tuple(enc["input_ids"])
    ends = np.asarray([e for _, e in enc["offset_mapping"]], dtype=np.int64)  # [S]
    starts = np.asarray([s for s, _ in enc["offset_mapping"]], dtype=np.int64)
    begin = int(np.searchsorted(starts, len(prefix), side="left"))

    def mark(chars: Sequence[int]) -> np.ndarray:
        out = np.zeros(len(ids), dtype=bool)
        t = np.searchsorted(ends, np.asarray(chars, dtype=np.int64) + len(prefix), side="right")
        out[t[t < len(ids)]] = True
        return out

    return TokenLabels(ids, mark(doc.units), mark(doc.subunits), begin)


# ---------------------------------------------------------------------------- features


@dataclass(frozen=True, eq=False)
class Features:
    """One split, flat over documents.

    - `x`: float32 [N, n_embd], the tap of every token (chat prefix included);
    - `unit`, `subunit`: bool [N] labels; `mask`: bool [N], document tokens (loss and
      evaluation run on these only);
    - `offsets`: int64 [D+1], document d is rows [offsets[d], offsets[d+1]).
    """

    x: np.ndarray
    unit: np.ndarray
    subunit: np.ndarray
    mask: np.ndarray
    offsets: np.ndarray
    kinds: tuple[str, ...]

    def doc(self, d: int) -> slice:
        return slice(int(self.offsets[d]), int(self.offsets[d + 1]))

    @property
    def n_docs(self) -> int:
        return len(self.offsets) - 1


def tap_of(scorer, ids: Sequence[int]) -> np.ndarray:
    """The drafter's tap float32 [S, n_embd] for `ids`, through the scorer contract (the
    query is the last token; its mass is computed and ignored)."""
    from pflash.compress.plan.query import QueryWindow
    from pflash.compress.scoring import ScoreRequest
    from pflash.spans import Span

    s = len(ids)
    query = Span(s - 1, s)
    result = scorer(
        ScoreRequest(
            ids=tuple(ids),
            windows=(QueryWindow(query, 1.0, "main"),),
            query=query,
            want_tap=True,
        )
    )
    return np.asarray(result.tap, dtype=np.float32)


def extract_taps(scorer, labelled: Sequence[TokenLabels], *, desc: str = "tap") -> np.ndarray:
    """Run the drafter over every document; the taps one after the other, float32 [N, n_embd]."""
    from tqdm import tqdm

    out = []
    with tqdm(total=sum(len(t.ids) for t in labelled), desc=desc, unit="tok") as bar:
        for t in labelled:
            out.append(tap_of(scorer, t.ids))
            bar.update(len(t.ids))
    return np.concatenate(out)


def assemble_features(x: np.ndarray, labelled: Sequence[TokenLabels], kinds) -> Features:
    offsets = np.cumsum([0] + [len(t.ids) for t in labelled]).astype(np.int64)
    mask = np.zeros(int(offsets[-1]), dtype=bool)
    for t, o in zip(labelled, offsets[:-1].tolist(), strict=True):
        mask[o + t.begin : o + len(t.ids)] = True
    return Features(
        x,
        np.concatenate([t.unit for t in labelled]),
        np.concatenate([t.subunit for t in labelled]),
        mask,
        offsets,
        tuple(kinds),
    )


def split_features(
    opts: TrainOptions, split: str, scorer_factory, tokenizer, tap_key: str, cache: Path
) -> Features:
    """A split's labelled documents with the drafter's tap. The tap is cached under a key
    of the drafter file, the tap (scoring layer) and the exact token ids, so relabelling
    never reruns the drafter."""
    n = opts.train_docs if split == "train" else opts.val_docs
    docs = list(documents(split, n, seed=opts.seed, chars=opts.doc_chars))
    prefix = chat_prefix(tokenizer)
    labelled = [token_labels(tokenizer, d, prefix) for d in docs]
    h = hashlib.sha256(tap_key.encode())
    for t in labelled:
        h.update(np.asarray(t.ids, dtype=np.int64).tobytes() + b"|")
    path = cache / f"probe_tap_{split}_{h.hexdigest()[:16]}.npy"
    if path.is_file():
        log.info("tap %s from %s", split, path)
        x = np.load(path)
    else:
        x = extract_taps(scorer_factory(), labelled, desc=f"tap {split}")
        cache.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.npy")
        np.save(tmp, x)
        tmp.replace(path)
    return assemble_features(x, labelled, [d.kind for d in docs])


# ---------------------------------------------------------------------------- training


def _batch(feats: Features, docs: Sequence[int]):
    """Documents padded to the longest: x [B, L, n_embd], unit/subunit/mask/valid [B, L]."""
    import torch

    length = max(feats.offsets[d + 1] - feats.offsets[d] for d in docs)
    b = len(docs)
    x = torch.zeros(b, length, feats.x.shape[1])
    unit = torch.zeros(b, length)
    sub = torch.zeros(b, length)
    mask = torch.zeros(b, length, dtype=torch.bool)
    valid = torch.zeros(b, length)
    for i, d in enumerate(docs):
        sl = feats.doc(d)
        n = sl.stop - sl.start
        x[i, :n] = torch.from_numpy(feats.x[sl])
        unit[i, :n] = torch.from_numpy(feats.unit[sl].astype(np.float32))
        sub[i, :n] = torch.from_numpy(feats.subunit[sl].astype(np.float32))
        mask[i, :n] = torch.from_numpy(feats.mask[sl])
        valid[i, :n] = 1.0
    return x, unit, sub, mask, valid


def _logits(net, x, valid):
    """Smoothed logits over padded documents: raw logits are zeroed past each document's
    end before the conv, which is exactly the per-document zero padding of serving."""
    unit, sub = net.raw_logits(x)  # [B, L]
    unit = net.smooth(unit * valid, net.conv)
    sub = net.smooth(sub * valid, net.subunit_conv) if sub is not None else None
    return unit, sub


def _loss(net, batch, opts: TrainOptions):
    import torch
    import torch.nn.functional as F

    x, unit, sub, mask, valid = batch
    lu, ls = _logits(net, x, valid)
    pw = torch.tensor(opts.pos_weight)
    loss = F.binary_cross_entropy_with_logits(lu[mask], unit[mask], pos_weight=pw)
    if ls is not None:
        loss = loss + opts.subunit_weight * F.binary_cross_entropy_with_logits(
            ls[mask], sub[mask], pos_weight=pw
        )
    return loss


def train_probe(train: Features, val: Features, opts: TrainOptions, *, progress: bool = True):
    """Fit a `ProbeNet` on `train`; returns (the net of the best validation epoch, history)."""
    import torch
    from tqdm import tqdm

    from pflash.models.probe import ProbeNet

    torch.manual_seed(opts.seed)
    net = ProbeNet(train.x.shape[1], opts.width, opts.taps, subunit=True)
    optim = torch.optim.AdamW(net.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    steps = opts.epochs * -(-train.n_docs // opts.batch_docs)
    sched = torch.optim.lr_scheduler.OneCycleLR(optim, max_lr=opts.lr, total_steps=steps)
    rng = np.random.default_rng(opts.seed)
    val_batches = [
        _batch(val, range(i, min(i + opts.batch_docs, val.n_docs)))
        for i in range(0, val.n_docs, opts.batch_docs)
    ]
    best, best_loss, history = None, float("inf"), []
    bar = tqdm(range(opts.epochs), desc="train probe", unit="epoch", disable=not progress)
    for epoch in bar:
        net.train()
        order = rng.permutation(train.n_docs)
        total = 0.0
        for i in range(0, len(order), opts.batch_docs):
            loss = _loss(net, _batch(train, order[i : i + opts.batch_docs].tolist()), opts)
            optim.zero_grad()
            loss.backward()
            optim.step()
            sched.step()
            total += float(loss.detach())
        net.eval()
        with torch.no_grad():
            vloss = sum(float(_loss(net, b, opts)) for b in val_batches) / len(val_batches)
        steps_per_epoch = -(-train.n_docs // opts.batch_docs)
        history.append({"epoch": epoch, "train": total / steps_per_epoch, "val": vloss})
        bar.set_postfix(train=f"{total / steps_per_epoch:.4f}", val=f"{vloss:.4f}")
        if vloss < best_loss:
            best, best_loss = copy.deepcopy(net.state_dict()), vloss
    net.load_state_dict(best)
    return net.eval(), history


# ---------------------------------------------------------------------------- evaluation


def probabilities(net, feats: Features) -> tuple[np.ndarray, np.ndarray]:
    """Unit and sub-unit probabilities float32 [N], per document (conv padded at its ends)."""
    import torch

    unit = np.zeros(len(feats.x), dtype=np.float32)
    sub = np.zeros(len(feats.x), dtype=np.float32)
    with torch.inference_mode():
        for d in range(feats.n_docs):
            sl = feats.doc(d)
            u, s = net.probabilities(torch.from_numpy(feats.x[sl]))
            unit[sl] = u.numpy()
            sub[sl] = s.numpy() if s is not None else 0.0
    return unit, sub


@dataclass(frozen=True)
class BoundaryScore:
    """Cut-level boundary quality: a predicted cut is right when it is a labelled unit
    start (same token). Counts over document tokens only."""

    true_positive: int
    predicted: int
    actual: int

    @property
    def precision(self) -> float:
        return self.true_positive / self.predicted if self.predicted else 1.0

    @property
    def recall(self) -> float:
        return self.true_positive / self.actual if self.actual else 1.0

    def __add__(self, other: BoundaryScore) -> BoundaryScore:
        return BoundaryScore(
            self.true_positive + other.true_positive,
            self.predicted + other.predicted,
            self.actual + other.actual,
        )


def score_cuts(
    boundary: np.ndarray, unit: np.ndarray, mask: np.ndarray, params: ProbeParams
) -> BoundaryScore:
    """Cuts the probe makes on one document (§4.7 step 4, no forced cuts) vs its labels.
    Only positions in `mask` count; the first document token is a boundary by construction
    (the prompt's start) and is not scored."""
    b = np.where(mask, boundary, 0.0)
    first = int(np.argmax(mask))
    cuts = probe_cuts(b, params)[1:-1]
    cuts = cuts[cuts > first]
    truth = np.flatnonzero(unit & mask)
    truth = truth[truth > first]
    tp = int(np.isin(cuts, truth).sum())
    return BoundaryScore(tp, int(cuts.size), int(truth.size))


def evaluate(prob: np.ndarray, feats: Features, params: ProbeParams, kinds=None) -> BoundaryScore:
    total = BoundaryScore(0, 0, 0)
    for d in range(feats.n_docs):
        if kinds is not None and feats.kinds[d] not in kinds:
            continue
        sl = feats.doc(d)
        total = total + score_cuts(prob[sl], feats.unit[sl], feats.mask[sl], params)
    return total


def choose_cut_params(
    prob: np.ndarray, val: Features, opts: TrainOptions
) -> tuple[ProbeParams, list[dict]]:
    """The (min_segment, threshold) with the highest validation recall among those whose
    precision reaches `opts.target_precision` (else the best F0.5), and the full table."""
    grid = np.round(np.concatenate([np.arange(0.05, 0.95, 0.05), np.arange(0.95, 0.995, 0.01)]), 3)
    table = []
    for mn in opts.min_segments:
        for t in grid.tolist():
            s = evaluate(prob, val, ProbeParams(float(t), mn, opts.max_segment))
            p, r = s.precision, s.recall
            f05 = 1.25 * p * r / (0.25 * p + r) if p + r else 0.0
            table.append(
                {"min_segment": mn, "threshold": t, "precision": p, "recall": r, "f05": f05}
            )
    ok = [row for row in table if row["precision"] >= opts.target_precision]
    pick = (
        max(ok, key=lambda r: (r["recall"], r["precision"]))
        if ok
        else max(table, key=lambda r: r["f05"])
    )
    return ProbeParams(pick["threshold"], pick["min_segment"], opts.max_segment), table


# ---------------------------------------------------------------------------- the command


def train_to_file(opts: TrainOptions, out: Path, cache: Path | None = None) -> dict:
    """Extract (or reuse) features, train, choose the cut parameters, write `out`.
    Returns the report (validation numbers, timings) that is also printed."""
    import torch

    from pflash.config import UNTUNED_SCORING, build_config
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.loading import load_causal_lm
    from pflash.models.probe import ProbeFile, scorer_probe_identity, write_probe_gguf
    from pflash.models.source import cache_dir, load_tokenizer

    torch.set_num_threads(opts.threads)
    torch.use_deterministic_algorithms(True)
    t0 = time.perf_counter()
    config = build_config(
        {**UNTUNED_SCORING, "drafter": opts.drafter, "drafter_head_layer": opts.layer}, env={}
    )
    scorer = DrafterScorer(config, load_causal_lm(opts.drafter))
    identity = scorer_probe_identity(scorer)
    tap_key = f"{identity.runtime_gguf_sha256}:{identity.feature_tap}"  # cached taps per layer
    tokenizer = load_tokenizer(opts.drafter)
    cache = cache or cache_dir() / "probe_features"
    feats = {
        split: split_features(opts, split, lambda: scorer, tokenizer, tap_key, cache)
        for split in ("train", "val")
    }
    t1 = time.perf_counter()
    net, history = train_probe(feats["train"], feats["val"], opts)
    t2 = time.perf_counter()
    unit, _ = probabilities(net, feats["val"])
    params, table = choose_cut_params(unit, feats["val"], opts)
    probe = ProbeFile(
        schema=identity.schema(subunit=True),
        base_model=identity.base_model,
        runtime_gguf_sha256=identity.runtime_gguf_sha256,
        feature_tap=identity.feature_tap,
        threshold=params.threshold,
        norm_eps=float(net.norm.eps),
        min_segment=params.min_segment,
        max_segment=params.max_segment,
        conv_taps=opts.taps,
        tensors=net.tensors(),
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    write_probe_gguf(out, probe)
    by_kind = {
        kind: asdict(evaluate(unit, feats["val"], params, kinds={kind}))
        for kind in sorted(set(feats["val"].kinds))
    }
    overall = evaluate(unit, feats["val"], params)
    return {
        "out": str(out),
        "bytes": out.stat().st_size,
        "schema": probe.schema,
        "threshold": params.threshold,
        "min_segment": params.min_segment,
        "max_segment": params.max_segment,
        "val_precision": round(overall.precision, 4),
        "val_recall": round(overall.recall, 4),
        "val_by_kind": by_kind,
        "tokens": {s: int(f.mask.sum()) for s, f in feats.items()},
        "features_s": round(t1 - t0, 1),
        "train_s": round(t2 - t1, 1),
        "best_epoch": min(history, key=lambda h: h["val"])["epoch"],
        "options": asdict(opts),
        "table": [r for r in table if r["min_segment"] == params.min_segment],
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    d = TrainOptions()
    p.add_argument("--drafter", default=d.drafter, help="drafter source the probe binds to")
    p.add_argument("--out", required=True, help="probe GGUF to write")
    p.add_argument(
        "--layer",
        type=int,
        default=None,
        help="scoring layer whose input the probe reads (default: the drafter profile's; "
        "serving then needs the same drafter_head_layer)",
    )
    p.add_argument("--cache", default=None, help="feature cache directory (default: pflash cache)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--train-docs", type=int, default=d.train_docs)
    p.add_argument("--val-docs", type=int, default=d.val_docs)
    p.add_argument("--epochs", type=int, default=d.epochs)
    p.add_argument("--width", type=int, default=d.width, help="fc1 width")
    p.add_argument("--max-segment", type=int, default=d.max_segment)
    p.add_argument("--target-precision", type=float, default=d.target_precision)
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads (determinism)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def run_train(args: argparse.Namespace) -> int:
    opts = options_from_args(TrainOptions, args)
    report = train_to_file(opts, Path(args.out), Path(args.cache) if args.cache else None)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    print(f"wrote {report['out']} ({report['bytes']} bytes, {report['schema']})")
    print(
        f"threshold {report['threshold']}, min_segment {report['min_segment']}, "
        f"max_segment {report['max_segment']}"
    )
    print(
        f"held-out boundary precision {report['val_precision']:.3f}, "
        f"recall {report['val_recall']:.3f} over {report['tokens']['val']} tokens"
    )
    for kind, s in report["val_by_kind"].items():
        p = s["true_positive"] / max(1, s["predicted"])
        r = s["true_positive"] / max(1, s["actual"])
        print(f"  {kind:6s} precision {p:.3f} recall {r:.3f} ({s['actual']} boundaries)")
    print(f"features {report['features_s']} s, training {report['train_s']} s")
    return 0
