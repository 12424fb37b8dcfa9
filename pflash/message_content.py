"""A chat message's content as text: the one rule for OpenAI content parts.

`content` is a string, or a list of parts of which PFlash reads text parts only
(`{"type": "text", "text": ...}`), joined with "\\n" as vLLM does; any other part (an image,
audio) is the client's error, because PFlash is text only. The API validates requests with
it (`pflash.serving.chat_completion.protocol`) and the chat renderer applies it to messages a
library caller hands over directly (`pflash.compress.render.chat.normalize_messages`), so both read a message
the same way and refuse the same parts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pflash.errors import InvalidRequest


def content_text(content: Any) -> str | None:
    """`content` as one string: a string as it is, None as None (whether a role needs
    content is the caller's rule), text parts joined with "\\n".

    Raises `InvalidRequest` with code "invalid_type" when `content` is none of those and
    "invalid_value" for a part that is not a text part. The message does not name the
    message's field: each caller names it in its own terms."""
    if content is None or isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or isinstance(content, bytes):
        raise InvalidRequest(
            "content must be a string or a list of text parts", code="invalid_type"
        )
    texts = []
    for i, part in enumerate(content):
        if not (
            isinstance(part, Mapping)
            and part.get("type") == "text"
            and isinstance(part.get("text"), str)
        ):
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise InvalidRequest(
                f"content part {i} has type {kind!r}: only text parts "
                '({"type": "text", "text": "..."}) are supported',
                code="invalid_value",
            )
        texts.append(part["text"])
    return "\n".join(texts)
