"""Coding-agent traces for the agent benchmark, generated from real text on this machine.

A trace is what a tool-using coding agent sends a model, step by step: a system prompt and
a task, then tool steps (an assistant tool call in OpenAI's format and the tool's output)
and, every few tool steps, a question from the user that needs an early tool output. The
tool outputs are real: Python standard-library sources (`read_file`), a unified diff made
with difflib between a stdlib file and a seeded edit of it (`git_diff`), a pytest-style log
built from the stdlib test suite's real test names (`run_tests`) and `grep -rn` over the
stdlib (`grep`). Nothing is downloaded.

Three facts are planted in the first three tool outputs (a constant in a source file, a
warning in a test log, a changed constant in a diff), each as one whole line: the evidence a
later question needs. A question is either *literal* (it names the line's identifiers) or a
*paraphrase* (it shares no content word with the line, so lexical matching cannot find the
evidence). Everything is a function of the seed and the token budget.
"""

from __future__ import annotations

import difflib
import json
import random
import sysconfig
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

MESSAGE_OVERHEAD = 5  # ChatML: <|im_start|>role\n ... <|im_end|>\n
FIRST_QUESTION_AFTER = 3  # tool steps before the first question (the facts are in 0..2)

SYSTEM = (
    "You are a careful software engineering agent working in a Python repository. Use the "
    "tools to read files, search the code, inspect changes and run the tests. Keep answers "
    "short and exact; when the user asks about something a tool showed earlier, answer "
    "from that output."
)
TASKS = (
    "The nightly upload job intermittently hangs and then fails. Find out why, look at the "
    "recent change to the locking code, and get the test suite green again.",
    "Users report that the background scheduler drops work after a restart. Investigate the "
    "configuration, the failing tests and the pending patch, then propose a fix.",
    "We are preparing a release. Review the pending change, run the tests, and check that "
    "the configuration constants are consistent across the modules that use them.",
)
TOOLS: tuple[dict[str, Any], ...] = (
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the repository and return its text.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string", "description": "repository path"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "git_diff",
            "description": "Show the uncommitted changes to a file as a unified diff.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "run_tests",
            "description": "Run pytest on a test file or directory and return the log.",
            "parameters": {
                "type": "object",
                "properties": {"target": {"type": "string"}},
                "required": ["target"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "grep",
            "description": "Search the repository with grep -rn and return the matching lines.",
            "parameters": {
                "type": "object",
                "properties": {"pattern": {"type": "string"}, "path": {"type": "string"}},
                "required": ["pattern"],
            },
        },
    },
)
TOOL_NAMES = tuple(t["function"]["name"] for t in TOOLS)
ACK = "Understood. Continuing with the task."

BIRDS = ("kestrel", "heron", "osprey", "plover", "wren", "curlew", "merlin", "dunlin")
GREP_PATTERNS = ("timeout", "raise ValueError", "def close", "encoding=", "self._lock", "os.path")

# words that carry no content: a paraphrase may share these with the planted line
STOPWORDS = frozenset(
    """a an the and or but if of to in on at by for from with as is are was were be been
    being it its this that these those what which who whom how many much when where why
    does do did done has have had after before into out up down over under again than then
    so not no yes you your we our i me my he she they them their there here py ms s""".split()
)

# --------------------------------------------------------------------------- the facts


@dataclass(frozen=True)
class Fact:
    """One planted line: `line` is put verbatim into tool step `step`'s output."""

    name: str
    tool: str
    step: int
    line: str
    answer: str
    literal: tuple[str, ...]
    paraphrase: tuple[str, ...]


def make_facts(rng: random.Random) -> tuple[Fact, ...]:
    budget = rng.randint(11, 97)
    delay = rng.randint(1000, 9999)
    shard = f"{rng.choice(BIRDS)}-{rng.randint(10, 99)}"
    lineno = rng.randint(120, 480)
    stale = rng.choice((45, 90, 120, 240, 300, 600, 900))
    return (
        Fact(
            name="config",
            tool="read_file",
            step=0,
            line=f"MAX_RETRY_BUDGET = {budget}",
            answer=str(budget),
            literal=(
                "What is MAX_RETRY_BUDGET set to in the file you read?",
                "Quick check: which value does the MAX_RETRY_BUDGET constant hold?",
                "Before you go on, tell me the MAX_RETRY_BUDGET value from that module.",
            ),
            paraphrase=(
                "How many times will the code try an operation again after it fails, "
                "before giving up?",
                "What is the upper limit on repeated attempts after a failure, according to "
                "the source you opened first?",
                "If a request keeps failing, after how many further attempts does the "
                "program stop?",
            ),
        ),
        Fact(
            name="log",
            tool="run_tests",
            step=1,
            line=(
                f"WARNING  pool:scheduler.py:{lineno} lease expired after {delay} ms; "
                f"shard {shard} reassigned"
            ),
            answer=shard,
            literal=(
                "Which shard was reassigned when the lease expired in the test run?",
                "The test log had a lease expired warning: which shard did it name?",
                "In that pytest output, which shard got reassigned?",
            ),
            paraphrase=(
                "During the tests, which partition got handed over to another process "
                "because its hold timed out?",
                "Which data partition changed owners when a claim ran out of time in the "
                "test output?",
                "When the job's reservation lapsed in the suite you ran, which partition "
                "moved elsewhere?",
            ),
        ),
        Fact(
            name="diff",
            tool="git_diff",
            step=2,
            line=f"+STALE_LOCK_SECONDS = {stale}",
            answer=str(stale),
            literal=(
                "What did the diff set STALE_LOCK_SECONDS to?",
                "In the change you showed, what is the new STALE_LOCK_SECONDS value?",
                "Which number does the patch give STALE_LOCK_SECONDS?",
            ),
            paraphrase=(
                "After the patch, how long must a held mutex sit idle before it is "
                "considered abandoned?",
                "How much time must pass before an old file guard is treated as dead, per "
                "the change under review?",
                "With the pending edit applied, what is the age at which an unreleased "
                "guard counts as orphaned?",
            ),
        ),
    )


def content_words(text: str) -> set[str]:
    """Lower-cased words of `text` (identifiers split at `_` and case changes, digits kept
    as words) minus STOPWORDS: what a literal question shares with its evidence."""
    words, cur = [], []
    prev = ""
    for ch in text:
        if ch.isalnum():
            if cur and ch.isupper() and prev.islower():
                words.append("".join(cur))
                cur = []
            cur.append(ch)
        elif cur:
            words.append("".join(cur))
            cur = []
        prev = ch
    if cur:
        words.append("".join(cur))
    return {w.lower() for w in words} - STOPWORDS


def shares_content_word(question: str, line: str) -> bool:
    """True if a content word of `question` is a word of `line`, or the two share a stem
    (their first four letters, both at least four long): "retries" matches "retry"."""
    q, evidence = content_words(question), content_words(line)
    if q & evidence:
        return True
    stems = {w[:4] for w in evidence if len(w) >= 4}
    return any(len(w) >= 4 and w[:4] in stems for w in q)


# --------------------------------------------------------------------------- real sources


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


@cache
def source_files() -> tuple[Path, ...]:
    """Stdlib modules of 12-200 KB outside the test suite and site-packages, sorted."""
    root = stdlib_root()
    out = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).parts
        if rel[0] in ("test", "site-packages", "idlelib", "lib2to3") or "tests" in rel:
            continue
        try:
            size = path.stat().st_size
        except OSError:
            continue
        if 12_000 <= size <= 200_000:
            out.append(path)
    return tuple(out)


@cache
def test_names() -> tuple[tuple[str, str, str], ...]:
    """(file, class, test) of the stdlib test suite, by a line scan of test_*.py files."""
    root = stdlib_root() / "test"
    out = []
    for path in sorted(root.glob("test_*.py")):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        cls = ""
        for line in lines:
            if line.startswith("class ") and "Test" in line:
                cls = line[6:].split("(")[0].split(":")[0].strip()
            elif cls and line.startswith("    def test_"):
                out.append((f"Lib/test/{path.name}", cls, line[8:].split("(")[0]))
    return tuple(out)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8", errors="replace").splitlines()


def _rel(path: Path) -> str:
    return "Lib/" + path.relative_to(stdlib_root()).as_posix()


class Budget:
    """Takes lines while their token count fits `size` (per-line counts, then the joined
    text counted once)."""

    def __init__(self, count: Callable[[str], int]):
        self.count = count

    def take(self, lines: Sequence[str], size: int, head: Sequence[str] = ()) -> str:
        out = list(head)
        used = sum(self.count(x + "\n") for x in out)
        for line in lines:
            cost = self.count(line + "\n")
            if used + cost > size:
                break
            out.append(line)
            used += cost
        return "\n".join(out)


# --------------------------------------------------------------------------- tool outputs


def read_file_output(rng, budget: Budget, size: int, fact: Fact | None) -> tuple[dict, str]:
    path = rng.choice(source_files())
    lines = _lines(path)
    if fact is None:
        start = rng.randrange(0, max(1, len(lines) - 40))
        lines = lines[start:]
    else:
        # after the module's imports, where a constant lives
        at = next((i for i, x in enumerate(lines[:400]) if x.startswith(("class ", "def "))), 0)
        lines = lines[:at] + [fact.line, ""] + lines[at:]
        return {"path": _rel(path)}, _keep_line(budget, lines, size, fact.line)
    return {"path": _rel(path)}, budget.take(lines, size)


def _keep_line(budget: Budget, lines: list[str], size: int, line: str) -> str:
    """`lines` cut to `size` tokens, keeping `line`: the window ends after it if needed."""
    text = budget.take(lines, size)
    if line in text.splitlines():
        return text
    i = lines.index(line)
    return budget.take(lines[max(0, i - 20) :], size)


def _edit(rng, lines: list[str], edits: int) -> list[str]:
    """A seeded change: some lines annotated or renamed, some deleted, comments added."""
    out = list(lines)
    for _ in range(max(3, min(edits, len(lines) // 4))):
        i = rng.randrange(len(out))
        roll = rng.random()
        if roll < 0.4 and "=" in out[i]:
            out[i] = out[i].rstrip() + "  # reviewed"
        elif roll < 0.6:
            del out[i]
        elif roll < 0.8:
            indent = out[i][: len(out[i]) - len(out[i].lstrip())]
            out.insert(i, f"{indent}# TODO: release the lock before returning")
        else:
            out[i] = out[i].replace("self", "this", 1)
    return out


def git_diff_output(rng, budget: Budget, size: int, fact: Fact | None) -> tuple[dict, str]:
    path = rng.choice(source_files())
    before = _lines(path)
    after = _edit(rng, before, size // 60)
    if fact is not None:
        at = next((i for i, x in enumerate(after[:400]) if x.startswith(("class ", "def "))), 0)
        old = fact.line[1:].split("=")[0] + "= 30"
        before = before[:at] + [old] + before[at:]
        after = after[:at] + [fact.line[1:]] + after[at:]
    rel = _rel(path)
    head = [
        f"diff --git a/{rel} b/{rel}",
        f"index {rng.getrandbits(28):07x}..{rng.getrandbits(28):07x} 100644",
    ]
    diff = [
        x.rstrip("\n")
        for x in difflib.unified_diff(before, after, f"a/{rel}", f"b/{rel}", n=3, lineterm="")
    ]
    lines = head + diff
    if fact is not None:
        return {"path": rel}, _keep_line(budget, lines, size, fact.line)
    return {"path": rel}, budget.take(lines, size)


def run_tests_output(rng, budget: Budget, size: int, fact: Fact | None) -> tuple[dict, str]:
    names = test_names()
    start = rng.randrange(0, max(1, len(names) - 2000))
    target = names[start][0]
    head = [
        "============================= test session starts ==============================",
        "platform linux -- Python 3.11.7, pytest-8.3.2, pluggy-1.5.0",
        "rootdir: /workspace/repo",
        "configfile: pyproject.toml",
        f"collected {rng.randint(300, 3000)} items",
        "",
    ]
    results, failures = [], []
    for k, (file, cls, test) in enumerate(names[start : start + 2000]):
        status = "FAILED" if rng.random() < 0.04 else "PASSED"
        results.append(f"{file}::{cls}::{test} {status} [{min(99, k // 20):3d}%]")
        if status == "FAILED":
            failures.append((file, cls, test))
    body = results[: max(20, len(results) // 2)]
    tail = ["", "=================================== FAILURES ==================================="]
    for file, cls, test in failures[:4]:
        tail += [
            f"_________________________ {cls}.{test} _________________________",
            "",
            f"self = <{file[9:-3]}.{cls} testMethod={test}>",
            "",
            f"    def {test}(self):",
            ">       self.assertEqual(result, expected)",
            "E       AssertionError: 3 != 4",
            "",
            f"{file}:{rng.randint(40, 900)}: AssertionError",
            "------------------------------ Captured log call -------------------------------",
        ]
        if fact is not None and fact.line not in tail:
            tail.append(fact.line)
        tail.append(f"INFO     pool:scheduler.py:{rng.randint(60, 400)} worker started")
    if fact is not None and fact.line not in tail:
        tail += [
            "------------------------------ Captured log call ------------------------------",
            fact.line,
        ]
    tail.append(
        f"==== {len(failures)} failed, {len(results) - len(failures)} passed in {rng.uniform(20, 300):.2f}s ===="
    )
    tail_tokens = budget.count("\n".join(tail))
    text = budget.take(body, max(0, size - tail_tokens), head=head)
    return {"target": target}, text + "\n" + "\n".join(tail)


def grep_output(rng, budget: Budget, size: int, fact: Fact | None) -> tuple[dict, str]:
    pattern = rng.choice(GREP_PATTERNS)
    files = source_files()
    start = rng.randrange(len(files))
    hits: list[str] = []
    used = 0
    for path in files[start:] + files[:start]:
        for n, line in enumerate(_lines(path), 1):
            if pattern in line:
                hit = f"{_rel(path)}:{n}:{line}"
                used += budget.count(hit + "\n")
                if used > size:
                    return {"pattern": pattern, "path": "Lib/"}, "\n".join(hits)
                hits.append(hit)
    return {"pattern": pattern, "path": "Lib/"}, "\n".join(hits)


OUTPUTS = {
    "read_file": read_file_output,
    "git_diff": git_diff_output,
    "run_tests": run_tests_output,
    "grep": grep_output,
}

# --------------------------------------------------------------------------- the trace

# "first": a client's first request, its harness and task before any tool step (agent_clients)
StepKind = Literal["tool", "question", "first"]


@dataclass(frozen=True)
class Step:
    """One model call. `messages` are appended before the call; `after` (the assistant's
    scripted reply to a question) after it. `tokens` is the conversation at the call."""

    index: int
    kind: StepKind
    messages: tuple[dict, ...]
    after: tuple[dict, ...]
    tokens: int
    added_tokens: int
    tool: str | None = None
    fact: str | None = None
    question_class: Literal["literal", "paraphrase"] | None = None
    evidence: str | None = None
    answer: str | None = None


@dataclass(frozen=True)
class Trace:
    seed: int
    target_tokens: int
    system: str
    task: str
    steps: tuple[Step, ...]
    facts: tuple[Fact, ...]
    tools: tuple[dict, ...] = field(default=TOOLS)

    def request(self, i: int, header: str = "") -> list[dict]:
        """The chat messages of step `i`'s call; `header` opens the system prompt (a run
        sends each pass as its own conversation)."""
        system = (header + "\n" + self.system) if header else self.system
        out = [{"role": "system", "content": system}, {"role": "user", "content": self.task}]
        for step in self.steps[:i]:
            out += [*step.messages, *step.after]
        return out + list(self.steps[i].messages)

    def planted_before(self, i: int) -> list[Fact]:
        """Facts whose tool output is in step `i`'s request (a trace cut short may hold
        fewer)."""
        tool_steps = [s.index for s in self.steps if s.kind == "tool"]
        return [f for f in self.facts if f.step < len(tool_steps) and tool_steps[f.step] <= i]


def message_tokens(count: Callable[[str], int], message: dict) -> int:
    n = MESSAGE_OVERHEAD + count(message.get("content") or "")
    for call in message.get("tool_calls") or ():
        n += count(call["function"]["name"] + call["function"]["arguments"]) + 4
    return n


def size_range(target: int) -> tuple[int, int]:
    """Tool output sizes: 1-8K tokens, smaller for short traces so they still have steps."""
    lo = min(1000, max(200, target // 10))
    hi = min(8000, max(lo, target // 6))
    return lo, hi


def generate(
    count: Callable[[str], int],
    target_tokens: int,
    seed: int = 0,
    question_every: int = 2,
    sizes: tuple[int, int] | None = None,
) -> Trace:
    """A trace that grows to about `target_tokens` (never over), deterministic in `seed`;
    tool outputs of `sizes` (lo, hi) tokens, by default `size_range(target_tokens)`."""
    rng = random.Random(seed)
    budget = Budget(count)
    facts = make_facts(rng)
    task = rng.choice(TASKS)
    used = MESSAGE_OVERHEAD * 2 + count(SYSTEM) + count(task) + count(json.dumps(TOOLS)) // 2
    lo, hi = sizes or size_range(target_tokens)
    steps: list[Step] = []
    asked = 0
    tool_step = 0

    def question(used: int) -> int:
        nonlocal asked
        fact = facts[asked % len(facts)]
        # every (fact, class) pair once per two rounds over the facts
        cls = ("literal", "paraphrase")[(asked % len(facts) + asked // len(facts)) % 2]
        text = rng.choice(fact.literal if cls == "literal" else fact.paraphrase)
        msg = {"role": "user", "content": text}
        ack = {"role": "assistant", "content": ACK}
        added = message_tokens(count, msg)
        steps.append(
            Step(
                len(steps),
                "question",
                (msg,),
                (ack,),
                used + added,
                added,
                None,
                fact.name,
                cls,
                fact.line,
                fact.answer,
            )  # fmt: skip
        )
        asked += 1
        return used + added + message_tokens(count, ack)

    while True:
        fact = facts[tool_step] if tool_step < len(facts) else None
        tool = fact.tool if fact else rng.choice(TOOL_NAMES)
        remaining = target_tokens - used - 60  # the call, and room for a last question
        if remaining < lo // 2 or (fact is None and remaining < 150):
            break
        size = rng.randint(lo, hi)
        if remaining - size < lo // 2:
            size = remaining
        args, text = OUTPUTS[tool](rng, budget, size, fact)
        call_id = f"call_{seed:x}{len(steps):03d}{rng.getrandbits(24):06x}"
        call = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps(args)},
                }
            ],
        }
        out = {"role": "tool", "tool_call_id": call_id, "content": text}
        added = message_tokens(count, call) + message_tokens(count, out)
        if used + added > target_tokens and fact is None:
            break
        used += added
        steps.append(
            Step(
                len(steps), "tool", (call, out), (), used, added, tool, fact.name if fact else None
            )
        )
        tool_step += 1
        if (
            tool_step >= FIRST_QUESTION_AFTER
            and (tool_step - FIRST_QUESTION_AFTER) % question_every == 0
        ):
            used = question(used)
    if steps and steps[-1].kind == "tool" and tool_step >= FIRST_QUESTION_AFTER:
        question(used)
    return Trace(seed, target_tokens, SYSTEM, task, tuple(steps), facts)
