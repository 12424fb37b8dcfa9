"""`OpenAITarget` through a `ChunkTransport` (`target_backend: ray_llm`): the same body, the
same events, and every failure mapped as the HTTP path maps it. The transport here is a
list of chunks or an exception (pure logic); the real one, a Serve handle to Ray Serve LLM,
is exercised in tests/upstream/test_ray_llm.py.
"""

from __future__ import annotations

import asyncio
import json

import pytest

from deployments.ray_llm import stream_chunks
from pflash.config import build_config
from pflash.models.target.protocol import (
    SamplingParams,
    UpstreamError,
    UpstreamTimeout,
    collect_generation,
)
from pflash.models.target.upstream import (
    OpenAITarget,
    UpstreamOverloaded,
    UpstreamRejected,
    chunk_error,
    runtime_error,
)

STREAM = [
    {"choices": [{"index": 0, "text": "Hello", "finish_reason": None}]},
    {"choices": [{"index": 0, "text": ", world", "finish_reason": "length"}]},
    {
        "choices": [],
        "usage": {
            "prompt_tokens": 9,
            "completion_tokens": 2,
            "prompt_tokens_details": {"cached_tokens": 4},
        },
    },
]


class Recorder:
    """A transport yielding `chunks` (raising `fail` after them, or sleeping `stall` s)."""

    def __init__(self, chunks=(), fail: BaseException | None = None, stall: float = 0.0):
        self.chunks, self.fail, self.stall = list(chunks), fail, stall
        self.calls: list[tuple[str, dict, dict]] = []
        self.closed = False

    async def __call__(self, path, body, headers):
        self.calls.append((path, body, headers))
        try:
            for chunk in self.chunks:
                yield chunk
            if self.stall:
                await asyncio.sleep(self.stall)
            if self.fail is not None:
                raise self.fail
        finally:
            self.closed = True


def target(transport, tokenizer, **config) -> OpenAITarget:
    cfg = build_config({"target_backend": "ray_llm", "upstream_model": "smollm2", **config}, env={})
    return OpenAITarget.from_config(cfg, tokenizer, 8192, transport)


def run(t: OpenAITarget, ids=(1, 2, 3), **kw):
    return asyncio.run(
        collect_generation(t.generate(list(ids), SamplingParams(max_tokens=8), **kw))
    )


def test_the_transport_gets_the_token_id_body_and_its_chunks_become_the_answer(smollm2_tokenizer):
    transport = Recorder(STREAM)
    result = run(target(transport, smollm2_tokenizer), tenant="acme", session_id="c1")
    assert result.text == "Hello, world"
    assert result.finish_reason == "length"
    assert (result.timings.cache_n, result.timings.prompt_n, result.timings.predicted_n) == (
        4,
        5,
        2,
    )
    ((path, body, headers),) = transport.calls
    assert path == "/completions"
    assert body["prompt"] == [1, 2, 3]  # token ids whatever upstream_prompt_format says
    assert body["model"] == "smollm2" and body["max_tokens"] == 8
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["cache_salt"] == "acme"
    assert headers == {"x-session-id": "c1"}
    assert transport.closed


@pytest.mark.parametrize(
    ("error", "expected", "status"),
    [
        (
            {"message": "maximum context length is 8192", "type": "BadRequestError", "code": 400},
            UpstreamRejected,
            400,
        ),
        (
            {"message": "The model `x` does not exist.", "type": "NotFoundError", "code": 404},
            UpstreamError,
            502,
        ),
        ({"message": "busy", "code": 503}, UpstreamOverloaded, 503),
        ({"message": "engine died", "code": 500}, UpstreamError, 502),
        ({"message": "no status"}, UpstreamError, 502),
    ],
)
def test_an_error_chunk_maps_as_the_same_http_status_would(
    smollm2_tokenizer, error, expected, status
):
    with pytest.raises(expected) as err:
        run(target(Recorder([STREAM[0], {"error": error}]), smollm2_tokenizer))
    assert type(err.value) is expected
    assert err.value.http_status == status
    if status == 400:
        assert err.value.code == "context_length_exceeded"
        assert "8192" in err.value.message  # a 4xx shows the reason (5xx only what failed)


def test_chunk_error_is_none_for_an_ordinary_chunk():
    assert chunk_error("x", STREAM[0]) is None
    assert chunk_error("x", {"error": {"code": True, "message": "m"}}).http_status == 502


class BackPressureError(Exception):
    """Named as Ray Serve's, which is how `runtime_failure` recognises it."""


class RayActorError(Exception):
    pass


@pytest.mark.parametrize(
    ("exc", "status", "code"),
    [
        (BackPressureError("queue full"), 503, "upstream_overloaded"),
        (RayActorError("replica died"), 502, "upstream_unavailable"),
        (TimeoutError("deadline"), 504, "upstream_timeout"),
    ],
)
def test_runtime_failures_of_the_handle_map_to_the_upstream_envelope(
    smollm2_tokenizer, exc, status, code
):
    with pytest.raises(UpstreamError) as err:
        run(target(Recorder([STREAM[0]], fail=exc), smollm2_tokenizer))
    assert (err.value.http_status, err.value.code) == (status, code)
    assert runtime_error("x", ValueError("other")) is None
    if status == 503:
        assert err.value.retry_after_s == 1


def test_an_unknown_exception_is_not_disguised(smollm2_tokenizer):
    with pytest.raises(KeyError):
        run(target(Recorder(fail=KeyError("bug")), smollm2_tokenizer))


def test_no_chunk_within_the_timeout_is_a_504_and_closes_the_stream(smollm2_tokenizer):
    transport = Recorder([STREAM[0]], stall=5.0)
    with pytest.raises(UpstreamTimeout) as err:
        run(target(transport, smollm2_tokenizer, upstream_timeout_s=0.2))
    assert err.value.http_status == 504
    assert transport.closed


def test_ray_llm_requires_the_model_id():
    from pflash.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        build_config({"target_backend": "ray_llm"}, env={})
    assert err.value.key == "upstream_model"


# ---------------------------------------------------------------------- the adapter's parsing


def sse(chunk) -> str:
    return f"data: {json.dumps(chunk)}\n\n"


class Dumpable:
    def __init__(self, data):
        self.data = data

    def model_dump(self, mode="python", exclude_none=False):
        return self.data


def test_stream_chunks_reads_sse_strings_lists_and_response_objects():
    items = [
        [sse(STREAM[0]), sse(STREAM[1])],
        sse(STREAM[2]) + ": keep-alive\n\ndata: [DONE]\n\n",
        Dumpable({"error": {"message": "m", "code": 400}}),
        {"choices": []},
    ]
    got = [chunk for item in items for chunk in stream_chunks(item)]
    assert got == [*STREAM, {"error": {"message": "m", "code": 400}}, {"choices": []}]
    with pytest.raises(TypeError):
        list(stream_chunks(42))


# ---------------------------------------------------------------------- the handle transport


class FakeResponses:
    """Stands in for a DeploymentResponseGenerator: chunks, then `cancel()` is recorded."""

    def __init__(self, chunks):
        self.chunks, self.cancelled = list(chunks), False

    def __aiter__(self):
        async def gen():
            for chunk in self.chunks:
                yield chunk

        return gen()

    def cancel(self):
        self.cancelled = True


def test_a_missing_llm_app_is_a_502_upstream_unavailable(monkeypatch):
    import deployments.target as target_mod

    def missing(name, app_name):
        raise KeyError(f"no app {app_name}")

    monkeypatch.setattr(target_mod.serve, "get_deployment_handle", missing)
    transport = target_mod.HandleTransport("nope")

    async def go():
        return [c async for c in transport("/completions", {}, {})]

    with pytest.raises(UpstreamError) as err:
        asyncio.run(go())
    assert (err.value.http_status, err.value.code) == (502, "upstream_unavailable")
    assert "'nope'" in err.value.message


def test_a_stream_left_early_cancels_the_engines_request_and_a_finished_one_does_not():
    import deployments.target as target_mod

    transport = target_mod.HandleTransport("llm")
    responses = []

    class Handle:
        class completions:  # noqa: N801 - the method name on a Serve handle
            @staticmethod
            def remote(body):
                responses.append(FakeResponses(STREAM))
                return responses[-1]

        def options(self, stream):
            assert stream is True
            return self

    transport._handle = Handle()

    async def first_only():
        chunks = transport("/completions", {}, {})
        first = await anext(chunks)
        await chunks.aclose()
        return first

    async def all_of():
        return [c async for c in transport("/completions", {}, {})]

    assert asyncio.run(first_only()) == STREAM[0]
    assert asyncio.run(all_of()) == STREAM
    assert [r.cancelled for r in responses] == [True, False]
