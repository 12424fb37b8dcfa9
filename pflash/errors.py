"""One exception type per failure class, mapped to HTTP in exactly one place
(`pflash.serving.envelope`).

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

    @property
    def public_message(self) -> str:
        """What a client is told when this is a 5xx: no internals (the log has the rest)."""
        return self.message


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
    "drafter", "selection", "assembly", "ceiling", "probe", "required_check" (a
    pflash_required string missing from what is served). A client-caused failure (an
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

    @property
    def public_message(self) -> str:
        return f"pflash {self.stage} failed"


# Failures of the serving runtime, matched by class name so pflash/ needs no Ray import:
# name -> (status, error type, code, what the client is told). Walked along the MRO.
RUNTIME_FAILURES: dict[str, tuple[int, str, str, str]] = {
    "BackPressureError": (
        503,
        "overloaded_error",
        "backpressure",
        "server overloaded, retry later",
    ),
    "DeploymentUnavailableError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "service unavailable",
    ),
    "ReplicaUnavailableError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "service unavailable",
    ),
    "RayActorError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a model replica died, retry",
    ),
    # Ray's own transient failures: a result lost with the worker that held it, a worker
    # or node gone, the object store full, the memory monitor's kill. None is a bug in the
    # request; each is retryable, so none may reach the client as a 500.
    "ObjectLostError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a result was lost in the serving runtime, retry",
    ),
    "WorkerCrashedError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a model replica died, retry",
    ),
    "NodeDiedError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a node of the cluster died, retry",
    ),
    "LocalRayletDiedError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a node of the cluster died, retry",
    ),
    "RaySystemError": (
        503,
        "service_unavailable",
        "replica_unavailable",
        "a transient failure of the serving runtime, retry",
    ),
    "ObjectStoreFullError": (
        503,
        "overloaded_error",
        "backpressure",
        "server overloaded, retry later",
    ),
    "PendingCallsLimitExceeded": (
        503,
        "overloaded_error",
        "backpressure",
        "server overloaded, retry later",
    ),
    "OutOfMemoryError": (
        503,
        "overloaded_error",
        "out_of_memory",
        "a model replica ran out of memory, retry later",
    ),
    "TimeoutError": (504, "timeout_error", "timeout", "timed out"),
}


def runtime_failure(exc: BaseException) -> tuple[int, str, str, str] | None:
    """The `RUNTIME_FAILURES` entry of `exc` (overload, a lost replica, a deadline), if any."""
    return next(
        (RUNTIME_FAILURES[c.__name__] for c in type(exc).__mro__ if c.__name__ in RUNTIME_FAILURES),
        None,
    )


class StageUnavailable(CompressionFailed):
    """A stage could not run because the runtime could not give it a replica in time
    (overload, a replica that died, a deadline). Still fail closed — nothing is served
    uncompressed — but retryable: a 503/504 with Retry-After, not a 500."""

    retry_after_s = 1

    def __init__(self, stage: str, cause: BaseException):
        status, error_type, code, reason = runtime_failure(cause) or (
            503,
            "service_unavailable",
            "replica_unavailable",
            "service unavailable",
        )
        super().__init__(stage, f"{reason} ({type(cause).__name__}: {cause})")
        self.http_status = status
        self.error_type = error_type
        self.code = f"pflash_{stage}_{code}"
        self.reason = reason

    @property
    def public_message(self) -> str:
        return f"pflash {self.stage} unavailable: {self.reason}"


class ModelUnavailable(PFlashError):
    """A model file is missing or unreadable. Raised at startup, with how to provide it."""

    http_status = 503
    error_type = "model_unavailable"
