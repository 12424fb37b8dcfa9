"""Tenants: who a request belongs to, and what state it may reach (issue 16)."""

from __future__ import annotations

import pytest
import torch

from pflash.errors import PFlashError
from pflash.models.target.hf import PrefixSnapshots
from pflash.tenants import tenant_for

KEYS = ("key-number-one", "key-number-two")


def test_each_api_key_is_its_own_tenant_and_the_key_is_not_in_it():
    one = tenant_for(KEYS, "Bearer key-number-one", "10.0.0.1")
    two = tenant_for(KEYS, "bearer key-number-two", "10.0.0.1")
    assert one != two and one.startswith("key-") and "number" not in one
    assert tenant_for(KEYS, "Bearer key-number-one", "10.9.9.9") == one  # not the address


@pytest.mark.parametrize("header", [None, "", "Bearer", "Bearer key-number-on", "Basic a2V5"])
def test_a_missing_or_wrong_key_is_a_401(header):
    with pytest.raises(PFlashError) as info:
        tenant_for(KEYS, header, "10.0.0.1")
    assert info.value.http_status == 401 and info.value.code == "invalid_api_key"


def test_without_keys_anonymous_callers_are_scoped_by_address():
    assert tenant_for((), None, "10.0.0.1") == tenant_for((), "Bearer x", "10.0.0.1")
    assert tenant_for((), None, "10.0.0.1") != tenant_for((), None, "10.0.0.2")
    assert tenant_for((), None, "10.0.0.1").startswith("anon-")


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
