"""Multi-turn TTFT through the HTTP API: full prefill vs PFlash with and without views.

    python -m pflash_lab.bench.multiturn [--chars 26000] [--keep 0.1] [--turns 3] [--views-only]

One Ray cluster, three applications built from serve_config.yaml: `views` (the default:
views and drafter sessions on), `noview` (`chat_view: false`: a fresh compression every
turn) and `nosession` (views on, `drafter_sessions: 0`: the drafter re-reads the whole
prompt every turn). A scripted conversation over one real document (GPL-3 prose with facts
at 20/40/60/80%, ~6K target tokens) asks a different fact each turn. Per turn it reports
TTFT for (a) full prefill with the target's prefix snapshots (`pflash_mode=off`), (b) PFlash
with views, (c) PFlash with `chat_view: false`; the drafter forward per turn with and without
sessions; the view mode and the tokens recalled. Each pass uses its own document header so
no pass reuses another's caches. The machine is shared: read ratios, not absolute times.
`--views-only` runs the `views` app alone at serve_config's CPU shares, as a user runs it:
the full prompt against PFlash with views, without the other two apps on the same cores.
"""

from __future__ import annotations

import argparse
import copy
import json
import time
from pathlib import Path

import yaml

from pflash_lab.bench.launch import ROOT, ServeCluster, free_port, scratch_dir

FACTS = (
    "The access code for the north gate is 4417.",
    "The ferry to Lindholm leaves at 06:40 every Tuesday.",
    "Professor Okonkwo keeps the spare key in the blue teapot.",
    "The backup generator burns 12 litres of diesel per hour.",
)
QUESTIONS = (
    ("What is the access code for the north gate?", "4417"),
    ("When does the ferry to Lindholm leave?", "06:40"),
    ("Where does Professor Okonkwo keep the spare key?", "teapot"),
    ("How much diesel does the backup generator burn per hour?", "12"),
)


def document(chars: int, header: str) -> str:
    paras = Path("/usr/share/common-licenses/GPL-3").read_text()[:chars].split("\n\n")
    for i, fact in enumerate(FACTS):
        paras.insert((i + 1) * len(paras) // (len(FACTS) + 1), fact)
    return header + "\n\n" + "\n\n".join(paras)


def conversation(client, doc: str, turns: int, mode: str, keep: float) -> list[dict]:
    messages = [{"role": "user", "content": doc + "\n\n" + QUESTIONS[0][0]}]
    rows = []
    for t in range(turns):
        question, gold = QUESTIONS[t]
        if t:
            messages = messages + [{"role": "user", "content": question}]
        t0 = time.perf_counter()
        first, usage, text = None, None, []
        stream = client.chat.completions.create(
            model="pflash",
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"pflash_mode": mode, "pflash_keep_ratio": keep},
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter() - t0
                text.append(chunk.choices[0].delta.content)
            if chunk.usage is not None:
                usage = chunk.usage
        answer = "".join(text)
        timings = usage.model_extra["timings"]
        rows.append(
            {
                "turn": t + 1,
                "ttft_ms": first * 1000,
                "prompt_tokens": usage.prompt_tokens,
                "correct": gold in answer,
                "answer": answer,
                **{k: timings[k] for k in ("prompt_n", "prompt_ms", "cache_n")},
                "pflash": timings["pflash"],
            }
        )
        messages = messages + [{"role": "assistant", "content": answer}]
    return rows


VARIANTS = {"views": {}, "noview": {"chat_view": False}, "nosession": {"drafter_sessions": 0}}


def build_config(
    work: Path, port: int, keep: float, apps: tuple[str, ...] = tuple(VARIANTS)
) -> Path:
    """serve_config.yaml with one application per name in `apps` (`VARIANTS`). Alone, the
    `views` app keeps serve_config's CPU shares, as a user runs it; three apps must fit on
    2 CPUs, so each of their deployments gets 0.2, and every replica of the three shares the
    two cores (a third turn's drafter forward over 30 new tokens at 5.7K: 264 ms with the
    three apps, 110-115 ms alone; 6 Dec 2026)."""
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    cfg["http_options"]["port"] = port
    base = cfg["applications"][0]
    base["args"].update(threshold=1_000_000, keep_ratio=keep)
    if len(apps) > 1:
        for dep in base["deployments"]:
            dep["ray_actor_options"]["num_cpus"] = 0.05 if dep["name"] == "SegmentProbe" else 0.2
    return write_app_variants(cfg, {name: VARIANTS[name] for name in apps}, work)


def write_app_variants(cfg: dict, variants: dict[str, dict], work: Path, index: int = 0) -> Path:
    """`cfg` with its application number `index` copied once per variant (name → extra args),
    each at route /<name>, the other applications kept as they are (e.g. Ray Serve LLM's),
    written to work/serve_config.yaml."""
    apps = [app for i, app in enumerate(cfg["applications"]) if i != index]
    base = cfg["applications"][index]
    for name, extra in variants.items():
        app = copy.deepcopy(base)
        app.update(name=name, route_prefix=f"/{name}")
        app["args"].update(extra)
        apps.append(app)
    cfg["applications"] = apps
    path = work / "serve_config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def main(argv: list[str] | None = None) -> None:
    from openai import OpenAI

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--chars", type=int, default=26000, help="characters of GPL-3 in the document"
    )
    parser.add_argument("--keep", type=float, default=0.1)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--views-only",
        action="store_true",
        help="one app (views on) at serve_config's CPU shares: the full prompt and PFlash only",
    )
    args = parser.parse_args(argv)
    apps = ("views",) if args.views_only else tuple(VARIANTS)
    work = scratch_dir("pflash-mt-")
    port = free_port()
    cluster = ServeCluster(build_config(work, port, args.keep, apps), work)
    base = f"http://127.0.0.1:{port}"
    ping = {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"}
    cluster.start(f"{base}/views/v1/completions", ping, timeout_s=600)
    results = {}
    try:
        for app in apps[1:]:  # wait for the other apps
            client = OpenAI(base_url=f"{base}/{app}/v1", api_key="x", max_retries=30, timeout=900)
            client.completions.create(
                model="pflash", prompt="Hi", max_tokens=1, extra_body={"pflash_mode": "off"}
            )
        passes = tuple(
            p
            for p in (
                ("full prefill (prefix cache)", "views", "off"),
                ("PFlash + views", "views", "always"),
                ("PFlash, chat_view false", "noview", "always"),
                ("PFlash + views, no drafter sessions", "nosession", "always"),
            )
            if p[1] in apps
        )
        for i, (label, app, mode) in enumerate(passes):
            client = OpenAI(base_url=f"{base}/{app}/v1", api_key="x", max_retries=0, timeout=900)
            doc = document(args.chars, f"Document {i}-{time.time_ns() % 10**6}")
            results[label] = conversation(client, doc, args.turns, mode, args.keep)
            for row in results[label]:
                print(json.dumps({"pass": label, **row}), flush=True)
    finally:
        cluster.stop()
    print()
    print(table(results))


def table(results: dict[str, list[dict]]) -> str:
    labels = list(results)
    turns = len(next(iter(results.values())))
    lines = [
        "| turn | prompt tokens | "
        + " | ".join(f"TTFT {lbl} (ms)" for lbl in labels)
        + " | drafter ms (sessions / none) | view mode | recalled | served | correct (full/views/noview) |",
        "|" + "---|" * (len(labels) + 7),
    ]
    views = results.get("PFlash + views", [])
    nosess = results.get("PFlash + views, no drafter sessions", [])
    full = results.get("full prefill (prefix cache)", [])
    noview = results.get("PFlash, chat_view false", [])
    for t in range(turns):
        cells = [f"{results[lbl][t]['ttft_ms']:.0f}" for lbl in labels]
        v = views[t]["pflash"] if views else {}
        drafter = (
            f"{v.get('scorer_forward_ms', 0):.0f} / {nosess[t]['pflash']['scorer_forward_ms']:.0f}"
            if nosess
            else "-"
        )
        correct = "/".join("y" if r[t]["correct"] else "n" for r in (full, views, noview) if r)
        lines.append(
            f"| {t + 1} | {views[t]['prompt_tokens'] if views else '-'} | "
            + " | ".join(cells)
            + f" | {drafter} | {v.get('view', {}).get('mode', '-')} | {v.get('view', {}).get('recalled_tokens', 0)}"
            + f" | {v.get('compressed_tokens', 0)} | {correct} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
