"""PFlash in front of a real vLLM, through the HTTP API: TTFT, multi-turn, concurrency.

    python -m pflash_lab.bench.upstream [--vllm-url http://127.0.0.1:8100/v1]
        [--lengths 4096 7168] [--runs 3] [--keep 0.1] [--chars 16000] [--turns 3]
        [--concurrency 8] [--parts ttft multiturn concurrency] [--out results.json]
        [--target vllm|ray_llm]

The target is vLLM (`target_backend: openai`, examples/serve_config.vllm.yaml: token-id
prompts, vLLM's prefix cache on), the drafter the embedded SmolLM2 in Ray. Without
`--vllm-url` it starts vLLM itself with scripts/vllm_upstream.sh (PFLASH_VLLM_VENV,
PFLASH_VLLM_MODEL_DIR) and stops it at the end. `--target ray_llm` measures the same with
Ray Serve LLM's LLMServer as the target (`target_backend: ray_llm`,
examples/serve_config.ray_llm.yaml: vLLM inside the Ray cluster, reached by handle).

One Ray cluster, two applications from the example: `views` (as shipped) and `noview`
(`chat_view: false`: a fresh compression every turn). Parts:
- ttft: per prompt length, alternating `pflash_mode` off (vLLM prefills everything) and
  always (PFlash), each request with a unique document (no cache reuse): median TTFT;
- multiturn: a 3-turn conversation over one document (pflash_lab.bench.multiturn's), per-turn
  TTFT and vLLM's cached_tokens for full prefill (vLLM's prefix cache) vs PFlash with views
  vs PFlash with `chat_view: false`, each pass on its own document;
- concurrency: N requests at once (unique ~first length prompts), off vs always:
  wall-clock throughput and p50/p99 TTFT.
TTFT is measured at the client (streaming, first content token). The machine is shared:
read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml

from pflash_lab.bench.launch import ROOT, ServeCluster, free_port, scratch_dir, stop_group
from pflash_lab.bench.multiturn import conversation, document, write_app_variants
from pflash_lab.bench.ttft import corpus, make_messages, stream_once

MODES = ("off", "always")


def start_vllm(work: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    log = open(work / "vllm.log", "w")
    proc = subprocess.Popen(
        ["nice", "-n", "10", str(ROOT / "scripts" / "vllm_upstream.sh"), str(port)],
        cwd=ROOT,
        env=dict(os.environ),
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vLLM exited: {(work / 'vllm.log').read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/models", timeout=5).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(1)
    stop_group(proc, 30)
    raise RuntimeError("vLLM did not come up")


def build_config(work: Path, port: int, vllm: str | None, keep: float) -> Path:
    """The two PFlash apps (`views`, `noview`) in front of vLLM at `vllm`, or, with `vllm`
    None, in front of Ray Serve LLM in the same cluster (examples/serve_config.ray_llm.yaml,
    its `llm` app on vLLM's venv: PFLASH_VLLM_VENV, PFLASH_VLLM_MODEL_DIR)."""
    example = "serve_config.vllm.yaml" if vllm else "serve_config.ray_llm.yaml"
    cfg = yaml.safe_load((ROOT / "examples" / example).read_text())
    cfg["http_options"]["port"] = port
    index = 0 if vllm else 1
    base = cfg["applications"][index]
    if vllm:
        base["args"].update(upstream_base_url=vllm)
    else:
        venv = Path(os.environ.get("PFLASH_VLLM_VENV", ROOT / ".venv-vllm"))
        llm = cfg["applications"][0]
        llm["runtime_env"]["py_executable"] = str(venv / "bin" / "python")
        source = os.environ.get("PFLASH_VLLM_MODEL_DIR", str(venv / "model"))
        llm["args"]["llm_config"]["model_loading_config"]["model_source"] = source
        # two PFlash apps (1.4 CPUs) beside the engine's bundle on 2 CPUs: Ray must be able to
        # place it (vLLM's threads do not follow Ray's share either way)
        llm["args"]["llm_config"]["placement_group_config"]["bundles"] = [{"CPU": 0.6}]
    base["args"].update(keep_ratio=keep, threshold=1_000_000)
    shares = {"Ingress": 0.1, "DrafterScorer": 0.5, "SegmentProbe": 0.05, "TargetModel": 0.05}
    for dep in base["deployments"]:  # two apps beside vLLM on 2 CPUs
        dep["ray_actor_options"]["num_cpus"] = shares[dep["name"]]
    variants = {"views": {}, "noview": {"chat_view": False}}
    return write_app_variants(cfg, variants, work, index)


def _client(base: str, app: str):
    from openai import OpenAI

    return OpenAI(base_url=f"{base}/{app}/v1", api_key="x", max_retries=0, timeout=1800)


def _med(xs) -> float:
    return statistics.median(xs) if xs else float("nan")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = (len(xs) - 1) * q
    lo, hi = int(k), min(len(xs) - 1, int(k) + 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


# ------------------------------------------------------------------ parts


def part_ttft(base: str, tok, lengths: list[int], runs: int, keep: float) -> list[dict]:
    client, text, rows = _client(base, "views"), corpus(), []
    for n in lengths:
        res: dict[str, list[dict]] = {m: [] for m in MODES}
        for r in range(runs):
            for mode in MODES:
                out = stream_once(client, make_messages(tok, text, n, 100 * n + 10 * r), mode, keep)
                res[mode].append(out)
                print(json.dumps({"part": "ttft", "length": n, "mode": mode, **out}), flush=True)
        on = res["always"]
        rows.append(
            {
                "target_tokens": _med([x["prompt_tokens"] for x in on]),
                "served_tokens": _med([x["pflash"]["compressed_tokens"] for x in on]),
                "ttft_off_ms": _med([x["ttft_ms"] for x in res["off"]]),
                "ttft_pflash_ms": _med([x["ttft_ms"] for x in on]),
                "drafter_ms": _med([x["pflash"]["scorer_forward_ms"] for x in on]),
                "compress_ms": _med([x["pflash"]["compress_ms"] for x in on]),
                "runs": runs,
            }
        )
        rows[-1]["speedup"] = rows[-1]["ttft_off_ms"] / rows[-1]["ttft_pflash_ms"]
    return rows


def part_multiturn(base: str, chars: int, turns: int, keep: float, runs: int) -> dict:
    passes = (
        ("full prefill (vLLM prefix cache)", "views", "off"),
        ("PFlash + views", "views", "always"),
        ("PFlash, chat_view false", "noview", "always"),
    )
    out: dict[str, list[list[dict]]] = {label: [] for label, _, _ in passes}
    failures: list[str] = []
    for r in range(runs):
        for i, (label, app, mode) in enumerate(passes):
            for attempt in range(3):  # a failed conversation is recorded, then redone
                doc = document(chars, f"Document {r}-{i}-{attempt}-{time.time_ns() % 10**6}")
                try:
                    rows = conversation(_client(base, app), doc, turns, mode, keep)
                except Exception as exc:  # noqa: BLE001 - a benchmark records and goes on
                    failures.append(f"{label} run {r}: {type(exc).__name__}: {exc}")
                    print(json.dumps({"part": "multiturn", "pass": label, "error": str(exc)}))
                    continue
                out[label].append(rows)
                for row in rows:
                    print(
                        json.dumps({"part": "multiturn", "pass": label, "run": r, **row}),
                        flush=True,
                    )
                break
    summary = {}
    for label, runs_rows in out.items():
        summary[label] = [
            {
                "turn": t + 1,
                "prompt_tokens": _med([rr[t]["prompt_tokens"] for rr in runs_rows]),
                "ttft_ms": _med([rr[t]["ttft_ms"] for rr in runs_rows]),
                "cached_tokens": _med([rr[t]["cache_n"] for rr in runs_rows]),
                "served_tokens": _med([rr[t]["pflash"]["compressed_tokens"] for rr in runs_rows]),
                "view": runs_rows[-1][t]["pflash"].get("view", {}).get("mode")
                if isinstance(runs_rows[-1][t]["pflash"].get("view"), dict)
                else None,
                "correct": sum(rr[t]["correct"] for rr in runs_rows),
                "runs": len(runs_rows),
            }
            for t in range(turns)
        ]
    summary["failures"] = failures
    return summary


def part_concurrency(base: str, tok, n_tokens: int, concurrency: int, keep: float) -> list[dict]:
    client, text, rows = _client(base, "views"), corpus(), []
    for mode in MODES:
        prompts = [
            make_messages(tok, text, n_tokens, 7000 + 100 * i + len(mode))
            for i in range(concurrency)
        ]
        t0 = time.perf_counter()

        def one(messages, mode=mode):
            try:
                return stream_once(client, messages, mode, keep)
            except Exception as exc:  # noqa: BLE001 - counted as a failed request
                return {"error": f"{type(exc).__name__}: {exc}"}

        with ThreadPoolExecutor(concurrency) as pool:
            every = list(pool.map(one, prompts))
        wall = time.perf_counter() - t0
        results = [r for r in every if "error" not in r]
        errors = [r["error"] for r in every if "error" in r]
        ttfts = [r["ttft_ms"] for r in results]
        for r in results:
            print(json.dumps({"part": "concurrency", "mode": mode, **r}), flush=True)
        rows.append(
            {
                "mode": mode,
                "requests": concurrency,
                "target_tokens": _med([r["prompt_tokens"] for r in results]),
                "served_tokens": _med([r["pflash"]["compressed_tokens"] for r in results]),
                "wall_s": wall,
                "req_per_s": len(results) / wall,
                "ttft_p50_ms": _pct(ttfts, 0.5),
                "ttft_p99_ms": _pct(ttfts, 0.99),
                "errors": errors,
            }
        )
    return rows


# ------------------------------------------------------------------ tables


def tables(results: dict) -> str:
    out = []
    if "ttft" in results:
        out += [
            f"TTFT, vLLM target, keep {results['keep']}, median of {results['ttft'][0]['runs']}",
            "",
            "| prompt tokens | served | TTFT full (ms) | TTFT PFlash (ms) | speedup | drafter (ms) | compress (ms) |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in results["ttft"]:
            out.append(
                f"| {r['target_tokens']:.0f} | {r['served_tokens']:.0f} | {r['ttft_off_ms']:.0f} "
                f"| {r['ttft_pflash_ms']:.0f} | {r['speedup']:.2f}x | {r['drafter_ms']:.0f} "
                f"| {r['compress_ms']:.0f} |"
            )
        out.append("")
    if "multiturn" in results:
        mt = {k: v for k, v in results["multiturn"].items() if k != "failures" and v}
        labels = list(mt)
        runs = mt[labels[0]][0]["runs"]
        out += [
            f"3-turn conversation, per-turn TTFT ms (vLLM cached_tokens), median of {runs}",
            "",
            "| turn | prompt tokens | " + " | ".join(labels) + " |",
            "|---|---|" + "---|" * len(labels),
        ]
        for t in range(len(mt[labels[0]])):
            cells = [
                f"{mt[lab][t]['ttft_ms']:.0f} ({mt[lab][t]['cached_tokens']:.0f})" for lab in labels
            ]
            out.append(
                f"| {t + 1} | {mt[labels[0]][t]['prompt_tokens']:.0f} | " + " | ".join(cells) + " |"
            )
        for failure in results["multiturn"].get("failures", []):
            out.append(f"- failed (redone): {failure}")
        out.append("")
    if "concurrency" in results:
        c = results["concurrency"]
        out += [
            f"{c[0]['requests']} concurrent requests (~{c[0]['target_tokens']:.0f} tokens each)",
            "",
            "| mode | served tokens | wall (s) | req/s (ok) | TTFT p50 (ms) | TTFT p99 (ms) | failed |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in c:
            label = "full prefill" if r["mode"] == "off" else "PFlash"
            out.append(
                f"| {label} | {r['served_tokens']:.0f} | {r['wall_s']:.1f} | {r['req_per_s']:.3f} "
                f"| {r['ttft_p50_ms']:.0f} | {r['ttft_p99_ms']:.0f} | {len(r['errors'])} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-url", default=None, help="a running vLLM (…/v1); else started")
    parser.add_argument(
        "--target",
        choices=["vllm", "ray_llm"],
        default="vllm",
        help="vllm: vLLM as its own server (target_backend openai); ray_llm: Ray Serve LLM's "
        "LLMServer in the same Ray cluster (target_backend ray_llm)",
    )
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 7168])
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (median)")
    parser.add_argument("--mt-runs", type=int, default=1, help="runs of the multi-turn part")
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--chars", type=int, default=16000, help="multi-turn document (GPL-3)")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument(
        "--parts",
        nargs="+",
        default=["ttft", "multiturn", "concurrency"],
        choices=["ttft", "multiturn", "concurrency"],
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results as JSON")
    args = parser.parse_args(argv)

    from pflash.models.source import load_tokenizer

    work = scratch_dir("pflash-upstream-")
    vllm_proc, vllm = None, None
    if args.target == "vllm":
        vllm_proc, vllm = (None, args.vllm_url) if args.vllm_url else start_vllm(work)
        vllm = vllm.rstrip("/")
    port = free_port()
    cluster = ServeCluster(build_config(work, port, vllm, args.keep), work)
    base = f"http://127.0.0.1:{port}"
    results: dict = {"keep": args.keep, "vllm": vllm or "ray_llm"}
    try:
        ping = {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"}
        cluster.start(f"{base}/views/v1/completions", ping, timeout_s=600)
        deadline = time.time() + 300
        while (
            httpx.post(f"{base}/noview/v1/completions", json=ping, timeout=120).status_code != 200
        ):
            if time.time() > deadline:
                raise RuntimeError("the noview app did not come up")
            time.sleep(2)
        tok = load_tokenizer("embedded:smollm2-135m")
        stream_once(_client(base, "views"), make_messages(tok, corpus(), 512, 1), "always", 0.1)
        if "ttft" in args.parts:
            results["ttft"] = part_ttft(base, tok, args.lengths, args.runs, args.keep)
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
        if "multiturn" in args.parts:
            results["multiturn"] = part_multiturn(
                base, args.chars, args.turns, args.keep, args.mt_runs
            )
            if args.out:
                args.out.write_text(json.dumps(results, indent=1))
        if "concurrency" in args.parts:
            results["concurrency"] = part_concurrency(
                base, tok, args.lengths[0], args.concurrency, args.keep
            )
    finally:
        cluster.stop()
        if vllm_proc is not None:
            stop_group(vllm_proc, 30)
        if args.out:
            args.out.write_text(json.dumps(results, indent=1))
    print()
    print(tables(results))


if __name__ == "__main__":
    main()
