"""What an agent step costs end to end: Claude Code's and Codex's own sessions, PFlash vs full.

Through the real app, with PFlash and with the full prompt (its prefix cache warm).

    python -m pflash_lab.bench.agent_clients [--clients claude_code codex]
        [--lengths 20480 32000] [--seed 0] [--mode always|auto] [--keep 0.1]
        [--max-tokens 256] [--target embedded|big|vllm] [--max-steps N] [--set KEY=VALUE]
        [--out DIR] | --report DIR

A *captured client session* is the client's own recorded harness (tests/fixtures/agent_clients:
the first request as recorded, its system blocks, mid-conversation system turn, instruction
blocks, tools and every other field, with its answer capped at `--max-tokens`; later steps
open as the client's second recorded request does) followed by `agent_trace`'s tool steps in
the client's own tool format: Claude Code's `Read` and `Bash` (`tool_use` / `tool_result`),
Codex's `exec_command` (`function_call` / `function_call_output`, in its output envelope).
The outputs are agent_trace's real ones (stdlib sources, diffs, test logs, grep), with its
planted facts and its questions (Claude Code: after the tool result in the same user turn, as
its API requires; Codex: a user message). The user's prompt is the trace's task. Each
session is grown until its last request is about `--lengths` tokens as the app renders it
(usage's prompt tokens, the harness included: ~12.4K for Claude Code, ~9.3K for Codex), with
tool outputs sized as agent.py's traces of that whole length (1-8K tokens).

Each step (the session's first request, then every trace step) is sent as the client sends
it, a raw JSON body streamed over HTTP to `/v1/messages?beta=true` or `/v1/responses` with
the client's headers, twice side by side (alternating which goes first, and which opens
each session, one session of a client to the next): with PFlash
(`pflash_mode` `--mode`, `pflash_keep_ratio` `--keep`, `pflash_return_prompt`) in one session
and with `pflash_mode: off` in another, each with its own session id in the client's own
fields (`metadata.user_id` and `x-claude-code-session-id`; `prompt_cache_key`, `session-id`,
`client_metadata`) and its own first line in the first instruction text, so that neither
reuses the other's prefix cache and the full path has its own warm one, as a provider's
would. At the client: TTFT (the first text or tool-call delta) and end to end (the end of
the stream), with the output tokens the target generated (a target may stop before
`--max-tokens`: reported, never normalized). At each step every instruction line and tool
schema of the request (`instruction_lines`) is looked for in the PFlash served prompt, and
at question steps the planted line (evidence kept, literal or in other words). `--max-steps
0` sends only each session's first request (the harness: no drafter pass is needed).

The app is agent.py's (`agent.serving`: serve_config.yaml's, `--target big` a random-weight
840M llama with the embedded tokenizer, whose speed does not depend on weight values; past
the embedded target's 32K context, `--set max_context=N`, a speed measurement only).
Results: DIR/steps.jsonl (a row per step, written as it ends, with the machine's load),
DIR/summary.md; `--report DIR` rewrites the summary from them. The machine may be shared:
read ratios, measured side by side, not absolute times.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import os
import shlex
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from pflash_lab.bench import agent, agent_trace
from pflash_lab.bench.harness import parse_overrides
from pflash_lab.bench.instruction_lines import instruction_lines, missing, tool_schemas
from pflash_lab.bench.launch import ROOT, scratch_dir

FIXTURES = ROOT / "tests" / "fixtures" / "agent_clients"
CLIENTS = ("claude_code", "codex")
REPO = "/work/repo"  # the recorded sessions' working directory
MIN_STEPS_TOKENS = 2048  # a session's tool steps on top of its harness, at the least
SESSION_HEADERS = ("x-claude-code-session-id", "session-id", "thread-id")

# --------------------------------------------------------------------------- the client


@dataclass(frozen=True)
class Client:
    """A recorded agent client. `first`: its first request's body (answer capped); `later`:
    its second request's body cut before the first assistant turn, the opening every later
    step extends; `session_id`: the recorded session's id, replaced per session."""

    name: str
    path: str
    headers: dict
    first: dict
    later: dict
    session_id: str

    @property
    def messages_api(self) -> bool:
        return "messages" in self.first


def conversation_key(body: dict) -> str:
    return "messages" if "messages" in body else "input"


def load_client(name: str, max_tokens: int) -> Client:
    recorded = json.loads((FIXTURES / f"{name}.json").read_text())["requests"]
    first, second = recorded[0], recorded[1]
    headers = first["headers"]
    session_id = next(headers[h] for h in SESSION_HEADERS if h in headers)
    bodies = []
    for request in (first, second):
        body = copy.deepcopy(request["body"])
        key = conversation_key(body)
        body["max_tokens" if key == "messages" else "max_output_tokens"] = max_tokens
        turns = body[key]
        cut = next(
            (i for i, t in enumerate(turns) if t.get("role") == "assistant" or "call_id" in t),
            len(turns),
        )
        body[key] = turns[:cut]
        bodies.append(body)
    path = first["path"]
    return Client(name, path, dict(headers), bodies[0], bodies[1], session_id)


# --------------------------------------------------------------------------- tool steps


def _window(path: str, text: str) -> int:
    """The line number `text` (a read_file output) starts at in the stdlib file `path`
    ("Lib/..."); 1 when not found. A planted line shifts what follows it by one."""
    file = agent_trace.stdlib_root() / path.removeprefix("Lib/")
    lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    head = text.split("\n")[:3]
    return next(
        (i + 1 for i in range(len(lines)) if lines[i : i + len(head)] == head and head[0]), 1
    )


def shell_command(tool: str, args: dict, output: str) -> str:
    """The shell command a trace tool call stands for (read_file: a line range of the file)."""
    if tool == "read_file":
        first = _window(args["path"], output)
        return f"sed -n '{first},{first + output.count(chr(10))}p' {args['path']}"
    if tool == "git_diff":
        return f"git diff -- {args['path']}"
    if tool == "run_tests":
        return f"python -m pytest {args['target']}"
    return f"grep -rn {shlex.quote(args['pattern'])} {args.get('path', '.')}"


DESCRIPTIONS = {
    "git_diff": "Show the pending change to the file",
    "run_tests": "Run the tests",
    "grep": "Search the code",
}


def claude_code_call(tool: str, args: dict, output: str) -> tuple[str, dict, str]:
    """(Claude Code tool, its input, the tool_result text) for a trace tool call: `Read`
    (absolute path, line range, lines numbered as its Read tool numbers them) or `Bash`."""
    if tool == "read_file":
        first = _window(args["path"], output)
        lines = output.split("\n")
        text = "\n".join(f"{first + i}\t{line}" for i, line in enumerate(lines))
        read = {"file_path": f"{REPO}/{args['path']}", "offset": first, "limit": len(lines)}
        return "Read", read, text
    bash = {"command": shell_command(tool, args, output), "description": DESCRIPTIONS[tool]}
    return "Bash", bash, output


def codex_output(call_id: str, tool: str, output: str) -> str:
    """`exec_command`'s output envelope, as the recorded Codex writes it."""
    failed = (tool == "run_tests" and " 0 failed" not in output) or (tool == "grep" and not output)
    chunk = hashlib.sha256(call_id.encode()).hexdigest()[:6]
    return (
        f"Chunk ID: {chunk}\nWall time: 0.0000 seconds\nProcess exited with code {int(failed)}\n"
        f"Original token count: {len(output) // 4}\nOutput:\n{output}\n"
    )


def _tool_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def claude_code_turns(chat: list[dict]) -> list[dict]:
    """Trace messages (after the task) as Claude Code sends them: each call an assistant
    `tool_use` (an assistant's text and its next call one turn), each output a user
    `tool_result` (a question after it in the same user turn)."""
    outputs = {m["tool_call_id"]: m["content"] for m in chat if m["role"] == "tool"}
    _, turns = agent.to_messages_api(chat)
    calls: dict[str, tuple[str, dict]] = {}
    out: list[dict] = []
    for turn in turns:
        for block in turn["content"]:
            if block["type"] == "tool_use":
                call_id = block["id"]
                calls[call_id] = (block["name"], block["input"])
                name, args, _ = claude_code_call(*calls[call_id], outputs[call_id])
                block.update(id=_tool_id(call_id), name=name, input=args)
            elif block["type"] == "tool_result":
                call_id = block["tool_use_id"]
                name, _, text = claude_code_call(*calls[call_id], outputs[call_id])
                block.update(tool_use_id=_tool_id(call_id), content=text)
                if name == "Bash":
                    block["is_error"] = False
        if out and out[-1]["role"] == turn["role"]:
            out[-1]["content"] += turn["content"]
        else:
            out.append(turn)
    return out


def codex_items(chat: list[dict]) -> list[dict]:
    """Trace messages (after the task) as Codex sends them: `function_call` items of
    `exec_command` and their `function_call_output`s, questions and replies as messages."""
    _, items = agent.to_responses_api(chat)
    names = {}
    out = []
    for k, item in enumerate(items):
        if item["type"] == "function_call":
            args = json.loads(item["arguments"])
            names[item["call_id"]] = item["name"]
            output = next(m["content"] for m in chat if m.get("tool_call_id") == item["call_id"])
            command = shell_command(item["name"], args, output)
            item = {
                "type": "function_call",
                "status": "completed",
                "id": f"fc_{k}",
                "name": "exec_command",
                "arguments": json.dumps({"cmd": command}),
                "call_id": item["call_id"],
            }
        elif item["type"] == "function_call_output":
            output = codex_output(item["call_id"], names[item["call_id"]], item["output"])
            item = {**item, "id": f"fco_{k}", "output": output}
        else:
            part = "input_text" if item["role"] == "user" else "output_text"
            item = {**item, "id": f"msg_{k}", "content": [{"type": part, "text": item["content"]}]}
        out.append(item)
    return out


# --------------------------------------------------------------------------- the session


@dataclass(frozen=True)
class Identity:
    """One side of a run: its session id (in the client's own fields and headers) and the
    line its first instruction text opens with, so it shares no prefix with the other side."""

    session_id: str
    line: str


@dataclass(frozen=True)
class CapturedSession:
    """A client's harness and a trace's steps in its format; `harness_tokens` is the first
    request as the app renders it (target tokens)."""

    client: Client
    trace: agent_trace.Trace
    harness_tokens: int = 0
    length: int = 0  # what it was grown to (target tokens of its last request, at most)

    def request(self, step: int | None, who: Identity, extra: dict) -> tuple[dict, dict]:
        """(headers, body) of trace step `step`'s request, or of the first (None), for `who`,
        with PFlash's fields `extra`."""
        client = self.client
        body = copy.deepcopy(client.first if step is None else client.later)
        key = conversation_key(body)
        _set_task(body[key], self.trace.task)
        if step is not None:
            chat = self.trace.request(step)[2:]  # after the trace's own system and task
            body[key] += claude_code_turns(chat) if client.messages_api else codex_items(chat)
            if client.messages_api:
                _mark_last_block(body[key])
        headers = dict(client.headers)
        text = json.dumps(body).replace(client.session_id, who.session_id)
        body = json.loads(text)
        for h in SESSION_HEADERS:
            if h in headers:
                headers[h] = headers[h].replace(client.session_id, who.session_id)
        _open_with(body, who.line)
        return headers, {**body, **extra}


def _set_task(turns: list[dict], task: str) -> None:
    """The user's prompt, the last text of the last user turn, becomes `task`."""
    user = next(t for t in reversed(turns) if t.get("role") == "user")
    if isinstance(user["content"], str):
        user["content"] = task
    else:
        user["content"][-1] = {**user["content"][-1], "text": task}


def _mark_last_block(turns: list[dict]) -> None:
    """Claude Code's cache breakpoint: on the last block of the last turn, nowhere else in
    the conversation (its system blocks keep theirs)."""
    for turn in turns:
        if isinstance(turn["content"], list):
            for block in turn["content"]:
                block.pop("cache_control", None)
    turns[-1]["content"][-1]["cache_control"] = {"type": "ephemeral"}


def _open_with(body: dict, line: str) -> None:
    """`line` opens the first instruction text: the first system block, or the first
    developer message."""
    if "system" in body:
        block = body["system"][0]
    else:
        first = next(i for i in body["input"] if i.get("role") in ("developer", "system"))
        block = first["content"][0]
    block["text"] = f"{line}\n{block['text']}"


def render_tokens(client: Client, body: dict, tokenizer) -> int:
    """The prompt tokens the app renders `body` to (the target's chat template, tools in)."""
    from pflash.flow.request import render_request
    from pflash.serving.messages.translate import EDGE as MESSAGES
    from pflash.serving.responses.translate import EDGE as RESPONSES

    edge = MESSAGES if client.messages_api else RESPONSES
    chat = edge.parse(json.dumps(body), client.headers).chat
    return len(render_request(chat, "chat", tokenizer).ids)


def harness_tokens(client: Client, seed: int, tokenizer) -> int:
    """The first request's tokens as the app renders it, with the task of `seed`'s traces."""
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    probe = CapturedSession(client, agent_trace.generate(count, 4096, seed))
    body = probe.request(None, Identity(client.session_id, "Session"), {})[1]
    return render_tokens(client, body, tokenizer)


def captured_session(
    client: Client, length: int, seed: int, tokenizer, question_every: int = 2
) -> CapturedSession:
    """`client`'s session whose last request renders to about `length` tokens (at most):
    the trace's budget is the length less the harness, shrunk until the client's format
    (line numbers, output envelopes) fits; its tool outputs are sized for `length`."""
    count = lambda text: len(tokenizer(text, add_special_tokens=False)["input_ids"])  # noqa: E731
    who = Identity(client.session_id, "Session")
    harness = harness_tokens(client, seed, tokenizer)
    if length - harness < MIN_STEPS_TOKENS:
        raise ValueError(
            f"{client.name}: length {length} leaves less than {MIN_STEPS_TOKENS} tokens of tool"
            f" steps after its harness ({harness} tokens)"
        )
    budget = length - harness
    # outputs sized as agent.py's traces of the whole length are (1-8K tokens), harness or not
    sizes = agent_trace.size_range(length)
    for _ in range(6):
        trace = agent_trace.generate(count, budget, seed, question_every, sizes)
        session = CapturedSession(client, trace, harness, length)
        total = render_tokens(client, session.request(len(trace.steps) - 1, who, {})[1], tokenizer)
        if total <= length:
            return session
        budget = int(budget * (length - harness) / (total - harness) * 0.98)
    raise RuntimeError(f"{client.name}: no trace fits {length} tokens")


# --------------------------------------------------------------------------- one call


class StepFailed(RuntimeError):
    """The app answered a step with an error (status, body, request id); `request` the body
    that failed, once known."""

    def __init__(self, message: str, request: dict | None = None):
        super().__init__(message)
        self.request = request


def sse_data(response: httpx.Response) -> Iterator[dict]:
    for line in response.iter_lines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            yield json.loads(line[5:])


def client_events(messages_api: bool, events: Iterator[dict]) -> Iterator[tuple[str, object]]:
    """A Messages or Responses stream as `agent.read_stream`'s (kind, value) pairs."""
    for d in events:
        kind = d.get("type", "")
        if kind == "error" or kind == "response.failed":
            raise StepFailed(f"200, then an error event: {json.dumps(d)[:2000]}")
        if messages_api:
            if kind == "message_start":
                yield "served", d["message"].get("pflash_prompt")
            elif kind == "content_block_delta":
                yield "delta", d["delta"].get("text") or d["delta"].get("partial_json") or ""
            elif kind == "message_delta":
                yield "usage", d["usage"]
        elif kind.endswith(
            ("output_text.delta", "arguments.delta", "custom_tool_call_input.delta")
        ):
            yield "delta", d["delta"]
        elif kind in ("response.created", "response.completed", "response.incomplete"):
            # the served prompt rides on the first chunk: response.created carries it
            yield "served", d["response"].get("pflash_prompt")
            if kind != "response.created":
                yield "usage", d["response"]["usage"]


def call(http: httpx.Client, base: str, client: Client, headers: dict, body: dict) -> dict:
    """One streamed request as the client sends it; `agent.read_stream`'s dict."""
    started = time.perf_counter()
    url = base + client.path
    with http.stream("POST", url, headers=headers, content=json.dumps(body)) as response:
        if response.status_code != 200:
            response.read()
            raise StepFailed(
                f"{response.status_code} from {client.path}"
                f" (x-request-id {response.headers.get('x-request-id')}): {response.text[:2000]}"
            )
        return agent.read_stream(
            client_events(client.messages_api, sse_data(response)), started, client.name
        )


# --------------------------------------------------------------------------- the run


def first_step(session: CapturedSession) -> agent_trace.Step:
    """The session's first request (harness and task, no tool output) as a step row's."""
    n = session.harness_tokens
    return agent_trace.Step(-1, "first", (), (), n, n)


def run_session(
    http: httpx.Client,
    base: str,
    session: CapturedSession,
    mode: str,
    keep: float,
    on_row: Callable[[dict], None],
    flip: bool = False,
) -> list[dict]:
    """The first request and every step of `session`, with PFlash and with the full prompt,
    side by side (alternating which goes first; `flip`: the full prompt first at the first
    request, so that over a run's sessions neither side always opens them)."""
    nonce = f"{time.time_ns() % 10**9:09d}"
    who = {
        "pflash": Identity(str(uuid.uuid4()), f"Session A-{nonce}"),
        "full": Identity(str(uuid.uuid4()), f"Session B-{nonce}"),
    }
    extras = {
        "pflash": {"pflash_mode": mode, "pflash_keep_ratio": keep, "pflash_return_prompt": True},
        "full": {"pflash_mode": "off"},
    }
    rows = []
    for k, step in enumerate([first_step(session), *session.trace.steps]):
        index = None if step.kind == "first" else step.index
        order = ("pflash", "full") if (k + flip) % 2 == 0 else ("full", "pflash")
        res, bodies = {}, {}
        for side in order:
            headers, bodies[side] = session.request(index, who[side], extras[side])
            try:
                res[side] = call(http, base, session.client, headers, bodies[side])
            except StepFailed as exc:
                where = f"step {step.index} ({step.kind}), {side}"
                raise StepFailed(f"{where}: {exc}", bodies[side]) from exc
        row = agent.step_row(session.trace, step, res["pflash"], res["full"])
        served = res["pflash"]["served"] or ""
        lines, schemas = instruction_lines(bodies["pflash"]), tool_schemas(bodies["pflash"])
        row.update(
            load=round(os.getloadavg()[0], 2),  # the machine is shared: its 1-min load here
            length=session.length,
            first=order[0],
            client=session.client.name,
            harness_tokens=session.harness_tokens,
            instruction_lines=len(lines),
            instructions_missing=missing(served, lines),
            tool_schemas=len(schemas),
            schemas_missing=missing(served, schemas),
        )
        rows.append(row)
        on_row(row)
    return rows


# --------------------------------------------------------------------------- the report


def _table(columns: tuple[str, ...], body: list[list]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in cells) + " |" for cells in body])


def _pair(rows: list[dict], what: str) -> list[str]:
    """Summed PFlash / full (s) and the ratio full / PFlash."""
    on = sum(r[f"{what}_pflash_ms"] for r in rows) / 1000
    off = sum(r[f"{what}_full_ms"] for r in rows) / 1000
    return [f"{on:.1f} s / {off:.1f} s", f"**{off / on:.2f}×**"]


def _median_ratio(rows: list[dict], what: str) -> str:
    return f"{statistics.median(r[f'{what}_full_ms'] / r[f'{what}_pflash_ms'] for r in rows):.2f}×"


def decode_ms(r: dict, side: str) -> float | None:
    """Time per generated token after the first (ms): what the answer's length costs."""
    n = r[f"output_tokens_{side}"]
    return (r[f"e2e_{side}_ms"] - r[f"ttft_{side}_ms"]) / (n - 1) if n and n > 1 else None


def _decode(rows: list[dict]) -> str:
    def med(side: str) -> str:
        values = [v for r in rows if (v := decode_ms(r, side)) is not None]
        return f"{statistics.median(values):.0f}" if values else "—"

    return f"{med('pflash')} / {med('full')}"


def _tokens(rows: list[dict], cap: int) -> str:
    on = [r["output_tokens_pflash"] for r in rows]
    off = [r["output_tokens_full"] for r in rows]
    short = f"{sum(n < cap for n in on)} / {sum(n < cap for n in off)}"
    return f"{sum(on):,} / {sum(off):,} ({short} under {cap})"


def _kept(rows: list[dict], cls: str) -> str:
    qs = [r for r in rows if r["kind"] == "question" and r["question_class"] == cls]
    return f"{sum(r['evidence_kept'] for r in qs)}/{len(qs)}" if qs else "—"


def _instructions(rows: list[dict]) -> str:
    lines = sum(r["instruction_lines"] for r in rows)
    schemas = sum(r["tool_schemas"] for r in rows)
    lost = sum(len(r["instructions_missing"]) for r in rows)
    lost_schemas = sum(len(r["schemas_missing"]) for r in rows)
    return f"{lines - lost}/{lines} / {schemas - lost_schemas}/{schemas}"


SUMMARY_COLUMNS = (
    "client",
    "length",
    "steps",
    "first request: TTFT PFlash / full",
    "ratio",
    "e2e PFlash / full",
    "ratio",
    "drafter tokens",
    "steps: TTFT PFlash / full (summed)",
    "ratio",
    "e2e PFlash / full (summed)",
    "ratio",
    "median step ratio TTFT / e2e",
    "session e2e ratio (first + steps)",
    "decode ms/token PFlash / full (median)",
    "output tokens PFlash / full",
    "evidence kept: literal",
    "other words",
    "instruction lines / schemas kept",
)


def summary(rows: list[dict], cap: int) -> str:
    """Per client and length: the first request, then the steps after it summed."""
    body = []
    for client in dict.fromkeys(r["client"] for r in rows):
        for length in sorted({r["length"] for r in rows if r["client"] == client}):
            rs = [r for r in rows if r["client"] == client and r["length"] == length]
            first = [r for r in rs if r["kind"] == "first"]
            steps = [r for r in rs if r["kind"] != "first"]
            body.append(
                [client, f"{rs[-1]['prompt_tokens']:,}", len(steps)]
                + (
                    [*_pair(first, "ttft"), *_pair(first, "e2e"), first[0]["drafter_new_tokens"]]
                    if first
                    else ["—"] * 5
                )
                + (
                    [
                        *_pair(steps, "ttft"),
                        *_pair(steps, "e2e"),
                        f"{_median_ratio(steps, 'ttft')} / {_median_ratio(steps, 'e2e')}",
                    ]
                    if steps
                    else ["—"] * 5
                )
                + [
                    _pair(rs, "e2e")[1],
                    _decode(rs),
                    _tokens(rs, cap),
                    _kept(rs, "literal"),
                    _kept(rs, "paraphrase"),
                    _instructions(rs),
                ]
            )
    return _table(SUMMARY_COLUMNS, body)


STEP_COLUMNS = (
    "client",
    "length",
    "step",
    "kind",
    "prompt",
    "served",
    "TTFT PFlash / full",
    "ratio",
    "e2e PFlash / full",
    "ratio",
    "output tokens PFlash / full",
    "compress ms",
    "drafter tokens",
    "view",
    "recalled",
    "evidence",
    "missing lines / schemas",
    "load",
)


def _side_by_side(r: dict, what: str) -> list[str]:
    on, off = r[f"{what}_pflash_ms"], r[f"{what}_full_ms"]
    return [f"{on:.0f} / {off:.0f} ms", f"{off / on:.2f}×"]


def step_table(rows: list[dict]) -> str:
    body = []
    for r in rows:
        kind, evidence = agent.step_cells(r)
        body.append(
            [
                r["client"],
                f"{r['length']:,}",
                r["step"],
                kind,
                f"{r['prompt_tokens']:,}",
                f"{r['served_tokens'] or 0:,}",
                *_side_by_side(r, "ttft"),
                *_side_by_side(r, "e2e"),
                f"{r['output_tokens_pflash']} / {r['output_tokens_full']}",
                f"{r['compress_ms']:.0f}",
                r["drafter_new_tokens"],
                r["view"],
                r["recalled_tokens"],
                evidence,
                f"{len(r['instructions_missing'])} / {len(r['schemas_missing'])}",
                r["load"],
            ]
        )
    return _table(STEP_COLUMNS, body)


def write_summary(out: Path, rows: list[dict], meta: dict) -> str:
    intro = (
        f"Target `{meta['target']}`, mode `{meta['mode']}`, keep {meta['keep']}, seed"
        f" {meta['seed']}, answers capped at {meta['max_tokens']} tokens; started"
        f" {meta['started']}, commit `{meta['commit']}`. Ratio = full / PFlash (over 1 ="
        " PFlash faster); length = the session's last prompt (tokens, harness included);"
        " e2e = the end of the streamed answer at the client. The first request is the"
        " harness and the task; the steps are the tool and question steps after it."
    )
    title = "Agent clients' sessions: what a step costs end to end, PFlash vs the full prompt"
    table = summary(rows, meta["max_tokens"])
    return agent.write_summary(out, title, meta["command"], intro, table, step_table(rows))


def read_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line]


# --------------------------------------------------------------------------- main


def _commit() -> str:
    import subprocess

    run = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return run.stdout.strip() or "unknown"


def warm_up(http: httpx.Client, base: str, client: Client, mode: str) -> None:
    """One short request of the client's API per path, with tools (the app asks a template
    once whether it renders them), before any session's first request is timed."""
    tools = agent_trace.TOOLS
    for side in ("off", mode):
        if client.messages_api:
            body = {
                "model": "pflash",
                "max_tokens": 4,
                "messages": [{"role": "user", "content": "Say hello."}],
                "tools": agent.messages_tools(tools),
            }
        else:
            body = {
                "model": "pflash",
                "max_output_tokens": 4,
                "input": "Say hello.",
                "tools": agent.responses_tools(tools),
            }
        headers = {"content-type": "application/json"}
        call(http, base, client, headers, {**body, "stream": True, "pflash_mode": side})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", nargs="+", choices=CLIENTS, default=list(CLIENTS))
    parser.add_argument(
        "--lengths",
        type=int,
        nargs="+",
        default=[20480],
        help="the session's last prompt in target tokens, the client's harness included",
    )
    parser.add_argument(
        "--max-steps", type=int, default=None, help="cut each session's steps (0: first requests)"
    )
    parser.add_argument("--max-tokens", type=int, default=256, help="each answer's cap")
    parser.add_argument(
        "--full-first",
        action="store_true",
        help="the full prompt opens the run's first session (then sessions alternate as before)",
    )
    agent.add_session_arguments(parser)
    parser.add_argument("--report", type=Path, help="only rewrite DIR/summary.md from its rows")
    args = parser.parse_args(argv)
    if args.report:
        meta = json.loads((args.report / "meta.json").read_text())
        print(write_summary(args.report, read_rows(args.report), meta))
        return 0
    from pflash.models.source import load_tokenizer

    tok = load_tokenizer("embedded:smollm2-135m")
    clients = [load_client(name, args.max_tokens) for name in args.clients]
    sessions = []
    for length in args.lengths:
        for client in clients:
            session = captured_session(client, length, args.seed, tok, args.question_every)
            if args.max_steps is not None:
                cut = agent._first_steps(session.trace, args.max_steps)
                session = CapturedSession(client, cut, session.harness_tokens, length)
            sessions.append((length, session))
            print(
                f"{client.name} {length}: harness {session.harness_tokens} tokens,"
                f" {len(session.trace.steps)} steps",
                flush=True,
            )
    out = args.out or Path(tempfile.mkdtemp(prefix="pflash-agent-clients-"))
    out.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": "python -m pflash_lab.bench.agent_clients " + " ".join(argv or sys.argv[1:]),
        "mode": args.mode,
        "keep": args.keep,
        "seed": args.seed,
        "max_tokens": args.max_tokens,
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "commit": _commit(),
    }
    (out / "steps.jsonl").write_text("")
    rows: list[dict] = []

    def keep_row(row: dict) -> None:
        with (out / "steps.jsonl").open("a") as f:
            f.write(json.dumps(row) + "\n")
        brief = {k: v for k, v in row.items() if k not in ("pflash", "evidence_held")}
        brief["instructions_missing"] = len(row["instructions_missing"])
        brief["schemas_missing"] = len(row["schemas_missing"])
        print(json.dumps(brief), flush=True)

    work = scratch_dir("pflash-agent-clients-")
    overrides = parse_overrides(args.set)
    app = agent.serving(
        work, args.target, args.keep, args.threshold, overrides, args.big_spec, args.base_url
    )
    failed = None
    with app as (base, target), httpx.Client(timeout=httpx.Timeout(7200, connect=30)) as http:
        meta["target"] = target
        (out / "meta.json").write_text(json.dumps(meta, indent=1))
        for client in clients:
            warm_up(http, base, client, args.mode)
        for n, (length, session) in enumerate(sessions):
            try:
                # each client's sessions alternate which side opens them
                flip = (n // len(clients) + args.full_first) % 2 == 1
                rows += run_session(http, base, session, args.mode, args.keep, keep_row, flip)
            except StepFailed as exc:  # a product error: reported, the next session runs
                failed = f"{session.client.name} {length}: {exc}"
                print(f"FAILED {failed}", file=sys.stderr, flush=True)
                with (out / "failures.txt").open("a") as f:
                    f.write(failed + "\n")
                name = f"failed-{session.client.name}-{length}.json"
                (out / name).write_text(json.dumps(exc.request))
    rows = read_rows(out)
    text = write_summary(out, rows, meta)
    print()
    print(text)
    print(f"written to {out}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
