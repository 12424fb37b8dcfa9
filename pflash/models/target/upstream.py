"""`OpenAITarget`: an OpenAI-compatible upstream server (vLLM, SGLang, llama.cpp server,
another PFlash gateway) as the target. The served prompt already carries the chat template,
so it goes out as a raw `/v1/completions` prompt; the upstream's own prefix cache does the
reuse.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol

from pflash.errors import InvalidRequest, runtime_failure

if TYPE_CHECKING:
    import httpx

    from pflash.config import GenerationConfig

from pflash.models.target.protocol import (
    FinishReason,
    GenerationDone,
    GenerationEvent,
    GenerationTimings,
    SamplingParams,
    TargetBackend,
    TokenDelta,
    UpstreamError,
    UpstreamTimeout,
    max_new_tokens,
)

log = logging.getLogger("ray.serve")

# ---------------------------------------------------------------------- upstream failures
#
# How an upstream failure reaches the client (the envelope maps `http_status`). Every
# message starts with a colon-free summary ("upstream timed out: <url> ..."): the ingress
# shows a 5xx client only the text before the first colon and logs the rest.
#   upstream 400/413/422 (the request's fault)  -> the same status, invalid_request_error,
#                                                  the upstream's message, no URL
#   upstream 429/503 (overloaded)                -> 503 overloaded_error + Retry-After
#                                                  (the upstream's value, else 1 s)
#   upstream 504                                 -> 504 upstream_timeout
#   any other upstream status (401/404/5xx)      -> 502 upstream_http_<status> (our config
#                                                  or the upstream is broken, not the client)
#   connection refused/reset, no response        -> 502 upstream_unavailable
#   no response/next chunk within the timeout    -> 504 upstream_timeout

CLIENT_STATUSES = frozenset({400, 413, 422})
OVERLOAD_STATUSES = frozenset({429, 503})
DEFAULT_RETRY_AFTER_S = 1


class UpstreamRejected(UpstreamError):
    """The upstream refused the request as invalid (its 400/413/422): the client's fault, so
    the client gets the same status with the upstream's reason (without the upstream URL)."""

    error_type = "invalid_request_error"

    # defaults everywhere: an exception is rebuilt from its message alone when it crosses
    # the Ray boundary (pickle), its attributes then restored from __dict__
    def __init__(
        self,
        message: str,
        *,
        upstream_status: int = 400,
        code: str = "upstream_invalid_request",
        param: str | None = None,
    ):
        super().__init__(message, upstream_status=upstream_status, code=code)
        self.http_status = upstream_status
        self.param = param


class UpstreamOverloaded(UpstreamError):
    """The upstream is overloaded (its 429 or 503): a 503 with `Retry-After`."""

    http_status = 503
    error_type = "overloaded_error"

    def __init__(
        self,
        message: str,
        *,
        upstream_status: int = 503,
        retry_after_s: int = DEFAULT_RETRY_AFTER_S,
    ):
        super().__init__(message, upstream_status=upstream_status, code="upstream_overloaded")
        self.retry_after_s = retry_after_s


def retry_after_seconds(value: str | None, default: int = DEFAULT_RETRY_AFTER_S) -> int:
    """A `Retry-After` header (delta-seconds or an HTTP date) as whole seconds, >= 1."""
    if not value:
        return default
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return default
    if not math.isfinite(seconds):
        return default
    return max(1, math.ceil(seconds))


def status_error(
    url: str, status: int, text: str, headers: Mapping[str, str] | None = None
) -> UpstreamError:
    """The exception for an upstream HTTP error status (the table above)."""
    message, param, code = text.strip()[:500], None, None
    try:
        err = json.loads(text).get("error")
        if isinstance(err, dict):
            message = str(err.get("message") or message)
            param, code = err.get("param"), err.get("code")
        elif err:
            message = str(err)
    except (json.JSONDecodeError, AttributeError):
        pass
    if status in CLIENT_STATUSES:
        # the client sees the reason only; the operator's log has where it came from
        log.info("upstream %s rejected a request (HTTP %d): %s", url, status, message[:500])
        if not isinstance(code, str) or not code or code.isdigit():
            lowered = message.lower()
            code = (
                "context_length_exceeded"
                if "context length" in lowered or "maximum context" in lowered
                else "upstream_invalid_request"
            )
        return UpstreamRejected(
            f"the target model rejected the request: {message[:300]}",
            upstream_status=status,
            code=code,
            param=param if isinstance(param, str) else None,
        )
    if status in OVERLOAD_STATUSES:
        retry = retry_after_seconds((headers or {}).get("retry-after"))
        return UpstreamOverloaded(
            f"the target model is overloaded (upstream HTTP {status}), retry later",
            upstream_status=status,
            retry_after_s=retry,
        )
    if status == 504:
        return UpstreamTimeout(
            f"upstream returned HTTP 504: {url}: {message}",
            upstream_status=status,
            code="upstream_timeout",
        )
    return UpstreamError(
        f"upstream returned HTTP {status}: {url}: {message}",
        upstream_status=status,
        code=f"upstream_http_{status}",
    )


def chunk_error(where: str, chunk: Mapping[str, Any]) -> UpstreamError | None:
    """The exception for an error a transport yields as a chunk, `{"error": {..., "code": N}}`
    with the HTTP status vLLM would have answered (the same table); None for a normal chunk.
    An error without a status is the upstream failing mid-answer."""
    err = chunk.get("error")
    if err is None:
        return None
    status = err.get("code") if isinstance(err, dict) else None
    if isinstance(status, int) and not isinstance(status, bool) and 400 <= status < 600:
        return status_error(where, status, json.dumps({"error": err}))
    message = err.get("message") if isinstance(err, dict) else str(err)
    return UpstreamError(f"upstream failed mid-stream: {where}: {message}")


def runtime_error(where: str, exc: BaseException) -> UpstreamError | None:
    """The exception for a runtime failure reaching an upstream deployment through a handle
    (`RUNTIME_FAILURES`: overload is a 503 with Retry-After, a lost replica 502
    upstream_unavailable, a deadline 504); None for anything else."""
    failure = runtime_failure(exc)
    if failure is None:
        return None
    status, _, code, _ = failure
    detail = f"{where}: {type(exc).__name__}: {exc}"
    if status == 504:
        return UpstreamTimeout(f"upstream timed out: {detail}", code="upstream_timeout")
    if code == "backpressure":
        return UpstreamOverloaded(
            f"the target model is overloaded, retry later: {detail}",
            upstream_status=503,
        )
    return UpstreamError(f"upstream unavailable: {detail}", code="upstream_unavailable")


class ChunkTransport(Protocol):
    """How `OpenAITarget` reaches an upstream that is not an HTTP URL (a Serve deployment
    handle, `target_backend: ray_llm`): send `body` for `path` ("/completions") and yield the
    answer's JSON chunks (a whole answer is one chunk). Failures are raised (Ray's runtime
    errors are mapped by `runtime_error`) or yielded as `chunk_error` chunks."""

    def __call__(
        self, path: str, body: dict[str, Any], headers: dict[str, str]
    ) -> AsyncIterator[dict[str, Any]]: ...


async def next_within(chunks: AsyncIterator[Any], timeout_s: float, where: str) -> Any:
    """The next chunk, or StopAsyncIteration; a 504 `UpstreamTimeout` when none arrives in
    `timeout_s` (the same per-chunk bound the HTTP path gets from httpx)."""
    try:
        return await asyncio.wait_for(anext(chunks), timeout_s)
    except TimeoutError as exc:
        raise UpstreamTimeout(
            f"upstream timed out: {where} (no chunk in {timeout_s:g} s)", code="upstream_timeout"
        ) from exc


# ---------------------------------------------------------------------- OpenAI upstream


class _UpstreamStream:
    """Turns upstream completion/chat chunks into our events and measures what it can."""

    def __init__(self, prompt_len: int, t_start: float):
        self.prompt_len = prompt_len
        self.t_start = t_start
        self.t_first: float | None = None
        self.finish: FinishReason = "stop"
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.pieces = 0

    def feed(self, chunk: dict[str, Any]) -> TokenDelta | None:
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message") if isinstance(err, dict) else str(err)
            raise UpstreamError(f"upstream failed mid-stream: {message}")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            if isinstance(self.usage.get("timings"), dict):  # a PFlash gateway upstream
                self.timings = self.usage["timings"]
        if isinstance(chunk.get("timings"), dict):  # llama.cpp server
            self.timings = chunk["timings"]
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        reason = choice.get("finish_reason")
        if reason:
            self.finish = reason if reason in ("stop", "length", "tool_calls") else "stop"
        if "message" in choice or "delta" in choice:
            body = choice.get("delta") or choice.get("message") or {}
            text, calls = body.get("content") or "", tuple(body.get("tool_calls") or ())
        else:
            text, calls = choice.get("text") or "", ()
        if not text and not calls:
            return None
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.pieces += 1
        return TokenDelta(text, (), calls)

    def done(self) -> GenerationDone:
        t_end = time.perf_counter()
        t_first = self.t_first if self.t_first is not None else t_end
        usage = self.usage or {}
        cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        t = self.timings or {}
        timings = GenerationTimings(
            prompt_n=int(
                t.get("prompt_n", max(0, usage.get("prompt_tokens", self.prompt_len) - cached))
            ),
            prompt_ms=float(t.get("prompt_ms", (t_first - self.t_start) * 1000)),
            predicted_n=int(t.get("predicted_n", usage.get("completion_tokens", self.pieces))),
            predicted_ms=float(t.get("predicted_ms", (t_end - t_first) * 1000)),
            cache_n=int(t.get("cache_n", cached)),
        )
        return GenerationDone(self.finish, timings)


class OpenAITarget(TargetBackend):
    """An upstream OpenAI-compatible server as the target.

    `generate` sends the served prompt to `{base_url}/completions` as a raw prompt: as text
    (`prompt_format="text"`, works with every server; a leading BOS is dropped when the
    tokenizer adds one itself, so it is not doubled) or as token ids
    (`prompt_format="token_ids"`, exact; vLLM, SGLang and llama.cpp accept it).
    `generate_chat` passes an uncompressed chat through to `{base_url}/chat/completions`.
    With `stream=True` (default) the upstream streams SSE and deltas are forwarded as they
    arrive; with False one response is read and yielded as a single delta.

    Failures map as the table at the top of this module says; `timeout_s` bounds the wait
    for the response and for each streamed chunk (`upstream_timeout_s`).

    `transport` replaces HTTP with another way to reach the same `/v1/completions` body
    (`ChunkTransport`; `base_url` then only names the upstream in logs).

    Timings: the upstream's llama.cpp-style `timings` when it sends them; otherwise
    `cache_n` from `usage.prompt_tokens_details.cached_tokens`, `prompt_ms` is the time to
    the first delta and `predicted_ms` the time from there to the end, as seen here.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        max_context: int,
        *,
        api_key: str | None = None,
        prompt_format: Literal["text", "token_ids"] = "text",
        cache_salt: bool = True,
        stream: bool = True,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
        transport: ChunkTransport | None = None,
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.prompt_format = prompt_format
        self.cache_salt = cache_salt
        self.stream = stream
        self.timeout_s = timeout_s
        self._transport = transport
        self._client = None
        if transport is None:
            import httpx

            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            self._client = client or httpx.AsyncClient(
                timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), headers=headers
            )
        encoded = tokenizer("x", add_special_tokens=True)["input_ids"]
        bos = tokenizer.bos_token_id
        self._upstream_adds_bos = bos is not None and bool(encoded) and encoded[0] == bos

    @classmethod
    def from_config(
        cls,
        config: GenerationConfig,
        tokenizer: Any,
        max_context: int,
        transport: ChunkTransport | None = None,
    ) -> OpenAITarget:
        """From the `generation` knobs (the whole config or a part holding it reads the same).
        With a `transport` (`target_backend: ray_llm`) the prompt always goes as token ids
        and `upstream_base_url` is not needed."""
        if transport is not None:
            return cls(
                f"ray_llm app {config.ray_llm_app!r}",
                config.upstream_model or config.target,
                tokenizer,
                max_context,
                prompt_format="token_ids",
                cache_salt=config.upstream_cache_salt,
                timeout_s=config.upstream_timeout_s,
                transport=transport,
            )
        if not config.upstream_base_url:
            raise ValueError("OpenAITarget needs upstream_base_url")
        return cls(
            config.upstream_base_url,
            config.upstream_model or config.target,
            tokenizer,
            max_context,
            api_key=config.upstream_api_key,
            prompt_format=config.upstream_prompt_format,
            cache_salt=getattr(config, "upstream_cache_salt", True),
            timeout_s=getattr(config, "upstream_timeout_s", 600.0),
        )

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()

    def _prompt(self, prompt_ids: list[int]) -> str | list[int]:
        if self.prompt_format == "token_ids":
            return prompt_ids
        if self._upstream_adds_bos and prompt_ids[0] == self.tokenizer.bos_token_id:
            prompt_ids = prompt_ids[1:]
        return self.tokenizer.decode(
            prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    @staticmethod
    def _sampling_body(params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p}
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        if params.output_format is not None:
            body["response_format"] = params.output_format.response_format()
        return body

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        snapshot_cut: int | None = None,
        session_id: str | None = None,
        tenant: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        body = {
            "model": self.model,
            "prompt": self._prompt(prompt_ids),
            "max_tokens": max_new_tokens(len(prompt_ids), params, self.max_context),
            **self._sampling_body(params),
        }
        if self.cache_salt and tenant:
            # vLLM's prefix cache reuses a block only for requests with the same salt, so one
            # tenant's cached prefix never shortens (and so reveals) another's prefill
            body["cache_salt"] = tenant
        async for event in self._request("/completions", body, len(prompt_ids), session_id):
            yield event

    async def generate_chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        prompt_tokens: int | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        """Pass an uncompressed chat through; the upstream applies its own chat template.

        Same events as `generate`. `prompt_tokens` (the rendered prompt length, when known)
        clamps `max_tokens` to the context and fills `prompt_n` if the upstream sends no usage.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            **self._sampling_body(params),
        }
        if prompt_tokens is not None:
            body["max_tokens"] = max_new_tokens(prompt_tokens, params, self.max_context)
        elif params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        if tools:
            body["tools"] = tools
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        async for event in self._request("/chat/completions", body, prompt_tokens or 0, session_id):
            yield event

    async def _request(
        self, path: str, body: dict[str, Any], prompt_len: int, session_id: str | None
    ) -> AsyncIterator[GenerationEvent]:
        headers = {"x-session-id": session_id} if session_id else {}
        body = {**body, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        state = _UpstreamStream(prompt_len, time.perf_counter())
        if self._transport is not None:
            async for event in self._transported(path, body, headers, state):
                yield event
            return
        import httpx

        url = self.base_url + path
        try:
            if not self.stream:
                response = await self._client.post(url, json=body, headers=headers)
                if response.status_code >= 400:
                    raise status_error(url, response.status_code, response.text, response.headers)
                delta = state.feed(self._json(url, response.text))
                if delta is not None:
                    yield delta
                yield state.done()
                return
            async with self._client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise status_error(url, response.status_code, text, response.headers)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, ": keep-alive" comments, event: lines
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    delta = state.feed(self._json(url, data))
                    if delta is not None:
                        yield delta
            yield state.done()
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(
                f"upstream timed out: {url} ({type(exc).__name__})", code="upstream_timeout"
            ) from exc
        except (httpx.ConnectError, httpx.ReadError, httpx.WriteError) as exc:
            # refused, reset, or closed under us: the upstream is down or restarting
            raise UpstreamError(
                f"upstream unavailable: cannot connect to {url}: {type(exc).__name__}: {exc}",
                code="upstream_unavailable",
            ) from exc
        except httpx.RemoteProtocolError as exc:  # closed without (a complete) response
            raise UpstreamError(
                f"upstream unavailable: {url} closed the connection: {exc}",
                code="upstream_unavailable",
            ) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream failed: {url}: {type(exc).__name__}: {exc}") from exc

    async def _transported(
        self, path: str, body: dict[str, Any], headers: dict[str, str], state: _UpstreamStream
    ) -> AsyncIterator[GenerationEvent]:
        """`_request` through `self._transport`: the same chunks, errors and timeouts."""
        assert self._transport is not None
        where = self.base_url
        chunks = aiter(self._transport(path, body, headers))
        try:
            while True:
                try:
                    chunk = await next_within(chunks, self.timeout_s, where)
                except StopAsyncIteration:
                    break
                error = chunk_error(where, chunk)
                if error is not None:
                    raise error
                delta = state.feed(chunk)
                if delta is not None:
                    yield delta
        except UpstreamError:
            raise
        except Exception as exc:
            error = runtime_error(where, exc)
            if error is None:
                raise
            raise error from exc
        finally:
            close = getattr(chunks, "aclose", None)
            if close is not None:
                await close()
        yield state.done()

    @staticmethod
    def _json(url: str, text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UpstreamError(f"upstream sent invalid JSON: {url}: {text[:200]!r}") from exc
        if not isinstance(data, dict):
            raise UpstreamError(f"upstream sent a non-object: {url}: {text[:200]!r}")
        return data
