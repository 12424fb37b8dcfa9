"""Long-context drafter benchmark: dense vs windowed vs block-sparse drafter
attention, and where the window's sink keys are read from (`drafter_sink_positions`).

`python -m pflash_lab.bench.long_context [--lengths 8192 16384] [--modes dense window block_sparse]
[--sink-positions absolute adjacent] [--seeds 2]`

Per prompt length, `--seeds` haystacks of real text (the license texts under
/usr/share/common-licenses, then docstrings and comments of the Python standard library
beyond ~70K tokens; paragraphs shuffled per seed). Each holds:
- five needles ("The special magic <animal> number is: <7 digits>."), a different animal at
  each of the five depths; each is asked for alone, so the other four are same-shaped
  distractors;
- two three-fact projects (budget, leader, city of one made-up project at three seeded
  depths), each asked for in one question: kept only if all three facts survive.
Every question goes last and is compressed through the real path (`compress_in_process`,
the embedded SmolLM2-135M as drafter and target tokenizer, product defaults otherwise) at
keep 0.1 and 0.05. The first question of a haystack runs the full drafter pass (its time is
the one reported, per 1K tokens too); the later ones resume the text from the drafter's
session, which scores exactly as a fresh pass (`tests/unit/test_drafter_window.py`), and
their median time is reported apart.

Each (length, mode, sink positions) runs in its own subprocess so the peak RSS is that
case's alone (the model load is in it too: `rss_loaded_mb` is the peak right after loading).
Torch runs with `--threads` threads (1 by default: the machine is shared and the numbers
compare).
"""

from __future__ import annotations

import argparse
import ast
import io
import json
import random
import resource
import subprocess
import sys
import sysconfig
import time
import tokenize
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

LICENSES = Path("/usr/share/common-licenses")
EMBEDDED = "embedded:smollm2-135m"
DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)
KEEPS = (0.1, 0.05)
ANIMALS = ("otter", "heron", "lynx", "badger", "falcon", "walrus", "ibex", "marmot")


# --------------------------------------------------------------------------- haystack


def license_paragraphs() -> Iterator[str]:
    """Paragraphs of every license text once (GPL and GPL-3 are the same file)."""
    seen = set()
    if not LICENSES.is_dir():
        return
    for p in sorted(LICENSES.iterdir()):
        real = p.resolve()
        if not real.is_file() or real in seen:
            continue
        seen.add(real)
        text = real.read_text(encoding="utf-8", errors="replace")
        for block in text.split("\n\n"):
            if len(block.split()) >= 8:
                yield " ".join(block.split())


def stdlib_paragraphs() -> Iterator[str]:
    """Docstrings of every stdlib module, class and function, then its comment blocks."""
    root = Path(sysconfig.get_paths()["stdlib"])
    for p in sorted(root.rglob("*.py")):
        if "test" in p.parts or "idlelib" in p.parts:
            continue
        source = p.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(source)
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= 8:
                    yield " ".join(doc.split())
        comments: list[str] = []
        try:
            for tok in tokenize.generate_tokens(io.StringIO(source).readline):
                if tok.type == tokenize.COMMENT:
                    comments.append(tok.string.lstrip("#").strip())
                elif tok.type not in (tokenize.NL, tokenize.NEWLINE) and comments:
                    if len(" ".join(comments).split()) >= 8:
                        yield " ".join(comments)
                    comments = []
        except (tokenize.TokenError, SyntaxError):
            continue


def haystack(tokenizer, n_tokens: int) -> list[str]:
    """Paragraphs of real text adding up to about `n_tokens` target tokens."""
    out, used = [], 0
    for source in (license_paragraphs, stdlib_paragraphs):
        for paragraph in source():
            out.append(paragraph)
            used += len(tokenizer(paragraph, add_special_tokens=False)["input_ids"]) + 1
            if used >= n_tokens:
                return out
    raise RuntimeError(f"not enough text on this machine for {n_tokens} tokens (got {used})")


# Multi-fact family: three facts about one made-up project, asked for in one question. The
# project names, people and places are invented so no text on the machine mentions them.
PROJECTS = (
    "Halcyon",
    "Vantor",
    "Quillmere",
    "Ostrel",
    "Brindlewick",
    "Corvane",
    "Tessaly",
    "Morrow",
)
PEOPLE = ("Mirela Okafor", "Tomas Vendel", "Ines Harrowgate", "Kofi Lindqvist", "Aiko Brannigan")
CITIES = ("Port Savel", "Lyndrath", "Caer Hollis", "Westmere Quay", "Dunmarrow")
MULTI_FACT_PER_HAYSTACK = 2


@dataclass(frozen=True)
class Question:
    """One question over a haystack: every string of `answers` must survive compression."""

    family: str  # "needle" (one number) or "multi_fact" (three facts, one question)
    depths: tuple[float, ...]  # where its facts sit, as fractions of the haystack
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True)
class Haystack:
    """Real text with five needles (a different animal at each depth: the other four are
    same-shaped distractors for each needle question) and `MULTI_FACT_PER_HAYSTACK`
    three-fact projects at seeded depths. Every question is asked of the same text, so one
    drafter pass over the text serves them all (a session resumes each question)."""

    body: str
    questions: tuple[Question, ...]


def build_haystack(paragraphs: list[str], depths: tuple[float, ...], seed: int) -> Haystack:
    """Facts inserted between `paragraphs` (shuffled by `seed` so each seed reads other text
    around them); the needle numbers, projects and fact depths are drawn from `seed`."""
    if len(depths) > len(ANIMALS):
        raise ValueError(
            f"at most {len(ANIMALS)} needle depths (each needle a different animal),"
            f" {len(depths)} given"
        )
    rng = random.Random(seed)
    text = list(paragraphs)
    rng.shuffle(text)
    inserts: list[tuple[float, str]] = []
    questions: list[Question] = []
    animals = rng.sample(ANIMALS, len(depths))
    for depth, animal in zip(depths, animals, strict=True):
        number = str(rng.randrange(1_000_000, 10_000_000))
        inserts.append((depth, f"The special magic {animal} number is: {number}."))
        questions.append(
            Question(
                "needle",
                (depth,),
                f"What is the special magic {animal} number mentioned in the text above?",
                (number,),
            )
        )
    for project in rng.sample(PROJECTS, MULTI_FACT_PER_HAYSTACK):
        budget = str(rng.randrange(1_000, 10_000))
        person, city = rng.choice(PEOPLE), rng.choice(CITIES)
        at = tuple(sorted(round(rng.uniform(0.05, 0.95), 3) for _ in range(3)))
        facts = (
            f"The budget of Project {project} was fixed at {budget} thousand credits.",
            f"Project {project} is led by an engineer called {person}.",
            f"The records of Project {project} are kept in the city of {city}.",
        )
        order = rng.sample(range(3), 3)  # which fact sits where
        inserts.extend((at[i], facts[order[i]]) for i in range(3))
        questions.append(
            Question(
                "multi_fact",
                at,
                f"For Project {project}: what was its budget, who leads it, and in which city"
                " are its records kept?",
                (budget, person, city),
            )
        )
    for depth, fact in sorted(inserts, reverse=True):  # from the back: indices stay valid
        text.insert(round(depth * len(paragraphs)), fact)
    return Haystack("\n\n".join(text), tuple(questions))


def question_messages(haystack: Haystack, question: Question) -> tuple[dict, ...]:
    return ({"role": "user", "content": f"{haystack.body}\n\nQuestion: {question.question}"},)


def kept(question: Question, served_text: str) -> bool:
    return all(a in served_text for a in question.answers)


# --------------------------------------------------------------------------- one case


@dataclass(frozen=True)
class CaseResult:
    length: int  # target tokens of the prompt (mean over haystacks)
    mode: str
    haystacks: int
    questions: dict  # family -> questions asked
    drafter_s: float  # mean full drafter pass over a haystack (its first question), wall clock
    drafter_cpu_s: float  # the same pass in process CPU time (robust on a loaded machine)
    resume_s: float  # median pass for the later questions (the session resumes the text)
    ms_per_1k: float  # wall
    cpu_ms_per_1k: float
    rss_loaded_mb: float
    peak_rss_mb: float
    kept: dict  # keep ratio (str) -> family -> questions whose answers all survived
    misses: list  # [keep, family, depths] of every question that lost an answer
    window: int
    sink: int
    sink_positions: str = "absolute"


class CpuTimed:
    """A scorer wrapper recording the process CPU time of its last call: with torch on one
    thread that is the pass's compute, whatever else the machine runs."""

    def __init__(self, scorer):
        self.scorer = scorer
        self.cpu_s = 0.0

    def __call__(self, request):
        t0 = time.process_time()
        try:
            return self.scorer(request)
        finally:
            self.cpu_s = time.process_time() - t0


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def run_case(
    length: int,
    mode: str,
    depths: tuple[float, ...],
    *,
    window: int,
    sink: int,
    threads: int,
    block: int = 128,
    top: int = 8,
    seeds: int = 1,
    sink_positions: str = "adjacent",
    keeps: tuple[float, ...] = KEEPS,
    overrides: dict | None = None,
) -> CaseResult:
    """Every question of `seeds` haystacks for one (length, mode) with one loaded drafter."""
    import statistics

    import torch

    from pflash.compress.render.rendered import render_chat_prompt
    from pflash.config import build_config
    from pflash.flow.in_process import ScoreOnce, compress_in_process
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.models.loading import load_causal_lm
    from pflash.models.probe import probe_for
    from pflash.models.source import load_tokenizer

    torch.set_num_threads(threads)
    base = {
        "mode": "always",
        "drafter": EMBEDDED,
        "drafter_attention": mode,
        "drafter_window_tokens": window,
        "drafter_sink_tokens": sink,
        "drafter_sink_positions": sink_positions,
        "drafter_block_tokens": block,
        "drafter_top_blocks": top,
        "drafter_sessions": 2,
        **(overrides or {}),
    }
    configs = {k: build_config({**base, "keep_ratio": k}, env={}) for k in keeps}
    first = configs[keeps[0]]
    tokenizer = load_tokenizer(EMBEDDED)
    scorer = DrafterScorer(first, load_causal_lm(first.drafter))
    probe = probe_for(first, scorer)
    rss_loaded = peak_rss_mb()
    paragraphs = haystack(tokenizer, length)
    kept_n: dict = {str(k): {} for k in keeps}
    asked: dict = {}
    misses: list = []
    full, cpu, resumes, lengths = [], [], [], []
    for seed in range(seeds):
        stack = build_haystack(paragraphs, depths, seed)
        for qi, question in enumerate(stack.questions):
            prompt = render_chat_prompt(tokenizer, question_messages(stack, question))
            timed = CpuTimed(scorer)
            once = ScoreOnce(timed)
            asked[question.family] = asked.get(question.family, 0) + 1
            for keep in keeps:
                result = compress_in_process(
                    prompt,
                    configs[keep],
                    target_tokenizer=tokenizer,
                    drafter_tokenizer=tokenizer,
                    scorer=once,
                    probe=probe,
                    conversation=f"haystack-{seed}",
                )
                by_family = kept_n[str(keep)]
                hit = kept(question, result.served_text)
                by_family[question.family] = by_family.get(question.family, 0) + hit
                if not hit:
                    misses.append([keep, question.family, list(question.depths)])
            if qi == 0:
                lengths.append(len(prompt.ids))
                full.append(once.last_ms / 1000)
                cpu.append(timed.cpu_s)
            else:
                resumes.append(once.last_ms / 1000)
            print(
                f"  {mode} {len(prompt.ids)} tokens seed {seed} {question.family}"
                f" {question.depths}: drafter {once.last_ms / 1000:.1f} s",
                file=sys.stderr,
                flush=True,
            )
        scorer.sessions.drop(f"haystack-{seed}")  # peak RSS is one haystack's, as served
    n = sum(lengths) / len(lengths)
    drafter_s = sum(full) / len(full)
    cpu_s = sum(cpu) / len(cpu)
    return CaseResult(
        length=round(n),
        mode=mode,
        haystacks=seeds,
        questions=asked,
        drafter_s=round(drafter_s, 2),
        drafter_cpu_s=round(cpu_s, 2),
        resume_s=round(statistics.median(resumes), 2) if resumes else 0.0,
        ms_per_1k=round(drafter_s * 1000 / (n / 1000), 1),
        cpu_ms_per_1k=round(cpu_s * 1000 / (n / 1000), 1),
        rss_loaded_mb=round(rss_loaded),
        peak_rss_mb=round(peak_rss_mb()),
        kept=kept_n,
        misses=misses,
        window=window,
        sink=sink,
        sink_positions=sink_positions,
    )


# --------------------------------------------------------------------------- report


def mode_label(r: CaseResult) -> str:
    sinks = " (sinks next to the window)" if r.sink_positions == "adjacent" else ""
    return {
        "dense": "dense",
        "window": f"window {r.window} + sink {r.sink}{sinks}",
        "block_sparse": f"block-sparse: window {r.window} + sink {r.sink}{sinks} + top blocks",
    }[r.mode]


def table(rows: list[CaseResult]) -> str:
    def rate(r: CaseResult, keep: str, family: str) -> str:
        return f"{r.kept[keep].get(family, 0)}/{r.questions.get(family, 0)}"

    keeps = list(rows[0].kept) if rows else []
    head = (
        "| tokens | drafter attention | drafter wall s | drafter CPU s | CPU ms / 1K tok "
        "| later question s | peak RSS MB | "
        + " | ".join(f"needles @{k}" for k in keeps)
        + " | "
        + " | ".join(f"multi-fact @{k}" for k in keeps)
        + " |"
    )
    out = [head, "|---" * (7 + 2 * len(keeps)) + "|"]
    for r in rows:
        out.append(
            f"| {r.length} | {mode_label(r)} | {r.drafter_s} | {r.drafter_cpu_s} "
            f"| {r.cpu_ms_per_1k} | {r.resume_s} | {r.peak_rss_mb} | "
            + " | ".join(rate(r, k, "needle") for k in keeps)
            + " | "
            + " | ".join(rate(r, k, "multi_fact") for k in keeps)
            + " |"
        )
    return "\n".join(out)


def run_child(args, length: int, mode: str, positions: str) -> CaseResult:
    """One (length, mode, sink positions) in a subprocess of its own: its peak RSS alone."""
    cmd = [sys.executable, "-m", "pflash_lab.bench.long_context", "--one"]
    cmd += ["--lengths", str(length), "--modes", mode, "--depths", *map(str, args.depths)]
    for flag in ("window", "sink", "block", "top", "threads", "seeds"):
        cmd += [f"--{flag}", str(getattr(args, flag))]
    cmd += ["--sink-positions", positions, "--keeps", *map(str, args.keeps)]
    cmd += ["--set", *args.set]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
    row = CaseResult(**json.loads(out.strip().splitlines()[-1]))
    print(
        f"{length} {mode_label(row)}: {row.drafter_s} s/pass (cpu {row.drafter_cpu_s}), "
        f"peak {row.peak_rss_mb} MB, kept {row.kept} of {row.questions} "
        f"({time.perf_counter() - t0:.0f} s)",
        file=sys.stderr,
        flush=True,
    )
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32768])
    ap.add_argument(
        "--modes",
        nargs="+",
        choices=["dense", "window", "block_sparse"],
        default=["dense", "window", "block_sparse"],
    )
    ap.add_argument("--depths", type=float, nargs="+", default=list(DEPTHS))
    ap.add_argument("--window", type=int, default=2048, help="drafter_window_tokens")
    ap.add_argument("--sink", type=int, default=64, help="drafter_sink_tokens")
    ap.add_argument("--block", type=int, default=128, help="drafter_block_tokens")
    ap.add_argument("--top", type=int, default=8, help="drafter_top_blocks")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seeds", type=int, default=1, help="haystacks per (length, mode)")
    ap.add_argument("--keeps", type=float, nargs="+", default=list(KEEPS), help="keep ratios")
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="config overrides for every row (e.g. select_lexical=off: the drafter's scores alone)",
    )
    ap.add_argument(
        "--sink-positions",
        nargs="+",
        choices=["absolute", "adjacent"],
        default=["adjacent"],
        help="drafter_sink_positions of the window and block-sparse modes (each one a row; "
        "default: the product's)",
    )
    ap.add_argument(
        "--dense-max", type=int, default=32768, help="skip dense above this many tokens"
    )
    ap.add_argument("--json", type=Path, help="also write the rows as JSON lines here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process
    args = ap.parse_args(argv)
    if len(args.depths) > len(ANIMALS):  # before any child process loads a model
        ap.error(f"--depths: at most {len(ANIMALS)} (each needle a different animal)")
    if args.one:  # one (length, mode) in this process, result as JSON on stdout
        r = run_case(
            args.lengths[0],
            args.modes[0],
            tuple(args.depths),
            window=args.window,
            sink=args.sink,
            threads=args.threads,
            block=args.block,
            top=args.top,
            seeds=args.seeds,
            sink_positions=args.sink_positions[0],
            keeps=tuple(args.keeps),
            overrides=dict(kv.split("=", 1) for kv in args.set),
        )
        print(json.dumps(asdict(r)))
        return 0
    rows = []
    for length in args.lengths:
        for mode in args.modes:
            if mode == "dense" and length > args.dense_max:
                continue
            for positions in ["absolute"] if mode == "dense" else args.sink_positions:
                row = run_child(args, length, mode, positions)
                rows.append(row)
                if args.json:
                    with args.json.open("a") as f:
                        f.write(json.dumps(asdict(row)) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
