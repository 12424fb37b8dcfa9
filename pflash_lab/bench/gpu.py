"""The GPU check: one command that exercises and measures the GPU deployment in minutes.

    python -m pflash_lab.bench.gpu [--out gpu.json] [--budget-s 480]    # on one GPU
    python -m pflash_lab.bench.gpu --dry-run [--out dry.json]            # the same code, CPU, tiny

Library only: no Ray, no deployments, no downloads, nothing read from disk but the Python
standard library's own sources (the prompt text and the tokenizer's training text). Every
model is built here with random weights from a config written in this file, because speed
does not depend on weight values; every timing in the table says so (`random weights`).

Three steps, each under a time guard (`Budget`: a step whose estimate, scaled from the step
before it, does not fit in what is left is skipped with the estimate and the reason):

1. correctness: the scorer's masses and taps on tiny random-weight llama, qwen3 and qwen3_5
   drafters, dense, window and block-sparse drafter attention, on the device in float32 and
   in bfloat16 against the CPU in float32 (`TOLERANCE` per dtype). The dry run compares the
   CPU with itself in float32 and with bfloat16 on the CPU: the same code, the same checks.
2. drafter: a random-weight drafter with Qwen3-0.6B's shape (`qwen3_06b_config`) compresses
   8K-128K-token prompts (keep 0.1) through `compress_in_process`, the flow the serving app
   runs, with a random-weight segment probe of the tap's width and a random-weight sentence
   embedder with all-MiniLM-L6-v2's shape: time to the scoring layer, scoring, probe,
   semantic evidence and selection; peak GPU memory; dense, window and block-sparse.
3. TTFT: a random-weight target with a 32B-class shape (`target_32b_config`, Qwen2.5-32B's
   dimensions, bfloat16, built on the GPU) prefilled in full vs compressed (keep 0.1) at 32K
   and 128K, the drafter on the same GPU. `ratio` = full prefill / (compression + compressed
   prefill); `ideal` = full prefill / compressed prefill (a drafter that cost nothing).

The dry run (`--dry-run`) runs every step at tiny sizes on the CPU, so CI keeps the script
from rotting (tests/unit/test_bench_gpu.py); its numbers measure nothing.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import sys
import sysconfig
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

SPEED_NOTE = "random weights: speed does not depend on weight values"
KINDS = ("llama", "qwen3", "qwen3_5")
ATTENTIONS = ("dense", "window", "block_sparse")
# max |device - cpu float32| / max |cpu float32|, per dtype the device ran in. float32: the
# same math in another kernel order; bfloat16: 8 mantissa bits through every layer below the
# scoring layer (measured on the CPU: masses within 0.9%, taps within 2% of their largest value)
TOLERANCE = {"float32": {"mass": 1e-4, "tap": 1e-4}, "bfloat16": {"mass": 0.05, "tap": 0.05}}


@dataclass(frozen=True)
class Plan:
    """Sizes of one run. `gpu` is the measurement; `dry` the same code at tiny sizes."""

    name: str
    device: str
    dtypes: tuple[str, ...]  # the dtypes the device is checked in against the CPU's float32
    drafter: dict  # Qwen3Config keyword arguments
    target: dict  # Qwen2Config keyword arguments
    drafter_tokens: tuple[int, ...]
    ttft_tokens: tuple[int, ...]
    embedder: dict  # BertConfig keyword arguments
    probe_width: int
    correctness_tokens: int = 90
    text_chars: int = 400_000  # standard-library text the tokenizer trains on and prompts use
    cpu_threads: int | None = None  # torch's CPU threads (None: torch's default)
    budget_s: float = 480.0


def qwen3_06b_config() -> dict:
    """Qwen3-0.6B's shape (its config.json): 28 layers, GQA 16/8, head_dim 128, tied head."""
    return dict(
        hidden_size=1024,
        num_hidden_layers=28,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        intermediate_size=3072,
        vocab_size=151936,
        tie_word_embeddings=True,
        max_position_embeddings=40960,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )


def target_32b_config() -> dict:
    """Qwen2.5-32B's shape (its config.json): 64 layers, hidden 5120, GQA 40/8, FFN 27648."""
    return dict(
        hidden_size=5120,
        num_hidden_layers=64,
        num_attention_heads=40,
        num_key_value_heads=8,
        intermediate_size=27648,
        vocab_size=152064,
        tie_word_embeddings=False,
        max_position_embeddings=131072,
        rms_norm_eps=1e-6,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
    )


MINILM = dict(  # all-MiniLM-L6-v2's shape
    hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536
)

GPU = Plan(
    name="gpu",
    device="cuda",
    dtypes=("float32", "bfloat16"),
    drafter=qwen3_06b_config(),
    target=target_32b_config(),
    drafter_tokens=(8192, 32768, 65536, 131072),
    ttft_tokens=(32768, 131072),
    embedder=MINILM,
    probe_width=256,
)

DRY = Plan(
    name="dry",
    device="cpu",
    dtypes=("float32", "bfloat16"),
    drafter=qwen3_06b_config()
    | dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
    | dict(head_dim=16, intermediate_size=96, vocab_size=2048),
    target=target_32b_config()
    | dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
    | dict(intermediate_size=96, vocab_size=2048),
    drafter_tokens=(512, 1024),
    ttft_tokens=(512, 1024),
    embedder=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64),
    probe_width=16,
    correctness_tokens=60,
    text_chars=60_000,
    cpu_threads=1,  # tiny matmuls: threads only contend on a shared CI machine
    budget_s=600.0,  # every step runs: on a loaded 2-core CI machine the dry run takes 1-2 min
)


# --------------------------------------------------------------------------- time guard


@dataclass
class Budget:
    """Wall-clock budget of the whole run; `fits` says whether a step estimated at
    `estimate_s` still fits, and records why not."""

    total_s: float
    started: float = field(default_factory=time.perf_counter)
    skipped: list[dict] = field(default_factory=list)

    def left(self) -> float:
        return self.total_s - (time.perf_counter() - self.started)

    def fits(self, step: str, estimate_s: float, basis: str) -> bool:
        if estimate_s <= self.left():
            return True
        self.skipped.append(
            {
                "step": step,
                "reason": f"estimated {estimate_s:.0f} s ({basis}) > {self.left():.0f} s left",
            }
        )
        print(f"skipped {step}: {self.skipped[-1]['reason']}", flush=True)
        return False


def scaled(seconds: float, tokens: int, to_tokens: int, exponent: float = 2.0) -> float:
    """A step's estimate at `to_tokens` from its time at `tokens`: quadratic by default
    (dense attention's worst case), so the guard errs on the side of skipping."""
    return seconds * (to_tokens / tokens) ** exponent


# --------------------------------------------------------------------------- device helpers


def synchronize(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak_gib(device: str) -> float | None:
    """Peak memory allocated on the GPU since `reset_peak`, GiB (None on the CPU)."""
    import torch

    if not device.startswith("cuda"):
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def random_causal_lm(kind: str, config: dict, device: str, dtype: str):
    """A random-weight causal LM built where it runs, in `dtype` (a 32B-class target in
    bfloat16 is 65 GB: built on the GPU it never passes through host memory)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

    cls = {"qwen3": Qwen3Config, "qwen2": Qwen2Config}[kind]
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cls(**config), dtype=getattr(torch, dtype))
    return model.eval()


def loaded(model, architecture: str):
    from pflash.models.loading import LoadedModel
    from pflash.models.source import ModelSource

    return LoadedModel(
        model, ModelSource(f"random:{architecture}", Path(".")), None, 0.0, False, architecture
    )


# --------------------------------------------------------------------------- text and tokenizer


def stdlib_text(min_chars: int) -> str:
    """Real prose and code that ships with every Python: the standard library's sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    parts, size = [], 0
    for p in sorted(root.glob("*.py")):
        text = p.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text)
        if size >= min_chars:
            break
    return "\n\n".join(parts)


def bpe_tokenizer(text: str):
    """A byte-level BPE (vocabulary 1500) trained here on standard-library sources: a real
    tokenizer without a download, shared by the target and the drafter."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "[PAD]", "[CLS]", "[SEP]"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator([text], trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        model_max_length=1 << 20,
    )


def prompt_of(tokenizer, body_ids: list[int], n_tokens: int, run: int) -> str:
    """A prompt of about `n_tokens` tokens: standard-library text with a needle at 50% and
    the question last (the query the completion prompt's tail parser finds)."""
    reps = n_tokens // max(1, len(body_ids)) + 1
    ids = (body_ids * reps)[: n_tokens - 40]
    body = tokenizer.decode(ids)
    mid = len(body) // 2
    needle = f"\nThe special magic code for run {run} is {7300000 + run}.\n"
    return body[:mid] + needle + body[mid:] + f"\n\nWhat is the special magic code for run {run}?"


def random_embedder(directory: Path, tokenizer, config: dict) -> str:
    """Save a random-weight BERT (the sentence embedder's architecture) with `tokenizer` as
    an HF directory the semantic embedder loads like any local one; returns its path."""
    from transformers import BertConfig, BertModel

    BertModel(BertConfig(vocab_size=len(tokenizer), **config)).save_pretrained(str(directory))
    tokenizer.save_pretrained(str(directory))
    return str(directory)


def random_probe(n_embd: int, width: int):
    """A random-weight segment probe reading a tap of `n_embd` features (its cost is a
    LayerNorm and two small matmuls per token, whatever the weights)."""
    import torch

    from pflash.compress.plan.segments import ProbeParams
    from pflash.models.probe import ProbeIdentity, ProbeNet, SegmentProbe

    torch.manual_seed(0)
    net = ProbeNet(n_embd, width).eval()
    identity = ProbeIdentity("random", "random", "random", "0" * 64, n_embd)
    return SegmentProbe(net, ProbeParams(0.5, 8, 512), identity, "random")


# --------------------------------------------------------------------------- 1. correctness


def _score_tiny(model, kind: str, attention: str, n: int):
    """Mass and tap of a tiny drafter over a fixed random prompt (two query windows)."""
    import torch

    from pflash.compress.plan.query import QueryWindow
    from pflash.compress.scoring import ScoreRequest
    from pflash.config import UNTUNED_SCORING, build_config
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash.spans import Span

    settings = UNTUNED_SCORING | {
        "drafter_head_layer": {"llama": 2, "qwen3": 2, "qwen3_5": 7}[kind],
        "drafter_chunk_tokens": 16,
        "drafter_attention": attention,
        "drafter_window_tokens": 24,
        "drafter_sink_tokens": 4,
        "drafter_block_tokens": 16,
        "drafter_top_blocks": 1,
        "drafter_sessions": 0,
        "projection_gguf": None,
        "select_semantic_weight": 0.0,  # the scorer's own numbers: no embedder loaded
    }
    arch = {"llama": "llama", "qwen3": "qwen3", "qwen3_5": "qwen35"}[kind]
    scorer = DrafterScorer(build_config(settings, env={}), loaded(model, arch))
    ids = tuple(torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(7)).tolist())
    windows = (
        QueryWindow(Span(n - 4, n), 1.0, "main"),
        QueryWindow(Span(n - 30, n - 24), 1.0, "turn"),
    )
    result = scorer(ScoreRequest(ids=ids, windows=windows, query=Span(n - 4, n), want_tap=True))
    return result.mass, result.tap


def check_correctness(plan: Plan, budget: Budget) -> list[dict]:
    """Device (in each of `plan.dtypes`) against the CPU in float32, per model and attention."""
    import torch

    from pflash.models.gguf_io import tiny_decoder

    rows = []
    for kind in KINDS:
        cpu = tiny_decoder(kind, layers={"qwen3_5": 8}.get(kind, 4), seed=5)
        for attention in ATTENTIONS:
            if not budget.fits(f"correctness {kind} {attention}", 5.0, "5 s per tiny model"):
                continue
            ref_mass, ref_tap = _score_tiny(cpu, kind, attention, plan.correctness_tokens)
            for dtype in plan.dtypes:
                model = copy.deepcopy(cpu).to(device=plan.device, dtype=getattr(torch, dtype))
                mass, tap = _score_tiny(model, kind, attention, plan.correctness_tokens)
                err = {
                    "mass": float(np.abs(mass - ref_mass).max() / np.abs(ref_mass).max()),
                    "tap": float(np.abs(tap - ref_tap).max() / np.abs(ref_tap).max()),
                }
                tol = TOLERANCE[dtype]
                rows.append(
                    {
                        "model": kind,
                        "attention": attention,
                        "device": plan.device,
                        "dtype": dtype,
                        "mass_rel_err": round(err["mass"], 7),
                        "tap_rel_err": round(err["tap"], 7),
                        "tolerance": tol,
                        "ok": err["mass"] <= tol["mass"] and err["tap"] <= tol["tap"],
                    }
                )
                del model
    return rows


# --------------------------------------------------------------------------- 2. the drafter


@dataclass
class StageClock:
    """The scorer and probe as the flow calls them, timed: `score_ms` the whole drafter
    call, `probe_ms` the probe's, `extras` the drafter's own split (semantic_ms)."""

    scorer: Callable
    probe: Any
    device: str
    score_ms: float = 0.0
    probe_ms: float = 0.0
    result: Any = None

    def score(self, request):
        t0 = time.perf_counter()
        self.result = self.scorer(request)
        self.score_ms = (time.perf_counter() - t0) * 1000
        return self.result

    def segment(self, scores):
        t0 = time.perf_counter()
        out = self.probe(scores)
        synchronize(self.device)
        self.probe_ms = (time.perf_counter() - t0) * 1000
        return out


class _ProbeCall:
    def __init__(self, clock: StageClock):
        self.clock = clock
        self.params = clock.probe.params

    def __call__(self, scores):
        return self.clock.segment(scores)


def pipeline_config(plan: Plan, attention: str, embedder_dir: str, max_context: int):
    from pflash.config import UNTUNED_SCORING, build_config

    return build_config(
        UNTUNED_SCORING
        | {
            "mode": "always",
            "keep_ratio": 0.1,
            "curve": (),
            "drafter_attention": attention,
            "drafter_sessions": 0,  # every prompt is cold: nothing resumed, nothing held
            "segment_probe_gguf": "random",  # the flow asks for the tap the probe reads
            "select_segments": "probe",
            "semantic_embedder": embedder_dir,
            "projection_gguf": None,
            "max_context": max_context,
            "device": "cpu" if plan.device == "cpu" else "cuda",
        },
        env={},
    )


def compress_timed(prompt, config, tokenizer, scorer, probe, device: str) -> dict:
    """One compression through the serving flow, split into its stages (ms)."""
    from pflash.flow.in_process import compress_in_process

    clock = StageClock(scorer, probe, device)
    t0 = time.perf_counter()
    result = compress_in_process(
        prompt,
        config,
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=clock.score,
        probe=_ProbeCall(clock),
    )
    total = (time.perf_counter() - t0) * 1000
    extras = clock.result.extras
    semantic = float(extras.get("semantic_ms", 0.0))
    forward = float(clock.result.scorer_forward_ms) - semantic
    return {
        "drafter_tokens": result.stats.get("drafter_input_tokens"),
        "served_tokens": len(result.served_ids),
        "to_scoring_layer_ms": round(forward, 1),
        "scoring_ms": round(clock.score_ms - forward - semantic, 1),
        "probe_ms": round(clock.probe_ms, 1),
        "semantic_ms": round(semantic, 1),
        "selection_ms": result.stats.get("select_ms"),
        "compress_ms": round(total, 1),
        "served_ids": result.served_ids,
    }


def measure_drafter(plan: Plan, budget: Budget, parts: dict) -> list[dict]:
    """The Qwen3-0.6B-shaped drafter over every size and attention (one cold compression
    each, after one small warm-up pass per attention)."""
    from pflash.compress.render.rendered import render_completion_prompt
    from pflash.models.drafter.scorer import DrafterScorer

    rows, last = [], {}
    tok = parts["tokenizer"]
    for attention in ATTENTIONS:
        config = pipeline_config(plan, attention, parts["embedder"], max(plan.drafter_tokens) * 2)
        scorer = DrafterScorer(config, parts["drafter"])
        warm = render_completion_prompt(tok, prompt_of(tok, parts["body"], 2048, 0))
        compress_timed(warm, config, tok, scorer, parts["probe"], plan.device)
        for n in plan.drafter_tokens:
            step = f"drafter {attention} {n}"
            if attention in last:
                t, at = last[attention]
                if not budget.fits(step, scaled(t, at, n), f"{t:.1f} s at {at} tokens, squared"):
                    break
            prompt = render_completion_prompt(tok, prompt_of(tok, parts["body"], n, n))
            reset_peak(plan.device)
            row = compress_timed(prompt, config, tok, scorer, parts["probe"], plan.device)
            row.pop("served_ids")
            row |= {
                "attention": attention,
                "tokens": len(prompt.ids),
                "dtype": str(parts["drafter"].model.dtype).removeprefix("torch."),
                "peak_gib": peak_gib(plan.device),
                "note": SPEED_NOTE,
            }
            last[attention] = (row["compress_ms"] / 1000, len(prompt.ids))
            rows.append(row)
            print(json.dumps(row), flush=True)
        del scorer
    return rows


# --------------------------------------------------------------------------- 3. TTFT


def prefill_seconds(model, ids: tuple[int, ...], chunk: int = 1024) -> float:
    """The in-process target's cold prefill (`TransformersTarget`: 1024-token chunks into a
    DynamicCache, logits of the last token only), seconds to the first token's logits."""
    import torch
    from transformers.cache_utils import DynamicCache

    device = next(model.parameters()).device
    x = torch.tensor([ids], dtype=torch.long, device=device)  # [1, S]
    synchronize(str(device))
    t0 = time.perf_counter()
    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        for begin in range(0, x.shape[1], chunk):
            out = model(
                input_ids=x[:, begin : begin + chunk], cache=cache, use_cache=True, logits_to_keep=1
            )
        int(out.logits[0, -1].argmax())  # the first token: waits for every kernel
    seconds = time.perf_counter() - t0
    del cache, out
    return seconds


def measure_ttft(plan: Plan, budget: Budget, parts: dict) -> list[dict]:
    """Full vs compressed prefill of the 32B-class target, the drafter (window attention,
    the default) on the same device."""
    from pflash.compress.render.rendered import render_completion_prompt
    from pflash.models.drafter.scorer import DrafterScorer

    tok = parts["tokenizer"]
    config = pipeline_config(plan, "window", parts["embedder"], max(plan.ttft_tokens) * 2)
    scorer = DrafterScorer(config, parts["drafter"])
    target = parts["target"]
    prefill_seconds(target, tuple(range(100, 1124)))  # warm-up: kernels, allocator
    rows, last = [], None
    for n in plan.ttft_tokens:
        if last is not None:
            t, at = last
            if not budget.fits(f"ttft {n}", scaled(t, at, n), f"{t:.1f} s at {at} tokens, squared"):
                break
        prompt = render_completion_prompt(tok, prompt_of(tok, parts["body"], n, 10_000 + n))
        reset_peak(plan.device)
        full_s = prefill_seconds(target, prompt.ids)
        stages = compress_timed(prompt, config, tok, scorer, parts["probe"], plan.device)
        short_s = prefill_seconds(target, stages.pop("served_ids"))
        ttft_s = stages["compress_ms"] / 1000 + short_s
        row = {
            "tokens": len(prompt.ids),
            "served_tokens": stages["served_tokens"],
            "full_prefill_s": round(full_s, 3),
            "compress_s": round(stages["compress_ms"] / 1000, 3),
            "compressed_prefill_s": round(short_s, 3),
            "ttft_s": round(ttft_s, 3),
            "ratio": round(full_s / ttft_s, 2),
            "ideal_ratio": round(full_s / short_s, 2),
            "of_ideal": round((full_s / ttft_s) / (full_s / short_s), 3),
            "peak_gib": peak_gib(plan.device),
            "note": SPEED_NOTE,
        }
        last = (full_s + stages["compress_ms"] / 1000 + short_s, len(prompt.ids))
        rows.append(row)
        print(json.dumps(row), flush=True)
    return rows


# --------------------------------------------------------------------------- the run


def build_parts(plan: Plan, workdir: Path) -> dict:
    """The random-weight models and the tokenizer every step shares."""
    import torch

    from pflash.models.loading import model_dtype

    dtype = model_dtype(plan.device)
    text = stdlib_text(plan.text_chars)
    tok = bpe_tokenizer(text)
    body = tok(text, add_special_tokens=False)["input_ids"]
    torch.manual_seed(0)
    drafter = random_causal_lm("qwen3", plan.drafter, plan.device, dtype)
    with torch.device(plan.device):
        probe = random_probe(plan.drafter["hidden_size"], plan.probe_width)
    return {
        "tokenizer": tok,
        "body": body,
        "drafter": loaded(drafter, "qwen3"),
        "probe": probe,
        "embedder": random_embedder(workdir / "embedder", tok, plan.embedder),
    }


def run(plan: Plan) -> dict:
    """Every step of `plan`; the report as a dict (also what `--out` writes)."""
    import torch

    from pflash.models.loading import model_dtype, resolve_device

    resolve_device(plan.device)  # cuda without a GPU: a ConfigError naming `device`
    if plan.cpu_threads is not None:
        torch.set_num_threads(plan.cpu_threads)
    torch.backends.cuda.matmul.allow_tf32 = False  # float32 correctness means float32
    torch.backends.cudnn.allow_tf32 = False
    budget = Budget(plan.budget_s)
    report: dict[str, Any] = {"plan": asdict(plan), "note": SPEED_NOTE}
    if plan.device.startswith("cuda"):
        report["gpu"] = torch.cuda.get_device_name()
    report["correctness"] = check_correctness(plan, budget)
    with tempfile.TemporaryDirectory() as tmp:
        parts = build_parts(plan, Path(tmp))
        report["drafter"] = measure_drafter(plan, budget, parts)
        if budget.fits("ttft target build", 30.0, "30 s to build a 32B-class target"):
            torch.manual_seed(1)
            parts["target"] = random_causal_lm(
                "qwen2", plan.target, plan.device, model_dtype(plan.device)
            )
            report["ttft"] = measure_ttft(plan, budget, parts)
    report["skipped"] = budget.skipped
    report["seconds"] = round(time.perf_counter() - budget.started, 1)
    report["ok"] = all(r["ok"] for r in report["correctness"]) and bool(report["correctness"])
    return report


def table(report: dict) -> str:
    """The report as one plain-text table, a section per step."""
    lines = [f"GPU check ({report['plan']['name']}, {report['plan']['device']}): {SPEED_NOTE}"]
    lines.append("correctness     attention     dtype     mass err   tap err    ok")
    for r in report["correctness"]:
        lines.append(
            f"  {r['model']:<13} {r['attention']:<13} {r['dtype']:<9} "
            f"{r['mass_rel_err']:<10.2e} {r['tap_rel_err']:<10.2e} {r['ok']}"
        )
    lines.append(
        "drafter tokens  attention     dtype     trunk ms  score ms  probe ms  sem ms   select ms  total ms  peak GiB"
    )
    for r in report.get("drafter", []):
        lines.append(
            f"  {r['tokens']:<13} {r['attention']:<13} {r['dtype']:<9} {r['to_scoring_layer_ms']:<9} "
            f"{r['scoring_ms']:<9} {r['probe_ms']:<9} {r['semantic_ms']:<8} {r['selection_ms']!s:<10} "
            f"{r['compress_ms']:<9} {r['peak_gib']}"
        )
    lines.append(
        "ttft tokens     served   full s    compress s  short s   ratio   ideal   of ideal"
    )
    for r in report.get("ttft", []):
        lines.append(
            f"  {r['tokens']:<13} {r['served_tokens']:<8} {r['full_prefill_s']:<9} {r['compress_s']:<11} "
            f"{r['compressed_prefill_s']:<9} {r['ratio']:<7} {r['ideal_ratio']:<7} {r['of_ideal']}"
        )
    for s in report["skipped"]:
        lines.append(f"skipped {s['step']}: {s['reason']}")
    lines.append(f"total {report['seconds']} s; correctness {'ok' if report['ok'] else 'FAILED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m pflash_lab.bench.gpu", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dry-run", action="store_true", help="the same code, tiny sizes, CPU")
    parser.add_argument("--out", help="write the report as JSON here")
    parser.add_argument("--budget-s", type=float, help="wall-clock budget (default: the plan's)")
    args = parser.parse_args(argv)
    plan = DRY if args.dry_run else GPU
    if args.budget_s is not None:
        plan = Plan(**(asdict(plan) | {"budget_s": args.budget_s}))
    report = run(plan)
    print(table(report), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1, default=str))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
