"""The edge end to end in process (`pflash.serving.gateway`): the ingress's routes over a
`Gateway` with a real `Compressor` (the embedded tokenizer, an in-process scorer and store)
and a scripted target, behind the middleware; every API, whole and streamed, token counts,
model listings and failures, with the headers a client reads. No Ray."""

from __future__ import annotations

import asyncio
import json

import anthropic.types
import numpy as np
import openai.types
import openai.types.chat
import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from pflash.compress.scoring import ScoreResult
from pflash.config import build_config
from pflash.flow.compressor import Compressor
from pflash.flow.in_process import LocalStore
from pflash.models.target.protocol import GenerationDone, GenerationTimings, TokenDelta
from pflash.serving.chat_completion.serving import ChatAnswer
from pflash.serving.completion.serving import CompletionAnswer
from pflash.serving.gateway import Gateway
from pflash.serving.messages.translate import COUNT as MESSAGES_COUNT
from pflash.serving.messages.translate import EDGE as MESSAGES
from pflash.serving.middleware import install
from pflash.serving.responses.translate import COUNT as RESPONSES_COUNT
from pflash.serving.responses.translate import EDGE as RESPONSES
from pflash.serving.tenants import tenant_policy
from pflash.views.store import ViewStore

KEY = "sk-gateway"
AUTH = {"authorization": f"Bearer {KEY}"}
ANTHROPIC = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
TIMINGS = GenerationTimings(prompt_n=20, prompt_ms=5.0, predicted_n=2, predicted_ms=4.0, cache_n=0)
HI = [{"role": "user", "content": "Capital of France?"}]


class Target:
    """The target's `generate`: "Paris." in two pieces, or `failure` raised at once."""

    def __init__(self):
        self.failure: Exception | None = None

    def __call__(self, ids, params, cut, conversation):
        return Events(self.failure)


class Events:
    """One generation's events, as the target handle streams them (`cancel` included)."""

    def __init__(self, failure: Exception | None):
        self.events = [TokenDelta("Par"), TokenDelta("is."), GenerationDone("stop", TIMINGS)]
        self.failure = failure

    async def __anext__(self):
        if self.failure is not None:
            raise self.failure
        if not self.events:
            raise StopAsyncIteration
        return self.events.pop(0)

    def cancel(self):
        self.events = []


def _uniform_scorer(request, conversation):
    future = asyncio.get_running_loop().create_future()
    n = len(request.ids)
    future.set_result(ScoreResult(mass=np.full(n, 1.0 / n, dtype=np.float32)))
    return future


@pytest.fixture(scope="module")
def edge(smollm2_tokenizer):
    """(a client of the app, its target, the metric events)."""
    config = build_config(
        {"api_keys": [KEY], "max_body_bytes": 20_000, "return_prompt_enabled": True}, env={}
    )
    metrics: list[tuple] = []
    target = Target()
    gateway = Gateway(
        config=config,
        tenants=tenant_policy(config.security, "127.0.0.1"),
        target_tokenizer=smollm2_tokenizer,
        compressor=Compressor(
            target_tokenizer=smollm2_tokenizer,
            drafter_tokenizer=smollm2_tokenizer,
            scorer=_uniform_scorer,
            store=LocalStore(ViewStore(16, 3600.0)),
            max_context=8192,
        ),
        generate=target,
        record=lambda name, value=1.0, **tags: metrics.append((name, tags)),
        replica="replica-1",
    )
    app = FastAPI(redirect_slashes=False)
    install(app)
    routes = {
        "/v1/chat/completions": lambda r: gateway.serve(r, ChatAnswer),
        "/v1/completions": lambda r: gateway.serve(r, CompletionAnswer),
        "/v1/messages": lambda r: gateway.serve(r, ChatAnswer, MESSAGES),
        "/v1/responses": lambda r: gateway.serve(r, ChatAnswer, RESPONSES),
        "/v1/messages/count_tokens": lambda r: gateway.count(r, MESSAGES_COUNT),
        "/v1/responses/input_tokens": lambda r: gateway.count(r, RESPONSES_COUNT),
    }
    for path, handler in routes.items():

        async def route(request: Request, handler=handler):
            return await handler(request)

        app.post(path)(route)

    @app.get("/v1/models")
    async def models(request: Request):
        return await gateway.models(request, None)

    @app.get("/v1/models/{model_id:path}")
    async def model(request: Request, model_id: str):
        return await gateway.models(request, model_id)

    return TestClient(app, raise_server_exceptions=False), target, metrics


def sse_data(text: str) -> list:
    return [line[len("data: ") :] for line in text.split("\n") if line.startswith("data: ")]


def test_a_chat_completion_names_its_request_and_replica(edge):
    client, _, _ = edge
    r = client.post("/v1/chat/completions", json={"messages": HI}, headers=AUTH)
    assert r.status_code == 200, r.text
    parsed = openai.types.chat.ChatCompletion.model_validate(r.json())
    assert parsed.choices[0].message.content == "Paris." and parsed.id.startswith("chatcmpl-")
    assert r.headers["x-request-id"].startswith("req-") and "request-id" not in r.headers
    assert r.headers["x-pflash-replica"] == "replica-1"
    assert parsed.usage.prompt_tokens > 0


def test_a_streamed_completion_ends_with_done_and_names_its_request(edge):
    client, _, _ = edge
    body = {"prompt": "The capital of France is", "stream": True, "pflash_return_prompt": True}
    r = client.post("/v1/completions", json=body, headers=AUTH)
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("req-")
    *chunks, done = sse_data(r.text)
    assert done == "[DONE]"
    chunks = [json.loads(c) for c in chunks]
    assert "".join(c["choices"][0]["text"] for c in chunks) == "Paris."
    assert chunks[-1]["pflash_prompt"] == "The capital of France is"


def test_anthropic_messages_answer_with_its_key_header_and_request_id(edge):
    client, _, metrics = edge
    body = {"model": "pflash", "max_tokens": 8, "messages": HI}
    r = client.post("/v1/messages", json=body, headers=ANTHROPIC)
    assert r.status_code == 200, r.text
    message = anthropic.types.Message.model_validate(r.json())
    assert message.content[0].text == "Paris." and message.stop_reason == "end_turn"
    assert r.headers["request-id"] == r.headers["x-request-id"]
    assert json.loads(r.headers["x-pflash-stats"])["served_ratio"] == 1.0
    assert ("pflash_requests", {"endpoint": "chat", "compressed": "false"}) in metrics
    unauthorized = client.post("/v1/messages", json=body)
    assert unauthorized.status_code == 401
    assert unauthorized.json()["error"]["type"] == "authentication_error"
    assert unauthorized.headers["request-id"].startswith("req-")


def test_a_responses_stream_names_the_hosted_tools_it_did_not_offer(edge):
    client, _, metrics = edge
    body = {"input": "Capital of France?", "stream": True, "tools": [{"type": "web_search"}]}
    r = client.post("/v1/responses", json=body, headers=AUTH)
    assert r.status_code == 200 and r.headers["x-pflash-tools-not-offered"] == "web_search"
    events = [json.loads(d) for d in sse_data(r.text)]
    assert events[-1]["type"] == "response.completed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Paris."
    assert ("pflash_tools_not_offered", {"tool": "web_search"}) in metrics


def test_token_counts_answer_in_each_apis_shape(edge):
    client, _, _ = edge
    messages = client.post(
        "/v1/messages/count_tokens", json={"model": "pflash", "messages": HI}, headers=ANTHROPIC
    )
    responses = client.post("/v1/responses/input_tokens", json={"input": HI}, headers=AUTH)
    assert messages.json()["input_tokens"] == responses.json()["input_tokens"] > 0
    assert responses.json()["object"] == "response.input_tokens"
    assert messages.headers["request-id"].startswith("req-")
    assert responses.headers["x-pflash-replica"] == "replica-1"


def test_model_listings_answer_in_the_shape_their_client_reads(edge):
    client, _, _ = edge
    openai_list = client.get("/v1/models", headers=AUTH).json()
    assert openai_list["data"][0]["max_model_len"] == 8192
    page = client.get("/v1/models", headers=ANTHROPIC).json()
    assert anthropic.types.ModelInfo.model_validate(page["data"][0]).id == "pflash"
    missing = client.get("/v1/models/claude-x", headers=ANTHROPIC)
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert client.get("/v1/models").status_code == 401


def test_a_body_past_max_body_bytes_is_a_413_counted_as_a_request_error(edge):
    client, _, metrics = edge
    before = metrics.count(("pflash_errors", {"stage": "request"}))
    big = {"messages": [{"role": "user", "content": "x" * 30_000}]}
    r = client.post("/v1/chat/completions", json=big, headers=AUTH)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    assert metrics.count(("pflash_errors", {"stage": "request"})) == before + 1


def test_a_failing_target_is_a_5xx_naming_only_the_request(edge):
    client, target, metrics = edge
    target.failure = RuntimeError("the GPU at 10.0.0.3 fell over")
    try:
        whole = client.post("/v1/chat/completions", json={"messages": HI}, headers=AUTH)
        stream = client.post(
            "/v1/chat/completions", json={"messages": HI, "stream": True}, headers=AUTH
        )
    finally:
        target.failure = None
    rid = whole.headers["x-request-id"]
    assert whole.status_code == 500
    assert (
        whole.json()["error"]["message"]
        == f"internal server error (RuntimeError) (request id {rid})"
    )
    assert ("pflash_errors", {"stage": "target"}) in metrics
    *_, error, done = sse_data(stream.text)  # headers were sent: in-band, then [DONE]
    assert stream.status_code == 200 and done == "[DONE]"
    assert json.loads(error)["error"]["message"].endswith(
        f"(request id {stream.headers['x-request-id']})"
    )
