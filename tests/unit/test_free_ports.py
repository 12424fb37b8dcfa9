"""Ports for a local Ray cluster: chosen together, so no two components get the same one."""

from __future__ import annotations

import socket

from pflash_lab.bench.launch import free_ports


def test_ports_chosen_together_are_distinct_free_and_outside_the_worker_range():
    ports = free_ports(12)
    assert len(set(ports)) == 12
    assert not any(10002 <= p < 20000 for p in ports)
    for p in ports:  # each is free now that the choice is made
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))
