"""`pflash compress FILE`: compress one prompt in process with the real drafter, as the server would.

FILE is a chat request (`{"messages": [...], "tools"?, "pflash_query"?, "pflash_required"?,
"chat_template_kwargs"?}`), a raw completion (`{"prompt": "..."}`), or plain text (a raw
completion prompt). Chats are rendered with the target tokenizer's chat template and
encoded exactly as the server's ingress does, then compressed by the server's own
`pflash.flow.compressor.Compressor` with `mode: always` and the drafter `DrafterScorer`.

Output: the compressed prompt, then the stats; with `--json` one object
`{"prompt": str, "stats": {...}}`. The stats use the `usage.timings.pflash` names, plus
`prompt_tokens` (target tokens of the prompt before compression). Every expected failure
(unreadable file, bad config, missing model, a request the pipeline refuses) prints one
line to stderr and exits 2.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from pflash.config import DrafterScorerPart, PFlashConfig, build_config, load_config
from pflash.errors import InvalidRequest, PFlashError

EXIT_ERROR = 2


@dataclass(frozen=True)
class CompressFile:
    """What FILE asks to compress: `messages` for a chat, else the raw `prompt` text."""

    prompt: str | None = None
    messages: Sequence[Mapping] | None = None
    tools: Sequence[Mapping] | None = None
    chat_template_kwargs: Mapping[str, Any] | None = None
    pflash_query: str | None = None
    pflash_required: tuple[str, ...] = ()


@dataclass(frozen=True)
class CompressReport:
    """What the command prints: the served prompt text and its stats."""

    prompt: str
    stats: dict[str, Any]


def run_compress(args) -> int:
    """Entry point wired in pflash.cli; returns the process exit code (0 ok, 2 error)."""
    try:
        request = read_request(Path(args.file))
        config = compress_config(
            args.config,
            keep_ratio=args.keep_ratio,
            chunk_size=args.chunk_size,
            drafter=args.drafter,
        )
        report = compress_request(request, config, target_tokenizer_spec=args.target_tokenizer)
    except (PFlashError, OSError, ValueError, yaml.YAMLError) as err:
        message = getattr(err, "message", None) or str(err) or type(err).__name__
        print(f"pflash compress: {message}", file=sys.stderr)
        return EXIT_ERROR
    if args.json:
        print(json.dumps({"prompt": report.prompt, "stats": report.stats}, ensure_ascii=False))
    else:
        print(format_report(report))
    return 0


def read_request(path: Path) -> CompressFile:
    """Parse FILE: a JSON object with "messages" (or "prompt"), otherwise plain text."""
    raw = path.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return CompressFile(prompt=raw)
    if not isinstance(data, dict) or not ("messages" in data or "prompt" in data):
        raise InvalidRequest(f'{path}: a JSON file must be an object with "messages" (or "prompt")')
    if "chat_template" in data:
        raise InvalidRequest(
            f"{path}: chat_template is not supported; the target's template is used"
        )
    required = data.get("pflash_required") or []
    if not isinstance(required, list) or not all(isinstance(s, str) for s in required):
        raise InvalidRequest(f"{path}: pflash_required must be a list of strings")
    query = data.get("pflash_query")
    if query is not None and not isinstance(query, str):
        raise InvalidRequest(f"{path}: pflash_query must be a string")
    kwargs = data.get("chat_template_kwargs")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise InvalidRequest(f"{path}: chat_template_kwargs must be an object")
    if "messages" in data:
        return CompressFile(
            messages=data["messages"],
            tools=data.get("tools"),
            chat_template_kwargs=kwargs,
            pflash_query=query,
            pflash_required=tuple(required),
        )
    if not isinstance(data["prompt"], str):
        raise InvalidRequest(f'{path}: "prompt" must be a string')
    return CompressFile(prompt=data["prompt"], pflash_query=query, pflash_required=tuple(required))


def compress_config(
    path: str | None,
    *,
    keep_ratio: float | None = None,
    chunk_size: int | None = None,
    drafter: str | None = None,
) -> PFlashConfig:
    """Defaults < YAML `path` < `PFLASH_*` env < the command-line flags; mode is always.

    `--keep-ratio` replaces the keep curve too; `--drafter` names the drafter model and its
    tokenizer (a configured `drafter_tokenizer` belongs to the configured drafter).
    """
    base = load_config(path)
    updates: dict[str, Any] = {"mode": "always"}
    if keep_ratio is not None:
        updates.update(keep_ratio=keep_ratio, curve=())
    if chunk_size is not None:
        updates["select_chunk_size"] = chunk_size
    if drafter is not None:
        updates.update(drafter=drafter, drafter_tokenizer=None)
    return build_config({**base.model_dump(), **updates}, env={})


@lru_cache(maxsize=1)
def load_drafter(spec: str):
    """The drafter model for `spec`, loaded once per process (tests compress many files)."""
    from pflash.models.loading import load_causal_lm

    return load_causal_lm(spec)


def compress_request(
    request: CompressFile, config: PFlashConfig, *, target_tokenizer_spec: str | None = None
) -> CompressReport:
    """Render, encode and compress one request with the real drafter under `config`: the
    same `Compressor` the server runs, in process, without views (a file is one turn)."""
    from pflash.flow.in_process import compress_in_process
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.probe import probe_for
    from pflash.models.source import load_tokenizer
    from pflash.serving.usage import PFlashStats
    from pflash.trace import TraceWriter

    target_tokenizer = load_tokenizer(
        target_tokenizer_spec or config.target_tokenizer or config.target
    )
    drafter_tokenizer = load_tokenizer(config.drafter_tokenizer or config.drafter)
    prompt = render_request(target_tokenizer, request)
    drafter = config.part(DrafterScorerPart)  # what the DrafterScorer deployment is given
    scorer = DrafterScorer(drafter, load_drafter(config.drafter))
    probe = probe_for(drafter, scorer)
    trace = TraceWriter(config.trace_path) if config.trace_path else None
    try:
        result = compress_in_process(
            prompt,
            config,
            target_tokenizer=target_tokenizer,
            drafter_tokenizer=drafter_tokenizer,
            scorer=scorer,
            probe=probe,
            trace=trace,
            pflash_query=request.pflash_query,
            pflash_required=request.pflash_required,
        )
    finally:
        if trace is not None:
            trace.close()
    # Through the API model: the names and units are exactly usage.timings.pflash (no views here).
    timings = PFlashStats(**result.stats).model_dump(exclude={"view"})
    stats = {"prompt_tokens": len(prompt.ids), **timings}
    return CompressReport(prompt=result.served_text, stats=stats)


def render_request(target_tokenizer, request: CompressFile):
    """The prompt as the ingress renders it: a chat with the target's template (no special
    tokens added), a raw prompt with the tokenizer's own."""
    from pflash.compress.render.rendered import render_chat_prompt, render_completion_prompt

    if request.messages is None:
        return render_completion_prompt(target_tokenizer, request.prompt)
    return render_chat_prompt(
        target_tokenizer,
        request.messages,
        tools=request.tools,
        template_kwargs=request.chat_template_kwargs,
    )


def encode_request(target_tokenizer, request: CompressFile) -> tuple[int, ...]:
    """Target tokens of the prompt as the ingress builds them (`render_request`)."""
    return render_request(target_tokenizer, request).ids


def format_report(report: CompressReport) -> str:
    """Human-readable form: the prompt verbatim between two rules, then one stat per line."""
    stats = report.stats
    lines = [
        f"=== compressed prompt: {stats['prompt_tokens']} -> {stats['compressed_tokens']}"
        " target tokens ===",
        report.prompt.removesuffix("\n"),
        "=== stats ===",
    ]
    width = max(len(k) for k in stats)
    lines += [f"{k:<{width}}  {v}" for k, v in stats.items()]
    return "\n".join(lines)
