"""What every `pflash bench` command shares: the product settings a run uses (serve_config.yaml's
application), the app it starts for the HTTP engine, and the results directory it writes
(`results.jsonl`, `summary.md`, plots).

`suite` (the `pflash bench` command), `smoke` and `ablation` all build on this module and
none of them on another, so the harness has no import cycle.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from pflash_lab.bench.launch import ROOT, ServeCluster, free_port
from pflash_lab.bench.runner import read_jsonl

RESULTS = "results.jsonl"
SUMMARY = "summary.md"


def serve_args() -> dict:
    """The PFlash settings of serve_config.yaml's application (the product default)."""
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    return dict(cfg["applications"][0]["args"])


def inprocess_config(keep: float, overrides: dict | None = None):
    """serve_config.yaml's settings at `keep`, then `--set` overrides (no PFLASH_* env)."""
    from pflash.config import build_config

    return build_config({**serve_args(), "keep_ratio": keep, **(overrides or {})}, env={})


def parse_overrides(items: list[str] | None) -> dict:
    """`KEY=VALUE` pairs, values read as YAML (so numbers, booleans and null work)."""
    out = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        out[key.strip()] = yaml.safe_load(value)
    return out


class http_engine:  # noqa: N801 - a context manager used like a function
    """An `HttpEngine` on `base_url`, or on the embedded app started here (and stopped)."""

    def __init__(self, tokenizer, base_url: str | None, workdir: Path, **app_args):
        self.tokenizer, self.base_url, self.workdir = tokenizer, base_url, workdir
        self.app_args = app_args
        self.cluster: ServeCluster | None = None

    def __enter__(self):
        from pflash_lab.bench.runner import HttpEngine

        if self.base_url is None:
            self.cluster, self.base_url = start_app(self.workdir, **self.app_args)
        return HttpEngine(self.base_url, self.tokenizer)

    def __exit__(self, *exc) -> None:
        if self.cluster is not None:
            self.cluster.stop()


def start_app(workdir: Path, *, cpus: float = 0.9, **args) -> tuple[ServeCluster, str]:
    """serve_config.yaml's app on a free port with `pflash_return_prompt` allowed."""
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    port = free_port()
    cfg["http_options"]["port"] = port
    app = cfg["applications"][0]
    app["args"].update(return_prompt_enabled=True, threshold=1_000_000, **args)
    for dep in app["deployments"]:
        if dep["name"] in ("DrafterScorer", "TargetModel"):
            dep["ray_actor_options"]["num_cpus"] = cpus
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "serve_config.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    cluster = ServeCluster(path, workdir)
    base = f"http://127.0.0.1:{port}"
    cluster.start(
        f"{base}/v1/completions",
        {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"},
        timeout_s=600,
    )
    return cluster, f"{base}/v1"


def write_report(out: Path) -> None:
    """summary.md and the PNG plots from `out/results.jsonl`."""
    from pflash_lab.bench.plots import write_plots
    from pflash_lab.bench.report import summary_markdown

    results = read_jsonl(out / RESULTS)
    meta_path = out / "run.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    plots = write_plots(results, out)
    (out / SUMMARY).write_text(summary_markdown(results, meta=meta, plots=plots))
