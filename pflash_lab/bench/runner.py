"""Run generated cases through PFlash and the baselines; score every turn.

Per case, turn and method the runner records (`TurnResult`, one JSONL line):

- evidence retention: the share of the turn's evidence strings (needles, chain
  statements, a `def` line; with multiplicity) found verbatim — whitespace-normalised — in
  the exact prompt served to the target. Over HTTP that prompt is the server's own
  `pflash_prompt` (`pflash_return_prompt`), so what is scored is what was prefilled;
- whether the gold answers and the question itself survived in the served prompt;
- answer correctness: the share of gold answers in the target's greedy reply, for the
  method and (joined later in the report) for full prefill on the same turn;
- time to first token (streaming), compression wall time, served and kept tokens.

Two engines run the same loop:

- `InProcessEngine` (quality numbers): the real drafter (`DrafterScorer`) and the real
  own flow (`pflash.flow.compressor`), the embedded model as the target through
  `TransformersTarget` with prefix snapshots off, so every prefill is cold. A keep-ratio
  sweep reuses one drafter pass per turn: the scores do not depend on the ratio, only
  the selection does.
- `HttpEngine` (the product path): the OpenAI-compatible API through the official
  `openai` client, streaming, `pflash_mode` always/off, the compressed prompt returned by
  the server. Baselines compress on the client and send with `pflash_mode: off`.

Methods: `pflash`, `full` (no compression), `llmlingua` (LongLLMLingua), `tail`
(keep-the-tail truncation), `random` (random chunks at the same budget).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from pflash_lab.bench.baselines import BaselineOutput, random_chunks, tail_truncate
from pflash_lab.corpus.cases import BenchCase

METHODS = ("pflash", "full", "llmlingua", "tail", "random")
SWEEP_METHODS = ("pflash", "tail", "random")


# --------------------------------------------------------------------------- scoring


def normalize(text: str) -> str:
    """Whitespace runs collapsed to one space: assembly may re-join paragraphs."""
    return re.sub(r"\s+", " ", text).strip()


def evidence_kept(served: str, evidence: Sequence[str]) -> int:
    """How many of `evidence` (a multiset) occur verbatim in `served`.

    A string listed k times counts up to k occurrences, so eight keyword lines need eight
    surviving copies.
    """
    text = normalize(served)
    return sum(min(text.count(normalize(e)), k) for e, k in Counter(evidence).items())


def answer_score(reply: str, answers: Sequence[str]) -> float:
    """Share of gold answers found in the reply (case-insensitive substring)."""
    if not answers:
        return 0.0
    low = reply.lower()
    return sum(1 for a in answers if a.lower() in low) / len(answers)


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class Served:
    """A prompt as one method serves it: the exact text, and target ids when known."""

    method: str
    keep_ratio: float
    text: str
    ids: tuple[int, ...] | None
    served_tokens: int
    kept_tokens: int
    compress_ms: float
    error: str = ""  # why the method served nothing (its row is an error, not a 0% turn)

    @classmethod
    def compressed(cls, method: str, keep_ratio: float, result, compress_ms: float) -> Served:
        """What PFlash served: a `pipeline.Compressed` and the time it took."""
        return cls(
            method,
            keep_ratio,
            result.served_text,
            result.served_ids,
            len(result.served_ids),
            int(result.stats.get("kept_tokens", 0)),
            compress_ms,
        )


@dataclass(frozen=True)
class Reply:
    """The target's answer with its timings (milliseconds; TTFT at the client)."""

    text: str
    ttft_ms: float
    prefill_ms: float | None
    served_text: str | None = None  # over HTTP: the server's pflash_prompt
    served_tokens: int | None = None


@dataclass(frozen=True)
class TurnResult:
    """One method on one turn of one case: a JSONL line of the results file."""

    case_id: str
    family: str
    length: int
    depth: float | None
    placement: str
    turn: int
    method: str
    keep_ratio: float
    engine: str
    prompt_tokens: int
    served_tokens: int
    kept_tokens: int
    evidence_total: int
    evidence_kept: int
    answers_total: int
    answers_in_prompt: int
    question_kept: bool
    answer_score: float
    compress_ms: float
    prefill_ms: float | None
    ttft_ms: float
    answer: str
    error: str = ""

    @property
    def retention(self) -> float:
        return self.evidence_kept / self.evidence_total if self.evidence_total else 1.0

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> TurnResult:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in obj.items() if k in names})


def score_turn(
    case: BenchCase,
    turn: int,
    served: Served,
    reply: Reply,
    *,
    engine: str,
    prompt_tokens: int,
) -> TurnResult:
    """Score one served prompt and its reply against the turn's gold data."""
    t = case.turns[turn]
    text = reply.served_text if reply.served_text is not None else served.text
    low = normalize(text).lower()
    served_tokens = reply.served_tokens if reply.served_tokens is not None else served.served_tokens
    return TurnResult(
        case_id=case.case_id,
        family=case.family,
        length=case.spec.length,
        depth=case.spec.depth,
        placement=case.spec.placement,
        turn=turn,
        method=served.method,
        keep_ratio=served.keep_ratio,
        engine=engine,
        prompt_tokens=prompt_tokens,
        served_tokens=served_tokens,
        kept_tokens=served.kept_tokens,
        evidence_total=len(t.evidence),
        evidence_kept=evidence_kept(text, t.evidence),
        answers_total=len(t.answers),
        answers_in_prompt=sum(1 for a in t.answers if a.lower() in low),
        question_kept=normalize(t.question).lower() in low,
        answer_score=answer_score(reply.text, t.answers),
        compress_ms=served.compress_ms,
        prefill_ms=reply.prefill_ms,
        ttft_ms=served.compress_ms + reply.ttft_ms if engine == "inprocess" else reply.ttft_ms,
        answer=reply.text,
    )


def write_jsonl(path: Path, results: Iterable[TurnResult]) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        for r in results:
            fh.write(json.dumps(r.to_json(), ensure_ascii=False) + "\n")


def read_jsonl(path: Path) -> list[TurnResult]:
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            out.append(TurnResult.from_json(json.loads(line)))
    return out


# --------------------------------------------------------------------------- baselines


class Baselines:
    """The client-side baselines on a case's document, one call per method and ratio."""

    def __init__(self, tokenizer, *, llmlingua=None):
        self.tokenizer = tokenizer
        self.llmlingua = llmlingua

    def compress(
        self, method: str, case: BenchCase, turn: int, ratio: float
    ) -> BaselineOutput | None:
        if method == "tail":
            return tail_truncate(case.document, ratio, self.tokenizer)
        if method == "random":
            return random_chunks(case.document, ratio, self.tokenizer, seed=case.spec.seed + turn)
        if method == "llmlingua":
            if self.llmlingua is None:
                return None
            return self.llmlingua(case.document, case.turns[turn].question, ratio)
        raise ValueError(f"not a baseline: {method}")


# --------------------------------------------------------------------------- engines


class InProcessEngine:
    """The real drafter and pipeline in this process, the embedded model as the target."""

    name = "inprocess"

    def __init__(self, config, *, threads: int | None = None):
        import torch

        from pflash.models.drafter.scorer import DrafterScorer
        from pflash.models.loading import load_causal_lm
        from pflash.models.source import load_tokenizer
        from pflash.models.target.hf import TransformersTarget

        if threads:
            torch.set_num_threads(threads)
        self.config = config
        self.target_tokenizer = load_tokenizer(config.target_tokenizer or config.target)
        self.drafter_tokenizer = load_tokenizer(config.drafter_tokenizer or config.drafter)
        drafter = load_causal_lm(config.drafter)
        self.scorer = DrafterScorer(config, drafter)
        from pflash.models.probe import probe_for

        self.probe = probe_for(config, self.scorer)
        target = drafter if config.target == config.drafter else load_causal_lm(config.target)
        self.target = TransformersTarget(
            target.model, self.target_tokenizer, max_context=config.max_context, snapshot_capacity=0
        )

    @property
    def max_context(self) -> int:
        return self.target.max_context

    def encode(self, messages: list[dict]) -> tuple[int, ...]:
        from pflash.compress.render.chat import render_chat

        text = render_chat(self.target_tokenizer, messages)
        return tuple(self.target_tokenizer(text, add_special_tokens=False)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        from pflash.spans import decode_ids

        return decode_ids(self.target_tokenizer, ids)

    def full(self, messages: list[dict]) -> Served:
        ids = self.encode(messages)
        return Served("full", 1.0, self.decode(ids), ids, len(ids), len(ids), 0.0)

    def pflash(self, messages: list[dict], ratios: Sequence[float], trace=None) -> list[Served]:
        """Compress at each ratio with one drafter pass (the scores do not depend on the ratio);
        each ratio's time includes that pass."""
        from pflash.compress.render.rendered import render_chat_prompt
        from pflash.config import build_config
        from pflash.flow.in_process import ScoreOnce, compress_in_process

        prompt = render_chat_prompt(self.target_tokenizer, messages)
        ids = prompt.ids
        once = ScoreOnce(self.scorer)
        out = []
        for r in ratios:
            cfg = build_config(
                {**self.config.model_dump(), "mode": "always", "keep_ratio": r, "curve": ()},
                env={},
            )
            t0 = time.perf_counter()
            result = compress_in_process(
                prompt,
                cfg,
                target_tokenizer=self.target_tokenizer,
                drafter_tokenizer=self.drafter_tokenizer,
                scorer=once,
                probe=self.probe,
                trace=trace,
            )
            ms = (time.perf_counter() - t0) * 1000 + (once.last_ms if once.hit else 0.0)
            if not result.compressed:
                out.append(Served("pflash", r, result.served_text, ids, len(ids), len(ids), ms))
                continue
            out.append(Served.compressed("pflash", r, result, ms))
        return out

    def baseline(self, served: BaselineOutput, method: str, ratio: float, messages) -> Served:
        """A baseline's compressed document inside the same chat, rendered."""
        ids = self.encode(messages)
        return Served(
            method, ratio, self.decode(ids), ids, len(ids), served.kept_tokens, served.compress_ms
        )

    def generate(self, served: Served, max_tokens: int) -> Reply:
        """Greedy reply to the served ids; TTFT is the first streamed piece (cold prefill)."""
        from pflash.models.target.protocol import GenerationDone, SamplingParams

        params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
        ids = list(served.ids or ())

        async def run() -> tuple[str, float, float | None]:
            t0 = time.perf_counter()
            first = None
            pieces, prefill = [], None
            async for event in self.target.generate(ids, params, snapshot_cut=0):
                if isinstance(event, GenerationDone):
                    prefill = event.timings.prompt_ms
                    break
                if first is None:
                    first = time.perf_counter() - t0
                pieces.append(event.text)
            ttft = first if first is not None else time.perf_counter() - t0
            return "".join(pieces), ttft * 1000, prefill

        text, ttft, prefill = asyncio.run(run())
        return Reply(text, ttft, prefill)


class HttpEngine:
    """The OpenAI-compatible API through the official `openai` client (streaming)."""

    name = "http"

    def __init__(self, base_url: str, tokenizer, *, api_key: str = "unused", timeout: float = 900):
        from openai import OpenAI

        self.client = OpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout)
        self.target_tokenizer = tokenizer

    def encode(self, messages: list[dict]) -> tuple[int, ...]:
        from pflash.compress.render.chat import render_chat

        text = render_chat(self.target_tokenizer, messages)
        return tuple(self.target_tokenizer(text, add_special_tokens=False)["input_ids"])

    def chat(
        self,
        messages: list[dict],
        *,
        mode: str,
        ratio: float,
        max_tokens: int,
        session_id: str | None = None,
    ) -> Reply:
        extra = {"pflash_mode": mode, "pflash_keep_ratio": ratio, "pflash_return_prompt": True}
        if session_id:
            extra["session_id"] = session_id
        t0 = time.perf_counter()
        first, prompt, usage, pieces = None, None, None, []
        stream = self.client.chat.completions.create(
            model="pflash",
            messages=messages,
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        for chunk in stream:
            extra_fields = chunk.model_extra or {}
            if prompt is None and extra_fields.get("pflash_prompt") is not None:
                prompt = extra_fields["pflash_prompt"]
            if chunk.choices and chunk.choices[0].delta.content:
                if first is None:
                    first = time.perf_counter() - t0
                pieces.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        ttft = (first if first is not None else time.perf_counter() - t0) * 1000
        timings = (usage.model_extra or {}).get("timings", {}) if usage is not None else {}
        served_tokens = None
        if timings:
            served_tokens = int(timings.get("prompt_n", 0)) + int(timings.get("cache_n", 0))
        return Reply("".join(pieces), ttft, timings.get("prompt_ms"), prompt, served_tokens)


# --------------------------------------------------------------------------- the loop


@dataclass(frozen=True)
class RunPlan:
    """Methods, the main keep ratio, and the sweep ratios for the sweep subset of cases."""

    methods: tuple[str, ...] = METHODS
    keep: float = 0.1
    sweep: tuple[float, ...] = ()
    sweep_cases: frozenset[str] = frozenset()

    def ratios(self, case: BenchCase, method: str) -> list[float]:
        if method == "full":
            return [1.0]
        extra = []
        if case.case_id in self.sweep_cases and method in SWEEP_METHODS:
            extra = [r for r in self.sweep if not math.isclose(r, self.keep)]
        return [self.keep, *extra]


def turn_units(cases: Sequence[BenchCase]) -> int:
    return sum(len(c.turns) for c in cases)


def run_case_inprocess(
    case: BenchCase, engine: InProcessEngine, baselines: Baselines, plan: RunPlan
) -> list[TurnResult]:
    """Every turn of `case` by every method (each method keeps its own replies)."""
    out: list[TurnResult] = []
    replies: dict[str, list[str]] = {m: [] for m in plan.methods}
    for turn in range(len(case.turns)):
        max_tokens = case.turns[turn].max_tokens
        for method in plan.methods:
            messages = case.messages(turn, replies[method])
            prompt_tokens = len(engine.encode(messages))
            main_reply = ""
            for served in _serve_inprocess(
                case, turn, method, replies[method], engine, baselines, plan
            ):
                reply = engine.generate(served, max_tokens)
                if math.isclose(served.keep_ratio, plan.keep) or method == "full":
                    main_reply = reply.text
                out.append(
                    score_turn(
                        case, turn, served, reply, engine=engine.name, prompt_tokens=prompt_tokens
                    )
                )
            replies[method].append(main_reply)
    return out


def _serve_inprocess(case, turn, method, replies, engine, baselines, plan) -> list[Served]:
    messages = case.messages(turn, replies)
    if method == "full":
        return [engine.full(messages)]
    ratios = plan.ratios(case, method)
    if method == "pflash":
        return engine.pflash(messages, ratios)
    out = []
    for r in ratios:
        b = baselines.compress(method, case, turn, r)
        if b is not None:
            msgs = case.messages(turn, replies, document=b.document)
            out.append(engine.baseline(b, method, r, msgs))
    return out


def run_case_http(
    case: BenchCase, engine: HttpEngine, baselines: Baselines, plan: RunPlan
) -> list[TurnResult]:
    """Every turn of `case` through the HTTP API (PFlash server-side, baselines client-side)."""
    out: list[TurnResult] = []
    replies: dict[str, list[str]] = {m: [] for m in plan.methods}
    for turn in range(len(case.turns)):
        max_tokens = case.turns[turn].max_tokens
        for method in plan.methods:
            messages = case.messages(turn, replies[method])
            prompt_tokens = len(engine.encode(messages))
            for r in plan.ratios(case, method):
                msgs, kept, cms, mode = messages, prompt_tokens, 0.0, "off"
                if method == "pflash":
                    mode = "always"
                elif method != "full":
                    b = baselines.compress(method, case, turn, r)
                    if b is None:
                        continue
                    msgs = case.messages(turn, replies[method], document=b.document)
                    kept, cms = b.kept_tokens, b.compress_ms
                session = f"{case.case_id}-{method}-{r}" if method == "pflash" else None
                reply = engine.chat(
                    msgs, mode=mode, ratio=r, max_tokens=max_tokens, session_id=session
                )
                if method == "pflash":
                    kept = reply.served_tokens or 0
                served = Served(method, r, reply.served_text or "", None, 0, kept, cms)
                result = score_turn(
                    case, turn, served, reply, engine=engine.name, prompt_tokens=prompt_tokens
                )
                if cms:  # client-side compression happens before the request
                    result = _with_ttft(result, result.ttft_ms + cms)
                out.append(result)
                if math.isclose(r, plan.keep) or method == "full":
                    replies[method].append(reply.text)
    return out


def _with_ttft(result: TurnResult, ttft: float) -> TurnResult:
    data = result.to_json()
    data["ttft_ms"] = ttft
    return TurnResult.from_json(data)


def run_suite(
    cases: Sequence[BenchCase],
    engine,
    baselines: Baselines,
    plan: RunPlan,
    *,
    out_path: Path | None = None,
    progress: bool = True,
) -> list[TurnResult]:
    """All cases, with a progress bar (turns done, ETA); results appended as they finish."""
    from tqdm import tqdm

    runner = run_case_http if isinstance(engine, HttpEngine) else run_case_inprocess
    results: list[TurnResult] = []
    with tqdm(
        total=turn_units(cases), disable=not progress, unit="turn", dynamic_ncols=True
    ) as bar:
        for case in cases:
            bar.set_description(case.case_id)
            rows = runner(case, engine, baselines, plan)
            results.extend(rows)
            if out_path is not None:
                write_jsonl(out_path, rows)
            bar.update(len(case.turns))
    return results
