"""serve_config.yaml, the README's run command, must deploy on a 2-CPU laptop."""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]


def test_default_app_fits_on_two_cpus():
    """Ray schedules by declared CPUs: a replica whose share does not fit never starts
    (the Ingress then waits forever while the models load)."""
    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    (app,) = cfg["applications"]
    total = sum(
        d.get("num_replicas", 1) * d["ray_actor_options"]["num_cpus"] for d in app["deployments"]
    )
    assert total <= 2.0, f"serve_config.yaml asks for {total} CPUs"


def test_default_app_args_are_a_valid_config():
    from pflash.config import build_config

    cfg = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    (app,) = cfg["applications"]
    config = build_config(app["args"], env={})
    assert config.drafter == config.target == "embedded:smollm2-135m"
    assert config.segment_probe_gguf == "embedded"
    assert {d["name"] for d in app["deployments"]} == {
        "Ingress",
        "DrafterScorer",
        "SegmentProbe",
        "TargetModel",
    }


def test_serve_config_runs_the_product_defaults():
    """The library, `pflash compress` and the app agree: serve_config.yaml's args name only
    the models, the gate and the context the embedded target runs with (a fact of the
    deployment, not of compression), and otherwise build exactly the default config."""
    from pflash.config import build_config

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    assert set(args) == {"drafter", "target", "target_backend", "mode", "threshold", "max_context"}
    assert args["max_context"] == 32768
    served = build_config(args, env={}).model_dump()
    assert served == {**build_config({}, env={}).model_dump(), "max_context": 32768}
