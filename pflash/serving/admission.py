"""What a request must pass before work is spent on it: its body arrives in time and within
`max_body_bytes`, its prompt is not certain to exceed `max_prompt_tokens` before the chat is
rendered and tokenized, and what it may generate is bounded by `max_output_tokens`.

Each check is cheap next to what it saves (reading, rendering and tokenizing up to 16 MiB),
and refuses only what is certain to be refused later: the early prompt check uses a lower
bound on the token count that holds for the tokenizer it was built from, and the exact
count after rendering (`check_prompt_limit`) still decides everything it lets through.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterable
from dataclasses import dataclass, replace
from typing import Any

from pflash.config import ServerConfig
from pflash.errors import InvalidRequest, PFlashError
from pflash.models.target.protocol import SamplingParams
from pflash.serving.envelope import http_error

MAX_CONTENT_LENGTH_DIGITS = 20  # more digits than any body this server accepts


def body_too_large(limit: int) -> PFlashError:
    message = f"request body exceeds {limit} bytes (max_body_bytes)"
    return http_error(413, message, "request_too_large")


def body_too_slow(seconds: float) -> PFlashError:
    message = f"the request body did not arrive within {seconds:g} s (body_read_timeout_s)"
    return http_error(408, message, "request_timeout")


def client_disconnected() -> PFlashError:
    """The client left before its body arrived: its own doing, so a 4xx (nobody reads it)
    and never a 500 counted against the server."""
    return http_error(400, "the client disconnected before the body arrived", "client_closed")


async def read_body(
    parts: AsyncIterable[bytes],
    *,
    limit: int,
    timeout_s: float,
    declared: str | None = None,
    disconnect: tuple[type[BaseException], ...] = (),
) -> bytes:
    """The whole body of `parts` (an ASGI request stream), or a 413 once it passes `limit`
    bytes (at once when the declared Content-Length does), or a 408 when it has not all
    arrived within `timeout_s`: a client trickling bytes holds a slot for that long at most.
    Parts are joined once at the end (linear in the body, not quadratic). `disconnect`: the
    exceptions the stream raises when the client leaves (Starlette's `ClientDisconnect`),
    answered as `client_disconnected`."""
    if declared and declared.isdigit():
        if len(declared) > MAX_CONTENT_LENGTH_DIGITS or int(declared) > limit:
            raise body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            async for part in parts:
                size += len(part)
                if size > limit:
                    raise body_too_large(limit)
                chunks.append(part)
    except TimeoutError:
        raise body_too_slow(timeout_s) from None
    except disconnect:
        raise client_disconnected() from None
    return b"".join(chunks)


def cap_output(params: SamplingParams, cap: int | None) -> SamplingParams:
    """`max_output_tokens`: a request generates at most `cap` tokens, whether it asked for
    fewer, none or more (`cap` None leaves it as asked).

    Why more is clamped rather than refused: a client cannot know this server's cap before
    its first call, and agent clients send their own large default (Claude Code asks for
    32,000 of a model it does not know); an answer that reaches the cap ends with
    `finish_reason` "length" (`max_tokens`, `incomplete`), which every client handles."""
    if cap is None:
        return params
    if params.max_tokens is None or params.max_tokens > cap:
        return replace(params, max_tokens=cap)
    return params


def request_params(req: Any, config: ServerConfig) -> SamplingParams:
    """The sampling parameters a parsed request runs with: its own, with `max_output_tokens`
    applied (`cap_output`). Computed once per request; planning and the target both read it."""
    return cap_output(req.sampling_params(), config.max_output_tokens)


@dataclass(frozen=True)
class TokenBound:
    """A lower bound on how many tokens a text encodes to: ceil(UTF-8 bytes / the longest
    token's bytes).

    It holds for byte-level BPE tokenizers without a normalizer (GPT-2, SmolLM2, Llama 3):
    their tokens' bytes concatenate to exactly the text's bytes, so n bytes need at least
    n / `max_token_bytes` tokens, whatever the merges. `of` returns None for any other
    tokenizer (a normalizer may shrink the text, a fused unknown token may cover any
    length), and the early check is then skipped."""

    max_token_bytes: int

    @classmethod
    def of(cls, tokenizer: Any) -> TokenBound | None:
        backend = getattr(tokenizer, "backend_tokenizer", None)
        if backend is None:
            return None
        spec = json.loads(backend.to_str())
        model = spec.get("model") or {}
        if spec.get("normalizer") is not None or model.get("type") != "BPE":
            return None
        if not _is_byte_level(spec.get("pre_tokenizer")) or not model.get("vocab"):
            return None
        longest = max(len(piece) for piece in model["vocab"])  # one character per byte
        added = [len(t["content"].encode("utf-8")) for t in spec.get("added_tokens") or ()]
        return cls(max(longest, *added) if added else longest)

    def at_least(self, n_bytes: int) -> int:
        return -(-n_bytes // self.max_token_bytes)


def _is_byte_level(pre_tokenizer: dict | None) -> bool:
    if not pre_tokenizer:
        return False
    if pre_tokenizer.get("type") == "ByteLevel":
        return True
    if pre_tokenizer.get("type") == "Sequence":
        return any(_is_byte_level(p) for p in pre_tokenizer.get("pretokenizers") or ())
    return False


def certain_prompt_bytes(req: Any, kind: str) -> int:
    """UTF-8 bytes the rendered prompt certainly contains: a completion prompt's text, and
    the content of every chat message but the assistant's (chat templates write system,
    user and tool content whole; some rewrite earlier assistant turns, dropping reasoning)."""
    if kind == "completion":
        return (
            len(req.prompt.encode("utf-8", "surrogatepass")) if isinstance(req.prompt, str) else 0
        )
    return sum(
        len(m.content.encode("utf-8", "surrogatepass"))
        for m in req.messages
        if m.role != "assistant" and m.content
    )


def check_prompt_bound(req: Any, kind: str, bound: TokenBound | None, limit: int | None) -> None:
    """`max_prompt_tokens` before rendering: a 400 when the prompt is certain to exceed it
    (token ids counted exactly; text by `bound`'s lower bound), with the code and wording
    of the exact check after rendering."""
    if limit is None:
        return
    if kind == "completion" and not isinstance(req.prompt, str):
        at_least = len(req.prompt)
    elif bound is not None:
        at_least = bound.at_least(certain_prompt_bytes(req, kind))
    else:
        return
    if at_least > limit:
        raise InvalidRequest(
            f"the prompt has at least {at_least} tokens; this server accepts at most {limit} "
            "(max_prompt_tokens)",
            param="messages" if kind == "chat" else "prompt",
            code="context_length_exceeded",
        )
