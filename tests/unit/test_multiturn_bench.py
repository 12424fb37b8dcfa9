"""The multi-turn benchmark's Serve config (pflash_lab/bench/multiturn.py): the app a user
runs is measured at serve_config's CPU shares, and three apps side by side fit two CPUs."""

from __future__ import annotations

import yaml

from pflash_lab.bench.launch import ROOT
from pflash_lab.bench.multiturn import build_config


def _apps(path):
    return {
        app["name"]: {d["name"]: d["ray_actor_options"]["num_cpus"] for d in app["deployments"]}
        for app in yaml.safe_load(path.read_text())["applications"]
    }


def test_the_app_alone_keeps_serve_configs_cpu_shares(tmp_path):
    shipped = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]
    expected = {d["name"]: d["ray_actor_options"]["num_cpus"] for d in shipped["deployments"]}
    apps = _apps(build_config(tmp_path, 8123, 0.1, ("views",)))
    assert apps == {"views": expected}


def test_three_apps_side_by_side_fit_two_cpus(tmp_path):
    apps = _apps(build_config(tmp_path, 8123, 0.1))
    assert set(apps) == {"views", "noview", "nosession"}
    assert sum(sum(shares.values()) for shares in apps.values()) <= 2.0
