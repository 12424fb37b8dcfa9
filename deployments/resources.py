"""Process-level settings every replica applies on start (torch threads from its CPU share,
the start-up heap frozen out of the garbage collector's reach)."""

from __future__ import annotations

import gc
import math
import os


def replica_cpu_share(default: float = 1.0) -> float:
    """CPUs Ray assigned to this replica (fractional shares allowed)."""
    try:
        import ray

        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
        return float(cpus) if cpus else default
    except Exception:
        return default


def torch_threads_for_share(share: float) -> int:
    """At least one thread, at most the CPUs this replica was given (rounded up).

    Two torch processes that each use every core thrash (each forward slows many times
    over), so each replica uses only its share.
    """
    return max(1, min(os.cpu_count() or 1, math.ceil(share - 1e-9)))


def apply_thread_limits() -> int:
    import torch

    n = int(os.environ.get("PFLASH_TORCH_THREADS", "0")) or torch_threads_for_share(
        replica_cpu_share()
    )
    torch.set_num_threads(n)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return n


def freeze_startup_heap() -> int:
    """Collect once, then move every object alive now (imported modules, the model, the
    tokenizers) to the collector's permanent generation; returns how many. Called last in
    each replica's start-up.

    Why: a full collection walks every tracked object, and CPython runs one whenever the
    objects that survived since the last grow by a quarter - every few later steps of a
    long conversation, which allocate many tuples each. A process holding the drafter has
    hundreds of thousands of objects after start-up, so each such collection is a pause of
    the order of the question step itself; frozen, it walks only what requests allocated.
    Frozen objects are never freed, so only what lives as long as the replica is frozen:
    nothing a request allocates."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
