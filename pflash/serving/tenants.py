"""Who a request belongs to: the tenant that scopes views, drafter sessions, adaptive keep
state, the target's prefix snapshots and the upstream's `cache_salt`.

With API keys a tenant is a keyed digest of the key (the key itself is never stored or
logged). Without keys the operator chooses (`anonymous_tenant`):

- `local` (the default): for a server only this host can reach. The Ingress refuses to start
  when Serve listens on anything but a loopback address, and each client address is a
  tenant.
- `per_address`: each client address is a tenant, on any host.
- `shared`: all anonymous callers are one tenant.
- `refuse`: no anonymous calls (401).

A client address is the socket peer; `X-Forwarded-For` names the client only when the peer
is one of `trusted_proxies`. Ray Serve's proxy (uvicorn) may already have replaced the peer
with a value from that header (it trusts loopback unless `FORWARDED_ALLOW_IPS` is empty), so
a peer that the request's own header also names is not believed: the call then counts as
unattributable, one tenant with the other unattributable calls.

A tenant is private when the server can tell its caller from every other user: a key, or a
direct loopback caller under `local`. Anything else may share its tenant with strangers (a
NAT, a proxy, `shared`), so what only an earlier request in the same tenant could have caused
(view statistics, resumed drafter sessions, cached tokens) and the served prompt are never
returned to it (`public_usage`, `check_return_prompt`). What remains is timing.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from dataclasses import dataclass, field

from pflash.config import SecurityConfig
from pflash.errors import ConfigError, InvalidRequest, PFlashError
from pflash.serving.envelope import http_error
from pflash.serving.usage import Usage, ViewStats

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_DOMAIN = b"pflash tenant id v1\x00"
PRIVATE_PREFIXES = ("key-", "local-")
"""Tenant ids name their kind: private tenants start with one of these, the others `anon-`
(`is_private` reads it back where only the id travels, inside a conversation key)."""
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain"})


@dataclass(frozen=True)
class Tenant:
    """A request's tenant: `id` (no `:`, it leads the conversation key) and whether the caller
    is known apart from every other user (`private`)."""

    id: str
    private: bool


@dataclass(frozen=True)
class TenantPolicy:
    """How tenants are decided, built once from the config (`tenant_policy`). The keys and
    the secret never appear in a repr."""

    keys: tuple[bytes, ...] = field(repr=False)
    secret: bytes = field(repr=False)
    anonymous: str
    trusted: tuple[Network, ...]


def is_loopback(host: str | None) -> bool:
    """Whether `host` (an address or a name) can only be reached from this machine. Unknown
    (None, empty) and wildcard addresses (`0.0.0.0`, `::`) are not."""
    if not host:
        return False
    if host.lower() in LOOPBACK_NAMES:
        return True
    address = _address(host)
    return address is not None and address.is_loopback


def tenant_policy(security: SecurityConfig, http_host: str | None) -> TenantPolicy:
    """The policy of `security` for a server whose HTTP proxy listens on `http_host` (None
    when it cannot be told). Raises `ConfigError` naming `anonymous_tenant` and `api_keys`
    when anonymous callers would be accepted under `local` from beyond this machine.

    The tenant ids are HMACs under a secret every replica derives alike: `tenant_secret`, or
    without one the set of API keys (so a tenant id, sent upstream as `cache_salt` and
    written to traces, does not let anyone holding only that id test a guessed key)."""
    if (
        not security.api_keys
        and security.anonymous_tenant == "local"
        and not is_loopback(http_host)
    ):
        raise ConfigError(
            "anonymous_tenant",
            "local",
            f"Serve listens on {http_host or 'an unknown host'}, not a loopback address, and "
            "api_keys is empty: set api_keys (PFLASH_API_KEYS), or choose anonymous_tenant "
            "per_address, shared or refuse",
        )
    material = security.tenant_secret or "\n".join(sorted(security.api_keys))
    return TenantPolicy(
        keys=tuple(k.encode("utf-8", "surrogatepass") for k in security.api_keys),
        secret=hashlib.sha256(_DOMAIN + material.encode("utf-8", "surrogatepass")).digest(),
        anonymous=security.anonymous_tenant,
        trusted=tuple(ipaddress.ip_network(n, strict=False) for n in security.trusted_proxies),
    )


def _digest(policy: TenantPolicy, text: str) -> str:
    data = text.encode("utf-8", "surrogatepass")
    return hmac.new(policy.secret, data, hashlib.sha256).hexdigest()[:24]


def _address(text: str) -> Address | None:
    """An address written alone, `a.b.c.d:port` or `[v6]:port` (as X-Forwarded-For carries
    it); None for anything else."""
    text = text.strip()
    if text.startswith("["):
        text = text[1 : text.find("]")] if "]" in text else ""
    elif text.count(":") == 1:
        text = text.split(":", 1)[0]
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return None
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _trusted(address: Address | None, trusted: tuple[Network, ...]) -> bool:
    return address is not None and any(address in net for net in trusted)


def client_address(
    peer: str | None, forwarded_for: str | None, trusted: tuple[Network, ...]
) -> Address | None:
    """The client's address, or None when it cannot be known.

    `peer` is the connection's address as Serve reports it; `forwarded_for` the request's
    `X-Forwarded-For` values joined by commas. From a trusted proxy, the header is read right
    to left (each proxy appends the address it saw) up to the first address that is not a
    trusted proxy: that is the client. From any other peer the header is ignored, except that
    a peer the header itself names may have been taken from it by Serve's proxy: None.
    A linear scan of the header, whatever its length."""
    address = _address(peer) if peer else None
    if address is None:
        return None
    entries = forwarded_for.split(",") if forwarded_for and forwarded_for.strip() else []
    if not _trusted(address, trusted):
        named = any(_address(entry) == address for entry in entries)
        return None if named else address
    client = address
    for entry in reversed(entries):
        hop = _address(entry)
        if hop is None:  # text a proxy never writes: the client's own, unverifiable
            return None
        client = hop
        if not _trusted(hop, trusted):
            break
    return client


def _unauthorized(message: str) -> PFlashError:
    return http_error(401, message, "invalid_api_key", "authentication_error")


def tenant_for(
    policy: TenantPolicy,
    authorization: str | None,
    peer: str | None,
    forwarded_for: str | None = None,
) -> Tenant:
    """The request's tenant, or a 401 `PFlashError` when keys are on and none matches (or
    anonymous callers are refused).

    Every configured key is compared in constant time, so the answer's timing does not
    tell which prefix of which key a guess shares."""
    if policy.keys:
        header = authorization or ""
        token = header[7:].strip() if header.lower().startswith("bearer ") else ""
        given = token.encode("utf-8", "surrogatepass")
        matched = None
        for key in policy.keys:
            if hmac.compare_digest(given, key):
                matched = key
        if matched is None:
            raise _unauthorized("invalid or missing API key")
        name = matched.decode("utf-8", "surrogatepass")
        return Tenant("key-" + _digest(policy, "key\x00" + name), True)
    if policy.anonymous == "refuse":
        raise _unauthorized("this server accepts no anonymous calls: send an API key")
    if policy.anonymous == "shared":
        return Tenant("anon-" + _digest(policy, "shared"), False)
    address = client_address(peer, forwarded_for, policy.trusted)
    if address is None:
        return Tenant("anon-" + _digest(policy, "unattributed"), False)
    # Under `local` the server listens on loopback: a loopback client is this host's own
    # user, unless a hop that is not a trusted proxy relayed the call (it sent the header).
    relayed = bool(forwarded_for and forwarded_for.strip()) and not _trusted(
        _address(peer or ""), policy.trusted
    )
    local = policy.anonymous == "local" and address.is_loopback and not relayed
    kind = "local-" if local else "anon-"
    return Tenant(kind + _digest(policy, f"address\x00{address}"), local)


def is_private(tenant_id: str) -> bool:
    """Whether the tenant id (as `tenant_for` made it) is a private tenant's."""
    return tenant_id.startswith(PRIVATE_PREFIXES)


def check_return_prompt(tenant: Tenant, return_prompt: bool) -> None:
    """A 400 when a caller whose tenant may be shared asks for the served prompt: a view
    made for another user's request could be what was served."""
    if return_prompt and not tenant.private:
        raise InvalidRequest(
            "pflash_return_prompt needs an API key: an anonymous caller is never shown a "
            "served prompt",
            param="pflash_return_prompt",
            code="pflash_return_prompt_anonymous",
        )


def public_usage(usage: Usage, private: bool) -> Usage:
    """`usage` as the caller may see it. A private tenant sees everything; any other caller
    gets nothing an earlier request in its tenant could have caused: no view statistics
    (`usage.timings.pflash.view`), a drafter session resumed from 0, no cached tokens (the
    target's prefill counts every served token)."""
    if private:
        return usage
    timings = usage.timings
    stats = timings.pflash.model_copy(
        update={
            "view": ViewStats(),
            "scorer_resume": 0,
            "scorer_new_tokens": timings.pflash.drafter_input_tokens,
        }
    )
    return usage.model_copy(
        update={
            "prompt_tokens_details": usage.prompt_tokens_details.model_copy(
                update={"cached_tokens": 0}
            ),
            "timings": timings.model_copy(
                update={
                    "prompt_n": timings.prompt_n + timings.cache_n,
                    "cache_n": 0,
                    "pflash": stats,
                }
            ),
        }
    )
