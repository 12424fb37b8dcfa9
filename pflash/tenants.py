"""Who a request belongs to: the tenant that scopes views, drafter sessions, adaptive keep
state and the target's prefix snapshots.

With API keys, a tenant is a digest of the key (the key itself is never stored or logged).
Without keys the server still must not let one client reach another's state by sending
their `session_id` or a guessed prompt prefix, so an anonymous tenant is scoped by what the
server knows of the caller: its network address. Behind a proxy that hides client
addresses all anonymous callers share one tenant; use API keys there.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Sequence

from pflash.errors import PFlashError


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def tenant_for(api_keys: Sequence[str], authorization: str | None, client_host: str | None) -> str:
    """The request's tenant, or a 401 `PFlashError` when keys are on and none matches.

    Every configured key is compared in constant time, so the answer's timing does not
    tell which prefix of which key a guess shares."""
    if not api_keys:
        return "anon-" + _digest(client_host or "unknown")
    header = authorization or ""
    token = header[7:].strip() if header.lower().startswith("bearer ") else ""
    matched = None
    for key in api_keys:
        if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), key.encode()):
            matched = key
    if matched is not None:
        return "key-" + _digest(matched)
    exc = PFlashError("invalid or missing API key", code="invalid_api_key")
    exc.http_status, exc.error_type = 401, "authentication_error"
    raise exc
