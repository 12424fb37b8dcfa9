"""Request ids and error envelopes are the middleware's (`pflash.serving.middleware`): every
response names its request, an exception that escapes a route is its API's envelope, and a
route builds neither. A small FastAPI app with the ingress's routes stands in for it."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.testclient import TestClient

from pflash.errors import CompressionFailed, InvalidRequest, ModelNotFound, StageUnavailable
from pflash.serving.middleware import install, request_id


class BackPressureError(Exception):
    """Stands in for Ray Serve's (matched by class name)."""


FAILURES = {
    "bad": InvalidRequest("messages: must not be empty", param="messages", code="invalid_value"),
    "model": ModelNotFound("gpt-4o", ("pflash",)),
    "drafter": CompressionFailed("drafter", "KeyError: 'tap' at actor 4f2a"),
    "busy": StageUnavailable("drafter", BackPressureError("queue of replica 7 full")),
    "slow": TimeoutError(),
    "bug": RuntimeError("secret internals"),
}


def make_app() -> FastAPI:
    app = FastAPI(redirect_slashes=False)
    install(app)

    async def fail_or_echo(request: Request):
        failure = request.query_params.get("fail")
        if failure:
            raise FAILURES[failure]
        return JSONResponse({"request_id": request_id(request)})

    for path in ("/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens",
                 "/v1/responses"):  # fmt: skip
        app.post(path)(fail_or_echo)
    app.get("/v1/models")(fail_or_echo)
    app.get("/v1/models/{model_id:path}")(fail_or_echo)

    @app.post("/stream")
    async def stream():
        async def frames():
            yield "data: 1\n\n"
            raise RuntimeError("after the headers")

        return StreamingResponse(frames(), media_type="text/event-stream")

    return app


@pytest.fixture(scope="module")
def client():
    return TestClient(make_app(), raise_server_exceptions=False)


def test_every_response_carries_its_own_request_id(client):
    ok = client.post("/v1/chat/completions")
    bad = client.post("/v1/chat/completions?fail=bad")
    missing = client.get("/v1/nothing")
    ids = [r.headers["x-request-id"] for r in (ok, bad, missing)]
    assert all(i.startswith("req-") and len(i) == 20 for i in ids) and len(set(ids)) == 3
    assert ok.json()["request_id"] == ids[0]  # the route reads the same id
    assert "request-id" not in ok.headers


def test_a_client_mistake_is_the_openai_envelope(client):
    r = client.post("/v1/chat/completions?fail=bad")
    assert r.status_code == 400 and "retry-after" not in r.headers
    assert r.json() == {
        "error": {
            "message": "messages: must not be empty",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "invalid_value",
        }
    }
    assert client.post("/v1/responses?fail=model").json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("failure", "status", "public", "retry"),
    [
        ("drafter", 500, "pflash drafter failed", None),
        ("busy", 503, "pflash drafter unavailable: server overloaded, retry later", "1"),
        ("slow", 504, "timed out", "1"),
        ("bug", 500, "internal server error (RuntimeError)", None),
    ],
)
def test_a_5xx_names_only_what_failed_and_the_request_id(client, failure, status, public, retry):
    r = client.post(f"/v1/chat/completions?fail={failure}")
    rid = r.headers["x-request-id"]
    assert r.status_code == status and r.headers.get("retry-after") == retry
    assert r.json()["error"]["message"] == f"{public} (request id {rid})"


@pytest.mark.parametrize("path", ["/v1/messages", "/v1/messages/count_tokens"])
def test_the_messages_routes_answer_in_anthropics_shape_and_header(client, path):
    r = client.post(f"{path}?fail=bad")
    assert r.status_code == 400
    assert r.json() == {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "messages: must not be empty"},
    }
    assert r.headers["request-id"] == r.headers["x-request-id"]
    busy = client.post(f"{path}?fail=busy")
    assert busy.status_code == 503 and busy.json()["error"]["type"] == "overloaded_error"
    assert client.post(path).headers["request-id"].startswith("req-")


def test_a_model_listing_answers_in_the_shape_its_client_reads(client):
    anthropic = {"anthropic-version": "2023-06-01"}
    r = client.get("/v1/models/gpt-4o?fail=model", headers=anthropic)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert r.headers["request-id"] == r.headers["x-request-id"]
    r = client.get("/v1/models?fail=model")
    assert r.json()["error"]["code"] == "model_not_found" and "request-id" not in r.headers


def test_fastapis_own_errors_are_the_openai_envelope_on_every_route(client):
    r = client.get("/v1/messages")
    assert r.status_code == 405 and r.headers["x-request-id"].startswith("req-")
    assert r.json()["error"] == {
        "message": "method GET is not allowed on /v1/messages",
        "type": "invalid_request_error",
        "param": None,
        "code": "method_not_allowed",
    }
    r = client.post("/v1/chat/completions/")
    assert (r.status_code, r.json()["error"]["code"]) == (404, "not_found")
    assert r.json()["error"]["message"] == "no route /v1/chat/completions/"


def test_a_failure_after_the_headers_is_not_a_second_response(client):
    with pytest.raises(Exception, match="after the headers"):
        with TestClient(make_app()) as strict:
            strict.post("/stream")
    r = client.post("/stream")
    assert r.status_code == 200 and r.headers["x-request-id"].startswith("req-")
