"""OpenAITarget against a real local HTTP server that streams SSE like an OpenAI server.

The upstream is a small FastAPI app on 127.0.0.1 (a free port, uvicorn in a thread). Its
behaviour is chosen by the request's `model`: "vllm" (plain OpenAI chunks with usage),
"llamacpp" (llama.cpp `timings` in the last chunk), "pflash" (chunks built with our own
pflash.serving builders, as a PFlash gateway upstream would send), "boom" (HTTP 500),
"slow" (answers after 2 s), "broken" (an error event mid-stream), and the error statuses
of `FAILURES` (vLLM's 400, a 422, 429/503 with and without Retry-After, 401, 404, 504).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import openai
import pytest
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from pflash.models.target.protocol import (
    GenerationDone,
    GenerationTimings,
    OutputFormat,
    SamplingParams,
    UpstreamError,
    UpstreamTimeout,
    collect_generation,
)
from pflash.models.target.upstream import (
    OpenAITarget,
    UpstreamOverloaded,
    UpstreamRejected,
    retry_after_seconds,
    status_error,
)
from pflash.serving.chat_completion.serving import chat_chunk, chat_usage_chunk
from pflash.serving.envelope import SSE_DONE, SSE_KEEPALIVE, error_response, sse_event
from pflash.serving.protocol import ResponseMeta
from pflash.serving.usage import PFlashStats, build_usage

WORDS = ["Hello", ",", " wor", "ld", "!"]
CALL = {
    "index": 0,
    "id": "c1",
    "type": "function",
    "function": {"name": "lookup", "arguments": '{"q": "x"}'},
}


# model -> (status, body, headers) the fake upstream answers with
VLLM_400 = {  # vLLM 0.32's answer to a prompt over its --max-model-len, verbatim
    "error": {
        "message": "This model's maximum context length is 8192 tokens. However, your prompt "
        "contains 9000 input tokens, which exceeds this limit even without any output tokens. "
        "Please reduce the length of the input prompt. (parameter=input_tokens, value=9000)",
        "type": "BadRequestError",
        "param": "input_tokens",
        "code": 400,
    }
}
FAILURES = {
    "bad": (400, VLLM_400, None),
    "unprocessable": (422, {"detail": [{"msg": "field required"}]}, None),
    "busy": (429, {"error": {"message": "rate limited"}}, {"Retry-After": "7"}),
    "unavailable": (503, {"error": {"message": "no capacity"}}, None),
    "dated": (503, {"error": "later"}, {"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}),
    "denied": (401, {"error": {"message": "bad key"}}, None),
    "missing": (404, {"error": {"message": "The model `x` does not exist."}}, None),
    "gateway": (504, {"error": {"message": "proxy timed out"}}, None),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_upstream() -> FastAPI:
    app = FastAPI()
    app.state.requests = []

    def chunk(model: str, choice: dict, **extra) -> str:
        obj = {
            "id": "x-1",
            "object": "text_completion",
            "created": 0,
            "model": model,
            "choices": [choice],
            **extra,
        }
        return sse_event(obj)

    usage = {
        "prompt_tokens": 11,
        "completion_tokens": 5,
        "total_tokens": 16,
        "prompt_tokens_details": {"cached_tokens": 4},
    }

    async def completion_events(model: str, include_usage: bool):
        for word in WORDS:
            yield chunk(model, {"index": 0, "text": word, "finish_reason": None})
            yield SSE_KEEPALIVE
            if model == "broken":
                yield sse_event({"error": {"message": "engine died", "type": "server_error"}})
                return
        last = {
            "timings": {
                "prompt_n": 9,
                "prompt_ms": 12.5,
                "predicted_n": 5,
                "predicted_ms": 40.0,
                "cache_n": 2,
            }
        }
        yield chunk(
            model,
            {"index": 0, "text": "", "finish_reason": "length"},
            **(last if model == "llamacpp" else {}),
        )
        if include_usage:
            yield sse_event(
                {
                    "id": "x-1",
                    "object": "text_completion",
                    "created": 0,
                    "model": model,
                    "choices": [],
                    "usage": usage,
                }
            )
        yield SSE_DONE

    async def pflash_chat_events():
        meta = ResponseMeta.new("pflash", "chatcmpl-")
        yield sse_event(chat_chunk(meta, role="assistant", content=""))
        for word in WORDS:
            yield sse_event(chat_chunk(meta, content=word))
        yield sse_event(chat_chunk(meta, finish_reason="stop"))
        timings = GenerationTimings(
            prompt_n=30, prompt_ms=8.0, predicted_n=5, predicted_ms=20.0, cache_n=70
        )
        yield sse_event(
            chat_usage_chunk(meta, build_usage(4000, timings, PFlashStats(kept_tokens=90)))
        )
        yield SSE_DONE

    async def vllm_chat_events(tools: bool):
        def c(delta, finish=None):
            return sse_event(
                {
                    "id": "c-1",
                    "object": "chat.completion.chunk",
                    "created": 0,
                    "model": "vllm",
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                }  # fmt: skip
            )

        yield c({"role": "assistant", "content": ""})
        if tools:
            yield c({"tool_calls": [CALL]})
            yield c({}, "tool_calls")
        else:
            for word in WORDS:
                yield c({"content": word})
            yield c({}, "stop")
        yield SSE_DONE

    def failure(model: str):
        if model == "boom":
            return JSONResponse(
                {"error": {"message": "engine crashed", "type": "server_error"}}, status_code=500
            )
        if model in FAILURES:
            status, body, headers = FAILURES[model]
            return JSONResponse(body, status_code=status, headers=headers)
        return None

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        app.state.requests.append((body, dict(request.headers)))
        model = body["model"]
        if (err := failure(model)) is not None:
            return err
        if model == "slow":
            await asyncio.sleep(2)
        if body.get("stream"):
            include = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(
                completion_events(model, include), media_type="text/event-stream"
            )
        return {
            "id": "x-1",
            "object": "text_completion",
            "created": 0,
            "model": model,
            "choices": [{"index": 0, "text": "".join(WORDS), "finish_reason": "stop"}],
            "usage": usage,
        }

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        body = await request.json()
        app.state.requests.append((body, dict(request.headers)))
        if (err := failure(body["model"])) is not None:
            return err
        if body["model"] == "pflash":
            return StreamingResponse(pflash_chat_events(), media_type="text/event-stream")
        return StreamingResponse(
            vllm_chat_events(bool(body.get("tools"))), media_type="text/event-stream"
        )

    return app


@pytest.fixture(scope="module")
def upstream():
    app = make_upstream()
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "upstream did not start"
        time.sleep(0.02)
    yield app, f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    thread.join(timeout=5)


def make_target(base_url: str, tokenizer, model: str = "vllm", **kw) -> OpenAITarget:
    return OpenAITarget(base_url, model, tokenizer, max_context=8192, api_key="sk-test", **kw)


EIGHT = SamplingParams(max_tokens=8)


def collect(target: OpenAITarget, prompt_ids, params=EIGHT, **kw):
    async def go():
        try:
            return await collect_generation(target.generate(prompt_ids, params, **kw))
        finally:
            await target.aclose()

    return asyncio.run(go())


@pytest.fixture(scope="module")
def rendered(smollm2_tokenizer):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    text = smollm2_tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=False
    )
    ids = list(
        smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
    )
    return text, ids


# ---------------------------------------------------------------------- /v1/completions


def test_streamed_completion_becomes_deltas_and_usage_timings(
    upstream, smollm2_tokenizer, rendered
):
    app, base = upstream
    text, ids = rendered
    params = SamplingParams(max_tokens=8, temperature=0.5, top_p=0.9, stop=("END",), seed=3)
    result = collect(make_target(base, smollm2_tokenizer), ids, params, session_id="conv-1")
    assert result.text == "Hello, world!"
    assert result.finish_reason == "length"
    assert result.timings.cache_n == 4
    assert result.timings.prompt_n == 7  # usage.prompt_tokens 11 minus 4 cached
    assert result.timings.predicted_n == 5
    body, headers = app.state.requests[-1]
    assert body == {
        "model": "vllm",
        "prompt": text,  # the rendered template, sent as is: never templated twice
        "max_tokens": 8,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert headers["authorization"] == "Bearer sk-test"
    assert headers["x-session-id"] == "conv-1"


def test_token_id_prompts_are_sent_verbatim_and_max_tokens_clamped(
    upstream, smollm2_tokenizer, rendered
):
    app, base = upstream
    _, ids = rendered
    target = OpenAITarget(
        base, "vllm", smollm2_tokenizer, max_context=len(ids) + 3, prompt_format="token_ids"
    )
    collect(target, ids, SamplingParams(max_tokens=50))
    body, headers = app.state.requests[-1]
    assert body["prompt"] == ids
    assert body["max_tokens"] == 3
    assert "authorization" not in headers and "x-session-id" not in headers


def test_llamacpp_timings_are_taken_as_reported(upstream, smollm2_tokenizer, rendered):
    _, base = upstream
    result = collect(make_target(base, smollm2_tokenizer, "llamacpp"), rendered[1])
    assert result.timings == GenerationTimings(
        prompt_n=9, prompt_ms=12.5, predicted_n=5, predicted_ms=40.0, cache_n=2
    )


def test_non_streaming_upstream_yields_one_delta(upstream, smollm2_tokenizer, rendered):
    app, base = upstream

    async def events():
        target = make_target(base, smollm2_tokenizer, stream=False)
        out = [e async for e in target.generate(rendered[1], SamplingParams(max_tokens=8))]
        await target.aclose()
        return out

    out = asyncio.run(events())
    assert [e.text for e in out[:-1]] == ["Hello, world!"]
    assert isinstance(out[-1], GenerationDone)
    assert (out[-1].finish_reason, out[-1].timings.cache_n, out[-1].timings.predicted_n) == (
        "stop",
        4,
        5,
    )
    assert app.state.requests[-1][0]["stream"] is False
    assert "stream_options" not in app.state.requests[-1][0]


# ---------------------------------------------------------------------- /v1/chat/completions


def test_chat_passthrough_sends_messages_and_streams_text(upstream, smollm2_tokenizer):
    app, base = upstream
    messages = [{"role": "user", "content": "hi"}]

    async def go():
        target = make_target(base, smollm2_tokenizer)
        stream = target.generate_chat(
            messages,
            SamplingParams(max_tokens=4, temperature=0),
            chat_template_kwargs={"enable_thinking": False},
        )
        result = await collect_generation(stream)
        await target.aclose()
        return result

    result = asyncio.run(go())
    assert (result.text, result.finish_reason) == ("Hello, world!", "stop")
    body = app.state.requests[-1][0]
    assert body["messages"] == messages
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert (body["max_tokens"], body["temperature"]) == (4, 0.0)


def test_chat_passthrough_forwards_tool_calls(upstream, smollm2_tokenizer):
    _, base = upstream
    tools = [{"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}]

    async def go():
        target = make_target(base, smollm2_tokenizer)
        result = await collect_generation(
            target.generate_chat([{"role": "user", "content": "x"}], SamplingParams(), tools=tools)
        )
        await target.aclose()
        return result

    result = asyncio.run(go())
    assert result.tool_calls == [CALL]
    assert result.finish_reason == "tool_calls"


def test_pflash_gateway_upstream_timings_are_read_from_usage(upstream, smollm2_tokenizer):
    _, base = upstream

    async def go():
        target = make_target(base, smollm2_tokenizer, "pflash")
        result = await collect_generation(
            target.generate_chat([{"role": "user", "content": "x"}], SamplingParams())
        )
        await target.aclose()
        return result

    result = asyncio.run(go())
    assert result.text == "Hello, world!"
    assert result.timings == GenerationTimings(
        prompt_n=30, prompt_ms=8.0, predicted_n=5, predicted_ms=20.0, cache_n=70
    )


def test_official_openai_client_reads_our_sse_stream(upstream):
    _, base = upstream
    client = openai.OpenAI(base_url=base, api_key="sk-test")
    stream = client.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": "x"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    client.close()
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "Hello, world!"
    assert chunks[-1].usage.prompt_tokens == 4000
    assert chunks[-1].usage.prompt_tokens_details.cached_tokens == 70
    assert chunks[-1].usage.model_extra["timings"]["pflash"]["kept_tokens"] == 90


# ---------------------------------------------------------------------- failures


def test_upstream_500_is_a_502_naming_the_upstream_status(upstream, smollm2_tokenizer, rendered):
    _, base = upstream
    for stream in (True, False):
        with pytest.raises(UpstreamError) as info:
            collect(make_target(base, smollm2_tokenizer, "boom", stream=stream), rendered[1])
        assert info.value.upstream_status == 500
        status, body = error_response(info.value)
        assert status == 502
        assert body["error"] == {
            "message": f"upstream returned HTTP 500: {base}/completions: engine crashed",
            "type": "upstream_error",
            "param": None,
            "code": "upstream_http_500",
        }


def test_error_event_mid_stream_raises_after_the_first_delta(upstream, smollm2_tokenizer, rendered):
    _, base = upstream

    async def go():
        target = make_target(base, smollm2_tokenizer, "broken")
        seen = []
        try:
            async for event in target.generate(rendered[1], SamplingParams(max_tokens=8)):
                seen.append(event.text)
        finally:
            await target.aclose()
        return seen

    with pytest.raises(UpstreamError) as info:
        asyncio.run(go())
    assert "engine died" in info.value.message
    assert error_response(info.value)[0] == 502


def test_connection_refused_is_a_502_unavailable(smollm2_tokenizer, rendered):
    base = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    with pytest.raises(UpstreamError) as info:
        collect(make_target(base, smollm2_tokenizer), rendered[1])
    status, body = error_response(info.value)
    assert status == 502
    assert body["error"]["code"] == "upstream_unavailable"
    assert body["error"]["message"].startswith(
        f"upstream unavailable: cannot connect to {base}/completions"
    )


def test_slow_upstream_is_a_504_timeout(upstream, smollm2_tokenizer, rendered):
    _, base = upstream
    t0 = time.monotonic()
    with pytest.raises(UpstreamTimeout) as info:
        collect(make_target(base, smollm2_tokenizer, "slow", timeout_s=0.3), rendered[1])
    assert time.monotonic() - t0 < 1.5
    status, body = error_response(info.value)
    assert status == 504
    assert (body["error"]["type"], body["error"]["code"]) == (
        "upstream_timeout",
        "upstream_timeout",
    )
    assert f"{base}/completions" in body["error"]["message"]  # the log line's message
    assert info.value.public_message == "upstream timed out"  # what the client is told


def test_a_client_is_told_what_failed_upstream_but_never_the_upstreams_address(
    smollm2_tokenizer, rendered
):
    base = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(UpstreamError) as info:
        collect(make_target(base, smollm2_tokenizer), rendered[1])
    assert info.value.public_message == "upstream unavailable"
    assert "127.0.0.1" not in info.value.public_message


def test_empty_prompt_is_rejected_before_any_request(smollm2_tokenizer):
    from pflash.errors import InvalidRequest

    with pytest.raises(InvalidRequest):
        collect(make_target("http://127.0.0.1:9/v1", smollm2_tokenizer), [])


def test_config_chooses_token_id_prompts_for_the_upstream(upstream, smollm2_tokenizer, rendered):
    """`upstream_prompt_format: token_ids` reaches the backend: the served ids go out as they
    are (text stays the default, which every server accepts)."""
    from pflash.config import build_config

    app, base = upstream
    _, ids = rendered
    common = {"target_backend": "openai", "upstream_base_url": base, "upstream_model": "vllm"}
    text = OpenAITarget.from_config(build_config(common, env={}), smollm2_tokenizer, 4096)
    assert text.prompt_format == "text"
    config = build_config({**common, "upstream_prompt_format": "token_ids"}, env={})
    target = OpenAITarget.from_config(config, smollm2_tokenizer, 4096)
    collect(target, ids, SamplingParams(max_tokens=2))
    body, _ = app.state.requests[-1]
    assert body["prompt"] == list(ids)


# ---------------------------------------------------------------------- the status mapping


def _failure(base: str, tokenizer, rendered, model: str, stream: bool = True) -> UpstreamError:
    with pytest.raises(UpstreamError) as info:
        collect(make_target(base, tokenizer, model, stream=stream), rendered[1])
    return info.value


def test_upstream_400_is_our_400_with_its_reason_and_no_url(upstream, smollm2_tokenizer, rendered):
    _, base = upstream
    for stream in (True, False):
        exc = _failure(base, smollm2_tokenizer, rendered, "bad", stream)
        assert isinstance(exc, UpstreamRejected) and exc.upstream_status == 400
        status, body = error_response(exc)
        assert status == 400 and not hasattr(exc, "retry_after_s")
        err = body["error"]
        assert err["type"] == "invalid_request_error"
        assert err["code"] == "context_length_exceeded"
        assert err["param"] == "input_tokens"
        assert "maximum context length is 8192 tokens" in err["message"]
        assert "127.0.0.1" not in err["message"] and "/completions" not in err["message"]


def test_upstream_422_keeps_its_status(upstream, smollm2_tokenizer, rendered):
    _, base = upstream
    status, body = error_response(_failure(base, smollm2_tokenizer, rendered, "unprocessable"))
    assert status == 422
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["code"] == "upstream_invalid_request"


@pytest.mark.parametrize(
    ("model", "retry_after"), [("busy", "7"), ("unavailable", "1"), ("dated", "1")]
)
def test_upstream_overload_is_a_503_with_retry_after(
    upstream, smollm2_tokenizer, rendered, model, retry_after
):
    _, base = upstream
    exc = _failure(base, smollm2_tokenizer, rendered, model)
    assert isinstance(exc, UpstreamOverloaded)
    status, body = error_response(exc)
    assert status == 503
    assert (body["error"]["type"], body["error"]["code"]) == (
        "overloaded_error",
        "upstream_overloaded",
    )
    # the ingress sends it as Retry-After (deployments/ingress.py error_envelope)
    assert str(exc.retry_after_s) == retry_after  # a past date: 1


@pytest.mark.parametrize(("model", "code"), [("denied", 401), ("missing", 404)])
def test_upstream_auth_or_model_errors_are_ours_a_502(
    upstream, smollm2_tokenizer, rendered, model, code
):
    _, base = upstream
    status, body = error_response(_failure(base, smollm2_tokenizer, rendered, model))
    assert status == 502 and body["error"]["code"] == f"upstream_http_{code}"


def test_upstream_504_is_a_504(upstream, smollm2_tokenizer, rendered):
    _, base = upstream
    exc = _failure(base, smollm2_tokenizer, rendered, "gateway")
    assert isinstance(exc, UpstreamTimeout)
    assert error_response(exc)[0] == 504


def test_connection_reset_is_a_502_unavailable(smollm2_tokenizer, rendered):
    """A server that accepts and drops every connection (reset / closed without a response)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    port = listener.getsockname()[1]
    stop = threading.Event()

    def drop():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.setsockopt(
                socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
            )
            conn.close()  # linger 0: RST

    thread = threading.Thread(target=drop, daemon=True)
    thread.start()
    try:
        exc = _failure(f"http://127.0.0.1:{port}/v1", smollm2_tokenizer, rendered, "vllm")
    finally:
        stop.set()
        thread.join(timeout=2)
        listener.close()
    status, body = error_response(exc)
    assert status == 502 and body["error"]["code"] == "upstream_unavailable"


def test_upstream_timeout_comes_from_the_config(smollm2_tokenizer):
    from pflash.config import build_config

    config = build_config(
        {
            "target_backend": "openai",
            "upstream_base_url": "http://127.0.0.1:9/v1",
            "upstream_timeout_s": 2.5,
        },
        env={},
    )
    target = OpenAITarget.from_config(config, smollm2_tokenizer, 4096)
    try:
        assert target._client.timeout.read == 2.5
        assert target._client.timeout.connect == 10.0
    finally:
        asyncio.run(target.aclose())


@pytest.mark.parametrize(
    ("header", "seconds"),
    [(None, 1), ("", 1), ("7", 7), ("2.2", 3), ("0", 1), ("-5", 1), ("soon", 1), ("inf", 1)],
)
def test_retry_after_parsing(header, seconds):
    assert retry_after_seconds(header) == seconds


def test_retry_after_http_date_in_the_future():
    from email.utils import formatdate

    assert 25 <= retry_after_seconds(formatdate(time.time() + 30, usegmt=True)) <= 31


def test_mapped_errors_survive_pickling_across_ray():
    """Ray ships a replica's exception to the ingress by pickle: status, code and the
    retry hint must come back intact."""
    import pickle

    rejected = status_error("u", 400, json.dumps(VLLM_400))
    busy = status_error("u", 429, "{}", {"retry-after": "9"})
    for exc in (rejected, busy):
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc)
        assert error_response(back) == error_response(exc)
        assert getattr(back, "retry_after_s", None) == getattr(exc, "retry_after_s", None)
    assert pickle.loads(pickle.dumps(busy)).retry_after_s == 9


def test_the_tenant_goes_upstream_as_the_prefix_cache_salt(upstream, smollm2_tokenizer, rendered):
    app, base = upstream
    _, ids = rendered
    for tenant in ("key-aaaa", "key-bbbb"):
        collect(OpenAITarget(base, "vllm", smollm2_tokenizer, 8192), ids, tenant=tenant)
        assert app.state.requests[-1][0]["cache_salt"] == tenant
    collect(OpenAITarget(base, "vllm", smollm2_tokenizer, 8192, cache_salt=False), ids, tenant="t")
    assert "cache_salt" not in app.state.requests[-1][0]
    collect(OpenAITarget(base, "vllm", smollm2_tokenizer, 8192), ids)
    assert "cache_salt" not in app.state.requests[-1][0]


def test_an_output_format_reaches_the_upstream_as_response_format(
    upstream, smollm2_tokenizer, rendered
):
    # vLLM's completions and chat take `response_format` and compile it into a grammar
    app, base = upstream
    _, ids = rendered
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    params = SamplingParams(
        max_tokens=8, output_format=OutputFormat("json_schema", json.dumps(schema), "place", True)
    )
    collect(make_target(base, smollm2_tokenizer), ids, params)
    assert app.state.requests[-1][0]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "place", "schema": schema, "strict": True},
    }

    async def chat():
        target = make_target(base, smollm2_tokenizer)
        stream = target.generate_chat(
            [{"role": "user", "content": "hi"}],
            SamplingParams(max_tokens=4, output_format=OutputFormat("json_object")),
        )
        await collect_generation(stream)
        await target.aclose()

    asyncio.run(chat())
    assert app.state.requests[-1][0]["response_format"] == {"type": "json_object"}
    collect(make_target(base, smollm2_tokenizer), ids)  # free text: no response_format
    assert "response_format" not in app.state.requests[-1][0]
