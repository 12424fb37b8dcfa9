"""Ports for a local Ray cluster: chosen together, so no two components get the same one,
and outside the ranges other processes take ports from on their own."""

from __future__ import annotations

import socket

from pflash_lab.bench.launch import ephemeral_ports, free_ports, pinned_candidates


def test_ports_chosen_together_are_distinct_free_and_outside_the_worker_range():
    ports = free_ports(12)
    assert len(set(ports)) == 12
    assert not any(10002 <= p < 20000 for p in ports)
    for p in ports:  # each is free now that the choice is made
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_pinned_ports_are_never_in_the_kernels_ephemeral_range():
    # a port bound to 0 (Ray's agents) or a connection's local end comes from this range, so
    # a pinned port there could be taken before the proxy binds it
    ephemeral = ephemeral_ports()
    assert len(ephemeral) > 1000
    for _ in range(20):
        assert not any(p in ephemeral for p in free_ports(6))
    candidates = pinned_candidates()
    assert min(candidates) >= 20000 and len(candidates) > 1000


def test_ephemeral_range_is_read_from_the_kernel_file_or_linux_default(tmp_path):
    f = tmp_path / "ip_local_port_range"
    f.write_text("40000\t50000\n")
    assert ephemeral_ports(str(f)) == range(40000, 50001)
    assert ephemeral_ports(str(tmp_path / "missing")) == range(32768, 61000)
    f.write_text("junk")
    assert ephemeral_ports(str(f)) == range(32768, 61000)


def test_a_port_held_by_another_socket_is_not_chosen(monkeypatch):
    import pflash_lab.bench.launch as launch

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        others = [p for p in pinned_candidates()[:400] if p != taken]
        monkeypatch.setattr(launch, "pinned_candidates", lambda avoid: [taken, *others[:3]])
        for _ in range(20):  # four candidates, one taken: three ports, never the taken one
            assert sorted(free_ports(3)) == sorted(others[:3])
