"""The request the flow takes (`CompressionRequest`, pflash.compress.pipeline) made from a
parsed API request (its prompt rendered, its conversation key), and the checks of a request
against the server's limits and the target's context."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from pflash.compress.pipeline import (
    Compressed,
    CompressionRequest,
)
from pflash.compress.render.rendered import (
    RenderedPrompt,
    render_chat_prompt,
    render_completion_prompt,
)
from pflash.config import PFlashConfig, ServerConfig
from pflash.errors import CompressionFailed, InvalidRequest
from pflash.models.target.protocol import SamplingParams


def render_request(
    req: Any, kind: str, target_tokenizer: Any, *, memo: Any = None, scope: str = ""
) -> RenderedPrompt:
    """The prompt of a parsed API request (`pflash.serving` chat or completion request).
    `memo` (an `EncodingMemo`) and `scope` (the tenant): a chat's pieces that earlier turns
    encoded are not encoded again."""
    if kind == "completion":
        return render_completion_prompt(target_tokenizer, req.prompt)
    return render_chat_prompt(
        target_tokenizer,
        req.template_messages(),
        tools=req.template_tools(),
        template_kwargs=req.chat_template_kwargs,
        memo=memo,
        scope=scope,
    )


def compression_request(
    req: Any, prompt: RenderedPrompt, config: PFlashConfig, tenant: str, params: SamplingParams
) -> CompressionRequest:
    """The flow's input for a parsed API request whose `config` has the request's overrides
    applied (`config.with_request_overrides`). `params`: the sampling parameters the target
    will be given (`admission.cap_output` applied), so the room planning leaves for the
    answer is the room the answer is asked to fill."""
    return CompressionRequest(
        prompt=prompt,
        config=config,
        tenant=tenant,
        conversation=conversation_key(tenant, req.session_id, prompt.messages, prompt.ids),
        session_id=req.session_id,
        pflash_query=req.pflash_query,
        pflash_required=tuple(req.pflash_required or ()),
        max_output=params.max_tokens or 0,
        keep_text=req.pflash_return_prompt,
        keep_ratio=req.pflash_keep_ratio,
    )


def conversation_key(
    tenant: str,
    session_id: str | None,
    messages: Sequence[Mapping] | None,
    prompt_ids: tuple[int, ...],
) -> str:
    """Affinity key: the client's session id, else tenant + hash of the conversation's start
    (up to the end of the first user turn), so every turn of a chat maps to the same key."""
    if session_id:
        return f"{tenant}:{session_id}"
    h = hashlib.sha256(tenant.encode())
    if messages:
        head = []
        for m in messages:
            head.append({"role": m.get("role"), "content": m.get("content")})
            if m.get("role") == "user":
                break
        h.update(json.dumps(head, sort_keys=True, default=str).encode())
    else:
        h.update(repr(prompt_ids[:256]).encode())
    return f"{tenant}:{h.hexdigest()[:24]}"


def tenant_of(conversation: str) -> str:
    """The tenant a conversation key belongs to (`conversation_key` puts it first)."""
    return conversation.split(":", 1)[0]


def check_prompt_limit(prompt: RenderedPrompt, config: ServerConfig) -> None:
    """`max_prompt_tokens`: a prompt past what the deployment is sized for is a 400 before
    any model runs (prompts over the target's context but under it are compressed to fit)."""
    limit = config.max_prompt_tokens
    if limit is not None and len(prompt.ids) > limit:
        raise InvalidRequest(
            f"the prompt has {len(prompt.ids)} tokens; this server accepts at most {limit} "
            "(max_prompt_tokens)",
            param="messages" if prompt.kind == "chat" else "prompt",
            code="context_length_exceeded",
        )


def check_context(result: Compressed, request: CompressionRequest) -> None:
    """The served prompt plus max_tokens must fit the target's context (target tokens)."""
    max_ctx = request.max_context
    if max_ctx is None:
        return
    served, max_output = len(result.served_ids), request.max_output
    if served + max(1, max_output) > max_ctx:
        raise InvalidRequest(
            f"the prompt ({served} tokens served of {len(request.prompt.ids)}) plus max_tokens "
            f"({max_output}) exceeds the context ({max_ctx}); compress it (pflash_mode) or "
            "shorten it",
            param="messages" if request.prompt.kind == "chat" else "prompt",
            code="context_length_exceeded",
        )


def check_required(compressed: Compressed, required: Sequence[str]) -> None:
    """Every `pflash_required` string occurs in the served text, whatever served it (a fresh
    selection, a view, the prompt as is). The planner pinned each string it found in the
    prompt, so one missing here is a bug between plan and target: fail closed (a 500 naming
    stage `required_check`) rather than let the target answer without it. Strings are taken
    as the planner takes them (stripped, empty ones ignored). CPython's substring search
    falls back to the linear two-way algorithm on adversarial input."""
    for text in required:
        needle = text.strip()
        if needle and needle not in compressed.served_text:
            raise CompressionFailed(
                "required_check", f"pflash_required {needle[:80]!r} is not in the served prompt"
            )
