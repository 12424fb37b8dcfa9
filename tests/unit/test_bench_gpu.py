"""The GPU check and the GPU deployment's guards, exercised on the CPU.

`python -m pflash_lab.bench.gpu --dry-run` runs every step of the GPU check at tiny sizes on the
CPU (the same code the GPU run executes), so the script cannot rot before a GPU is at hand.
A config asking for CUDA where torch sees no GPU fails at startup naming the `device` key.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import UNTUNED

from pflash.config import build_config
from pflash.errors import ConfigError
from pflash.models.drafter.scorer import DrafterScorer
from pflash.models.loading import model_dtype, resolve_device
from pflash_lab.bench.gpu import ATTENTIONS, KINDS, TOLERANCE, main


def test_gpu_check_dry_run_runs_every_step_and_writes_its_report(tmp_path):
    out = tmp_path / "dry.json"
    run = subprocess.run(
        [sys.executable, "-m", "pflash_lab.bench.gpu", "--dry-run", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "correctness ok" in run.stdout
    report = json.loads(out.read_text())
    assert report["ok"] and report["skipped"] == []

    checks = report["correctness"]
    assert {(r["model"], r["attention"], r["dtype"]) for r in checks} == {
        (k, a, d) for k in KINDS for a in ATTENTIONS for d in ("float32", "bfloat16")
    }
    for r in checks:
        if r["dtype"] == "float32":  # the CPU against itself: the same numbers
            assert r["mass_rel_err"] == 0.0 and r["tap_rel_err"] == 0.0
        else:  # a bfloat16 drafter scores, close to float32 but not equal
            assert 0.0 < r["mass_rel_err"] <= TOLERANCE["bfloat16"]["mass"]
            assert 0.0 < r["tap_rel_err"] <= TOLERANCE["bfloat16"]["tap"]

    drafter = report["drafter"]
    assert [(r["attention"], r["tokens"] // 512) for r in drafter] == [
        (a, n) for a in ATTENTIONS for n in (1, 2)
    ]
    for r in drafter:
        assert r["served_tokens"] < r["tokens"] / 4  # keep 0.1 plus the question
        assert r["to_scoring_layer_ms"] > 0 and r["probe_ms"] > 0 and r["semantic_ms"] > 0
        assert r["selection_ms"] > 0 and r["dtype"] == "float32"
        assert "speed does not depend on weight values" in r["note"]

    ttft = report["ttft"]
    assert [r["tokens"] // 512 for r in ttft] == [1, 2]
    for r in ttft:
        assert r["compressed_prefill_s"] > 0 and r["full_prefill_s"] > 0
        assert r["served_tokens"] < r["tokens"] / 4
        assert r["ideal_ratio"] > 0 and r["compress_s"] > 0
        # the drafter's time is charged to the ratio, not to the ideal (at tiny sizes on a
        # shared CPU the prefill times are noise, so no speed-up is asserted here)
        assert r["ratio"] <= r["ideal_ratio"]


def test_cuda_asked_without_a_gpu_fails_naming_the_device_key(monkeypatch):
    # this machine has no GPU; pinned so the test means the same on one that has
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = build_config(UNTUNED | {"device": "cuda"}, env={})
    with pytest.raises(ConfigError) as err:
        DrafterScorer(config)
    assert err.value.key == "device"
    assert "torch sees no GPU" in str(err.value) and "device: cpu" in str(err.value)
    assert resolve_device("auto") == "cpu"


def test_gpu_check_without_a_gpu_stops_before_building_anything(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="invalid config device='cuda'"):
        main([])


def test_models_load_in_bfloat16_on_a_gpu_and_float32_on_a_cpu():
    assert model_dtype("cuda") == "bfloat16"
    assert model_dtype("cuda:1") == "bfloat16"
    assert model_dtype("cpu") == "float32"


def test_a_bfloat16_drafter_scores_close_to_its_float32_self():
    """The dtype a GPU drafter runs in: the NoPE head's projections run in the layer's
    dtype (float32 input into bfloat16 weights was a dtype error), the mass in float32."""
    from pflash.models.gguf_io import tiny_decoder
    from pflash_lab.bench.gpu import _score_tiny

    model = tiny_decoder("qwen3", layers=4, seed=5)
    mass32, tap32 = _score_tiny(model, "qwen3", "dense", 60)
    mass16, tap16 = _score_tiny(model.to(torch.bfloat16), "qwen3", "dense", 60)
    assert mass16.dtype == np.float32 and tap16.dtype == np.float32
    assert np.abs(mass16 - mass32).max() <= 0.05 * mass32.max()
    assert int(np.argmax(mass16)) == int(np.argmax(mass32))


def test_time_guard_skips_a_step_whose_scaled_estimate_does_not_fit():
    from pflash_lab.bench.gpu import Budget, scaled

    budget = Budget(total_s=100.0)
    assert scaled(2.0, 32768, 131072) == 32.0  # 4x the tokens, squared
    assert budget.fits("ttft 32768", 50.0, "measured")
    assert not budget.fits("ttft 131072", 500.0, "8 s at 32768 tokens, squared")
    assert budget.skipped[0]["step"] == "ttft 131072"
    assert budget.skipped[0]["reason"].startswith("estimated 500 s (8 s at 32768 tokens")
