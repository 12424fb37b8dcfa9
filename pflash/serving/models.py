"""`GET /v1/models` and `GET /v1/models/{id}`: the served models in the shape the client
reads. OpenAI's list and card by default; Anthropic's (`messages.models`) for a client that
sends `anthropic-version`, as Claude Code does to discover a gateway's models."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, Field

from pflash.errors import ModelNotFound
from pflash.serving.messages import models as anthropic_models
from pflash.serving.protocol import absent


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "pflash"
    max_model_len: int | None = Field(None, exclude_if=absent)


class ModelList(BaseModel):
    """`GET /v1/models`."""

    object: Literal["list"] = "list"
    data: list[ModelCard]


def listing(
    names: Sequence[str],
    model_id: str | None,
    headers: Mapping[str, str],
    *,
    context: int | None,
    max_prompt_tokens: int | None,
    max_output_tokens: int | None,
) -> dict[str, Any]:
    """The body of the list (`model_id` None) or of the one model named; a name the server
    does not serve is `ModelNotFound` (a 404). `context`: the target's, in tokens. For an
    Anthropic client `max_input_tokens` is the most a request may carry (prompts over the
    target's context are compressed to fit, so `max_prompt_tokens` when it is set)."""
    if model_id is not None and model_id not in names:
        raise ModelNotFound(model_id, tuple(names))
    shown = names if model_id is None else (model_id,)
    if anthropic_models.wants_anthropic(headers):
        limits = {"max_input": max_prompt_tokens or context, "max_output": max_output_tokens}
        if model_id is not None:
            return anthropic_models.model_info(model_id, **limits)
        return anthropic_models.model_page(shown, **limits)
    cards = [ModelCard(id=name, max_model_len=context) for name in shown]
    if model_id is not None:
        return cards[0].model_dump(exclude_none=True)
    return ModelList(data=cards).model_dump(exclude_none=True)
