"""The tap projection: passage evidence from the drafter's own tap (`select_projection_weight`).

Why: the sentence embedder (`pflash.models.embedder`) connects a paraphrased question to
its evidence, but it is a second model with its own tokenizer and forward pass. The drafter
already computes its tap (the residual stream entering the scoring layer) for every prompt
token; a linear map trained on question/evidence pairs (`pflash projection train`) turns
those rows into a space where the question sits near the passages that answer it:

    x̂_t = x_t / sqrt(mean(x_t^2) + eps)                x: tap row [n_embd]
    q   = W · mean_{t in question} x̂_t                 W: [dim, n_embd]
    p_j = W · mean_{t in passage j} x̂_t
    s_j = <q / |q|, p_j / |p_j|>                        cosine, float64 [passages]

Pooling before projecting is the same number as projecting each row and pooling (W is
linear) at a fraction of the work; training pools with `pooled_rows` too and scores with the
same `projected_cosines` in torch, so training scores what serving scores.

The GGUF file is bound to one drafter file by sha256 and one feature tap, like the segment
probe (`pflash.models.probe`): every key is required and typed, the one tensor is F32,
finite and [dim, n_embd]. A bad or foreign file refuses to load with what is wrong named;
there is no fallback.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pflash.config.artefacts import refuse_unbound, resolve_artefact
from pflash.errors import ModelUnavailable
from pflash.models.probe import (
    ProbeIdentity,
    open_typed_gguf,
    scorer_probe_identity,
    write_gguf,
)
from pflash.spans import Span

PROJECTION_ARCH = "tapprojection"
NS = "tapprojection"
WEIGHT = f"{NS}.weight"
SCHEMA_SUFFIX = "_tap_projection_v1"
RMS_EPS = 1e-6  # the row norm's epsilon training writes; the file states the one it used
L2_EPS = 1e-12  # keeps the cosine of an all-zero projection finite (0)
_SHA256 = re.compile(r"^[0-9a-f]{64}$")

# What a projection must state to read a drafter's tap is what a probe must state (family,
# base model, tap, drafter sha256, tap width): one identity, computed by
# `scorer_probe_identity`; only the schema name differs (`projection_schema`).
ProjectionIdentity = ProbeIdentity


def projection_schema(family: str) -> str:
    """`smollm2_135m` -> `smollm2_135m_tap_projection_v1`."""
    return f"{family}{SCHEMA_SUFFIX}"


# --------------------------------------------------------------------------- the math


def rms_rows(rows: np.ndarray, eps: float = RMS_EPS) -> np.ndarray:
    """Each row divided by its root mean square, float64 [n, n_embd]. Why: tap rows differ
    in scale by orders of magnitude (the first token, chat markers); unnormalised, a few
    rows would decide every pooled vector."""
    x = np.asarray(rows, dtype=np.float64)
    return x / np.sqrt((x * x).mean(axis=-1, keepdims=True) + eps)


def pooled_rows(tap: np.ndarray, spans: Sequence[Span], eps: float = RMS_EPS) -> np.ndarray:
    """Per span, the mean of its RMS-normalised tap rows: float64 [len(spans), n_embd].

    `tap` float [S, n_embd] (drafter tokens); spans must be non-empty and inside [0, S).
    Raises ValueError on an empty or out-of-range span or a non-finite row it reads."""
    tap = np.asarray(tap)
    if tap.ndim != 2:
        raise ValueError(f"tap must be [S, n_embd], got shape {tap.shape}")
    out = np.empty((len(spans), tap.shape[1]), dtype=np.float64)
    for i, span in enumerate(spans):
        if span.empty or span.begin < 0 or span.end > tap.shape[0]:
            raise ValueError(f"span {span.as_list()} is empty or outside the {tap.shape[0]} rows")
        rows = tap[span.begin : span.end]
        if not np.all(np.isfinite(rows)):
            raise ValueError(f"non-finite tap rows in span {span.as_list()}")
        out[i] = rms_rows(rows, eps).mean(axis=0)
    return out


def reused_pooled_rows(
    tap: np.ndarray,
    spans: Sequence[Span],
    eps: float = RMS_EPS,
    memo: dict[Span, np.ndarray] | None = None,
    reusable_end: int = 0,
) -> np.ndarray:
    """`pooled_rows(tap, spans)`, reading from `memo` the spans that end by `reusable_end`.

    Why: a conversation's later turn asks for the same passages of its unchanged prefix
    again, and pooling them is the projection's cost that grows with the conversation.
    `memo` is the conversation's (the drafter session keeps it);
    `reusable_end` the rows this pass reused from the session, the only rows known to be
    the ones the memo was pooled from. Each span is pooled on its own, so a remembered
    vector is exactly what pooling it again would give. The memo is left holding this
    call's spans only (bounded by the prompt's passages; an entry past `reusable_end` was
    pooled from rows that have since changed and is never read)."""
    if memo is None:
        return pooled_rows(tap, spans, eps)
    known = {s: v for s, v in memo.items() if s.end <= reusable_end}
    missing = [s for s in spans if s not in known]
    fresh = dict(zip(missing, pooled_rows(tap, missing, eps), strict=True)) if missing else {}
    memo.clear()
    out = np.empty((len(spans), np.asarray(tap).shape[1]), dtype=np.float64)
    for i, span in enumerate(spans):
        out[i] = memo[span] = known[span] if span in known else fresh[span]
    return out


def projected_cosines(weight, question, passages):
    """Cosine of the projected question to each projected passage: [n].

    weight [dim, n_embd], question [n_embd] and passages [n, n_embd] pooled rows
    (`pooled_rows`). Written with operators numpy arrays and torch tensors share, so
    serving (numpy, float64) and training (torch, float32, differentiable) run this one
    formula."""
    q = question @ weight.T  # [dim]
    p = passages @ weight.T  # [n, dim]
    q = q / ((q * q).sum(-1) + L2_EPS) ** 0.5
    p = p / ((p * p).sum(-1)[..., None] + L2_EPS) ** 0.5
    return p @ q


# --------------------------------------------------------------------------- file format


@dataclass(frozen=True, eq=False)
class ProjectionFile:
    """A projection GGUF's content: the identity it binds to, `weight` float32
    [dim, n_embd] (PyTorch layout), the InfoNCE `temperature` it was trained with (a record:
    serving returns cosines), the row norm's `norm_eps`, and `trained_on`, a short note of
    the training data."""

    family: str
    base_model: str
    feature_tap: str
    runtime_gguf_sha256: str
    n_embd: int
    weight: np.ndarray
    temperature: float
    trained_on: str
    norm_eps: float = RMS_EPS

    @property
    def schema(self) -> str:
        return projection_schema(self.family)

    @property
    def dim(self) -> int:
        return int(self.weight.shape[0])


def projection_fields(f: ProjectionFile) -> dict[str, tuple[Any, str]]:
    """Metadata as written: key -> (value, GGUF type name)."""
    return {
        "general.architecture": (PROJECTION_ARCH, "STRING"),
        f"{NS}.schema": (f.schema, "STRING"),
        f"{NS}.base_model": (f.base_model, "STRING"),
        f"{NS}.feature_tap": (f.feature_tap, "STRING"),
        f"{NS}.runtime_gguf_sha256": (f.runtime_gguf_sha256, "STRING"),
        f"{NS}.n_embd": (int(f.n_embd), "UINT32"),
        f"{NS}.temperature": (float(f.temperature), "FLOAT32"),
        f"{NS}.norm_eps": (float(f.norm_eps), "FLOAT32"),
        f"{NS}.trained_on": (f.trained_on, "STRING"),
    }


def projection_tensors(f: ProjectionFile) -> dict[str, np.ndarray]:
    """The one tensor: `tapprojection.weight` [dim, n_embd] (ggml order [n_embd, dim])."""
    return {WEIGHT: np.ascontiguousarray(f.weight, dtype=np.float32)}


def write_projection_gguf(path: str | Path, f: ProjectionFile) -> Path:
    return write_gguf(path, projection_fields(f), projection_tensors(f))


def read_projection_gguf(path: str | Path) -> ProjectionFile:
    """Read and validate a projection file on its own terms: every key present with its
    type and range, the weight F32, finite and [dim, n_embd]. `ModelUnavailable` names the
    file and what is wrong."""

    path = Path(path)
    where = f"tap projection {path}"
    if not path.is_file():
        raise ModelUnavailable(
            f"{where} not found; set projection_gguf to an existing file or train one with "
            "`pflash projection train`"
        )
    reader, value = open_typed_gguf(path, where)

    arch = value("general.architecture", "STRING")
    if arch != PROJECTION_ARCH:
        raise ModelUnavailable(
            f"{where}: general.architecture is {arch!r}, expected {PROJECTION_ARCH!r}"
        )
    text = {
        k: value(f"{NS}.{k}", "STRING")
        for k in ("schema", "base_model", "feature_tap", "runtime_gguf_sha256", "trained_on")
    }
    n_embd = int(value(f"{NS}.n_embd", "UINT32"))
    temperature = float(value(f"{NS}.temperature", "FLOAT32"))
    norm_eps = float(value(f"{NS}.norm_eps", "FLOAT32"))
    schema = text.pop("schema")
    if not schema.endswith(SCHEMA_SUFFIX) or schema == SCHEMA_SUFFIX:
        raise ModelUnavailable(
            f"{where}: {NS}.schema {schema!r} is not a tap projection schema "
            f"(<family>{SCHEMA_SUFFIX})"
        )
    if not _SHA256.match(text["runtime_gguf_sha256"]):
        raise ModelUnavailable(
            f"{where}: {NS}.runtime_gguf_sha256 {text['runtime_gguf_sha256']!r} is not a "
            "lowercase hex sha256"
        )
    if not (math.isfinite(temperature) and temperature > 0):
        raise ModelUnavailable(f"{where}: {NS}.temperature {temperature} is not positive")
    if not (math.isfinite(norm_eps) and 0 < norm_eps < 1):
        raise ModelUnavailable(f"{where}: {NS}.norm_eps {norm_eps} is not in (0, 1)")
    weight = _read_weight(reader, where, n_embd)
    return ProjectionFile(
        family=schema.removesuffix(SCHEMA_SUFFIX),
        n_embd=n_embd,
        weight=weight,
        temperature=temperature,
        norm_eps=norm_eps,
        **text,
    )


def _read_weight(reader, where: str, n_embd: int) -> np.ndarray:
    import gguf

    found = {t.name: t for t in reader.tensors}
    t = found.get(WEIGHT)
    if t is None:
        raise ModelUnavailable(f"{where} lacks tensor {WEIGHT}")
    if t.tensor_type != gguf.GGMLQuantizationType.F32:
        raise ModelUnavailable(f"{where}: {WEIGHT} must be F32, got {t.tensor_type.name}")
    shape = tuple(int(d) for d in t.shape[::-1])  # ggml order -> [dim, n_embd]
    if len(shape) != 2 or shape[0] < 1 or shape[1] != n_embd:
        raise ModelUnavailable(
            f"{where}: {WEIGHT} has ggml shape {list(shape[::-1])}, expected [{n_embd}, dim] "
            f"({NS}.n_embd {n_embd})"
        )
    weight = np.array(t.data, dtype=np.float32).reshape(shape)
    if not np.all(np.isfinite(weight)):
        raise ModelUnavailable(f"{where}: {WEIGHT} has non-finite values")
    return weight


# --------------------------------------------------------------------------- the runtime


@dataclass(frozen=True, eq=False)
class TapProjection:
    """A loaded projection, bound to one drafter: scores passages against a question from
    the drafter's tap of the same prompt (`ScoreResult.tap`)."""

    weight: np.ndarray  # float64 [dim, n_embd]
    norm_eps: float
    identity: ProjectionIdentity
    path: str

    def similarity(
        self,
        tap: np.ndarray,
        question: Span,
        passages: Sequence[Span],
        memo: dict[Span, np.ndarray] | None = None,
        reusable_end: int = 0,
    ) -> np.ndarray:
        """Cosine of each passage to the question, float64 [len(passages)] in [-1, 1].

        `tap` float [S, n_embd]; `question` and `passages` drafter spans inside it. `memo`
        and `reusable_end`: a conversation's pooled passages (`reused_pooled_rows`).
        ValueError on a tap of the wrong width, an empty or out-of-range span, or
        non-finite rows."""
        tap = np.asarray(tap)
        if tap.ndim != 2 or tap.shape[1] != self.identity.n_embd:
            raise ValueError(f"tap has shape {tap.shape}, expected [S, {self.identity.n_embd}]")
        if not passages:
            return np.zeros(0, dtype=np.float64)
        q = pooled_rows(tap, [question], self.norm_eps)[0]  # [n_embd]
        p = reused_pooled_rows(tap, passages, self.norm_eps, memo, reusable_end)  # [n, n_embd]
        return np.asarray(projected_cosines(self.weight, q, p), dtype=np.float64)


def load_tap_projection(path: str | Path, expected: ProjectionIdentity) -> TapProjection:
    """Read a projection file and bind it to the drafter `expected` describes; refuse with
    the mismatch named (schema, base model, tap, drafter sha256, tap width)."""
    f = read_projection_gguf(path)
    where = f"tap projection {path}"
    want_schema = projection_schema(expected.family)
    if f.schema != want_schema:
        raise ModelUnavailable(
            f"{where} does not fit this drafter: schema is {f.schema!r}, expected {want_schema!r}"
        )
    refuse_unbound(
        "projection", path, f, expected, ("base_model", "feature_tap", "runtime_gguf_sha256")
    )
    if f.n_embd != expected.n_embd:
        raise ModelUnavailable(
            f"{where} does not fit this drafter: n_embd is {f.n_embd}, the drafter's tap has "
            f"{expected.n_embd}"
        )
    return TapProjection(f.weight.astype(np.float64), f.norm_eps, expected, str(path))


def projection_for(config, scorer) -> TapProjection:
    """The tap projection `config.projection_gguf` names, bound to the in-process `scorer`'s
    drafter (the scorer loads it at start when `select_projection_weight` is set, else on
    the first request that asks for projection scores). No file configured is
    `ModelUnavailable`: scores were asked for and there is nothing to compute them with."""
    spec = getattr(config, "projection_gguf", None)
    if not spec:
        raise ModelUnavailable(
            "projection evidence asked, but projection_gguf is empty; set it to `embedded` "
            "or to a file from `pflash projection train`"
        )
    identity = scorer_probe_identity(scorer)
    path = resolve_artefact("projection", spec, config.drafter, identity.feature_tap)
    return load_tap_projection(path, identity)
