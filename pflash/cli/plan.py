"""`pflash plan FILE`: show how PFlash reads a prompt — turns, query windows, pinned spans.

FILE is a chat request (`{"messages": [...], "tools"?, "pflash_query"?, "pflash_required"?,
"chat_template_kwargs"?, "chat_template"?}`), a raw completion (`{"prompt": "..."}`), or
plain text. Chats are rendered with the target tokenizer's template, exactly as the server
does, then planned with `pflash.query.plan_prompt`. All token indices printed are drafter
tokens. `--json` prints one JSON object with the same content.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pflash.compress.plan.query import Plan, plan_prompt
from pflash.compress.render.chat import render_chat
from pflash.config import EMBEDDED_SMOLLM2, build_config
from pflash.errors import PFlashError
from pflash.spans import Span

PREVIEW_CHARS = 60


def run_plan(args) -> int:
    """Entry point wired in pflash.cli; returns the process exit code (0 ok, 1 error)."""
    try:
        request = _read_request(Path(args.file))
        from pflash.models.source import load_tokenizer

        target_spec = args.target_tokenizer or EMBEDDED_SMOLLM2
        drafter_spec = args.drafter or EMBEDDED_SMOLLM2
        target = load_tokenizer(target_spec)
        drafter = load_tokenizer(drafter_spec)
        query = args.query if args.query is not None else request.get("pflash_query")
        required = (
            args.required if args.required is not None else request.get("pflash_required") or ()
        )
        messages = request.get("messages")
        kwargs = dict(request.get("chat_template_kwargs") or {})
        if messages is not None:
            prompt_text = render_chat(
                target,
                messages,
                tools=request.get("tools"),
                enable_thinking=kwargs.get("enable_thinking"),
                chat_template=request.get("chat_template"),
                template_kwargs={k: v for k, v in kwargs.items() if k != "enable_thinking"},
            )
        else:
            prompt_text = request["prompt"]
        plan = plan_prompt(
            prompt_text=prompt_text,
            drafter_tokenizer=drafter,
            target_tokenizer=target,
            config=build_config().selection,
            messages=messages,
            tools=request.get("tools"),
            chat_template_kwargs=kwargs,
            pflash_query=query,
            pflash_required=tuple(required),
            chat_template=request.get("chat_template"),
        )
    except (PFlashError, OSError, ValueError) as err:
        print(f"pflash plan: {getattr(err, 'message', err)}", file=sys.stderr)
        return 1
    report = describe_plan(plan, drafter=drafter_spec, target=target_spec)
    if args.json:
        print(json.dumps(report, ensure_ascii=False))
    else:
        print(format_report(report))
    return 0


def _read_request(path: Path) -> dict[str, Any]:
    raw = path.read_text(encoding="utf-8")
    try:
        data = json.loads(raw)
    except json.JSONDecodeError:
        return {"prompt": raw}
    if not isinstance(data, dict) or not ("messages" in data or "prompt" in data):
        raise ValueError(f'{path}: a JSON file must be an object with "messages" (or "prompt")')
    if "prompt" in data and not isinstance(data["prompt"], str):
        raise ValueError(f'{path}: "prompt" must be a string')
    return data


def _span_text(plan: Plan, span: Span) -> str:
    begin, end = plan.drafter.char_span(span)
    return plan.drafter.text[begin:end]


def _preview(text: str) -> str:
    if len(text) <= 2 * PREVIEW_CHARS + 3:
        return text
    return text[:PREVIEW_CHARS] + " … " + text[-PREVIEW_CHARS:]


def describe_plan(plan: Plan, *, drafter: str, target: str) -> dict[str, Any]:
    """The plan as plain data (what `--json` prints): every span as [begin, end) drafter
    tokens with the text it covers (turn contents as first/last 60 characters)."""
    layout = plan.layout
    turns = []
    if layout is not None:
        for k, t in enumerate(layout.turns):
            content = plan.drafter.text[t.char_content_begin : t.char_content_end]
            turns.append(
                {
                    "index": k,
                    "role": t.role,
                    "span": t.span.as_list(),
                    "header": t.header.as_list(),
                    "content": t.content.as_list(),
                    "closed": t.closed,
                    "query_turn": k == layout.query_turn_index,
                    "generation_prompt": k == layout.generation_turn_index,
                    "content_preview": _preview(content),
                }
            )
    pins = {}
    for name in ("required", "system", "instruction_role"):
        pins[name] = [
            {"span": s.as_list(), "tokens": len(s), "text": _span_text(plan, s)}
            for s in getattr(plan, name)
        ]
    pinned = plan.pinned()
    return {
        "drafter": drafter,
        "target": target,
        "input_kind": plan.input_kind,
        "drafter_tokens": plan.n_tokens,
        "family": layout.family if layout is not None else None,
        "special_markers": layout.special_markers if layout is not None else None,
        "generation_begin": plan.generation_begin,
        "later_turns": layout.later_turns if layout is not None else False,
        "turns": turns,
        "query_parser": plan.query_parser,
        "query_rule": plan.query_rule,
        "query_span": plan.query_span.as_list(),
        "query_span_text": _span_text(plan, plan.query_span),
        "content": plan.content.as_list() if plan.content is not None else None,
        "windows": [
            {
                "kind": w.kind,
                "weight": w.weight,
                "span": w.span.as_list(),
                "text": _span_text(plan, w.span),
            }
            for w in plan.windows()
        ],
        "history": [h.as_list() if h is not None else None for h in plan.history],
        "query_suffix_candidates": plan.query_suffix_candidates,
        "pinned": pins,
        "pinned_tokens": sum(len(s) for s in pinned),
    }


def format_report(report: dict[str, Any]) -> str:
    """Human-readable form of `describe_plan`."""
    q = json.dumps  # quotes and escapes newlines, so whitespace is visible
    n = report["drafter_tokens"]
    lines = [
        f"prompt: {n} drafter tokens ({report['input_kind']}; drafter {report['drafter']}, target {report['target']})",
    ]
    if report["family"] is None:
        lines.append("chat markers: none")
    else:
        kind = "special tokens" if report["special_markers"] else "plain text"
        lines.append(
            f"chat markers: {report['family']} ({kind}); generation prompt at {report['generation_begin']}"
            + ("; agent loop (turns after the query turn)" if report["later_turns"] else "")
        )
        lines.append("turns:")
        for t in report["turns"]:
            flags = [("closed" if t["closed"] else "open")]
            if t["query_turn"]:
                flags.append("query turn")
            if t["generation_prompt"]:
                flags.append("generation prompt")
            b, e = t["span"]
            cb, ce = t["content"]
            lines.append(
                f"  #{t['index']:<3} {t['role']:<10} [{b}, {e})  content [{cb}, {ce})  {', '.join(flags)}"
            )
            lines.append(f"        {q(t['content_preview'], ensure_ascii=False)}")
    lines.append(f"query rule: {report['query_rule']} (parser {report['query_parser']})")
    qb, qe = report["query_span"]
    lines.append(
        f"query span: [{qb}, {qe})  {q(_preview(report['query_span_text']), ensure_ascii=False)}"
    )
    lines.append("windows:")
    for w in report["windows"]:
        b, e = w["span"]
        lines.append(
            f"  {w['kind']:<8} weight {w['weight']:.3f}  [{b}, {e})  {q(_preview(w['text']), ensure_ascii=False)}"
        )
    lines.append(f"query_suffix_candidates: {str(report['query_suffix_candidates']).lower()}")
    lines.append(f"pinned spans ({report['pinned_tokens']} of {n} tokens):")
    for name, spans in report["pinned"].items():
        if not spans:
            lines.append(f"  {name:<17} (none)")
        for s in spans:
            b, e = s["span"]
            lines.append(
                f"  {name:<17} [{b}, {e}) {s['tokens']:>5} tok  {q(_preview(s['text']), ensure_ascii=False)}"
            )
    return "\n".join(lines)
