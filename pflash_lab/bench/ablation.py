"""`pflash bench ablate`: evidence retention per family for each scoring mechanism, side by side.

It answers what each mechanism (lexical anchors, the cascade, the position prior,
look-ahead queries, a calibrated or trained head) adds on top of attention alone. Retention
depends only on what is served, so this bench runs no target: every turn is compressed by
every variant and the served prompt is checked for the turn's evidence strings (the same
metric as `pflash bench run`). Variants that differ only in selection share one drafter
pass per turn; variants that change the drafter (look-ahead, head, calibration, layer) get
their own scorer over the one loaded model. Compression time per variant is what that
variant alone would take: prepare + its drafter pass (+ probe) + finish.

Multi-turn cases are answered with the gold answers as the assistant's earlier replies, so
every variant sees the same conversation. `--llmlingua` adds LongLLMLingua (same 135M
model, question-aware, strict rate) as a column, measured in the same run.

`--control` serves every case a second time with each question replaced by one about the
license text (`CONTROL_QUESTIONS`, touching no fact and no code) and scores the same
evidence: what a method keeps without being asked for it. Evidence that stands out from
its surroundings is kept under the control too, so the real retention minus the control's
is what the scorer contributes by reading the question; summary.md gives both side by side
and their difference.

    pflash bench ablate --out bench-out/ablate [--families ...] [--cases 4]
        [--lengths 2048 4096] [--keep 0.1] [--variant NAME:KEY=VALUE,KEY=VALUE ...]
        [--llmlingua] [--uniform] [--control] [--threads 1] [--set KEY=VALUE]

`--uniform` adds evenly spaced 64-token chunks of the document at the first variant's
realized keep (its served tokens over the prompt's): the baseline a scorer must beat.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import yaml

from pflash_lab.bench.runner import Reply, Served, TurnResult, score_turn, write_jsonl
from pflash_lab.corpus.cases import BenchCase

# Keys that change what the drafter computes: variants differing in these need their own pass.
DRAFTER_KEYS = (
    "drafter",
    "drafter_attention",
    "drafter_window_tokens",
    "drafter_sink_tokens",
    "drafter_block_tokens",
    "drafter_top_blocks",
    "drafter_head_layer",
    "drafter_calibration",
    "scoring_head_gguf",
    "select_scorer",
    # the scorer's own models: a variant with another embedder or projection needs its scorer
    "semantic_embedder",
    "semantic_embedder_dtype",
    "projection_gguf",
)


@dataclass(frozen=True)
class Variant:
    """A named set of config overrides on top of the run's base config."""

    name: str
    overrides: tuple[tuple[str, object], ...] = ()

    @property
    def settings(self) -> dict:
        return dict(self.overrides)

    def drafter_key(self, base: dict) -> tuple:
        merged = {**base, **self.settings}
        return tuple((k, merged.get(k)) for k in DRAFTER_KEYS)


def variant(name: str, **overrides) -> Variant:
    return Variant(name, tuple(sorted(overrides.items())))


DEFAULT_VARIANTS = (
    variant("attention", select_lexical="off"),
    variant("prior", select_lexical="off", select_position_prior="distance"),
    variant("anchors", select_lexical="anchors"),
    variant("cascade", select_lexical="cascade"),
    variant("cascade+prior", select_lexical="cascade", select_position_prior="distance"),
)


def parse_variant(text: str) -> Variant:
    """`NAME:KEY=VALUE,KEY=VALUE` (values read as YAML); `NAME:` alone = the base config."""
    name, sep, rest = text.partition(":")
    if not sep or not name:
        raise ValueError(f"--variant {text!r}: expected NAME:KEY=VALUE,...")
    pairs = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--variant {text!r}: {item!r} is not KEY=VALUE")
        pairs[key.strip()] = yaml.safe_load(value)
    return variant(name, **pairs)


# Questions about the license text that no fact, needle or function answers; a control
# turn gets one of them in place of its question (`control_case`).
CONTROL_QUESTIONS = (
    "Under which conditions may altered versions of the licensed software be passed on to others?",
    "What does the licence say about warranty and liability?",
    "Which duties fall on a distributor who conveys the licensed software to recipients?",
    "How can a recipient lose the rights granted by this licence?",
)
CONTROL_SUFFIX = " (control)"


def control_case(case: BenchCase) -> BenchCase:
    """`case` with every turn's question replaced by a control question (a different one
    per turn, rotating with the seed); document, answers and evidence stay, so the control
    scores the same evidence under a question that does not ask for it."""
    n = len(CONTROL_QUESTIONS)
    turns = tuple(
        dataclasses.replace(t, question=CONTROL_QUESTIONS[(case.spec.seed + i) % n])
        for i, t in enumerate(case.turns)
    )
    return dataclasses.replace(case, turns=turns)


def with_controls(methods: Sequence[str]) -> list[str]:
    """Each method followed by its control column."""
    return [m for method in methods for m in (method, method + CONTROL_SUFFIX)]


def gold_replies(case: BenchCase, turn: int) -> list[str]:
    """Earlier assistant turns for a multi-turn case: the gold answers, identical per variant."""
    return [", ".join(case.turns[t].answers) for t in range(turn)]


# --------------------------------------------------------------------------- engine


class AblationEngine:
    """One loaded drafter, one scorer per drafter-relevant variant group, the real pipeline."""

    def __init__(self, base: dict, variants: Sequence[Variant], *, threads: int | None = None):
        import torch

        from pflash.config import build_config
        from pflash.models.loading import load_causal_lm
        from pflash.models.source import load_tokenizer

        if threads:
            torch.set_num_threads(threads)
        self.base = dict(base)
        self.variants = tuple(variants)
        self.configs = {
            v.name: build_config({**self.base, **v.settings, "mode": "always"}, env={})
            for v in self.variants
        }
        first = next(iter(self.configs.values()))
        self.target_tokenizer = load_tokenizer(first.target_tokenizer or first.target)
        self.drafter_tokenizer = load_tokenizer(first.drafter_tokenizer or first.drafter)
        self.loaded = load_causal_lm(first.drafter)
        self.scorers: dict[tuple, object] = {}
        self.probes: dict[tuple, object] = {}
        for v in self.variants:
            key = v.drafter_key(self.base)
            if key not in self.scorers:
                self.scorers[key], self.probes[key] = self._scorer(self.configs[v.name])

    def _scorer(self, config):
        from pflash.models.drafter.scorer import DrafterScorer
        from pflash.models.probe import probe_for

        scorer = DrafterScorer(config, self.loaded)
        return scorer, probe_for(config, scorer)

    def encode(self, messages: list[dict]) -> tuple[int, ...]:
        from pflash.compress.render.chat import render_chat

        text = render_chat(self.target_tokenizer, messages)
        return tuple(self.target_tokenizer(text, add_special_tokens=False)["input_ids"])

    def serve(self, messages: list[dict]) -> dict[str, Served]:
        """Every variant's served prompt for one chat (one drafter pass per variant group;
        each variant's time includes its group's pass)."""
        from pflash.compress.render.rendered import render_chat_prompt
        from pflash.errors import CompressionFailed
        from pflash.flow.in_process import ScoreOnce, compress_in_process

        prompt = render_chat_prompt(self.target_tokenizer, messages)
        ids = prompt.ids
        passes: dict[tuple, ScoreOnce] = {}
        out: dict[str, Served] = {}
        for v in self.variants:
            cfg = self.configs[v.name]
            key = v.drafter_key(self.base)
            once = passes.setdefault(key, ScoreOnce(self.scorers[key]))
            t0 = time.perf_counter()
            try:
                result = compress_in_process(
                    prompt,
                    cfg,
                    target_tokenizer=self.target_tokenizer,
                    drafter_tokenizer=self.drafter_tokenizer,
                    scorer=once,
                    probe=self.probes[key],
                )
            except CompressionFailed as exc:
                out[v.name] = Served(v.name, cfg.keep_ratio, "", (), 0, 0, 0.0, error=str(exc))
                continue
            ms = (time.perf_counter() - t0) * 1000 + (once.last_ms if once.hit else 0.0)
            if not result.compressed:
                out[v.name] = Served(
                    v.name, cfg.keep_ratio, result.served_text, ids, len(ids), len(ids), ms
                )
                continue
            out[v.name] = Served.compressed(v.name, cfg.keep_ratio, result, ms)
        return out


def run_case(
    case: BenchCase, engine: AblationEngine, llmlingua=None, uniform: bool = False
) -> list[TurnResult]:
    """Every turn of `case` under every variant (and LongLLMLingua when given; with
    `uniform`, evenly spaced chunks of the document at the first variant's realized keep)."""
    out = []
    no_reply = Reply("", 0.0, None)
    for turn in range(len(case.turns)):
        messages = case.messages(turn, gold_replies(case, turn))
        prompt_tokens = len(engine.encode(messages))
        served = list(engine.serve(messages).values())
        if uniform:
            served.append(_uniform(case, turn, engine, served[0], prompt_tokens))
        if llmlingua is not None:
            keep = next(iter(engine.configs.values())).keep_ratio
            try:
                b = llmlingua(case.document, case.turns[turn].question, keep)
            except Exception as exc:  # a baseline crash is recorded, not fatal to the run
                failed = f"{type(exc).__name__}: {exc}"[:200]
                served.append(Served("llmlingua", keep, "", None, 0, 0, 0.0, error=failed))
            else:
                msgs = case.messages(turn, gold_replies(case, turn), document=b.document)
                text = engine.target_tokenizer.decode(engine.encode(msgs))
                served.append(
                    Served("llmlingua", keep, text, None, 0, b.kept_tokens, b.compress_ms)
                )
        for s in served:
            row = score_turn(
                case, turn, s, no_reply, engine="ablation", prompt_tokens=prompt_tokens
            )
            if s.error:
                row = dataclasses.replace(row, error=s.error)
            out.append(row)
    return out


def _uniform(case: BenchCase, turn: int, engine: AblationEngine, first, prompt_tokens: int):
    """The uniform baseline for one turn: the document's share of the first variant's
    realized keep (served / prompt tokens), as evenly spaced chunks."""
    from pflash_lab.bench.baselines import uniform_chunks

    realized = first.served_tokens / max(1, prompt_tokens)
    doc_tokens = len(engine.target_tokenizer(case.document, add_special_tokens=False)["input_ids"])
    b = uniform_chunks(case.document, round(realized * doc_tokens), engine.target_tokenizer)
    msgs = case.messages(turn, gold_replies(case, turn), document=b.document)
    text = engine.target_tokenizer.decode(engine.encode(msgs))
    return Served("uniform", realized, text, None, 0, b.kept_tokens, b.compress_ms)


def run_control(case: BenchCase, engine: AblationEngine, llmlingua=None) -> list[TurnResult]:
    """`run_case` on `control_case(case)`, each method renamed `NAME (control)`."""
    rows = run_case(control_case(case), engine, llmlingua)
    return [dataclasses.replace(r, method=r.method + CONTROL_SUFFIX) for r in rows]


# --------------------------------------------------------------------------- report


def retention_table(rows: Sequence[TurnResult], order: Sequence[str]) -> str:
    """Markdown: evidence retention per family × variant, the pooled line (every evidence
    string counts once, so a family with many strings weighs more), the mean over turns
    (every turn counts once), and the median compression time."""
    failed = Counter(r.method for r in rows if r.error)
    rows = [r for r in rows if not r.error]  # a crashed method has no served prompt to score
    by: dict[tuple[str, str], list[TurnResult]] = defaultdict(list)
    families: list[str] = []
    for r in rows:
        by[(r.family, r.method)].append(r)
        if r.family not in families:
            families.append(r.family)
    methods = [m for m in order if any(r.method == m for r in rows)]
    if not methods:
        return _failed_line(failed)

    def pct(rs: list[TurnResult]) -> str:
        total = sum(r.evidence_total for r in rs)
        kept = sum(r.evidence_kept for r in rs)
        return f"{100 * kept / total:.0f}%" if total else "–"

    lines = ["| family | turns | " + " | ".join(methods) + " |"]
    lines.append("|---|---|" + "---|" * len(methods))
    for f in families:
        n = len(by[(f, methods[0])])
        lines.append(f"| {f} | {n} | " + " | ".join(pct(by[(f, m)]) for m in methods) + " |")
    every = {m: [r for r in rows if r.method == m] for m in methods}
    lines.append(
        f"| **all** | {len(every[methods[0]])} | "
        + " | ".join(f"**{pct(every[m])}**" for m in methods)
        + " |"
    )
    lines.append(
        "| mean per turn | | "
        + " | ".join(
            f"{100 * statistics.fmean(r.retention for r in every[m]):.0f}%" for m in methods
        )
        + " |"
    )
    lines.append(
        "| median compress ms | | "
        + " | ".join(f"{statistics.median(r.compress_ms for r in every[m]):.0f}" for m in methods)
        + " |"
    )
    if failed:
        lines += ["", _failed_line(failed)]
    return "\n".join(lines)


def _failed_line(failed: Counter) -> str:
    return "Failed turns (not scored): " + ", ".join(f"{m} {n}" for m, n in sorted(failed.items()))


def _pooled(rows: Sequence[TurnResult]) -> float | None:
    total = sum(r.evidence_total for r in rows)
    return 100 * sum(r.evidence_kept for r in rows) / total if total else None


def contribution_table(rows: Sequence[TurnResult], order: Sequence[str]) -> str:
    """Markdown: real minus control retention per family × method, in points (pooled as in
    `retention_table`); methods without control rows are left out."""
    rows = [r for r in rows if not r.error]
    methods = [m for m in order if any(r.method == m + CONTROL_SUFFIX for r in rows)]
    families = list(dict.fromkeys(r.family for r in rows))

    def cell(family: str | None, method: str) -> str:
        def pick(m: str) -> list[TurnResult]:
            return [r for r in rows if r.method == m and family in (None, r.family)]

        real, control = _pooled(pick(method)), _pooled(pick(method + CONTROL_SUFFIX))
        return "–" if real is None or control is None else f"{real - control:+.0f}"

    lines = ["| family | " + " | ".join(methods) + " |", "|---|" + "---|" * len(methods)]
    for f in families:
        lines.append(f"| {f} | " + " | ".join(cell(f, m) for m in methods) + " |")
    lines.append("| **all** | " + " | ".join(f"**{cell(None, m)}**" for m in methods) + " |")
    return "\n".join(lines)


# --------------------------------------------------------------------------- CLI


def add_arguments(bsub) -> None:
    from pflash_lab.corpus.families import FAMILIES

    p = bsub.add_parser("ablate", help="evidence retention per family for each scoring variant")
    p.add_argument("--out", required=True, help="output directory (results.jsonl, summary.md)")
    p.add_argument("--families", nargs="+", default=list(FAMILIES), choices=list(FAMILIES))
    p.add_argument("--cases", type=int, default=4, help="cases per family")
    p.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    p.add_argument("--keep", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME:KEY=VALUE,...",
        help="a variant (repeatable); default: attention, prior, anchors, cascade, cascade+prior",
    )
    p.add_argument("--llmlingua", action="store_true", help="add LongLLMLingua as a column")
    p.add_argument(
        "--uniform",
        action="store_true",
        help="add evenly spaced chunks at the first variant's realized keep as a column",
    )
    p.add_argument(
        "--control",
        action="store_true",
        help="also serve every case with unrelated questions about the license text and "
        "report that retention next to the real one",
    )
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--set", action="append", default=None, metavar="KEY=VALUE")
    p.add_argument("--no-progress", action="store_true")


def run_ablation(args) -> int:
    from pflash_lab.bench.harness import parse_overrides, serve_args
    from pflash_lab.corpus.cases import SuitePlan, token_counter
    from pflash_lab.corpus.families import generate

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    variants = [parse_variant(v) for v in args.variant] if args.variant else DEFAULT_VARIANTS
    base = {**serve_args(), "keep_ratio": args.keep, "curve": (), **parse_overrides(args.set)}
    engine = AblationEngine(base, variants, threads=args.threads)
    count = token_counter(engine.target_tokenizer)
    plan = SuitePlan(tuple(args.families), args.cases, tuple(args.lengths), seed=args.seed)
    cases = [generate(spec, count) for spec in plan.specs()]
    llm = None
    if args.llmlingua:
        from pflash_lab.bench.baselines import LongLLMLingua

        llm = LongLLMLingua(base.get("drafter", "embedded:smollm2-135m"), engine.target_tokenizer)
    meta = {
        "command": "pflash " + " ".join(getattr(args, "argv", []) or []),
        "variants": {v.name: v.settings for v in variants},
        "base": base,
        "cases": len(cases),
        "control": bool(getattr(args, "control", False)),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    rows: list[TurnResult] = []
    t0 = time.perf_counter()
    for i, case in enumerate(cases):
        case_rows = run_case(case, engine, llm, uniform=getattr(args, "uniform", False))
        if meta["control"]:
            case_rows += run_control(case, engine, llm)
        write_jsonl(results, case_rows)
        rows += case_rows
        if not args.no_progress:
            kept = {r.method: f"{r.evidence_kept}/{r.evidence_total}" for r in case_rows}
            print(f"[{i + 1}/{len(cases)}] {case.case_id} {kept}", flush=True)
    meta["wall_s"] = round(time.perf_counter() - t0, 1)
    (out / "run.json").write_text(json.dumps(meta, indent=2, default=str))
    order = [v.name for v in variants] + ["llmlingua", "uniform"]
    table = retention_table(rows, with_controls(order) if meta["control"] else order)
    if meta["control"]:
        table += (
            "\n\nScorer contribution: real minus control retention, in points (control: "
            "every question replaced by one about the license text).\n\n"
            + contribution_table(rows, order)
        )
    (out / "summary.md").write_text(
        f"# Evidence retention at keep {args.keep}\n\n{table}\n\nCommand: `{meta['command']}`\n"
    )
    print(table)
    return 0
