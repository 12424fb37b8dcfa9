"""Process-level settings every replica applies on start (torch threads from its CPU share)."""

from __future__ import annotations

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

    Two torch processes that each use every core thrash (a 400-token forward went from
    0.3 s to ~10 s here), so each replica uses only its share.
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
