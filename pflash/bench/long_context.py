"""Long-context drafter benchmark (issue 15): dense vs windowed vs block-sparse drafter
attention.

`python -m pflash.bench.long_context [--lengths 8192 16384] [--modes dense window block_sparse]`

For each prompt length and attention mode: one needle ("The special magic <animal> number
is: <7 digits>.") at each of five depths of real text (the license texts under
/usr/share/common-licenses, then docstrings and comments of the Python standard library
beyond ~70K tokens), the question for it last, compressed through the real path
(`compress_in_process`, the embedded SmolLM2-135M as drafter and target tokenizer, product
defaults) at keep 0.1 and 0.05 from one drafter pass. Reported: the drafter pass time (and
per 1K tokens), the process's peak RSS, and at each keep how many depths kept the number.

Each (length, mode) runs in its own subprocess so the peak RSS is that case's alone (the
model load is in it too: `rss_loaded_mb` is the peak right after loading). Torch runs with
`--threads` threads (1 by default: the machine is shared and the numbers compare).
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


@dataclass(frozen=True)
class NeedleCase:
    """One chat with one needle: the number must survive compression."""

    depth: float
    animal: str
    number: str
    messages: tuple[dict, ...]


def needle_case(paragraphs: list[str], depth: float, seed: int) -> NeedleCase:
    rng = random.Random(seed)
    animal = ANIMALS[seed % len(ANIMALS)]
    number = str(rng.randrange(1_000_000, 10_000_000))
    fact = f"The special magic {animal} number is: {number}."
    at = round(depth * len(paragraphs))
    body = "\n\n".join(paragraphs[:at] + [fact] + paragraphs[at:])
    question = f"What is the special magic {animal} number mentioned in the text above?"
    messages = ({"role": "user", "content": f"{body}\n\nQuestion: {question}"},)
    return NeedleCase(depth, animal, number, messages)


# --------------------------------------------------------------------------- one case


@dataclass(frozen=True)
class CaseResult:
    length: int  # target tokens of the prompt (mean over depths)
    mode: str
    depths: int
    drafter_s: float  # mean drafter pass over depths, wall clock
    drafter_cpu_s: float  # the same pass in process CPU time (robust on a loaded machine)
    ms_per_1k: float  # wall
    cpu_ms_per_1k: float
    rss_loaded_mb: float
    peak_rss_mb: float
    kept: dict  # keep ratio (str) -> depths whose number survived
    window: int
    sink: int


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
) -> CaseResult:
    """Every depth of one (length, mode) with one loaded drafter (this process)."""
    import torch

    from pflash.compress.rendered import render_chat_prompt
    from pflash.compressor import ScoreOnce, compress_in_process
    from pflash.config import build_config
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
        "drafter_block_tokens": block,
        "drafter_top_blocks": top,
        "drafter_sessions": 0,
    }
    configs = {k: build_config({**base, "keep_ratio": k}, env={}) for k in KEEPS}
    first = configs[KEEPS[0]]
    tokenizer = load_tokenizer(EMBEDDED)
    scorer = DrafterScorer(first, load_causal_lm(first.drafter))
    probe = probe_for(first, scorer)
    rss_loaded = peak_rss_mb()
    paragraphs = haystack(tokenizer, length)
    kept = {str(k): 0 for k in KEEPS}
    times, cpu, lengths = [], [], []
    for i, depth in enumerate(depths):
        case = needle_case(paragraphs, depth, seed=i)
        prompt = render_chat_prompt(tokenizer, case.messages)
        lengths.append(len(prompt.ids))
        timed = CpuTimed(scorer)
        once = ScoreOnce(timed)
        for keep in KEEPS:
            result = compress_in_process(
                prompt,
                configs[keep],
                target_tokenizer=tokenizer,
                drafter_tokenizer=tokenizer,
                scorer=once,
                probe=probe,
            )
            kept[str(keep)] += case.number in result.served_text
        times.append(once.last_ms / 1000)
        cpu.append(timed.cpu_s)
        print(
            f"  {mode} {len(prompt.ids)} tokens depth {depth}: drafter {times[-1]:.1f} s"
            f" (cpu {cpu[-1]:.1f} s)",
            file=sys.stderr,
            flush=True,
        )
    n = sum(lengths) / len(lengths)
    drafter_s = sum(times) / len(times)
    cpu_s = sum(cpu) / len(cpu)
    return CaseResult(
        length=round(n),
        mode=mode,
        depths=len(depths),
        drafter_s=round(drafter_s, 2),
        drafter_cpu_s=round(cpu_s, 2),
        ms_per_1k=round(drafter_s * 1000 / (n / 1000), 1),
        cpu_ms_per_1k=round(cpu_s * 1000 / (n / 1000), 1),
        rss_loaded_mb=round(rss_loaded),
        peak_rss_mb=round(peak_rss_mb()),
        kept=kept,
        window=window,
        sink=sink,
    )


# --------------------------------------------------------------------------- report


def table(rows: list[CaseResult]) -> str:
    head = (
        "| tokens | drafter attention | drafter wall s | drafter CPU s | CPU ms / 1K tok "
        "| RSS after load MB "
        "| peak RSS MB | needle kept @0.1 | needle kept @0.05 |"
    )
    out = [head, "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        mode = {
            "dense": "dense",
            "window": f"window {r.window} + sink {r.sink}",
            "block_sparse": f"block-sparse: window {r.window} + sink {r.sink} + top blocks",
        }[r.mode]
        out.append(
            f"| {r.length} | {mode} | {r.drafter_s} | {r.drafter_cpu_s} | {r.cpu_ms_per_1k} "
            f"| {r.rss_loaded_mb} "
            f"| {r.peak_rss_mb} | {r.kept['0.1']}/{r.depths} | {r.kept['0.05']}/{r.depths} |"
        )
    return "\n".join(out)


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
    ap.add_argument(
        "--dense-max", type=int, default=32768, help="skip dense above this many tokens"
    )
    ap.add_argument("--json", type=Path, help="also write the rows as JSON lines here")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # child process
    args = ap.parse_args(argv)
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
        )
        print(json.dumps(asdict(r)))
        return 0
    rows = []
    for length in args.lengths:
        for mode in args.modes:
            if mode == "dense" and length > args.dense_max:
                continue
            cmd = [
                sys.executable,
                "-m",
                "pflash.bench.long_context",
                "--one",
                "--lengths",
                str(length),
                "--modes",
                mode,
                "--depths",
                *map(str, args.depths),
                "--window",
                str(args.window),
                "--sink",
                str(args.sink),
                "--block",
                str(args.block),
                "--top",
                str(args.top),
                "--threads",
                str(args.threads),
            ]
            t0 = time.perf_counter()
            out = subprocess.run(cmd, check=True, stdout=subprocess.PIPE, text=True).stdout
            row = CaseResult(**json.loads(out.strip().splitlines()[-1]))
            rows.append(row)
            print(
                f"{length} {mode}: {row.drafter_s} s/pass (cpu {row.drafter_cpu_s}), peak {row.peak_rss_mb} MB, "
                f"kept {row.kept} ({time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
            if args.json:
                with args.json.open("a") as f:
                    f.write(json.dumps(asdict(row)) + "\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
