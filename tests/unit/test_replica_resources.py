"""Process settings every replica applies on start (`deployments.resources`)."""

from __future__ import annotations

import gc

from deployments.resources import freeze_startup_heap, torch_threads_for_share


def test_a_replica_uses_only_its_cpu_share_of_torch_threads():
    assert torch_threads_for_share(0.25) == 1
    assert torch_threads_for_share(1.0) == 1
    assert torch_threads_for_share(1.5) == 2


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the collector frees it


def test_the_startup_heap_is_frozen_and_what_requests_allocate_after_is_still_collected():
    startup = [_Node() for _ in range(1000)]
    try:
        frozen = freeze_startup_heap()
        assert frozen >= 1000 and gc.get_freeze_count() == frozen
        # the collector no longer tracks the start-up objects (a full collection skips them)
        assert not any(o is startup[0] for o in gc.get_objects())
        # ... and garbage made after start-up is still found
        for _ in range(10):
            _Node()
        assert gc.collect() >= 10
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
        del startup
