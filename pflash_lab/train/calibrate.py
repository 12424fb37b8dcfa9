"""`pflash calibrate`: the head scorer's layer and per-head weights, measured on needle prompts.

Why: the generic profile's scoring layer (57% of depth) and the plain mean over query heads
(§3.3 step 6) are guesses that happen to work for SmolLM2. This command measures, for every
attention layer ℓ and query head h of a drafter, how well that head alone finds the evidence
of generated needle prompts, then writes a calibration file (`pflash.models.drafter.calibration`)
that the scorer loads with `drafter_calibration`.

Stages, top-down:

1. `needle_case`: a ChatML needle prompt over real text from one source (`stdlib`
   docstrings or `licenses`), one of `FAMILIES`; the asked needle's tokens are the evidence.
2. `chunk_masses`: one full forward (`layer_inputs` below: pre-hooks
   capture every layer's input hidden states; no `output_attentions`), then per layer the scorer's own math (`head_keys`,
   `head_queries`, `window_head_masses`, `mix_window_masses`): per-head mass summed over
   the context's 64-token chunks, [layers, H, chunks]. Everything later is offline.
3. `head_table`: per (layer, head) over the prompts: the share of prompts whose evidence
   chunk ranks in the top 10% of context chunks (`top10`), and the mean reciprocal rank
   of that chunk (`mrr`).
4. `head_weights_for`: w_h ∝ max(0, mrr_h − mrr_random), normalised to sum 1; a head no
   better than a random ranking gets 0 (it only adds noise to the mean).
5. `choose_layer`: each layer scored with its own weighted mass on the calibration prompts;
   the best is the highest (top10, mrr); the chosen layer is the EARLIEST (cheapest: the
   scorer runs layers 0..ℓ-1) whose top10 is within one prompt of the best and whose mrr
   is within `MRR_TIE` of the best.
6. `validate`: held-out prompts (other seeds, the other text source) scored with the plain
   mean at the profile default layer and with the calibrated layer and weights.

Token indices are drafter tokens; spans are half-open.
"""

from __future__ import annotations

import argparse
import random
import time
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pflash.compress.plan.query import QueryWindow
from pflash.spans import Span
from pflash_lab.corpus.cases import (
    INSTRUCTION,
    LICENSE_DIR,
    LICENSE_FILES,
    _paragraphs,
    corpus_paragraphs,
    insert_at_depths,
    needle,
    random_key,
    random_value,
)
from pflash_lab.corpus.needles import (
    NEEDLES,
    SYSTEM,
    NeedlePrompt,
    encode_with_positions,
)

FAMILIES = ("single_needle", "multi_key", "fact")
CALIBRATION_SOURCE = "stdlib"
VALIDATION_SOURCE = "licenses"
VALIDATION_SEED_OFFSET = 100_000
CHUNK = 64
TOP_FRACTION = 0.10
MRR_TIE = 0.02
TURN_QUERY_TOKENS = 8


# --------------------------------------------------------------------------- 1. prompts


@lru_cache(maxsize=2)
def source_paragraphs(source: str) -> tuple[str, ...]:
    """The corpus of `pflash_lab.corpus.cases` split by source: `licenses` (the license
    files) or `stdlib` (standard-library docstrings), so validation text is unseen text."""
    licenses = []
    for name in LICENSE_FILES:
        path = LICENSE_DIR / name
        if path.is_file():
            licenses.extend(_paragraphs(path.read_text(encoding="utf-8", errors="replace")))
    if source == "licenses":
        return tuple(licenses)
    if source == "stdlib":
        return corpus_paragraphs()[len(licenses) :]
    raise ValueError(f"unknown text source {source!r}: licenses or stdlib")


def needle_case(tokenizer, family: str, seed: int, n_tokens: int, source: str) -> NeedlePrompt:
    """About `n_tokens` drafter tokens of ChatML prompt: a seeded run of `source` paragraphs
    with the family's needles inserted, then the question. Windows as the chat default
    (`needle_prompt`): the last prompt token (main) and the question's last 8 tokens (turn).

    - `single_needle`: one "special magic number" needle; `multi_key`: the asked needle and
      three distractor needles with other keys; `fact`: a natural sentence (`NEEDLES`).
    """
    rng = random.Random(seed)
    if family == "fact":
        fact, question = NEEDLES[rng.randrange(len(NEEDLES))]
        texts = [fact]
    elif family in ("single_needle", "multi_key"):
        keys: set[str] = set()
        values: set[str] = set()
        pairs = [
            (random_key(rng, keys), random_value(rng, values))
            for _ in range(1 if family == "single_needle" else 4)
        ]
        texts = [needle(k, v) for k, v in pairs]
        question = f"What is the special magic {pairs[0][0]} number?"
    else:
        raise ValueError(f"unknown family {family!r}: {', '.join(FAMILIES)}")

    def count(text: str) -> int:
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])

    head = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{INSTRUCTION}\n\n"
    tail_q = f"\n\nQuestion: {question}"
    tail = f"{tail_q}<|im_end|>\n<|im_start|>assistant\n"
    budget = n_tokens - count(head + tail) - sum(count(t) + 2 for t in texts)
    pool = source_paragraphs(source)
    i, hay, used = rng.randrange(len(pool)), [], 0
    while used < budget:
        p = pool[i % len(pool)]
        used += count(p) + 2
        hay.append(p)
        i += 1
    body = "\n\n".join(insert_at_depths(hay, [(rng.random(), t) for t in texts]))
    text = head + body + tail
    ids, token_at = encode_with_positions(tokenizer, text)

    fb = body.index(texts[0]) + len(head)
    q_end = token_at(len(head) + len(body) + len(tail_q))
    query = Span(len(ids) - 1, len(ids))
    return NeedlePrompt(
        ids=ids,
        query=query,
        windows=(
            QueryWindow(query, 1.0, "main"),
            QueryWindow(Span(q_end - TURN_QUERY_TOKENS, q_end), 1.0, "turn"),
        ),
        context=Span(token_at(len(head)), token_at(len(head) + len(body))),
        needle=Span(token_at(fb), token_at(fb + len(texts[0]))),
    )


def prompt_set(
    tokenizer, n: int, seed: int, lengths: tuple[int, ...], source: str
) -> list[tuple[dict, NeedlePrompt]]:
    """n prompts cycling `FAMILIES` and `lengths`, seeds seed, seed+1, ... ."""
    out = []
    for i in range(n):
        spec = {
            "family": FAMILIES[i % len(FAMILIES)],
            "seed": seed + i,
            "length": lengths[i % len(lengths)],
            "source": source,
        }
        p = needle_case(tokenizer, spec["family"], spec["seed"], spec["length"], source)
        out.append((spec | {"tokens": len(p.ids)}, p))
    return out


# --------------------------------------------------------------------------- 2. per-head chunk masses


def context_chunks(prompt: NeedlePrompt, chunk: int = CHUNK) -> list[tuple[int, int]]:
    """The fixed chunks of the context, [begin, end) drafter tokens (as `needle_rank`)."""
    c = prompt.context
    return [(b, min(b + chunk, c.end)) for b in range(c.begin, c.end, chunk)]


def chunk_masses(scorer, prompt: NeedlePrompt, layers: tuple[int, ...]) -> np.ndarray:
    """Per-head mass summed over each context chunk, [len(layers), H, chunks] float64.

    The scorer's math at each layer: keys from the layer's input_layernorm/k_proj/k_norm,
    queries from the windows' rows, softmax per (head, row) over the visible keys, mean
    over rows, windows mixed by weight; only the mean over heads is left out.
    """
    import torch

    from pflash.models.drafter.attention import (
        head_keys,
        head_queries,
        mix_window_masses,
        visible_keys,
        window_head_masses,
    )

    decoder_layers = scorer.model.model.layers
    inputs = layer_inputs(scorer.model, prompt.ids)  # {layer: [S, hidden]}, one full forward
    bounds = context_chunks(prompt)
    out = np.zeros((len(layers), scorer.n_head, len(bounds)))
    with torch.inference_mode():
        for li, layer_index in enumerate(layers):
            layer, x = decoder_layers[layer_index], inputs[layer_index]
            keys = head_keys(layer, x, n_kv=scorer.n_kv)
            masses, weights = [], []
            for w in prompt.windows:
                q = head_queries(
                    layer,
                    x[w.span.begin : w.span.end],
                    n_head=scorer.n_head,
                    gated=scorer.profile.gated_q,
                )
                visible = visible_keys(len(prompt.ids), prompt.query, w, suffix_candidates=False)
                scale = float(getattr(layer.self_attn, "scaling", q.shape[-1] ** -0.5))
                masses.append(window_head_masses(q, keys, visible, scale))
                weights.append(w.weight)
            mass = mix_window_masses(masses, weights).double().numpy()  # [H, S]
            csum = np.concatenate([np.zeros((mass.shape[0], 1)), np.cumsum(mass, axis=1)], axis=1)
            out[li] = np.stack([csum[:, e] - csum[:, b] for b, e in bounds], axis=1)
    return out


# --------------------------------------------------------------------------- 3-5. tables and choices


@dataclass(frozen=True)
class Measured:
    """Chunk masses of one prompt: [layers, H, chunks] and which chunks hold evidence."""

    sums: np.ndarray
    evidence: np.ndarray  # bool [chunks]


def measure(scorer, prompts: list[NeedlePrompt], layers: tuple[int, ...]) -> list[Measured]:
    out = []
    for p in prompts:
        bounds = context_chunks(p)
        evidence = np.array([b < p.needle.end and p.needle.begin < e for b, e in bounds])
        out.append(Measured(chunk_masses(scorer, p, layers), evidence))
    return out


def evidence_rank(sums: np.ndarray, evidence: np.ndarray) -> np.ndarray:
    """1-based rank of the best evidence chunk, by chunk mass over the last axis [..., C];
    ties go to the earlier chunk (a stable sort, as `needle_rank`)."""
    c = sums.shape[-1]
    order = np.argsort(-sums, axis=-1, kind="stable")
    ranks = np.empty_like(order)
    np.put_along_axis(ranks, order, np.arange(1, c + 1), axis=-1)
    return np.where(evidence, ranks, c + 1).min(axis=-1)


def top_rank(chunks: int) -> int:
    """The largest rank that counts as "in the top 10% of context chunks" (at least 1)."""
    return max(1, int(TOP_FRACTION * chunks))


def scores(ranks: np.ndarray, chunks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(top10 share, mrr) over the prompt axis 0 of `ranks` [P, ...]; chunks [P]."""
    limit = np.array([top_rank(int(c)) for c in chunks]).reshape((-1,) + (1,) * (ranks.ndim - 1))
    return (ranks <= limit).mean(axis=0), (1.0 / ranks).mean(axis=0)


def random_mrr(chunks: np.ndarray) -> float:
    """The mrr a random ranking gets: mean over prompts of H(C)/C."""
    return float(np.mean([np.sum(1.0 / np.arange(1, c + 1)) / c for c in chunks]))


def head_table(measured: list[Measured]) -> tuple[np.ndarray, np.ndarray]:
    """Per (layer, head): (top10 share, mrr) over the prompts, each [layers, H]."""
    ranks = np.stack([evidence_rank(m.sums, m.evidence) for m in measured])  # [P, L, H]
    return scores(ranks, np.array([m.evidence.size for m in measured]))


def head_weights_for(mrr: np.ndarray, baseline: float) -> np.ndarray:
    """w_h ∝ max(0, mrr_h − baseline) over one layer's heads, summing to 1; uniform if no
    head beats the baseline (then the layer is no better than the plain mean)."""
    gain = np.clip(mrr - baseline, 0.0, None)
    if gain.sum() <= 0:
        return np.full(mrr.shape, 1.0 / mrr.size)
    return gain / gain.sum()


def mixed_scores(
    measured: list[Measured], layer: int, weights: np.ndarray
) -> tuple[float, float, float]:
    """(top10 share, mrr, median rank fraction) of the `weights`-mixed mass at layer index
    `layer` (an index into the measured layers)."""
    ranks = np.array([evidence_rank(weights @ m.sums[layer], m.evidence) for m in measured])
    chunks = np.array([m.evidence.size for m in measured])
    top, mrr = scores(ranks, chunks)
    return float(top), float(mrr), float(np.median(ranks / chunks))


def choose_layer(per_layer: list[dict], n_prompts: int) -> int:
    """The earliest layer within one prompt of the best top10 share and within `MRR_TIE`
    of the best mrr, where best = max (weighted_top10, weighted_mrr)."""
    best = max(per_layer, key=lambda r: (r["weighted_top10"], r["weighted_mrr"]))
    for r in sorted(per_layer, key=lambda r: r["layer"]):
        if (
            r["weighted_top10"] >= best["weighted_top10"] - 1.0 / n_prompts - 1e-9
            and r["weighted_mrr"] >= best["weighted_mrr"] - MRR_TIE
        ):
            return r["layer"]
    return best["layer"]


# --------------------------------------------------------------------------- the command


def attention_layers(model) -> tuple[int, ...]:
    text = model.config.get_text_config()
    n = text.num_hidden_layers
    types = list(getattr(text, "layer_types", None) or ["full_attention"] * n)
    return tuple(i for i in range(n) if types[i] != "linear_attention")


def calibrate(
    drafter: str,
    *,
    prompts: int = 24,
    validation_prompts: int = 12,
    seed: int = 0,
    lengths: tuple[int, ...] = (1024, 2048),
    log=print,
) -> dict:
    """Measure, choose and validate; return the calibration payload (see calibration.py)."""
    from pflash.config import UNTUNED_SCORING, build_config
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.drafter.scoring_head import drafter_sha256
    from pflash.models.source import load_tokenizer

    scorer = DrafterScorer(
        build_config({**UNTUNED_SCORING, "drafter": drafter, "drafter_sessions": 0}, env={})
    )
    tokenizer = load_tokenizer(drafter)
    layers = attention_layers(scorer.model)
    default_layer = scorer.profile.head_layer
    t0 = time.perf_counter()
    cal = prompt_set(tokenizer, prompts, seed, lengths, CALIBRATION_SOURCE)
    measured = measure(scorer, [p for _, p in cal], layers)
    log(f"# measured {prompts} calibration prompts in {time.perf_counter() - t0:.0f} s")
    top10, mrr = head_table(measured)  # [L, H]
    chunks = np.array([m.evidence.size for m in measured])
    baseline = random_mrr(chunks)
    uniform = np.full(scorer.n_head, 1.0 / scorer.n_head)
    per_layer, weights_at = [], {}
    for li, layer in enumerate(layers):
        w = head_weights_for(mrr[li], baseline)
        weights_at[layer] = w
        mean_top, mean_mrr, _ = mixed_scores(measured, li, uniform)
        w_top, w_mrr, _ = mixed_scores(measured, li, w)
        per_layer.append(
            {
                "layer": layer,
                "mean_top10": round(mean_top, 4),
                "mean_mrr": round(mean_mrr, 4),
                "weighted_top10": round(w_top, 4),
                "weighted_mrr": round(w_mrr, 4),
                "head_top10": [round(float(v), 4) for v in top10[li]],
                "head_mrr": [round(float(v), 4) for v in mrr[li]],
                "head_weights": [round(float(v), 6) for v in w],
            }
        )
    chosen = choose_layer(per_layer, prompts)
    weights = weights_at[chosen]
    log("layer  mean_top10  mean_mrr  weighted_top10  weighted_mrr")
    for r in per_layer:
        mark = " <- chosen" if r["layer"] == chosen else ""
        mark += " (profile default)" if r["layer"] == default_layer else ""
        log(
            f"{r['layer']:5d}  {r['mean_top10']:10.3f}  {r['mean_mrr']:8.3f}  "
            f"{r['weighted_top10']:14.3f}  {r['weighted_mrr']:12.3f}{mark}"
        )
    t0 = time.perf_counter()
    val = prompt_set(
        tokenizer, validation_prompts, seed + VALIDATION_SEED_OFFSET, lengths, VALIDATION_SOURCE
    )
    val_layers = tuple(sorted({default_layer, chosen}))
    val_measured = measure(scorer, [p for _, p in val], val_layers)
    log(f"# measured {validation_prompts} validation prompts in {time.perf_counter() - t0:.0f} s")
    rows = [
        ("plain mean, profile default layer", default_layer, uniform),
        ("plain mean, calibrated layer", chosen, uniform),
        ("calibrated weights, calibrated layer", chosen, weights),
    ]
    validation = []
    for name, layer, w in rows:
        top, m, median = mixed_scores(val_measured, val_layers.index(layer), w)
        validation.append(
            {
                "scorer": name,
                "layer": layer,
                "top10": round(top, 4),
                "mrr": round(m, 4),
                "median_rank_fraction": round(median, 4),
            }
        )
    log("validation (held-out seeds, license text):")
    log("scorer                                 layer  top10   mrr    median_rank_fraction")
    for r in validation:
        log(
            f"{r['scorer']:38s} {r['layer']:5d}  {r['top10']:.3f}  {r['mrr']:.3f}  "
            f"{r['median_rank_fraction']:.3f}"
        )
    return {
        "drafter": drafter,
        "drafter_sha256": drafter_sha256(scorer.loaded.source.path),
        "base_model": scorer.profile.base_model,
        "n_layers": scorer.profile.n_layers,
        "n_heads": scorer.n_head,
        "layer": chosen,
        "head_weights": [round(float(v), 6) for v in weights],
        "profile_default_layer": default_layer,
        "rule": (
            "per (layer, head): evidence chunk rank among 64-token context chunks; head weight "
            "w_h ∝ max(0, mrr_h − mrr of a random ranking), normalised; layer = the earliest "
            "whose weighted top-10% share is within one prompt of the best and whose weighted "
            f"mrr is within {MRR_TIE} of the best"
        ),
        "calibration": {
            "families": list(FAMILIES),
            "lengths": list(lengths),
            "seed": seed,
            "source": CALIBRATION_SOURCE,
            "random_mrr": round(baseline, 4),
            "prompts": [spec for spec, _ in cal],
        },
        "per_layer": per_layer,
        "validation": {
            "source": VALIDATION_SOURCE,
            "seed": seed + VALIDATION_SEED_OFFSET,
            "prompts": [spec for spec, _ in val],
            "results": validation,
        },
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--drafter", default="embedded:smollm2-135m", help="drafter model source")
    p.add_argument("--out", required=True, help="calibration JSON to write")
    p.add_argument("--prompts", type=int, default=24, help="calibration prompts")
    p.add_argument("--validation-prompts", type=int, default=12, help="held-out prompts")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--lengths", type=int, nargs="+", default=[1024, 2048], help="prompt lengths (cycled)"
    )
    p.add_argument("--threads", type=int, default=1, help="torch threads")


def run_calibrate(args) -> int:
    import torch

    from pflash.models.drafter.calibration import write_calibration

    torch.set_num_threads(args.threads)
    payload = calibrate(
        args.drafter,
        prompts=args.prompts,
        validation_prompts=args.validation_prompts,
        seed=args.seed,
        lengths=tuple(args.lengths),
    )
    path = write_calibration(args.out, payload)
    print(f"wrote {path}: layer {payload['layer']}, head weights {payload['head_weights']}")
    return 0


# --------------------------------------------------------------------------- look-ahead report


def layer_inputs(model, ids) -> dict:
    """One full forward; the residual stream entering every layer, {layer: [S, hidden]}."""
    import torch

    inputs = {}

    def keep(i):
        def hook(module, args, kwargs):
            inputs[i] = (args[0] if args else kwargs["hidden_states"])[0]

        return hook

    layers = model.model.layers
    handles = [
        layer.register_forward_pre_hook(keep(i), with_kwargs=True) for i, layer in enumerate(layers)
    ]
    try:
        with torch.inference_mode():
            model.model(input_ids=torch.tensor([ids]))
    finally:
        for h in handles:
            h.remove()
    return inputs
