"""PFlash with Ray Serve LLM as the target (`target_backend: ray_llm`): one Ray
cluster from examples/serve_config.ray_llm.yaml, where Ray Serve LLM's `LLMServer` runs vLLM
(the CPU build) in vLLM's own venv (`runtime_env.py_executable`) and PFlash's TargetModel
reaches it through a deployment handle, no HTTP hop. Through the official `openai` client.

Needs PFLASH_VLLM_VENV with the project's Ray version in it and PFLASH_VLLM_MODEL_DIR
(scripts/vllm_upstream.sh makes both; scripts/test.sh runs it first):

    PFLASH_VLLM_VENV=... PFLASH_VLLM_MODEL_DIR=... python -m pytest -m vllm tests/upstream

Applications:
- `llm`: the example's, its LLM replica's engine on half a CPU (2 CPUs carry three apps);
  TokenIdCompletions takes 1 request at a time and queues 1, so overload is reachable;
- `pflash` at /: the example's, with pflash_return_prompt allowed;
- `gw` at /gw: the same app with a 3 s upstream_timeout_s and a max_context (16384) above
  vLLM's (8192), so vLLM's own 400, a stalled engine (and /readyz saying so) and a full
  queue are each shown through the real gateway. The LLM replica is stopped (SIGSTOP) for the stall, never
  long enough for Serve's health check (30 s) to replace it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml
from engine_cases import (
    VIEW_ARGS,
    assert_later_turns_extend_the_cached_prefix,
    compressed_needle_chat,
    envelope,
    streamed_compressed_chat,
    structured_compressed_chat,
    three_turns,
)

from pflash_lab.bench.launch import ServeCluster, free_port

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))  # faults.py
from faults import replica_pids  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
GW_TIMEOUT_S = 3.0
HOW = (
    "tests/upstream/test_ray_llm.py needs vLLM's venv with the project's Ray in it and the "
    "model dir: set PFLASH_VLLM_VENV and PFLASH_VLLM_MODEL_DIR and run "
    "`PFLASH_VLLM_PREPARE_ONLY=1 scripts/vllm_upstream.sh` (it installs both). "
    "Deselect with -m 'not vllm'."
)


def _config(tmp: Path, port: int, venv: Path, model: Path) -> Path:
    base = yaml.safe_load((ROOT / "examples" / "serve_config.ray_llm.yaml").read_text())
    base["http_options"]["port"] = port
    llm, main = base["applications"]
    llm["runtime_env"]["py_executable"] = str(venv / "bin" / "python")
    cfg = llm["args"]["llm_config"]
    cfg["model_loading_config"]["model_source"] = str(model)
    cfg["placement_group_config"]["bundles"] = [{"CPU": 0.5}]
    llm["args"]["adapter"] = {"max_ongoing_requests": 1, "max_queued_requests": 1}
    main["args"].update(return_prompt_enabled=True, **VIEW_ARGS)
    shares = {"Ingress": 0.1, "DrafterScorer": 0.5, "SegmentProbe": 0.05, "TargetModel": 0.05}
    for dep in main["deployments"]:
        dep["ray_actor_options"]["num_cpus"] = shares[dep["name"]]
    gw = yaml.safe_load(yaml.safe_dump(main))
    gw.update(name="gw", route_prefix="/gw")
    gw["args"].update(
        upstream_timeout_s=GW_TIMEOUT_S, max_context=16384, select_segments="fixed"
    )  # never compresses here: no SegmentProbe, and its drafter only loads
    gw["deployments"] = [d for d in gw["deployments"] if d["name"] != "SegmentProbe"]
    for dep in gw["deployments"]:
        dep["ray_actor_options"]["num_cpus"] = {"DrafterScorer": 0.25}.get(dep["name"], 0.05)
    base["applications"] = [llm, main, gw]
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    venv, model = os.environ.get("PFLASH_VLLM_VENV"), os.environ.get("PFLASH_VLLM_MODEL_DIR")
    if not venv or not model:
        pytest.fail(HOW, pytrace=False)
    probe = subprocess.run(
        [str(Path(venv) / "bin" / "python"), "-c", "import ray, ray.serve.llm, vllm"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        pytest.fail(f"{HOW}\n{probe.stderr[-1500:]}", pytrace=False)
    tmp = tmp_path_factory.mktemp("ray_llm")
    port = free_port()
    cluster = ServeCluster(_config(tmp, port, Path(venv), Path(model)), tmp)
    http = f"http://127.0.0.1:{port}"
    # the first answer needs vLLM's engine up (90-200 s here, beside two drafters loading)
    ping = {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"}
    try:
        cluster.start(f"{http}/gw/v1/completions", ping, timeout_s=600)
        deadline = time.time() + 300
        while httpx.post(f"{http}/v1/completions", json=ping, timeout=120).status_code != 200:
            assert time.time() < deadline, "the pflash app did not come up"
            time.sleep(2)
        yield {"http": http, "cluster": cluster}
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack['http']}/v1", api_key="unused", max_retries=0, timeout=300)


def test_compressed_chat_is_prefilled_by_ray_serve_llm_with_the_needle_kept(client):
    compressed_needle_chat(client)  # the usage checked there came back through the handle


def test_a_json_schema_is_enforced_by_the_engine_on_the_compressed_prompt(client):
    # response_format reaches the LLMServer with the served prompt; its grammar shapes the answer
    assert structured_compressed_chat(client)["number"] == 7318842


def test_streaming_with_include_usage_through_the_handle(client):
    streamed_compressed_chat(client)


def test_later_turns_are_served_from_the_view_and_hit_the_llm_servers_prefix_cache(stack, capsys):
    with httpx.Client(base_url=stack["http"], timeout=600) as http:
        turns = three_turns(http)
    line = assert_later_turns_extend_the_cached_prefix(turns)
    with capsys.disabled():
        print(f"\nRay Serve LLM: {line}")


# ----------------------------------------------------------------------------- failures


def _gw_post(stack, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{stack['http']}/gw/v1/completions", json=body, timeout=timeout)


def test_the_engines_400_for_a_prompt_over_its_context_is_our_400(stack):
    r = _gw_post(stack, {"prompt": list(range(100, 9100)), "max_tokens": 4, "pflash_mode": "off"})
    err = envelope(r, 400)
    assert (err["type"], err["code"]) == ("invalid_request_error", "context_length_exceeded")
    assert "maximum context length is 8192" in err["message"]


def test_a_stalled_engine_is_a_504_and_a_full_queue_a_503_then_it_answers_again(stack):
    (pid,) = replica_pids("LLMServer:smollm2", app="llm")
    body = {"prompt": f"Hello {uuid.uuid4()}", "max_tokens": 4, "pflash_mode": "off"}
    os.kill(pid, signal.SIGSTOP)
    try:
        t0 = time.monotonic()
        with ThreadPoolExecutor(5) as pool:  # 1 in the adapter, 1 queued, the rest refused
            ready = pool.submit(httpx.get, f"{stack['http']}/gw/readyz", timeout=60)
            answers = list(pool.map(lambda _: _gw_post(stack, body), range(4)))
            ready = ready.result()
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    statuses = sorted(r.status_code for r in answers)
    assert 503 in statuses and 504 in statuses, [r.text for r in answers]
    for r in answers:
        err = envelope(r, r.status_code)
        if r.status_code == 503:
            assert (err["type"], err["code"]) == ("overloaded_error", "upstream_overloaded")
            assert int(r.headers["retry-after"]) >= 1
        else:
            assert (r.status_code, err["code"]) == (504, "upstream_timeout")
    assert took < 4 * GW_TIMEOUT_S + 5
    # /readyz asks the engine itself, not only the TargetModel in front of it
    assert ready.status_code == 503 and ready.json()["checks"]["target"] == "unavailable"
    r = _gw_post(stack, body)
    assert r.status_code == 200, r.text
    # /readyz answers from a cache each ingress replica refreshes every few seconds: the
    # engine is ready again at the next refresh, not at once
    deadline, target = time.monotonic() + 30, None
    while target != "ok" and time.monotonic() < deadline:
        target = httpx.get(f"{stack['http']}/gw/readyz", timeout=60).json()["checks"]["target"]
        time.sleep(0.5)
    assert target == "ok"
