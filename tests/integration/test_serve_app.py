"""The real Ray Serve application, started from serve_config.yaml, through the `openai` client.

One Ray cluster for the module, three applications built from serve_config.yaml's app
(startup ~30-60 s here):
- `pflash` at /: the embedded SmolLM2 as drafter and target, API keys on;
- `gw2` at /gw2: the `openai` target backend pointed at the first app over real HTTP, with
  a one-request queue to show backpressure;
- `xv` at /xv: a cross-vocabulary pair, SmolLM2 drafter and the Gemma 3 270M target (a base
  model: raw completions), with semantic evidence on (the sentence embedder in the drafter
  replica).
Compressed requests use 1-3K-token prompts so a drafter forward stays a few seconds.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import select
import socket
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pflash_lab.bench.launch import ServeCluster, free_port

pytestmark = pytest.mark.integration
sys.path.insert(0, str(Path(__file__).parent))  # bad_requests.py, the fuzz strategies
sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))  # tool_chat.py
import tool_chat  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
KEY = "test-key-1"
OTHER_KEY = "test-key-2"
NEEDLE = "The special magic quokka number is: 7318842."
QUESTION = "What is the special magic quokka number?"
BODY_READ_TIMEOUT_S = 5
INGRESS_REPLICAS = 2


def _config(tmp: Path, port: int) -> Path:
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    base["http_options"]["port"] = port
    template = base["applications"][0]
    for dep in template["deployments"]:  # 3 apps must fit on 2 CPUs
        dep["ray_actor_options"]["num_cpus"] = 0.05 if dep["name"] == "SegmentProbe" else 0.15

    main = copy.deepcopy(template)
    main["args"].update(
        # the embedded model's trained context: these tests fit prompts to it (serve_config
        # stretches it to 32K for agent clients, tests/integration/test_agent_client_sessions.py)
        max_context=8192,
        return_prompt_enabled=True,
        threshold=100_000,  # auto never compresses here; tests ask with pflash_mode
        api_keys=[KEY, OTHER_KEY],
        max_body_bytes=2_000_000,
        body_read_timeout_s=BODY_READ_TIMEOUT_S,  # the slow-body test waits this long
        chat_compress_new_tokens=1000,  # a 2K-token paste counts as large on an 8K model
        # The view mechanics are asserted on the fixed 64-token grid, whose selection on this
        # document was measured; probe segmentation has its own tests (test_probe*.py).
        select_segments="fixed",
        # ... with attention alone at the profile layer (17): the scenario needs turn 1 to
        # drop the later facts and a drafter slow enough for keep-alives; the product
        # default (layer 8, trained head, lexical evidence, position prior) keeps all four
        # facts in turn 1 and compresses in under a second. Lexical recall is unit-tested
        # (test_views.py); the other apps and `pflash bench smoke` run the default scorer.
        select_lexical="off",
        select_position_prior="off",
        scoring_head_gguf=None,
        drafter_head_layer=None,
        # ... over a dense trunk, as measured: with the windowed trunk (the default for long
        # prompts) this untuned layer's lifts no longer recall the third turn's fact on this
        # 4.5K-token document; the product scorer (layer 8 and its head) recalls all three
        # facts under either attention, lexical evidence on or off (docs/BENCHMARK_NOTEBOOK.md)
        drafter_attention="dense",
    )
    # with fixed segments the app binds no SegmentProbe (deployments/app.py)
    main["deployments"] = [d for d in main["deployments"] if d["name"] != "SegmentProbe"]
    for dep in main["deployments"]:
        if dep["name"] == "Ingress":
            dep["num_replicas"] = INGRESS_REPLICAS  # a conversation's turns land on either

    gw2 = copy.deepcopy(template)
    gw2.update(name="gw2", route_prefix="/gw2")
    gw2["args"].update(
        target_backend="openai",
        upstream_base_url=f"http://127.0.0.1:{port}/v1",
        upstream_api_key=KEY,
        upstream_model="pflash",
        threshold=100_000,
    )
    for dep in gw2["deployments"]:
        if dep["name"] == "Ingress":
            dep.update(
                max_ongoing_requests=1,
                max_queued_requests=1,
                backpressure_config={"status_code": 503, "retry_after_s": 1},
            )

    xv = copy.deepcopy(template)
    xv.update(name="xv", route_prefix="/xv")
    xv["args"].update(
        target="embedded:gemma3-270m",
        return_prompt_enabled=True,
        threshold=100_000,
        select_semantic_weight=1.0,  # the sentence embedder ranks what attention would fill
        # passage cuts (the default) serve this 6K-character GPL prompt as
        # line-sized pieces; the needle is kept, but Gemma 270M (a base model) then repeats
        # the question where it answers on the full prompt. Over ten license prompts it
        # answered 10/10 full, 9/10 without cuts, 8/10 with them (docs/BENCHMARK_NOTEBOOK.md): what this
        # app checks is the cross-vocabulary mapping, so it serves chunks and segments whole
        select_passage_cuts=False,
        # keyless on loopback (anonymous_tenant: local); its trace names each request's tenant
        trace_path=str(tmp / "xv_trace.jsonl"),
    )

    base["applications"] = [main, gw2, xv]
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


def _warm_up(cluster: ServeCluster, timeout_s: float = 300) -> None:
    """Until every route the tests use has answered 200 once on every main Ingress replica.

    The other apps may still be loading their models. Twice in CI, a first request right
    after startup was a bare 500 from Serve: once the main app's first chat completion
    (within 21 ms, the app had answered gw2 already), once its first compressed request,
    the fourth test. Each Ingress replica (two here) and the drafter path are asked here
    first; what did not answer 200 is kept in `cluster.warmup_failures`, which a failing
    test's report shows beside Ray's log lines (tests/conftest.py).
    """
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
    compressed = {
        "messages": _long_messages(1500),
        "max_tokens": 1,
        "pflash_mode": "always",
        "pflash_keep_ratio": 0.5,
    }
    steps = [
        ("/xv/v1/completions", {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"}, {}),
        ("/v1/chat/completions", {**chat, "pflash_mode": "off"}, AUTH),
        ("/v1/chat/completions", compressed, AUTH),
    ]
    cluster.warmup_failures = []
    deadline = time.time() + timeout_s
    for path, body, headers in steps:
        replicas: set[str] = set()
        while len(replicas) < (INGRESS_REPLICAS if path.startswith("/v1/") else 1):
            try:
                r = httpx.post(f"{cluster.http}{path}", json=body, headers=headers, timeout=120)
                if r.status_code == 200:
                    replicas.add(r.headers.get("x-pflash-replica", "?"))
                    continue
                cluster.warmup_failures.append(f"{path}: {r.status_code} {r.text[:200]!r}")
            except httpx.HTTPError as exc:
                cluster.warmup_failures.append(f"{path}: {type(exc).__name__}")
            assert time.time() < deadline, f"{path} did not come up: {cluster.warmup_failures}"
            time.sleep(2)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    port = free_port()
    cluster = ServeCluster(_config(tmp, port), tmp)
    cluster.http = f"http://127.0.0.1:{port}"
    ping = {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"}
    try:
        cluster.start(f"{cluster.http}/gw2/v1/completions", ping)
        _warm_up(cluster)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def server(cluster):
    return cluster.http


@pytest.fixture(scope="module")
def client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)


AUTH = {"Authorization": f"Bearer {KEY}"}


def _document(chars: int) -> str:
    body = Path("/usr/share/common-licenses/GPL-3").read_text()[:chars]
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + NEEDLE + body[mid:]


def _long_messages(chars: int = 5000) -> list[dict]:
    return [{"role": "user", "content": _document(chars) + "\n\n" + QUESTION}]


# ----------------------------------------------------------------------------- the API


def test_chat_completion_answers_with_usage_and_timings(client):
    r = client.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
    )
    assert "Paris" in r.choices[0].message.content
    assert r.usage.prompt_tokens > 10
    timings = r.usage.model_extra["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == r.usage.prompt_tokens
    assert timings["predicted_n"] == r.usage.completion_tokens
    assert timings["pflash"]["compressed_tokens"] == r.usage.prompt_tokens
    assert timings["pflash"]["keep_ratio"] == 1.0


def test_streaming_chat_with_include_usage(client):
    stream = client.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_raw_completion(client):
    r = client.completions.create(
        model="pflash", prompt="The capital of France is", max_tokens=4, temperature=0
    )
    assert r.choices[0].text.strip()
    assert r.usage.prompt_tokens == 5  # "The capital of France is" in SmolLM2's vocabulary


def test_compressed_request_serves_fewer_tokens_and_reports_stats(client):
    r = client.chat.completions.create(
        model="pflash",
        messages=_long_messages(),
        max_tokens=8,
        temperature=0,
        extra_body={
            "pflash_mode": "always",
            "pflash_keep_ratio": 0.2,
            "pflash_return_prompt": True,
        },
    )
    stats = r.usage.model_extra["timings"]["pflash"]
    prompt = r.model_extra["pflash_prompt"]
    assert stats["drafter_input_tokens"] == r.usage.prompt_tokens
    assert 0 < stats["compressed_tokens"] < 0.5 * r.usage.prompt_tokens
    assert stats["scorer_new_tokens"] == stats["drafter_input_tokens"]
    assert stats["query_rule"] == "prompt_end"
    assert prompt.endswith(QUESTION + "<|im_end|>\n<|im_start|>assistant\n")
    timings = r.usage.model_extra["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == stats["compressed_tokens"]


def test_needle_answer_is_right_with_compression_on_and_off(client):
    answers = {}
    for mode in ("off", "always"):
        r = client.chat.completions.create(
            model="pflash",
            messages=_long_messages(),
            max_tokens=16,
            temperature=0,
            extra_body={
                "pflash_mode": mode,
                "pflash_keep_ratio": 0.1,
                "pflash_return_prompt": True,
                "pflash_required": [NEEDLE],
            },
        )
        answers[mode] = r.choices[0].message.content
        assert NEEDLE in r.model_extra["pflash_prompt"]
    assert "7318842" in answers["off"]
    assert "7318842" in answers["always"]


def test_streamed_compression_sends_keep_alives_while_the_drafter_runs(server):
    body = {
        "messages": _long_messages(12000),
        "max_tokens": 4,
        "stream": True,
        "pflash_mode": "always",
        "pflash_keep_ratio": 0.1,
    }
    lines = []
    with httpx.stream(
        "POST", f"{server}/v1/chat/completions", json=body, headers=AUTH, timeout=300
    ) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line:
                lines.append(line)
    assert lines[0] == ": keep-alive"
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert any('"content"' in line for line in data)


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": "x"}], "pflash_keep_ratio": 1.5},
            "pflash_keep_ratio",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}], "pflash_keep_ratio": 0},
            "pflash_keep_ratio",
        ),
        ({"messages": [{"role": "user", "content": "x"}], "max_tokens": "ten"}, "max_tokens"),
        (
            {"messages": [{"role": "user", "content": "x"}], "pflash_mode": "sometimes"},
            "pflash_mode",
        ),
        ({"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
    ],
)
def test_bad_input_is_a_400_in_the_openai_error_shape(server, body, param):
    r = httpx.post(f"{server}/v1/chat/completions", json=body, headers=AUTH, timeout=30)
    assert r.status_code == 400
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert err["type"] == "invalid_request_error" and err["param"] == param


def test_malformed_json_is_a_400(server):
    r = httpx.post(
        f"{server}/v1/chat/completions",
        content=b'{"messages": [',
        headers={"content-type": "application/json", **AUTH},
        timeout=30,
    )
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"


def test_body_over_the_size_limit_is_a_413(server):
    big = {"messages": [{"role": "user", "content": "x" * 2_100_000}]}
    r = httpx.post(f"{server}/v1/chat/completions", json=big, headers=AUTH, timeout=60)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


def test_explicit_query_not_in_prompt_fails_closed_as_400(server):
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={
            "messages": _long_messages(2000),
            "max_tokens": 4,
            "pflash_mode": "always",
            "pflash_query": "this sentence is nowhere in the prompt",
        },
        headers=AUTH,
        timeout=120,
    )
    assert r.status_code == 400, r.text
    assert "query" in r.json()["error"]["code"]


@pytest.mark.parametrize(
    ("fields", "code"),
    [
        ({"pflash_query": "this sentence is nowhere in the prompt"}, "pflash_query_mapping"),
        ({"pflash_required": ["nor is this one"]}, "pflash_required_mapping"),
        # what must be kept (seven 4,000-character required strings, ~7K tokens) and the
        # answer (max_tokens at the server's output cap) cannot share the 8K context
        (
            {
                "messages": _long_messages(30000),
                "pflash_required": [
                    _long_messages(30000)[0]["content"][i * 4000 : (i + 1) * 4000] for i in range(7)
                ],
                "max_tokens": 4096,
            },
            "pflash_context_fit",
        ),
    ],
    ids=["query", "required", "context_fit"],
)
def test_a_streamed_request_gets_what_planning_finds_as_a_4xx_before_any_byte(server, fields, code):
    """Planning completes before the stream starts: a client mistake is a 400 in the
    envelope, never a 200 followed by an in-band error event."""
    body = {
        "messages": _long_messages(12000),
        "max_tokens": 4,
        "stream": True,
        "pflash_mode": "always",
        **fields,
    }
    r = httpx.post(f"{server}/v1/chat/completions", json=body, headers=AUTH, timeout=120)
    assert r.status_code == 400, r.text
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["error"]["code"] == code


def test_prompt_over_the_context_with_compression_off_is_a_400(server):
    r = httpx.post(
        f"{server}/v1/completions",
        json={"prompt": list(range(100, 9100)), "max_tokens": 4, "pflash_mode": "off"},
        headers=AUTH,
        timeout=60,
    )
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"
    assert r.json()["error"]["param"] == "prompt"


def test_return_prompt_needs_the_server_setting(server):
    r = httpx.post(
        f"{server}/gw2/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "pflash_return_prompt": True},
        timeout=30,
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "pflash_return_prompt"
    assert "return_prompt_enabled" in r.json()["error"]["message"]


def test_models_and_health(server):
    assert httpx.get(f"{server}/healthz", timeout=10).json() == {"status": "ok"}
    models = httpx.get(f"{server}/v1/models", headers=AUTH, timeout=10).json()
    assert models["data"][0]["max_model_len"] == 8192


# ----------------------------------------------------------------------------- API keys


@pytest.mark.parametrize("header", [None, "Bearer wrong-key", "Basic dGVzdC1rZXktMQ=="])
def test_missing_or_wrong_api_key_is_a_401(server, header):
    headers = {"Authorization": header} if header else {}
    r = httpx.post(
        f"{server}/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1},
        headers=headers,
        timeout=30,
    )
    assert r.status_code == 401
    assert r.json()["error"]["type"] == "authentication_error"
    assert r.json()["error"]["code"] == "invalid_api_key"


def test_every_configured_api_key_is_accepted(server):
    for key in (KEY, OTHER_KEY):
        r = httpx.post(
            f"{server}/v1/completions",
            json={"prompt": "Hi", "max_tokens": 1},
            headers={"Authorization": f"Bearer {key}"},
            timeout=60,
        )
        assert r.status_code == 200


# ----------------------------------------------------------------------------- backends


def test_openai_backend_serves_a_compressed_prompt_through_a_real_upstream(server):
    from openai import OpenAI

    gw = OpenAI(base_url=f"{server}/gw2/v1", api_key="unused", max_retries=0, timeout=300)
    r = gw.chat.completions.create(
        model="pflash",
        messages=_long_messages(),
        max_tokens=16,
        temperature=0,
        extra_body={"pflash_mode": "always", "pflash_keep_ratio": 0.1, "pflash_required": [NEEDLE]},
    )
    stats = r.usage.model_extra["timings"]["pflash"]
    assert stats["compressed_tokens"] < 0.5 * r.usage.prompt_tokens
    assert "7318842" in r.choices[0].message.content
    # the upstream (first app) prefilled exactly the compressed prompt, as a raw completion
    assert (
        r.usage.model_extra["timings"]["prompt_n"] + r.usage.model_extra["timings"]["cache_n"]
        == stats["compressed_tokens"]
    )


def test_openai_backend_streams_an_uncompressed_chat(server):
    from openai import OpenAI

    gw = OpenAI(base_url=f"{server}/gw2/v1", api_key="unused", max_retries=0, timeout=300)
    stream = gw.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=12,
        temperature=0,
        stream=True,
    )
    assert "Paris" in "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_a_tool_call_in_the_answer_comes_back_as_tool_calls(client):
    r = client.chat.completions.create(**tool_chat.tool_request("Paris"))
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert not choice.message.content


def test_a_streamed_tool_call_arrives_as_a_tool_calls_delta_never_as_text(client):
    stream = client.chat.completions.create(**tool_chat.tool_request("Paris"), stream=True)
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    calls = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert "<tool_call>" not in text
    assert [(c.index, c.function.name) for c in calls] == [(0, "get_weather")]
    assert json.loads(calls[0].function.arguments) == {"city": "Paris"}
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_tool_choice_none_returns_the_answer_as_text(client):
    r = client.chat.completions.create(**tool_chat.tool_request("Paris"), tool_choice="none")
    assert "<tool_call>" in r.choices[0].message.content
    assert not r.choices[0].message.tool_calls and r.choices[0].finish_reason == "stop"


def test_overload_is_a_503_with_retry_after(server):
    async def burst():
        async with httpx.AsyncClient(timeout=120) as http:
            body = {"messages": [{"role": "user", "content": "Count to twenty."}], "max_tokens": 24}
            return await asyncio.gather(
                *[http.post(f"{server}/gw2/v1/chat/completions", json=body) for _ in range(6)]
            )

    responses = asyncio.run(burst())
    codes = sorted(r.status_code for r in responses)
    assert 200 in codes
    rejected = [r for r in responses if r.status_code == 503]
    assert rejected, codes
    assert all(r.headers.get("retry-after") == "1" for r in rejected)


def test_cross_vocabulary_pair_keeps_the_needle_for_a_gemma_target(server):
    from openai import OpenAI

    xv = OpenAI(base_url=f"{server}/xv/v1", api_key="unused", max_retries=0, timeout=300)
    prompt = (
        "Below is a long passage. Answer the question at the end based ONLY on information in "
        "the passage.\n\n" + _document(6000) + "\n\nQuestion: " + QUESTION + "\nAnswer:"
    )
    full = xv.completions.create(
        model="pflash",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        extra_body={"pflash_mode": "off"},
    )
    r = xv.completions.create(
        model="pflash",
        prompt=prompt,
        max_tokens=12,
        temperature=0,
        extra_body={
            "pflash_mode": "always",
            "pflash_keep_ratio": 0.15,
            "pflash_return_prompt": True,
            "pflash_query": QUESTION,
            "pflash_required": [NEEDLE],
        },
    )
    stats = r.usage.model_extra["timings"]["pflash"]
    assert r.usage.prompt_tokens == full.usage.prompt_tokens  # Gemma tokens of the original
    assert stats["drafter_input_tokens"] != r.usage.prompt_tokens  # SmolLM2 tokens differ
    assert stats["compressed_tokens"] < 0.5 * r.usage.prompt_tokens
    served = r.model_extra["pflash_prompt"]
    assert NEEDLE in served and served.rstrip().endswith("Answer:")
    assert ("7318842" in full.choices[0].text) == ("7318842" in r.choices[0].text)


def test_semantic_evidence_keeps_the_fact_a_paraphrased_question_asks_for(server):
    from conftest import PARAPHRASED
    from openai import OpenAI

    xv = OpenAI(base_url=f"{server}/xv/v1", api_key="unused", max_retries=0, timeout=300)
    fact, question = PARAPHRASED[0]
    body = _document(6000).replace(NEEDLE, fact)
    prompt = "Answer from the passage.\n\n" + body + "\n\nQuestion: " + question + "\nAnswer:"
    r = xv.completions.create(
        model="pflash",
        prompt=prompt,
        max_tokens=4,
        temperature=0,
        extra_body={
            "pflash_mode": "always",
            "pflash_keep_ratio": 0.1,
            "pflash_return_prompt": True,
            "pflash_query": question,
        },
    )
    stats = r.usage.model_extra["timings"]["pflash"]
    assert stats["semantic_passages"] > 20 and stats["semantic_ms"] > 0
    served = r.model_extra["pflash_prompt"]
    assert fact in served and served.rstrip().endswith("Answer:")
    assert stats["compressed_tokens"] < 0.25 * r.usage.prompt_tokens


def test_a_forged_forwarded_for_never_chooses_the_tenant(cluster, server):
    """Serve's proxy trusts X-Forwarded-For from loopback: `X-Forwarded-For: 10.0.0.7` once
    made any caller the tenant of 10.0.0.7. On the keyless `xv` app (anonymous_tenant: local)
    the caller without the header is its own private tenant; with a forged header it is
    neither that nor the named address's tenant, whichever address it names, and it is not
    shown the served prompt. The trace names each request's tenant."""
    from pflash.config import build_config
    from pflash.serving.tenants import tenant_for, tenant_policy

    trace = Path(cluster.workdir) / "xv_trace.jsonl"
    before = len(trace.read_text().splitlines()) if trace.exists() else 0
    forged = ({}, {"X-Forwarded-For": "10.0.0.7"}, {"X-Forwarded-For": "10.0.0.8, 10.0.0.9"})
    for i, headers in enumerate(forged):
        body = {
            "model": "pflash",
            # a different start each time: a fresh selection (and trace line) per request
            "prompt": f"Request {i}. Answer from the passage.\n\n"
            + _document(4000)
            + f"\n\nQuestion: {QUESTION}\nAnswer:",
            "max_tokens": 1,
            "pflash_mode": "always",
            "pflash_keep_ratio": 0.3,
        }
        r = httpx.post(f"{server}/xv/v1/completions", json=body, headers=headers, timeout=300)
        assert r.status_code == 200, r.text
        if headers:
            asked = httpx.post(
                f"{server}/xv/v1/completions",
                json={**body, "pflash_return_prompt": True},
                headers=headers,
                timeout=60,
            )
            assert asked.status_code == 400 and asked.json()["error"]["param"] == (
                "pflash_return_prompt"
            )
    deadline = time.time() + 30
    while len(trace.read_text().splitlines()) < before + 3:  # written off the request path
        assert time.time() < deadline, "the trace lines did not arrive"
        time.sleep(0.5)
    own, *by_forgers = [
        json.loads(line)["tenant"] for line in trace.read_text().splitlines()[before:]
    ]
    local = tenant_policy(build_config({}, env={}).security, "127.0.0.1")
    assert own == tenant_for(local, None, "127.0.0.1").id
    behind_proxy = tenant_policy(
        build_config({"trusted_proxies": ["127.0.0.1/32"]}, env={}).security, "127.0.0.1"
    )
    named = {tenant_for(behind_proxy, None, "127.0.0.1", a).id for a in ("10.0.0.7", "10.0.0.9")}
    assert by_forgers[0] == by_forgers[1] and own not in by_forgers
    assert not named & set(by_forgers)


# ----------------------------------------------------------------------------- metrics


def _scrape(url: str) -> dict[tuple[str, tuple], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=10).text
    out: dict[tuple[str, tuple], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = tuple(
                sorted(
                    (k, v)
                    for k, v in s.labels.items()
                    if k in ("application", "compressed", "endpoint", "stage", "reason")
                )
            )
            out[(s.name, labels)] = out.get((s.name, labels), 0.0) + s.value
    return out


def _value(samples, name: str, **labels) -> float:
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def test_metrics_are_exported_for_prometheus_and_move_with_requests(cluster, client):
    def compressed_requests():
        return _value(
            _scrape(cluster.metrics_url),
            "ray_pflash_requests_total",
            application="pflash",
            compressed="true",
        )

    client.chat.completions.create(
        model="pflash",
        messages=_long_messages(3000),
        max_tokens=2,
        extra_body={"pflash_mode": "always", "pflash_keep_ratio": 0.2},
    )
    deadline = time.time() + 30
    while compressed_requests() < 1:
        assert time.time() < deadline, "pflash metrics never reached the metrics endpoint"
        time.sleep(1)
    time.sleep(2.5)  # let the reporter flush everything recorded so far
    before = _scrape(cluster.metrics_url)
    client.chat.completions.create(
        model="pflash",
        messages=_long_messages(3200),  # a new conversation: no view to repeat, the drafter runs
        max_tokens=2,
        extra_body={"pflash_mode": "always", "pflash_keep_ratio": 0.2},
    )
    deadline = time.time() + 30
    while True:
        after = _scrape(cluster.metrics_url)
        if _value(
            after, "ray_pflash_requests_total", application="pflash", compressed="true"
        ) > _value(before, "ray_pflash_requests_total", application="pflash", compressed="true"):
            break
        assert time.time() < deadline
        time.sleep(1)
    time.sleep(2.5)
    after = _scrape(cluster.metrics_url)
    app = {"application": "pflash"}
    delta = lambda name, **kw: _value(after, name, **app, **kw) - _value(before, name, **app, **kw)  # noqa: E731
    assert delta("ray_pflash_requests_total", compressed="true") == 1
    assert delta("ray_pflash_compression_seconds_count") == 1
    assert delta("ray_pflash_compression_seconds_sum") > 0
    assert delta("ray_pflash_ttft_seconds_count", compressed="true") == 1
    assert delta("ray_pflash_drafter_forward_seconds_sum") > 0
    assert delta("ray_pflash_input_tokens_sum") > delta("ray_pflash_kept_tokens_sum") > 0


# ----------------------------------------------------------------------------- multi-turn

FACTS = (
    "The access code for the north gate is 4417.",
    "The ferry to Lindholm leaves at 06:40 every Tuesday.",
    "Professor Okonkwo keeps the spare key in the blue teapot.",
    "The backup generator burns 12 litres of diesel per hour.",
)
QUESTIONS = (
    "What is the access code for the north gate?",
    "When does the ferry to Lindholm leave?",
    "Where does Professor Okonkwo keep the spare key?",
)


def _fact_document() -> str:
    """~4.5K target tokens of real prose (GPL-3) with four facts at 20/40/60/80%."""
    paras = Path("/usr/share/common-licenses/GPL-3").read_text()[:20000].split("\n\n")
    for i, fact in enumerate(FACTS):
        paras.insert((i + 1) * len(paras) // (len(FACTS) + 1), fact)
    return "\n\n".join(paras)


def _turn(
    http: httpx.Client,
    messages: list[dict],
    key: str = KEY,
    max_tokens: int = 24,
    keep: float = 0.1,
):
    r = http.post(
        "/v1/chat/completions",
        json={
            "messages": messages,
            "max_tokens": max_tokens,
            "temperature": 0,
            "pflash_mode": "always",
            "pflash_keep_ratio": keep,
            "pflash_return_prompt": True,
        },
        headers={"Authorization": f"Bearer {key}"},
    )
    assert r.status_code == 200, r.text
    body = r.json()
    return (
        body,
        body["usage"]["timings"]["pflash"],
        body["pflash_prompt"],
        r.headers["x-pflash-replica"],
    )


@pytest.fixture(scope="module")
def conversation(server):
    """Three turns over one document; each later turn asks a fact the earlier served prompts dropped."""
    http = httpx.Client(base_url=server, timeout=600)
    messages = [{"role": "user", "content": _fact_document() + "\n\n" + QUESTIONS[0]}]
    turns = []
    for t, question in enumerate(QUESTIONS):
        if t:
            messages = messages + [{"role": "user", "content": question}]
        body, stats, served, replica = _turn(http, messages)
        turns.append(
            {
                "messages": messages,
                "body": body,
                "stats": stats,
                "served": served,
                "replica": replica,
            }
        )
        messages = messages + [
            {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
        ]
    yield turns
    http.close()


def test_first_turn_is_a_fresh_compressed_view(conversation):
    first = conversation[0]
    assert first["stats"]["view"]["mode"] == "fresh" and first["stats"]["view"]["turn"] == 1
    assert first["stats"]["compressed_tokens"] < 0.25 * first["body"]["usage"]["prompt_tokens"]
    assert FACTS[0] in first["served"] and FACTS[1] not in first["served"]
    assert "4417" in first["body"]["choices"][0]["message"]["content"]


def test_follow_up_recalls_the_dropped_fact_and_extends_the_served_prefix(conversation):
    for t in (1, 2):
        prev, turn = conversation[t - 1], conversation[t]
        view = turn["stats"]["view"]
        assert view["mode"] == "continue" and view["turn"] == t + 1
        assert view["recalled_tokens"] > 0
        assert FACTS[t] in turn["served"] and FACTS[t] not in prev["served"]
        # byte-stable prefix: everything the target cached up to the old generation prompt
        cut = prev["served"].rindex("<|im_start|>assistant\n")
        assert turn["served"][:cut] == prev["served"][:cut]
        assert view["reused_tokens"] > 0.8 * prev["stats"]["view"]["served_tokens"]
    assert "06:40" in conversation[1]["body"]["choices"][0]["message"]["content"]
    assert "teapot" in conversation[2]["body"]["choices"][0]["message"]["content"]


def test_later_turns_resume_the_drafter_session(conversation):
    first, later = conversation[0]["stats"], conversation[1]["stats"]
    assert (
        first["scorer_resume"] == 0 and first["scorer_new_tokens"] == first["drafter_input_tokens"]
    )
    assert later["scorer_resume"] >= first["drafter_input_tokens"] - 8
    assert later["scorer_new_tokens"] < 0.1 * later["drafter_input_tokens"]
    assert later["scorer_forward_ms"] < 0.25 * first["scorer_forward_ms"]


def test_same_request_again_is_a_byte_identical_repeat_on_any_ingress_replica(server, conversation):
    last = conversation[-1]
    body = {
        "messages": last["messages"],
        "max_tokens": 1,
        "temperature": 0,
        "pflash_mode": "always",
        "pflash_keep_ratio": 0.1,
        "pflash_return_prompt": True,
    }

    async def repeats():  # concurrent, so the router spreads them over both replicas
        async with httpx.AsyncClient(base_url=server, timeout=300) as http:
            return await asyncio.gather(
                *[http.post("/v1/chat/completions", json=body, headers=AUTH) for _ in range(12)]
            )

    # The router picks a replica per request by its queue lengths; requests this short
    # (a repeat runs no model) can all fit on one replica, as they once did in CI. Bursts
    # go on until both replicas have answered (each answer checked), at most five.
    replicas = {last["replica"]}
    sent = 1
    for _ in range(5):
        for r in asyncio.run(repeats()):
            assert r.status_code == 200, r.text
            stats = r.json()["usage"]["timings"]["pflash"]
            replicas.add(r.headers["x-pflash-replica"])
            assert stats["view"]["mode"] == "repeat"
            assert r.json()["pflash_prompt"] == last["served"]
            assert stats["compress_ms"] == 0
        sent += 12
        if len(replicas) == 2:
            break
    assert len(replicas) == 2, f"{sent} requests, 12 at a time, all landed on one ingress replica"


def test_agent_step_paste_and_rebuild_in_one_conversation(server, conversation):
    """Turn 3 → an agent step (assistant tool call + tool output, appended verbatim, no
    drafter) → the answer → a large paste (compressed into the view) → a mid-size paste
    appended verbatim that makes the view more than twice a fresh compression (rebuild).
    One conversation keeps one view, so the steps run in order in one test."""
    last = conversation[-1]
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"room": "12"}'},
    }
    messages = last["messages"] + [
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Room 12 is on the third floor."},
    ]
    with httpx.Client(base_url=server, timeout=600) as http:
        body, stats, served, _ = _turn(http, messages, max_tokens=4)
        assert stats["view"]["mode"] == "continue"
        assert stats["scorer_new_tokens"] == 0 and stats["compress_ms"] == 0
        assert "Room 12 is on the third floor." in served
        cut = last["served"].rindex("<|im_start|>assistant\n")
        assert served[:cut] == last["served"][:cut]

        answer = {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
        paste = Path("/usr/share/common-licenses/Apache-2.0").read_text()[:9000]
        question = paste + "\n\nWhat does this licence say about trademarks?"
        before = body["usage"]["prompt_tokens"]
        messages = messages + [answer, {"role": "user", "content": question}]
        body, stats, pasted, _ = _turn(http, messages, max_tokens=4)
    assert stats["view"]["mode"] == "continue-compressed"
    assert stats["view"]["delta_tokens"] < 0.5 * (body["usage"]["prompt_tokens"] - before)
    assert pasted.endswith(
        "What does this licence say about trademarks?<|im_end|>\n<|im_start|>assistant\n"
    )
    cut = served.rindex("<|im_start|>assistant\n")
    assert pasted[:cut] == served[:cut]

    # under chat_compress_new_tokens (1000): appended verbatim, so the view (~1.8K tokens)
    # outgrows twice a fresh compression at keep 0.03
    answer = {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
    notes = Path("/usr/share/common-licenses/GPL-2").read_text()[2000:5600]
    messages = messages + [answer, {"role": "user", "content": notes + "\n\nAnything odd here?"}]
    with httpx.Client(base_url=server, timeout=600) as http:
        _, stats, rebuilt, _ = _turn(http, messages, max_tokens=4, keep=0.03)
    assert stats["view"]["mode"] == "rebuild", stats["view"]
    assert (
        stats["view"]["served_tokens"]
        == stats["view"]["fresh_tokens"]
        == stats["compressed_tokens"]
    )
    assert len(rebuilt) < len(pasted)


def test_views_of_one_api_key_are_never_used_for_another(server, conversation):
    second = conversation[1]
    with httpx.Client(base_url=server, timeout=600) as http:
        _, stats, _, _ = _turn(http, second["messages"], key=OTHER_KEY, max_tokens=1)
    assert stats["view"]["mode"] == "fresh" and stats["view"]["turn"] == 1


# ----------------------------------------------------------------------------- long prompts


def _licenses_document(chars: int) -> str:
    """Real text past SmolLM2's 8K context: GPL-3, GPL-2, Apache-2.0, the needle in the middle."""
    root = Path("/usr/share/common-licenses")
    body = "\n\n".join((root / name).read_text() for name in ("GPL-3", "GPL-2", "Apache-2.0"))
    body = body[:chars]
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + NEEDLE + body[mid:]


def test_a_prompt_longer_than_the_target_context_is_compressed_to_fit_in_auto_mode(client):
    # 12K+ tokens on an 8K target, below the app's auto threshold (100,000): served whole it
    # cannot run, so auto compresses it to fit the context minus max_tokens
    r = client.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": _licenses_document(60_000) + "\n\n" + QUESTION}],
        max_tokens=16,
        temperature=0,
    )
    stats = r.usage.model_extra["timings"]["pflash"]
    assert r.usage.prompt_tokens > 12_000
    assert stats["compressed_tokens"] + 16 <= 8192
    assert r.choices[0].finish_reason in ("stop", "length")


def test_a_mandatory_part_over_the_context_is_a_400_naming_it(client):
    with pytest.raises(Exception) as info:
        client.chat.completions.create(
            model="pflash",
            messages=[
                {"role": "system", "content": _licenses_document(40_000)},
                {"role": "user", "content": QUESTION},
            ],
            max_tokens=16,
        )
    assert info.value.status_code == 400
    error = info.value.body
    assert error["code"] == "pflash_context_fit" and "system prompt" in error["message"]


def test_a_prompt_past_max_prompt_tokens_is_refused_before_any_model_runs(server):
    r = httpx.post(
        f"{server}/gw2/v1/completions",
        json={"prompt": [1] * 140_000, "max_tokens": 1},
        timeout=60,
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


# ----------------------------------------------------------------------------- hardening


def test_unknown_routes_and_methods_answer_in_the_envelope(server):
    for method, path, status in [
        ("GET", "/v1/nothing", 404),
        ("POST", "/v1/chat/completions/", 404),
        ("GET", "/v1/chat/completions", 405),
        ("DELETE", "/v1/models", 405),
    ]:
        r = httpx.request(method, f"{server}{path}", headers=AUTH, timeout=10)
        assert r.status_code == status, (method, path)
        assert set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_model_the_server_does_not_serve_is_404_and_models_lists_the_served_name(client):
    import openai

    assert [m.id for m in client.models.list().data] == ["pflash"]
    with pytest.raises(openai.NotFoundError) as info:
        client.chat.completions.create(
            model="gpt-4o", messages=[{"role": "user", "content": "hi"}], max_tokens=1
        )
    assert info.value.body["code"] == "model_not_found"


def test_every_response_carries_a_request_id(server):
    ok = httpx.post(
        f"{server}/v1/completions",
        json={"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"},
        headers=AUTH,
        timeout=60,
    )
    bad = httpx.post(f"{server}/v1/completions", json={"prompt": ""}, headers=AUTH, timeout=60)
    assert ok.headers["x-request-id"].startswith("req-")
    assert bad.headers["x-request-id"].startswith("req-")
    assert ok.headers["x-request-id"] != bad.headers["x-request-id"]


def test_generated_bad_requests_never_get_a_5xx_a_hang_or_a_bare_body(server):
    """The fuzz suite: requests drawn from tests/integration/bad_requests.py (mutated and
    unknown fields, raw bodies, odd chats, wrong routes), each answered within 60 s by a 4xx
    in the OpenAI envelope (or a 200), with /healthz up after each."""
    from collections import Counter

    from bad_requests import BAD_REQUESTS
    from hypothesis import HealthCheck, given, settings

    counts: Counter = Counter()
    failures: list = []
    with httpx.Client(timeout=60) as http:

        @settings(
            max_examples=int(os.environ.get("PFLASH_FUZZ_EXAMPLES", "1000")),
            deadline=None,
            database=None,
            derandomize=True,
            suppress_health_check=list(HealthCheck),
        )
        @given(BAD_REQUESTS)
        def send(req):
            headers = {**AUTH, **req.headers}
            try:
                r = http.request(req.method, server + req.path, content=req.body, headers=headers)
            except httpx.TimeoutException:
                counts["timeout"] += 1
                failures.append((req.family, "timeout", req.body[:200]))
                return
            counts[r.status_code] += 1
            try:
                error = r.json().get("error") if r.status_code != 200 else None
            except ValueError:
                error = None
            enveloped = r.status_code == 200 or (
                isinstance(error, dict) and {"message", "type"} <= set(error)
            )
            if r.status_code >= 500 or not enveloped:
                failures.append((req.family, r.status_code, req.body[:200], r.text[:200]))
            assert http.get(f"{server}/healthz").status_code == 200

        send()
    print("fuzz answers by status:", dict(counts))
    assert failures == []
    assert sum(counts.values()) >= int(os.environ.get("PFLASH_FUZZ_EXAMPLES", "1000"))


def test_a_tenant_never_reuses_another_tenants_cached_prefix(server):
    """Tenant B sending tenant A's exact conversation gets no cached tokens (the reuse would
    show in cached_tokens and in the TTFT); A's own next turn still reuses its prefix."""
    from openai import OpenAI

    a = OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)
    b = OpenAI(base_url=f"{server}/v1", api_key=OTHER_KEY, max_retries=0, timeout=300)
    secret = "The vault code of the Lisbon office is 4417-ALPHA. " * 20
    turn = [{"role": "system", "content": secret}, {"role": "user", "content": "Hello."}]
    common = dict(model="pflash", max_tokens=2, temperature=0, extra_body={"pflash_mode": "off"})
    a.chat.completions.create(messages=turn, **common)
    again = [*turn, {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye."}]
    by_b = b.chat.completions.create(messages=again, **common)
    by_a = a.chat.completions.create(messages=again, **common)
    assert by_b.usage.prompt_tokens_details.cached_tokens == 0
    assert by_a.usage.prompt_tokens_details.cached_tokens > 100


def test_readyz_reports_every_deployment_ready(server):
    r = httpx.get(f"{server}/readyz", timeout=30)
    assert r.status_code == 200
    assert r.json() == {
        "status": "ready",
        "checks": {"target": "ok", "drafter": "ok", "session_store": "ok"},
    }


def _trickle(server: str, path: str, headers: dict[str, str], declared: int, limit_s: float):
    """Send a request's headers, then its body one byte every 0.5 s until the server
    answers: (status, JSON body, seconds from the headers to the answer)."""
    host, port = server.removeprefix("http://").rsplit(":", 1)
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    head += f"Content-Length: {declared}\r\n\r\n"
    answer = b""
    with socket.create_connection((host, int(port)), timeout=limit_s) as sock:
        sock.sendall(head.encode())
        started = time.monotonic()
        sent = 0
        while time.monotonic() - started < limit_s:
            if select.select([sock], [], [], 0.5)[0]:
                chunk = sock.recv(65536)
                answer += chunk
                top, _, body = answer.partition(b"\r\n\r\n")
                length = [
                    int(line.split(b":", 1)[1])
                    for line in top.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                ]
                if not chunk or (length and len(body) >= length[0]):
                    break
            elif sent < declared - 1:  # never the last byte: the body stays incomplete
                sock.sendall(b" ")
                sent += 1
        elapsed = time.monotonic() - started
    top, _, body = answer.partition(b"\r\n\r\n")
    return int(top.split(b" ", 2)[1]), json.loads(body), elapsed


def test_a_body_trickled_slower_than_body_read_timeout_is_a_408_in_the_envelope(server):
    """A client that sends its headers and then a byte every half second holds its slot
    for body_read_timeout_s at most; the answer is a 408 naming the limit."""
    status, body, elapsed = _trickle(
        server, "/v1/chat/completions", AUTH, declared=10_000, limit_s=BODY_READ_TIMEOUT_S + 30
    )
    assert status == 408
    assert body["error"]["code"] == "request_timeout"
    assert "body_read_timeout_s" in body["error"]["message"]
    assert BODY_READ_TIMEOUT_S - 0.5 <= elapsed < BODY_READ_TIMEOUT_S + 10


def test_max_tokens_past_max_output_tokens_is_served_up_to_the_cap(server):
    """A client cannot know the cap before its first call: asking for more is served (the
    answer ends by itself here, long before the cap; admission.cap_output clamps it)."""
    chat = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 10**6,
            "temperature": 0}  # fmt: skip
    r = httpx.post(f"{server}/v1/chat/completions", json=chat, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["finish_reason"] == "stop"
    assert 0 < body["usage"]["completion_tokens"] < 4096


def _ingress_capacity(cluster) -> tuple[int, int, int, int]:
    """(replicas, max_ongoing_requests, max_queued_requests, backpressure Retry-After) of
    the main app's Ingress, as the test app configures it (the decorator's
    max_ongoing_requests where the config sets none)."""
    from deployments.ingress import Ingress

    config = yaml.safe_load(Path(cluster.config).read_text())
    (app,) = [a for a in config["applications"] if a["route_prefix"] == "/"]
    (dep,) = [d for d in app["deployments"] if d["name"] == "Ingress"]
    ongoing = dep.get("max_ongoing_requests", Ingress.max_ongoing_requests)
    retry_after = dep["backpressure_config"]["retry_after_s"]
    return dep["num_replicas"], ongoing, dep["max_queued_requests"], retry_after


def _probe_flood(server: str, n: int) -> tuple[list[httpx.Response], float]:
    """`n` /readyz probes sent at once, each on its own connection: (answers, seconds)."""

    async def flood():
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(timeout=30, limits=limits) as http:
            started = time.monotonic()
            answers = await asyncio.gather(*(http.get(f"{server}/readyz") for _ in range(n)))
            return answers, time.monotonic() - started

    return asyncio.run(flood())


def _until_ready_in_a_row(server: str, times: int = 20, limit_s: float = 60) -> int:
    """Probe one at a time until `times` answers in a row are ready (both Ingress replicas
    then answer from a filled cache): how many in a row it reached."""
    deadline, in_a_row = time.monotonic() + limit_s, 0
    while in_a_row < times and time.monotonic() < deadline:
        ok = httpx.get(f"{server}/readyz", timeout=30).status_code == 200
        in_a_row = in_a_row + 1 if ok else 0
        time.sleep(0 if ok else 0.5)
    return in_a_row


READY = {"status": "ready", "checks": {"target": "ok", "drafter": "ok", "session_store": "ok"}}


def test_a_flood_of_readyz_probes_within_the_proxy_queue_is_answered_ready_from_the_cache(
    cluster,
):
    """A burst of max_queued_requests probes is all ready, quickly: none calls a model.

    Sized by Serve's admission, not by the replicas: the proxy counts every request still
    waiting to be assigned a replica against the Ingress's max_queued_requests (one proxy,
    so not per replica), including those it is about to assign to idle replicas. A burst
    at most that large is never refused by Serve; a larger one may be (a plain-text 503,
    the next test), which is the operator's capacity setting, not readiness."""
    _, _, queued, _ = _ingress_capacity(cluster)
    assert _until_ready_in_a_row(cluster.http) == 20
    for _ in range(3):
        answers, elapsed = _probe_flood(cluster.http, queued)
        assert [(a.status_code, a.json()) for a in answers] == [(200, READY)] * queued
        assert elapsed < 10


def test_readyz_probes_past_the_ingress_capacity_are_refused_by_serve_not_by_readiness(
    cluster,
):
    """More probes at once than both replicas' max_ongoing_requests plus the proxy's queue:
    each answer is ready, or Serve's own backpressure 503 (plain text, the configured
    Retry-After), never readiness's 503 naming a deployment. How many Serve refuses
    depends on how fast the others are answered; the test asserts only what each is."""
    replicas, ongoing, queued, retry_after = _ingress_capacity(cluster)
    n = replicas * ongoing + queued + queued // 2
    assert _until_ready_in_a_row(cluster.http) == 20
    answers, _ = _probe_flood(cluster.http, n)
    refused = "Request dropped due to backpressure (num_queued_requests="
    ready = [a for a in answers if a.status_code == 200]
    assert [a.json() for a in ready] == [READY] * len(ready)
    assert len(ready) >= queued  # the first max_queued_requests to arrive are admitted
    for a in answers:
        if a.status_code != 200:
            assert a.status_code == 503
            assert a.headers["content-type"].startswith("text/plain")
            assert a.headers["retry-after"] == str(retry_after)
            assert a.text.startswith(refused), a.text
            assert a.text.endswith(f"max_queued_requests={queued}).")
