"""One exception type per failure class, mapped to HTTP in exactly one place (api.py).

Why classes and not codes: the pipeline fails closed. A drafter, mapping or ceiling failure
must surface as an error that names the stage, never as a silently uncompressed prompt, so
every raise site states which class of failure it is.
"""

from __future__ import annotations


class PFlashError(Exception):
    """Base class; `http_status` and `error_type` feed the OpenAI error envelope."""

    http_status = 500
    error_type = "server_error"

    def __init__(self, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code


class ConfigError(PFlashError, ValueError):
    """An invalid configuration value. The message names the key, the value and what is allowed."""

    http_status = 500
    error_type = "config_error"

    def __init__(self, key: str, value: object, allowed: str):
        super().__init__(
            f"invalid config {key}={value!r}: {allowed}", param=key, code="invalid_config"
        )
        self.key = key
        self.value = value
        self.allowed = allowed


class InvalidRequest(PFlashError, ValueError):
    """Bad client input: a 4xx in the OpenAI error shape, never a crashed replica."""

    http_status = 400
    error_type = "invalid_request_error"


class ModelNotFound(InvalidRequest):
    """A request names a model this server does not serve (OpenAI's and vLLM's 404)."""

    http_status = 404

    def __init__(self, model: str, served: tuple[str, ...]):
        shown = model if len(model) <= 64 else model[:61] + "..."
        super().__init__(
            f"the model {shown!r} does not exist; this server serves {', '.join(served)}",
            param="model",
            code="model_not_found",
        )


class CompressionFailed(PFlashError):
    """Compression could not produce a correct prompt. `stage` names where it failed.

    Stages: "query_mapping", "required_mapping", "span_validation", "context_fit",
    "drafter", "selection", "assembly", "ceiling", "probe". A client-caused failure (an
    explicit query that is not in the prompt) is a 4xx; an internal one a 5xx.
    """

    def __init__(
        self, stage: str, message: str, *, client_error: bool = False, param: str | None = None
    ):
        super().__init__(f"pflash {stage} failed: {message}", param=param, code=f"pflash_{stage}")
        self.stage = stage
        if client_error:
            self.http_status = 400
            self.error_type = "invalid_request_error"


class ModelUnavailable(PFlashError):
    """A model file is missing or unreadable. Raised at startup, with how to provide it."""

    http_status = 503
    error_type = "model_unavailable"
