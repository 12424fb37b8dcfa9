"""Later steps: what a question step and a tool step cost as a conversation grows.

Run: `python -m pflash_lab.bench.later_steps [--lengths 8000 32000 65000] [--threads 1]`.
One conversation per length, in process, through the server's own `Compressor` with
serve_config.yaml's args (`mode: always`), a view store, drafter sessions, and the ingress's
`EncodingMemo` for the render: a stdlib code document of N tokens with a planted line and
"Summarize", then one step adding a 2K-token test log and seven ~25-token questions. Per
length it prints the medians over the question steps of the render (the ingress's template
and encoding, paid with or without PFlash) and of the compression path (`Compressor.run_sync`:
planning, the view decision, the drafter's forward and mass, selection, assembly), split
into the drafter call (`drafter_wait_ms`: its forward over the step's tokens, their
attention mass over every key, the embedder) and the rest, and the same for the tool step;
`--json FILE` writes every step. The issue's bounds: a step's compression within 0.3 s
plus the drafter's cost of what it adds, and a step at 64K within 1.5x of the same step at
8K. The start-up heap is frozen (`deployments.resources.freeze_startup_heap`), as in every
replica.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sysconfig
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
FACT = "# NOTE: the spare key is kept under the blue flowerpot by the back door.\n"
QUESTIONS = (
    "Where is the spare key kept?",
    "Which worker handled the batch that took the longest?",
    "Tell me what the code does with temporary files.",
    "Where is the spare key kept again?",
    "Which function parses the command line?",
    "What does the log say about worker-3?",
    "How are errors reported in this code?",
)
ANSWER = "It is a set of Python modules."


@dataclass(frozen=True)
class Step:
    """One step of one conversation: what it added and where its time went (ms)."""

    length: int
    step: int
    kind: str  # "first", "tool" or "question"
    prompt_tokens: int
    drafter_new_tokens: int
    render_ms: float
    path_ms: float
    compress_ms: float
    plan_ms: float
    select_ms: float
    scorer_forward_ms: float
    drafter_ms: float  # the drafter call: its forward, the question rows' mass, embeddings


def log_lines(lines: int = 60) -> str:
    return "\n".join(
        f"2026-12-05 10:{i // 60:02d}:{i % 60:02d} INFO worker-{i % 7} processed batch {i * 37}"
        f" in {i % 13 + 2} ms"
        for i in range(lines)
    )


def document(tokenizer, length: int) -> str:
    """`length` tokens of stdlib source with FACT planted at a line break in the middle."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)
    parts: list[str] = []
    for p in files:  # source runs ~3.5 characters a token here: 6 a token is enough text
        parts.append(p.read_text(encoding="utf-8", errors="replace"))
        if sum(map(len, parts)) > 6 * length:
            break
    text = "\n\n".join(parts)
    doc = tokenizer.decode(tokenizer(text)["input_ids"][:length])
    cut = doc.rfind("\n", 0, len(doc) // 2) + 1
    return doc[:cut] + FACT + doc[cut:]


def conversation(doc: str) -> list[list[dict]]:
    """The chats of each step, one conversation growing: document, tool output, questions."""
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": doc + "\n\nSummarize what this code does."},
    ]
    chats = [messages]
    for turn in ("Here is the test log:\n" + log_lines(), *QUESTIONS):
        messages = [
            *messages,
            {"role": "assistant", "content": ANSWER},
            {"role": "user", "content": turn},
        ]
        chats.append(messages)
    return chats


def in_process_flow(parts: dict, max_context: int = 1 << 20):
    """The server's `Compressor` over `parts` (`load_parts`) in this process: the drafter
    and probe called directly, its own view store. `max_context` defaults to one no served
    view is ever cut to (these benches measure the flow, not a target's context)."""
    from pflash.flow.compressor import Compressor
    from pflash.flow.in_process import LocalProbe, LocalStore, local_scorer
    from pflash.views.adaptive import AdaptiveKeep
    from pflash.views.store import ViewStore

    config, tokenizer, probe = parts["config"], parts["tokenizer"], parts["probe"]
    return Compressor(
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=local_scorer(parts["scorer"]),
        probe=LocalProbe(probe) if probe is not None else None,
        store=LocalStore(ViewStore.from_config(config), AdaptiveKeep.from_config(config)),
        max_context=max_context,
    )


def run_length(length: int, parts: dict) -> list[Step]:
    """Every step of one conversation of `length` document tokens."""
    from pflash.compress.text.encoding_memo import EncodingMemo
    from pflash.flow.request import compression_request, render_request
    from pflash.serving.admission import request_params
    from pflash.serving.chat_completion.serving import parse_chat_request

    config, tokenizer = parts["config"], parts["tokenizer"]
    flow = in_process_flow(parts)
    memo = EncodingMemo()  # the ingress's, one per replica
    out = []
    for i, messages in enumerate(conversation(document(tokenizer, length))):
        req = parse_chat_request(
            {"messages": messages, "max_tokens": 32, "session_id": f"later-{length}"}
        )
        t0 = time.perf_counter()
        prompt = render_request(req, "chat", tokenizer, memo=memo, scope="tenant-a")
        t1 = time.perf_counter()
        result = flow.run_sync(
            compression_request(req, prompt, config, "tenant-a", request_params(req, config))
        )
        t2 = time.perf_counter()
        stats = result.stats
        out.append(
            Step(
                length=length,
                step=i,
                kind="first" if i == 0 else "tool" if i == 1 else "question",
                prompt_tokens=len(prompt.ids),
                drafter_new_tokens=int(stats.get("scorer_new_tokens", 0)),
                render_ms=(t1 - t0) * 1e3,
                path_ms=(t2 - t1) * 1e3,
                compress_ms=float(stats.get("compress_ms", 0.0)),
                plan_ms=float(stats.get("plan_ms", 0.0)),
                select_ms=float(stats.get("select_ms", 0.0)),
                scorer_forward_ms=float(stats.get("scorer_forward_ms", 0.0)),
                drafter_ms=float(stats.get("drafter_wait_ms", 0.0)),
            )
        )
    return out


def load_parts(overrides: dict | None = None) -> dict:
    """serve_config.yaml's args with `mode: always` (and `overrides`), the embedded drafter
    as the scorer."""
    from pflash.cli.compress import load_drafter
    from pflash.config import build_config
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.probe import probe_for
    from pflash.models.source import load_tokenizer

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    config = build_config({**args, "mode": "always", **(overrides or {})}, env={})
    scorer = DrafterScorer(config, load_drafter(config.drafter))
    return {
        "config": config,
        "tokenizer": load_tokenizer(config.target),
        "scorer": scorer,
        "probe": probe_for(config, scorer),
    }


def table(steps: list[Step]) -> str:
    """Medians per length: question steps and the tool step, render and compression path."""
    lines = [
        "| conversation | question steps | render | compression path | of it: drafter / rest "
        "| of the rest: plan / select | tool step: new tokens, render + path |",
        "|---|---|---|---|---|---|---|",
    ]
    for length in sorted({s.length for s in steps}):
        q = [s for s in steps if s.length == length and s.kind == "question"]
        tool = [s for s in steps if s.length == length and s.kind == "tool"]

        def med(field: str, rows: list[Step] = q) -> float:
            return statistics.median(getattr(s, field) for s in rows)

        tool_cell = (
            f"{tool[0].drafter_new_tokens}, {tool[0].render_ms:.0f} + {tool[0].path_ms:.0f} ms"
            if tool
            else "-"
        )
        rest = statistics.median(s.path_ms - s.drafter_ms for s in q)
        lines.append(
            f"| {length:,} | {len(q)} | {med('render_ms'):.0f} ms | {med('path_ms'):.0f} ms"
            f" | {med('drafter_ms'):.0f} / {rest:.0f} ms"
            f" | {med('plan_ms'):.0f} / {med('select_ms'):.0f} ms | {tool_cell} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[8000, 32000, 65000])
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a replica's)")
    parser.add_argument("--json", type=Path, help="write every step here")
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    parts = load_parts()
    from deployments.resources import freeze_startup_heap

    freeze_startup_heap()  # as every replica does once it has loaded its models
    steps = [s for n in args.lengths for s in run_length(n, parts)]
    if args.json:
        args.json.write_text(json.dumps([asdict(s) for s in steps], indent=1))
    print(table(steps))


if __name__ == "__main__":
    main()
