"""`GET /v1/models` and `GET /v1/models/{id}` as Anthropic clients read them.

Claude Code (2.1.126 on) lists a gateway's models at start-up to fill its `/model` picker and
parses only Anthropic's Models API shape; against OpenAI's list it finds nothing. It sends
`anthropic-version` on every call, as the `anthropic` SDK does, so that header chooses this
shape (`wants_anthropic`) and every other client keeps OpenAI's byte for byte.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

VERSION_HEADER = "anthropic-version"
# `created_at` is a release date; Anthropic's own docs allow the epoch when it is unknown
UNKNOWN_RELEASE = "1970-01-01T00:00:00Z"


def wants_anthropic(headers: Mapping[str, str]) -> bool:
    """Whether a models request comes from an Anthropic client (`anthropic-version` sent)."""
    return VERSION_HEADER in headers


def model_info(name: str, *, max_input: int | None, max_output: int | None) -> dict[str, Any]:
    """One served model as Anthropic's `ModelInfo`. `max_input`: the most prompt tokens a
    request may carry; `max_output`: the most a request may ask to generate (None: no cap
    of the server's own)."""
    info: dict[str, Any] = {
        "type": "model",
        "id": name,
        "display_name": name,
        "created_at": UNKNOWN_RELEASE,
        "lifecycle": "active",
    }
    if max_input is not None:
        info["max_input_tokens"] = max_input
    if max_output is not None:
        info["max_tokens"] = max_output
    return info


def model_page(
    names: Sequence[str], *, max_input: int | None, max_output: int | None
) -> dict[str, Any]:
    """Every served model on one page of Anthropic's list (`has_more` false)."""
    data = [model_info(n, max_input=max_input, max_output=max_output) for n in names]
    return {
        "data": data,
        "has_more": False,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
    }
