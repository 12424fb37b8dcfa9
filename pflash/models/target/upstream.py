"""`OpenAITarget`: an OpenAI-compatible upstream server (vLLM, SGLang, llama.cpp server,
another PFlash gateway) as the target. The served prompt already carries the chat template,
so it goes out as a raw `/v1/completions` prompt; the upstream's own prefix cache does the
reuse.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING, Any, Literal

from pflash.errors import InvalidRequest

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
        stream: bool = True,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.prompt_format = prompt_format
        self.stream = stream
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), headers=headers
        )
        encoded = tokenizer("x", add_special_tokens=True)["input_ids"]
        bos = tokenizer.bos_token_id
        self._upstream_adds_bos = bos is not None and bool(encoded) and encoded[0] == bos

    @classmethod
    def from_config(
        cls, config: GenerationConfig, tokenizer: Any, max_context: int
    ) -> OpenAITarget:
        """From the `generation` knobs (the whole config or a part holding it reads the same)."""
        if not config.upstream_base_url:
            raise ValueError("OpenAITarget needs upstream_base_url")
        return cls(
            config.upstream_base_url,
            config.upstream_model or config.target,
            tokenizer,
            max_context,
            api_key=config.upstream_api_key,
            prompt_format=config.upstream_prompt_format,
        )

    async def aclose(self) -> None:
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
        return body

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        snapshot_cut: int | None = None,
        session_id: str | None = None,
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
        import httpx

        url = self.base_url + path
        headers = {"x-session-id": session_id} if session_id else {}
        body = {**body, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        state = _UpstreamStream(prompt_len, time.perf_counter())
        try:
            if not self.stream:
                response = await self._client.post(url, json=body, headers=headers)
                if response.status_code >= 400:
                    raise self._status_error(url, response.status_code, response.text)
                delta = state.feed(self._json(url, response.text))
                if delta is not None:
                    yield delta
                yield state.done()
                return
            async with self._client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise self._status_error(url, response.status_code, text)
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
                f"upstream {url} timed out ({type(exc).__name__})", code="upstream_timeout"
            ) from exc
        except httpx.ConnectError as exc:
            raise UpstreamError(
                f"cannot connect to upstream {url}: {exc}", code="upstream_unreachable"
            ) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {url} failed: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _json(url: str, text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UpstreamError(f"upstream {url} sent invalid JSON: {text[:200]!r}") from exc
        if not isinstance(data, dict):
            raise UpstreamError(f"upstream {url} sent a non-object: {text[:200]!r}")
        return data

    @staticmethod
    def _status_error(url: str, status: int, text: str) -> UpstreamError:
        message = text.strip()[:500]
        try:
            err = json.loads(text).get("error")
            message = err.get("message", message) if isinstance(err, dict) else str(err or message)
        except (json.JSONDecodeError, AttributeError):
            pass
        return UpstreamError(
            f"upstream {url} returned HTTP {status}: {message}",
            upstream_status=status,
            code=f"upstream_http_{status}",
        )
