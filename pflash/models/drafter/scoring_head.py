"""The trained scoring head: a replacement for the scoring layer's q_proj/k_proj (§3.4, §7.1).

The head file is bound to one drafter file by sha256 and to one feature tap. A mismatch in
schema, base model, tap, drafter hash or tensor shapes refuses to start and names what
differs; there is no silent fallback to the untrained head.

The head replaces the projections only: the scoring layer's own `input_layernorm`, `q_norm`
and `k_norm` still apply, and `attn_q` holds query rows only (no Qwen3.5 gate rows).

`scoring_head_gguf: embedded` is the head shipped in `pflash/data` for the embedded
SmolLM2 drafter (`pflash.config.artefacts` resolves it and refuses it with any other
drafter; `pflash head train` reproduces it).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pflash.config.artefacts import refuse_unbound
from pflash.errors import ModelUnavailable
from pflash.models.gguf_io import ScoringHeadFile, read_scoring_head_gguf, write_scoring_head_gguf
from pflash.models.source import file_sha256

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass(frozen=True)
class HeadIdentity:
    """What a head file must state to be used with this drafter and profile."""

    schema: str
    base_model: str
    feature_tap: str
    runtime_gguf_sha256: str


@dataclass(frozen=True)
class ScoringHead:
    """Loaded head weights, torch Linear layout, float32."""

    q_weight: object  # torch.Tensor [n_head * head_dim, hidden]
    k_weight: object  # torch.Tensor [n_head_kv * head_dim, hidden]
    path: str
    identity: HeadIdentity


def drafter_sha256(path: str | Path) -> str:
    """The hash a head binds to: the GGUF file's sha256, or for an HF directory the sha256 of
    its weight files' hashes in name order (so any weight change breaks the binding)."""
    path = Path(path)
    if path.is_file():
        return file_sha256(str(path))
    files = sorted(p for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise ModelUnavailable(
            f"drafter directory {path} has no weight files to bind a scoring head to"
        )
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}:{file_sha256(str(p))}\n".encode())
    return h.hexdigest()


def load_scoring_head(
    path: str | Path, expected: HeadIdentity, *, q_shape: tuple[int, int], k_shape: tuple[int, int]
) -> ScoringHead:
    """Read and verify a head file (`resolve_artefact("head", ...)`) against the drafter;
    refuse with the mismatch named."""
    import torch

    f = read_scoring_head_gguf(path)
    refuse_unbound(
        "head", path, f, expected, ("schema", "base_model", "feature_tap", "runtime_gguf_sha256")
    )
    for leaf, got, want in (
        ("attn_q", f.attn_q.shape, q_shape),
        ("attn_k", f.attn_k.shape, k_shape),
    ):
        if tuple(got) != tuple(want):
            raise ModelUnavailable(
                f"scoring head {path}: scoringhead.{leaf}.weight has torch shape {tuple(got)}, expected {tuple(want)}"
            )
    return ScoringHead(
        q_weight=torch.from_numpy(np.ascontiguousarray(f.attn_q)),
        k_weight=torch.from_numpy(np.ascontiguousarray(f.attn_k)),
        path=str(path),
        identity=expected,
    )


def save_scoring_head(path: str | Path, identity: HeadIdentity, q_weight, k_weight) -> Path:
    """Write a head file (trained weights in torch layout) bound to `identity`."""
    return write_scoring_head_gguf(
        path,
        ScoringHeadFile(
            schema=identity.schema,
            base_model=identity.base_model,
            runtime_gguf_sha256=identity.runtime_gguf_sha256,
            feature_tap=identity.feature_tap,
            attn_q=_as_numpy(q_weight),
            attn_k=_as_numpy(k_weight),
        ),
    )


def _as_numpy(w) -> np.ndarray:
    """A torch tensor or array-like as a float32 numpy array."""
    if hasattr(w, "detach"):
        w = w.detach().float().cpu().numpy()
    return np.asarray(w, dtype=np.float32)
