"""The target contract: what a backend is asked (prompt ids, `SamplingParams`) and what it
streams back (`TokenDelta`s then one `GenerationDone`), the typed failures, and the
`TargetBackend` base every backend implements (its docstring is the contract).

Light on purpose: the ingress, the API schemas and the compressor import these types
without torch, httpx or a backend.
"""

from __future__ import annotations

import abc
import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from pflash.errors import InvalidRequest, PFlashError

if TYPE_CHECKING:
    pass


FinishReason = Literal["stop", "length", "tool_calls"]


# ---------------------------------------------------------------------- contract data


GREEDY_BELOW = 1e-5


@dataclass(frozen=True)
class OutputFormat:
    """JSON the answer must be: any JSON object (`json_object`) or one matching `schema`
    (`json_schema`; the schema kept as its JSON text, so the value stays frozen). A target
    honours it by constraining its sampler (vLLM compiles it into a grammar); one that
    cannot must refuse it rather than answer free text a client will fail to parse."""

    kind: Literal["json_object", "json_schema"]
    schema: str | None = None
    name: str = "response"
    strict: bool | None = None

    def response_format(self) -> dict[str, Any]:
        """The OpenAI `response_format` value (what vLLM's completions and chat take)."""
        if self.kind == "json_object":
            return {"type": "json_object"}
        spec: dict[str, Any] = {"name": self.name, "schema": json.loads(self.schema or "{}")}
        if self.strict is not None:
            spec["strict"] = self.strict
        return {"type": "json_schema", "json_schema": spec}


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `temperature == 0` is greedy; `max_tokens=None` means up to the context;
    `output_format` None means free text."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None
    output_format: OutputFormat | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
        if not 0 <= self.temperature <= 2:
            raise InvalidRequest("temperature must be in [0, 2]", param="temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p must be in (0, 1]", param="top_p")
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must not be empty", param="stop")

    @property
    def greedy(self) -> bool:
        """Temperatures below 1e-5 are greedy, as vLLM treats them: dividing logits by a
        denormal (1e-320) overflows the softmax to NaN."""
        return self.temperature < GREEDY_BELOW


@dataclass(frozen=True)
class TokenDelta:
    """A piece of the answer: `text` is complete UTF-8 (never a broken character).

    `token_ids` are the target tokens the piece came from (empty when the backend does not
    know them, e.g. an upstream server). `tool_calls` carries OpenAI tool-call deltas
    verbatim from a chat passthrough; the text is then often empty.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class GenerationTimings:
    """llama.cpp-style timings of one generation, in tokens and milliseconds.

    `prompt_n` is the prompt tokens actually prefilled; `cache_n` the prompt tokens reused
    from a cached prefix (so `prompt_n + cache_n` is the served prompt length);
    `predicted_n` every sampled token, including the one that ended generation.
    """

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int


@dataclass(frozen=True)
class GenerationDone:
    """The last event of every successful generation.

    `accept_rate` is the target's speculative-decoding acceptance: draft tokens accepted /
    draft tokens proposed, in [0, 1], over this generation's verification steps. None when
    no speculation ran (no assistant, a sampling request, an answer of one token, an
    upstream that does not report it). The adaptive keep-ratio controller (ALGORITHM §6.6)
    consumes it and moves only on a reported value.
    """

    finish_reason: FinishReason
    timings: GenerationTimings
    accept_rate: float | None = None


GenerationEvent = TokenDelta | GenerationDone


@dataclass
class GenerationResult:
    """A whole generation collected from its events (for non-streaming responses)."""

    text: str
    token_ids: list[int]
    tool_calls: list[dict[str, Any]]
    finish_reason: FinishReason
    timings: GenerationTimings
    accept_rate: float | None = None


async def collect_generation(events: AsyncIterator[GenerationEvent]) -> GenerationResult:
    """Drain a generation stream into one result."""
    pieces: list[str] = []
    ids: list[int] = []
    calls: list[dict[str, Any]] = []
    async for event in events:
        if isinstance(event, GenerationDone):
            return GenerationResult(
                "".join(pieces), ids, calls, event.finish_reason, event.timings, event.accept_rate
            )
        pieces.append(event.text)
        ids.extend(event.token_ids)
        calls.extend(event.tool_calls)
    raise GenerationFailed("the generation stream ended without a final event")


class GenerationFailed(PFlashError):
    """The target failed while generating (a model error, not bad input)."""

    http_status = 500
    error_type = "target_error"

    def __init__(self, message: str):
        super().__init__(f"target generation failed: {message}", code="target_generation")


class UpstreamError(PFlashError):
    """The upstream OpenAI-compatible server failed: an HTTP error, a broken stream, no answer.

    `upstream_status` is the upstream's HTTP status when it sent one. The client gets 502
    (504 for `UpstreamTimeout`) with a message naming the upstream and what it said.
    """

    http_status = 502
    error_type = "upstream_error"

    def __init__(
        self, message: str, *, upstream_status: int | None = None, code: str = "upstream_error"
    ):
        super().__init__(message, code=code)
        self.upstream_status = upstream_status

    @property
    def public_message(self) -> str:
        """What failed, without the upstream's address or raw answer (those go to the log):
        every message here is "<what failed>: <where and details>"."""
        return self.message.split(": ", 1)[0]


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer (connect or read) within the configured time."""

    http_status = 504
    error_type = "upstream_timeout"


def max_new_tokens(prompt_len: int, params: SamplingParams, max_context: int) -> int:
    """Tokens this generation may produce: `max_tokens` clamped to the context left.

    A prompt that leaves no room is a 400 ("context overflow", ALGORITHM §8.2).
    """
    room = max_context - prompt_len
    if room <= 0:
        raise InvalidRequest(
            f"context overflow: the prompt has {prompt_len} tokens and the target's context is "
            f"{max_context}",
            code="context_length_exceeded",
        )
    return room if params.max_tokens is None else min(params.max_tokens, room)


# ---------------------------------------------------------------------- the contract


class TargetBackend(abc.ABC):
    """The target model behind PFlash. Every backend keeps exactly this contract.

    `generate(prompt_ids, params, *, snapshot_cut, session_id, tenant)` is an async iterator of
    `GenerationEvent`s:

    - zero or more `TokenDelta`s, in order, each with non-empty `text` of complete UTF-8
      characters (or tool-call deltas); joined they are the answer. Stop strings are never
      part of the text; an EOS token is never part of the text or the token ids;
    - then exactly one `GenerationDone` with `finish_reason` ("stop": EOS or a stop string;
      "length": `max_tokens` or the context ran out; "tool_calls": only from a chat
      passthrough) and `timings` (`prompt_n` tokens actually prefilled, `cache_n` prefix
      tokens reused, `predicted_n` tokens sampled, milliseconds for both phases) and
      `accept_rate` (speculative-decoding acceptance, None when none ran).

    `prompt_ids` are target-vocabulary tokens of the fully rendered prompt: the chat
    template and generation prompt are already applied, and a backend never applies them
    again. `snapshot_cut` is the token index where the view's generation prompt starts
    (ALGORITHM §6.3): a backend that keeps prefix snapshots stores `prompt_ids[:cut]` (the
    whole prompt when None) and never the generated tokens. `session_id` is an affinity and
    cache hint only; a backend must give the same answer without it. `tenant` scopes what a
    backend caches across requests: a prompt may reuse only its own tenant's cached prefix
    (the reuse shows in `cache_n` and in the time to first token).

    Failures raise typed `PFlashError`s, before the first event or mid-stream: bad input
    (`InvalidRequest`, e.g. a prompt longer than the context), a failing model
    (`GenerationFailed`), a failing upstream (`UpstreamError`, `UpstreamTimeout`). Closing
    the iterator early (client went away) stops the generation.

    `tokenizer` is the target tokenizer the prompt ids come from; `max_context` the target's
    context length in tokens (prompt plus answer).
    """

    tokenizer: Any
    max_context: int

    @abc.abstractmethod
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        snapshot_cut: int | None = None,
        session_id: str | None = None,
        tenant: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        """Stream the answer to `prompt_ids` (see the class docstring for the contract)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release threads, connections and caches."""
