"""Tenants: who a request belongs to, and what state it may reach."""

from __future__ import annotations

import hashlib
import time

import pytest
import torch

from pflash.config import build_config
from pflash.errors import ConfigError, InvalidRequest, PFlashError
from pflash.models.target.hf import PrefixSnapshots
from pflash.models.target.protocol import GenerationTimings
from pflash.serving.tenants import (
    Tenant,
    check_return_prompt,
    client_address,
    is_private,
    public_usage,
    tenant_for,
    tenant_policy,
)
from pflash.serving.usage import PFlashStats, ViewStats, build_usage

KEYS = ("key-number-one", "key-number-two")


def policy(http_host: str | None = "127.0.0.1", **security):
    return tenant_policy(build_config(security, env={}).security, http_host)


KEYED = policy("0.0.0.0", api_keys=KEYS)


# ---------------------------------------------------------------------- API keys


def test_each_api_key_is_its_own_tenant_and_the_key_is_not_in_it():
    one = tenant_for(KEYED, "Bearer key-number-one", "10.0.0.1")
    two = tenant_for(KEYED, "bearer key-number-two", "10.0.0.1")
    assert one != two and one.id.startswith("key-") and "number" not in one.id
    assert one.private and two.private
    assert tenant_for(KEYED, "Bearer key-number-one", "10.9.9.9") == one  # not the address


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer key-number-on", "Basic a2V5"])
def test_a_missing_or_wrong_key_is_a_401(header):
    with pytest.raises(PFlashError) as info:
        tenant_for(KEYED, header, "10.0.0.1")
    assert info.value.http_status == 401 and info.value.code == "invalid_api_key"


def test_a_key_tenant_is_a_keyed_hash_not_a_plain_digest_of_the_key():
    """The id goes upstream as `cache_salt` and into traces: a plain sha256 of the key let
    anyone holding one test guessed keys offline."""
    one = tenant_for(KEYED, "Bearer key-number-one", None).id
    assert hashlib.sha256(b"key-number-one").hexdigest()[:16] not in one
    # every replica builds the same policy from the same config: the same id
    assert tenant_for(policy("0.0.0.0", api_keys=KEYS), "Bearer key-number-one", None).id == one
    # the key set is the secret when none is configured ...
    alone = policy("0.0.0.0", api_keys=KEYS[:1])
    assert tenant_for(alone, "Bearer key-number-one", None).id != one
    # ... and a configured secret keeps ids across key rotation, and changes them all
    a = policy("0.0.0.0", api_keys=KEYS, tenant_secret="server-secret-1")
    b = policy("0.0.0.0", api_keys=KEYS[:1], tenant_secret="server-secret-1")
    c = policy("0.0.0.0", api_keys=KEYS, tenant_secret="server-secret-2")
    ids = [tenant_for(p, "Bearer key-number-one", None).id for p in (a, b, c)]
    assert ids[0] == ids[1] != ids[2] and one not in ids


def test_the_policy_repr_shows_neither_keys_nor_secret():
    text = repr(policy("0.0.0.0", api_keys=KEYS, tenant_secret="server-secret-1"))
    assert "number" not in text and "server-secret" not in text and "secret=" not in text


# ---------------------------------------------------------------------- anonymous policies


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "10.1.2.3", "", None, "pflash.example"])
def test_local_policy_refuses_to_start_beyond_loopback_without_keys(host):
    with pytest.raises(ConfigError) as err:
        policy(host)
    message = str(err.value)
    assert err.value.key == "anonymous_tenant" and "api_keys" in message
    assert "per_address" in message and "refuse" in message


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.1.1", "::1", "localhost"])
def test_local_policy_starts_on_loopback(host):
    assert policy(host).anonymous == "local"


@pytest.mark.parametrize(
    "security",
    [{"api_keys": KEYS}, {"anonymous_tenant": "per_address"}, {"anonymous_tenant": "shared"}],
)
def test_keys_or_an_explicit_policy_start_on_any_host(security):
    assert policy("0.0.0.0", **security) is not None


def test_a_direct_loopback_caller_of_a_local_server_is_a_private_tenant():
    local = policy("127.0.0.1")
    one = tenant_for(local, None, "127.0.0.1")
    assert one.private and one.id.startswith("local-") and is_private(one.id)
    assert tenant_for(local, "Bearer anything", "127.0.0.1") == one


def test_per_address_callers_are_scoped_by_address_and_never_private():
    p = policy("0.0.0.0", anonymous_tenant="per_address")
    a, b = tenant_for(p, None, "10.0.0.1"), tenant_for(p, None, "10.0.0.2")
    assert a != b and a.id.startswith("anon-") and not a.private and not is_private(a.id)
    assert tenant_for(p, None, "127.0.0.1").private is False  # loopback too: explicit policy


def test_shared_callers_are_one_tenant_and_never_private():
    p = policy("0.0.0.0", anonymous_tenant="shared")
    tenants = {tenant_for(p, None, host) for host in ("10.0.0.1", "10.0.0.2", None)}
    assert len(tenants) == 1 and not tenants.pop().private


def test_refuse_policy_answers_every_anonymous_call_with_401():
    with pytest.raises(PFlashError) as info:
        tenant_for(policy("0.0.0.0", anonymous_tenant="refuse"), None, "10.0.0.1")
    assert info.value.http_status == 401 and "API key" in info.value.message


# ---------------------------------------------------------------------- X-Forwarded-For

PER_ADDRESS = policy("0.0.0.0", anonymous_tenant="per_address")


def test_a_forwarded_for_header_from_an_untrusted_peer_does_not_choose_the_tenant():
    """`X-Forwarded-For: 10.0.0.7` once made any caller the tenant of 10.0.0.7."""
    direct = tenant_for(PER_ADDRESS, None, "10.0.0.9")
    assert tenant_for(PER_ADDRESS, None, "10.0.0.9", "10.0.0.7") == direct
    assert tenant_for(PER_ADDRESS, None, "10.0.0.9", "10.0.0.7, 10.0.0.8") == direct


def test_a_peer_serve_took_from_the_header_is_not_believed():
    """Serve's proxy trusts X-Forwarded-For from loopback and reports its value as the
    client: a peer the header names is unattributable, never the named address's tenant."""
    victim = tenant_for(PER_ADDRESS, None, "10.0.0.7")
    forged = tenant_for(PER_ADDRESS, None, "10.0.0.7", "10.0.0.7")
    other = tenant_for(PER_ADDRESS, None, "10.0.0.8", "10.0.0.8:5555")
    assert forged != victim and forged == other and not forged.private


def test_a_trusted_proxy_names_the_client_right_to_left():
    p = policy("0.0.0.0", anonymous_tenant="per_address", trusted_proxies=["10.1.0.0/16"])
    direct = tenant_for(p, None, "203.0.113.9")
    assert tenant_for(p, None, "10.1.0.5", "203.0.113.9") == direct
    assert tenant_for(p, None, "10.1.0.5", "203.0.113.9, 10.1.0.4") == direct  # two hops
    # a client's own header value is left of what the proxy appended: it cannot choose
    assert tenant_for(p, None, "10.1.0.5", "198.51.100.1, 203.0.113.9") == direct
    assert tenant_for(p, None, "10.1.0.5") == tenant_for(p, None, "10.1.0.5", "")


@pytest.mark.parametrize(
    ("peer", "header", "expected"),
    [
        ("10.1.0.5", "203.0.113.9:443", "203.0.113.9"),
        ("10.1.0.5", "[2001:db8::1]:443", "2001:db8::1"),
        ("10.1.0.5", "2001:db8::1", "2001:db8::1"),
        ("10.1.0.5", "unknown", None),  # text no proxy writes
        ("10.1.0.5", "203.0.113.9, _hidden", None),
        ("10.1.0.5", "10.1.0.4", "10.1.0.4"),  # every hop trusted: the leftmost
        ("::ffff:10.1.0.5", "203.0.113.9", "203.0.113.9"),  # a v4-mapped peer
        ("not-an-address", "203.0.113.9", None),
        (None, "203.0.113.9", None),
    ],
)
def test_client_address_forms(peer, header, expected):
    p = policy("0.0.0.0", anonymous_tenant="per_address", trusted_proxies=["10.1.0.0/16"])
    address = client_address(peer, header, p.trusted)
    assert (None if address is None else str(address)) == expected


def test_a_relayed_call_to_a_local_server_is_not_its_private_tenant():
    """Under `local` a hop on the host (a sidecar, nginx) relays strangers from loopback."""
    local = policy("127.0.0.1")
    own = tenant_for(local, None, "127.0.0.1")
    relayed = tenant_for(local, None, "127.0.0.1", "10.0.0.7")
    assert relayed != own and not relayed.private
    assert tenant_for(local, None, "127.0.0.1", "10.0.0.8") == relayed  # the header chooses nothing


def test_a_client_behind_a_trusted_proxy_of_a_local_server_is_not_private():
    local = policy("127.0.0.1", trusted_proxies=["127.0.0.1/32"])
    remote = tenant_for(local, None, "127.0.0.1", "203.0.113.9")
    assert not remote.private and remote != tenant_for(local, None, "127.0.0.1")
    assert tenant_for(local, None, "127.0.0.1").private


def test_a_huge_forwarded_for_header_is_read_in_linear_time():
    p = policy("0.0.0.0", anonymous_tenant="per_address", trusted_proxies=["10.0.0.0/8"])
    header = ", ".join(["10.0.0.1"] * 20_000)  # ~200,000 characters, every hop trusted
    started = time.perf_counter()
    for peer in ("10.0.0.2", "192.0.2.1"):
        tenant_for(p, None, peer, header)
        tenant_for(p, None, peer, "x" * 200_000)
    assert time.perf_counter() - started < 2.0


# ---------------------------------------------------------------------- what a caller sees


def _usage() -> object:
    stats = PFlashStats(
        drafter_input_tokens=900,
        scorer_resume=700,
        scorer_new_tokens=200,
        compressed_tokens=300,
        view=ViewStats(mode="repeat", turn=2, served_tokens=300, reused_tokens=300),
    )
    timings = GenerationTimings(
        prompt_n=20, prompt_ms=5.0, predicted_n=3, predicted_ms=9.0, cache_n=280
    )
    return build_usage(1000, timings, stats)


def test_a_shared_tenant_gets_no_view_stats_resumed_session_or_cached_tokens():
    usage = public_usage(_usage(), private=False)
    stats = usage.timings.pflash
    assert stats.view == ViewStats() and stats.view.mode == "off"
    assert (stats.scorer_resume, stats.scorer_new_tokens) == (0, 900)
    assert usage.prompt_tokens_details.cached_tokens == 0 and usage.timings.cache_n == 0
    assert usage.timings.prompt_n == 300  # every served token counted as prefilled
    assert (stats.compressed_tokens, usage.prompt_tokens, usage.completion_tokens) == (300, 1000, 3)


def test_a_private_tenant_sees_its_usage_unchanged():
    assert public_usage(_usage(), private=True) == _usage()


def test_only_a_private_tenant_may_ask_for_the_served_prompt():
    check_return_prompt(Tenant("key-abc", True), True)
    check_return_prompt(Tenant("anon-abc", False), False)
    with pytest.raises(InvalidRequest) as err:
        check_return_prompt(Tenant("anon-abc", False), True)
    assert err.value.http_status == 400 and err.value.param == "pflash_return_prompt"


# ---------------------------------------------------------------------- target state


def _layers(n: int):
    return [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2))]


def test_prefix_snapshots_are_only_reused_by_their_own_tenant():
    snaps = PrefixSnapshots(4)
    prompt = torch.arange(50)
    snaps.store(prompt[:40], _layers(40), "tenant-a")
    assert snaps.lookup(prompt, "tenant-a")[0] == 40
    assert snaps.lookup(prompt, "tenant-b") == (0, None)
    snaps.store(prompt[:40], _layers(40), "tenant-b")  # b's own copy, a's is kept
    assert len(snaps) == 2 and snaps.lookup(prompt, "tenant-b")[0] == 40
