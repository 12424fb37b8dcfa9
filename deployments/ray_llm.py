"""Ray Serve LLM as the target (`target_backend: ray_llm`): the Serve application that holds
vLLM's `LLMServer`, and the one deployment through which PFlash's TargetModel calls it.

This module runs in vLLM's environment, not PFlash's: vLLM pins `transformers<5.20`, PFlash
runs a newer one, so the two live in one Ray cluster as two Python environments (the
application's `runtime_env.py_executable`, examples/serve_config.ray_llm.yaml). It imports
only Ray at module level and nothing from `pflash`.

Why an adapter at all: `LLMServer.completions` takes vLLM's pydantic `CompletionRequest` and
yields vLLM's response classes, and neither can be pickled across to (or unpickled in) an
environment without vLLM. `TokenIdCompletions` takes the body PFlash's `openai` backend would
POST to `/v1/completions` (token ids as the prompt) as a plain dict, builds the request here,
and yields plain dicts: the stream's chunks, or `{"error": {..., "code": <HTTP status>}}`.
Everything else (engine args, replicas, autoscaling, placement) is Ray Serve LLM's own
`LLMConfig`, passed through unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

from ray import serve
from ray.serve import Application
from ray.serve.handle import DeploymentHandle

ADAPTER_NAME = "TokenIdCompletions"


def stream_chunks(item: Any) -> Iterable[dict[str, Any]]:
    """The chunks in one item `LLMServer.completions` yields: SSE strings (`data: {...}`,
    possibly several per string, or a list of them), a response or `ErrorResponse` object
    (dumped), or a dict. `[DONE]` and blank or comment lines carry nothing."""
    if isinstance(item, list | tuple):
        for part in item:
            yield from stream_chunks(part)
    elif isinstance(item, str):
        for line in item.splitlines():
            line = line.strip()
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                yield json.loads(line[5:].strip())
    elif isinstance(item, dict):
        yield item
    elif hasattr(item, "model_dump"):
        yield item.model_dump(mode="json", exclude_none=True)
    else:
        raise TypeError(f"LLMServer yielded an unexpected {type(item).__name__}")


@serve.deployment(name=ADAPTER_NAME, ray_actor_options={"num_cpus": 0}, max_ongoing_requests=64)
class TokenIdCompletions:
    """Plain-dict `/v1/completions` in front of one `LLMServer` (see the module docstring)."""

    def __init__(self, server: DeploymentHandle):
        self._server = server
        self.server = server.options(stream=True)  # stream=True even for a whole answer

    async def ready(self) -> None:
        """Returns once the LLMServer has a replica whose engine passes its health check
        (PFlash's /readyz asks this through the TargetModel)."""
        await self._server.check_health.remote()

    async def completions(self, body: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        from pydantic import ValidationError
        from ray.serve.llm.openai_api_models import CompletionRequest

        try:
            request = CompletionRequest(**body)
        except ValidationError as exc:
            message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            yield {"error": {"message": message, "type": "BadRequestError", "code": 400}}
            return
        async for item in self.server.completions.remote(request):
            for chunk in stream_chunks(item):
                yield chunk


def build_llm_app(args: dict[str, Any]) -> Application:
    """The `llm` application: `args["llm_config"]` is a Ray Serve LLM `LLMConfig` (as a
    dict, exactly as Ray's docs write it); `args["adapter"]` optional Serve options for
    `TokenIdCompletions` (e.g. `max_ongoing_requests`)."""
    from ray.serve.llm import LLMConfig, build_llm_deployment

    if "llm_config" not in args:
        raise ValueError("build_llm_app: args.llm_config (a Ray Serve LLM LLMConfig) is required")
    server = build_llm_deployment(LLMConfig(**args["llm_config"]))
    return TokenIdCompletions.options(**dict(args.get("adapter") or {})).bind(server)
