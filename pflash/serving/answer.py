"""The answer path: a planned call's target events made into its API's answer, whole or
streamed, and accounted once the generation is done (usage, metrics, adaptive keep).

A call is one frozen record (`Call`) from admission to its answer. Chat completions and
completions differ only in how an answer is written, so each is an `Answer` strategy
(`chat_completion.serving.ChatAnswer`, `completion.serving.CompletionAnswer`) and the path
never asks which API it serves. The APIs served by translation (`edge`) run as chat.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel

from pflash.compress.pipeline import Compressed
from pflash.config import ServerConfig
from pflash.errors import CompressionFailed, StageUnavailable
from pflash.flow.request import tenant_of
from pflash.models.target.protocol import GenerationDone, SamplingParams, TokenDelta
from pflash.serving.envelope import SSE_KEEPALIVE, StreamError, StreamItem, error_envelope
from pflash.serving.protocol import GenerationRequest, ResponseMeta
from pflash.serving.tenants import is_private, public_usage
from pflash.serving.usage import Usage, build_usage, pflash_stats

KEEPALIVE_EVERY_S = 2.0  # a comment this often while a stream waits for its compression

# the target's `generate`, bound by the ingress: (served ids, sampling, snapshot cut,
# conversation key) -> its events, `TokenDelta`s then one `GenerationDone`; `cancel()` stops it
Generate = Callable[[Sequence[int], SamplingParams, int | None, str], Any]
Record = Callable[..., None]  # `record(name, value=1.0, **tags)`: a metric event
# `feedback(compressed, session, accept_rate)`: the acceptance of speculative decoding
# reported for the session's adaptive keep ratio (ALGORITHM §6.6)
Feedback = Callable[[Compressed, str, float], Awaitable[None]]


class Answer(Protocol):
    """How one API writes a call's answer. The class is the strategy (`kind`, `id_prefix`,
    `parse`); an instance writes one call's answer, made once its prompt is served
    (`prompt`: the served text when the request asked for it, else None), and holds what a
    stream carries from one chunk to the next.

    `kind` names the API where the flow below needs it: rendering (a chat or a raw prompt),
    the early prompt bound and the `endpoint` tag of `pflash_requests`."""

    kind: ClassVar[Literal["chat", "completion"]]
    id_prefix: ClassVar[str]

    @staticmethod
    def parse(body: bytes | str | Mapping[str, Any]) -> GenerationRequest:
        """The request, validated; `InvalidRequest` naming the bad field."""

    def __init__(self, call: Call, prompt: str | None) -> None: ...

    def whole(self, text: str, done: GenerationDone, usage: Usage) -> BaseModel:
        """The whole response for the answer's `text`."""

    def opening(self) -> list[BaseModel]:
        """The chunks a stream starts with, before the first token."""

    def piece(self, text: str) -> list[BaseModel]:
        """The chunks for the next `text` the target generated (none while held back)."""

    def closing(self, done: GenerationDone) -> list[BaseModel]:
        """The chunks that end the answer (what was held back, the finish reason)."""

    def usage(self, usage: Usage) -> BaseModel:
        """The `stream_options.include_usage` chunk."""


@dataclass(frozen=True)
class Call:
    """One request from admission to its answer; the answer path reads nothing else.

    - `request_id`: what its responses and its log lines name it by;
    - `request`: the chat or completion request (an edge API's as its chat request);
    - `answer`: the strategy that writes the answer (`Answer`);
    - `config`: the server component of the server's config (timeouts, tool-call parser);
    - `params`: the sampling parameters the target gets (the output cap applied);
    - `meta`: the id, model and creation time every response and chunk carries;
    - `conversation`: the conversation key (affinity; it starts with the tenant, which
      scopes the target's prefix snapshots and what usage may show);
    - `started`: `time.perf_counter()` when the request arrived (TTFT counts from it);
    - `deadline`: the event loop's time by which the answer must end (`request_timeout_s`);
    - `compression`: the rest of the flow (`Pending.finish`), running; it gives the
      `Compressed` result: what is served and its snapshot cut.
    """

    request_id: str
    request: GenerationRequest
    answer: type[Answer]
    config: ServerConfig
    params: SamplingParams
    meta: ResponseMeta
    conversation: str
    started: float
    deadline: float
    compression: asyncio.Future[Compressed]

    @property
    def session(self) -> str | None:
        """The conversation key when the client named its session: the adaptive keep ratio
        follows only those."""
        return self.conversation if self.request.session_id else None


class Answers:
    """The answer path of one ingress replica. `generate` reaches the target, `record` the
    metrics, `feedback` the session store; all three are bound by the ingress."""

    def __init__(self, generate: Generate, record: Record, feedback: Feedback) -> None:
        self.generate = generate
        self.record = record
        self.feedback = feedback

    async def whole(self, call: Call) -> BaseModel:
        """The whole response: every event of the generation, then the answer once."""
        result = await call.compression
        answer = call.answer(call, _returned_prompt(call, result))
        text: list[str] = []
        done: GenerationDone | None = None
        ttft = None
        async for event in self._events(call, result):
            if isinstance(event, TokenDelta):
                ttft = ttft if ttft is not None else time.perf_counter() - call.started
                text.append(event.text)
            elif isinstance(event, GenerationDone):
                done = event
        usage = self._account(call, result, done, ttft)
        return answer.whole("".join(text), done, usage)

    async def stream(self, call: Call, *, keepalive: bool) -> AsyncIterator[StreamItem]:
        """The stream's items, to be framed by the API: keep-alives while compressing (with
        `keepalive`), the answer's chunks, the usage chunk when asked. Within the call's
        deadline; a failure once headers are sent is the last item (`StreamError`)."""
        try:
            async with asyncio.timeout_at(call.deadline):
                async for item in self._chunks(call, keepalive=keepalive):
                    yield item
        except asyncio.CancelledError:
            call.compression.cancel()
            raise
        except Exception as exc:  # headers are sent: report in-band, then end the stream
            call.compression.cancel()
            status, body, _ = error_envelope(exc, call.request_id)
            yield StreamError(status, body)

    async def _chunks(self, call: Call, *, keepalive: bool) -> AsyncIterator[StreamItem]:
        if keepalive:
            while True:
                done, _ = await asyncio.wait({call.compression}, timeout=KEEPALIVE_EVERY_S)
                if done:
                    break
                yield SSE_KEEPALIVE
        result = await call.compression
        answer = call.answer(call, _returned_prompt(call, result))
        for chunk in answer.opening():
            yield chunk
        ttft = None
        finished: GenerationDone | None = None
        async for event in self._events(call, result):
            if isinstance(event, TokenDelta):
                ttft = ttft if ttft is not None else time.perf_counter() - call.started
                for chunk in answer.piece(event.text):
                    yield chunk
            elif isinstance(event, GenerationDone):
                finished = event
        if finished is None:
            raise _unfinished()
        for chunk in answer.closing(finished):
            yield chunk
        usage = self._account(call, result, finished, ttft)
        if call.request.include_usage:
            yield answer.usage(usage)

    async def _events(self, call: Call, result: Compressed) -> AsyncIterator[Any]:
        """The target's events, each within `remote_call_timeout_s` of the one before (the
        first within it of the call): a hung target is a 504 naming it, not a held request."""
        events = self.generate(
            result.served_ids, call.params, result.snapshot_cut, call.conversation
        )
        gap_s = call.config.remote_call_timeout_s
        while True:
            try:
                async with asyncio.timeout(gap_s):
                    event = await events.__anext__()
            except StopAsyncIteration:
                return
            except TimeoutError:
                events.cancel()
                raise StageUnavailable("target", TimeoutError(f"no event for {gap_s} s")) from None
            yield event

    def _account(
        self,
        call: Call,
        compressed: Compressed,
        done: GenerationDone | None,
        ttft: float | None,
    ) -> Usage:
        """Usage as the caller may see it, and the request's metrics, once the generation is
        done. When the target ran speculative decoding, its acceptance moves the session's
        adaptive keep ratio (§6.6): lower acceptance reads as lost context → keep more."""
        if done is None:
            raise _unfinished()
        accept = getattr(done, "accept_rate", None)
        if call.session and accept is not None:
            asyncio.ensure_future(self.feedback(compressed, call.session, accept))
        prompt_n = compressed.original_tokens
        usage = build_usage(prompt_n, done.timings, pflash_stats(compressed.stats))
        ttft_s = ttft if ttft is not None else time.perf_counter() - call.started
        tag = "true" if compressed.compressed else "false"
        self.record("pflash_ttft_seconds", ttft_s, compressed=tag)
        self.record(
            "pflash_target_prefill_seconds", done.timings.prompt_ms / 1000.0, compressed=tag
        )
        self.record("pflash_input_tokens", prompt_n)
        self.record("pflash_kept_tokens", len(compressed.served_ids))
        self.record("pflash_keep_ratio", compressed.served_ratio)
        self.record("pflash_requests", endpoint=call.answer.kind, compressed=tag)
        return public_usage(usage, is_private(tenant_of(call.conversation)))


def _returned_prompt(call: Call, result: Compressed) -> str | None:
    """The served text when the request asked for it (`pflash_return_prompt`)."""
    return result.served_text if call.request.pflash_return_prompt else None


def _unfinished() -> CompressionFailed:
    return CompressionFailed("target", "the target ended without finishing the generation")
