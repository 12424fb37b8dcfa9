"""JSONL traces: one line per selection (`trace_path`) and per served prompt
(a record type nothing writes yet), ALGORITHM.md §5.9.

Why a background writer: a trace is for offline inspection (`pflash trace view`, parity
checks against the reference). It must never slow down or fail a request. `TraceWriter.write`
only puts the record on a bounded queue; a daemon thread serialises and appends. A full
queue drops the record and a failed write (unwritable path, unserialisable value) is
logged; both are counted, neither raises.

Records are frozen dataclasses whose JSON form is exactly the reference's field set. Token
ids and spans in a `SelectionTrace` are **drafter** tokens; spans are written as `[b, e]`
lists; chunk scores are Python floats (IEEE doubles), written with `repr` precision so they
read back bit-exact.

Each line also names the request's `tenant` (the tenant id, never a key): the writer reads it
from `TRACE_TENANT`, which the ingress sets for the request's task (a context variable, so
the pipeline that writes the record needs no tenant argument). A trace holds prompts' token
ids: the file is created 0600, and past `max_bytes` it is rotated to `<path>.1` (one
previous file kept), so a busy server cannot fill its disk with traces.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import queue
import threading
from collections.abc import Iterable, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from pflash.spans import Span

logger = logging.getLogger(__name__)

SCHEMA_STRICT = 3
SCHEMA_LEGACY = 1
VIEW_SCHEMA = 1
QUEUE_SIZE = 1024
MAX_BYTES = 256 << 20  # a trace file past this is rotated to `<path>.1`
FILE_MODE = 0o600

TRACE_TENANT: ContextVar[str | None] = ContextVar("pflash_trace_tenant", default=None)
"""The tenant id of the request whose records are written now (`trace_tenant`)."""


def trace_tenant(tenant_id: str) -> None:
    """Name `tenant_id` on the trace lines the current task (and the tasks and threads it
    starts from now on) writes: the ingress calls it once per request."""
    TRACE_TENANT.set(tenant_id)


def _ints(values: Iterable[Any]) -> tuple[int, ...]:
    return tuple(int(v) for v in values)


def _floats(values: Iterable[Any]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


def _spans(values: Iterable[Any]) -> tuple[Span, ...]:
    out = []
    for v in values:
        out.append(v if isinstance(v, Span) else Span(int(v[0]), int(v[1])))
    return tuple(out)


def _float_or_none(value: Any) -> float | None:
    return None if value is None else float(value)


def _json_float(x: float) -> float | None:
    """Non-finite floats are written as null: JSON has no NaN/Infinity."""
    return x if math.isfinite(x) else None


@dataclass(frozen=True)
class SelectionTrace:
    """One selection, every §5.9 field. Schema 3 = strict selector, 1 = legacy.

    Vocabulary: `input_ids`, `compressed_ids` and every span/index are **drafter** tokens.
    - `input_tokens` = S; `keep_ratio`: the effective r used; `token_budget`: floor(S·r)
      (strict) or n_keep chunks' tokens (legacy); `retained_tokens`: drafter tokens kept.
    - `query_begin`/`query_end`: the main scorer window.
    - `required_instruction_spans`: pinned spans, canonical.
    - `retained_mass`: share of the scorer mass kept (strict); None in legacy.
    - `segmentation` ("fixed"/"probe"), `candidate_score` ("sum"/"density"), `scorer`
      ("head"/"legacy"/"split"), `split_fraction` (0 unless split), `other_chunk_scores`
      (the second scorer's per-candidate scores in split mode, else empty).
    - `segments`: the candidate spans, in source order; `chunk_size`: 0 for probe segments.
    - `n_lookahead`, `pool_kernel`: legacy scorer shape (query rows, smoothing width).
    - `n_keep`: legacy chunk target; strict: candidates kept.
    - `chunk_scores`: per-candidate score, exact doubles; `selected_chunks`: indices of
      kept candidates, ascending; `forced_chunks`: per-candidate mandatory mask (strict) or
      forced mask (legacy), one bool per candidate.
    Non-finite scores are written as null and read back as NaN.
    """

    schema_version: int
    input_tokens: int
    keep_ratio: float
    input_ids: tuple[int, ...]
    query_begin: int
    query_end: int
    selector_mode: str
    query_parser: str
    token_budget: int
    top_k: int
    retained_tokens: int
    required_instruction_spans: tuple[Span, ...]
    stop_reason: str
    retained_mass: float | None
    segmentation: str
    candidate_score: str
    scorer: str
    split_fraction: float
    other_chunk_scores: tuple[float, ...]
    segments: tuple[Span, ...]
    chunk_size: int
    n_lookahead: int
    pool_kernel: int
    n_keep: int
    chunk_scores: tuple[float, ...]
    selected_chunks: tuple[int, ...]
    forced_chunks: tuple[bool, ...]
    compressed_ids: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.schema_version not in (SCHEMA_STRICT, SCHEMA_LEGACY):
            raise ValueError(f"selection trace schema_version {self.schema_version} is not 1 or 3")
        if self.schema_version == SCHEMA_LEGACY and self.retained_mass is not None:
            raise ValueError("legacy selection traces carry retained_mass = None")
        coerce = {
            "input_ids": _ints,
            "compressed_ids": _ints,
            "selected_chunks": _ints,
            "required_instruction_spans": _spans,
            "segments": _spans,
            "chunk_scores": _floats,
            "other_chunk_scores": _floats,
            "forced_chunks": lambda v: tuple(bool(x) for x in v),
        }
        for name, fn in coerce.items():
            object.__setattr__(self, name, fn(getattr(self, name)))
        for name in (
            "input_tokens",
            "query_begin",
            "query_end",
            "token_budget",
            "top_k",
            "retained_tokens",
            "chunk_size",
            "n_lookahead",
            "pool_kernel",
            "n_keep",
        ):
            object.__setattr__(self, name, int(getattr(self, name)))
        object.__setattr__(self, "keep_ratio", float(self.keep_ratio))
        object.__setattr__(self, "split_fraction", float(self.split_fraction))
        object.__setattr__(self, "retained_mass", _float_or_none(self.retained_mass))
        if len(self.forced_chunks) not in (0, len(self.chunk_scores)):
            raise ValueError("forced_chunks must have one entry per candidate")

    def to_json(self) -> dict[str, Any]:
        """The JSONL object: field order as §5.9, spans as [b, e], null for non-finite."""
        out: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("required_instruction_spans", "segments"):
                v = [s.as_list() for s in v]
            elif f.name in ("chunk_scores", "other_chunk_scores"):
                v = [_json_float(x) for x in v]
            elif isinstance(v, float):
                v = _json_float(v)
            elif isinstance(v, tuple):
                v = list(v)
            out[f.name] = v
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> SelectionTrace:
        """Inverse of `to_json`; the key set must match exactly (strict reading)."""
        _require_keys(cls, obj)
        data = dict(obj)
        for name in ("chunk_scores", "other_chunk_scores"):
            data[name] = [math.nan if x is None else x for x in data[name]]
        for name in ("keep_ratio", "split_fraction"):
            data[name] = math.nan if data[name] is None else data[name]
        return cls(**data)


@dataclass(frozen=True)
class ViewTrace:
    """One served prompt (§5.9 `PFLASH_VIEW_TRACE_PATH`): schema 1.

    `prompt_tokens`: original prompt, **target** tokens; `served_tokens`: target tokens
    served; `pflash`: the `usage.timings.pflash` stats object (plain JSON values; a copy
    is stored, never mutate it); `served_text`: the exact text served to the target.
    """

    prompt_tokens: int
    served_tokens: int
    pflash: Mapping[str, Any]
    served_text: str
    schema_version: int = VIEW_SCHEMA

    def __post_init__(self) -> None:
        if self.schema_version != VIEW_SCHEMA:
            raise ValueError(f"view trace schema_version {self.schema_version} is not 1")
        object.__setattr__(self, "pflash", dict(self.pflash))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "prompt_tokens": int(self.prompt_tokens),
            "served_tokens": int(self.served_tokens),
            "pflash": dict(self.pflash),
            "served_text": self.served_text,
        }

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ViewTrace:
        _require_keys(cls, obj)
        return cls(**obj)


TraceRecord = SelectionTrace | ViewTrace


def _require_keys(cls: type, obj: Mapping[str, Any]) -> None:
    expected = {f.name for f in fields(cls)}
    missing, extra = expected - set(obj), set(obj) - expected
    if missing or extra:
        raise ValueError(
            f"{cls.__name__} keys differ: missing {sorted(missing)}, unknown {sorted(extra)}"
        )


def parse_trace(obj: Mapping[str, Any]) -> TraceRecord:
    """A JSON object from a trace file as its record type (view traces carry served_text);
    the line's `tenant` is not part of the record."""
    obj = {k: v for k, v in obj.items() if k != "tenant"}
    if "served_text" in obj:
        return ViewTrace.from_json(obj)
    return SelectionTrace.from_json(obj)


def trace_line(record: TraceRecord, tenant: str | None = None) -> str:
    """One JSONL line (with its newline), `tenant` first when given. Raises on values JSON
    cannot hold."""
    obj = record.to_json() if tenant is None else {"tenant": tenant, **record.to_json()}
    return json.dumps(obj, ensure_ascii=False, allow_nan=False) + "\n"


def read_traces(path: str | os.PathLike, *, skip_bad: bool = False) -> list[TraceRecord]:
    """All records of a trace file, in file order.

    A malformed line raises `ValueError` naming its line number, unless `skip_bad` (the
    trace viewer's choice: a crash can leave a torn last line). Blank lines are ignored.
    """
    out: list[TraceRecord] = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                out.append(parse_trace(json.loads(line)))
            except (ValueError, TypeError, KeyError) as err:
                if skip_bad:
                    continue
                raise ValueError(f"{path}:{number}: bad trace line: {err}") from err
    return out


# --------------------------------------------------------------------------- writer

_STOP = object()


class TraceWriter:
    """Appends one JSON line per record to `path`; off (a no-op) when `path` is None.

    The file is created with mode 0600 (an older file is narrowed to it); once it holds
    `max_bytes` it is renamed to `<path>.1` (replacing the one before) and a new file begun.

    Contract: `write` never blocks and never raises. It enqueues the record on a bounded
    queue (`queue_size`); when the queue is full the record is dropped and counted in
    `dropped`. A daemon thread serialises and appends; a failure (unwritable path,
    unserialisable value) is logged and counted in `failed_writes`. `written` counts lines
    appended. Each line goes out in a single `write(2)` on an `O_APPEND` descriptor, so
    lines stay whole even with several writers (threads or processes) on one file.

    Thread-safe: any number of threads may call `write`. `flush` waits for the queue to
    drain (tests, shutdown); `close` drains and stops the thread.
    """

    def __init__(
        self,
        path: str | os.PathLike | None,
        *,
        queue_size: int = QUEUE_SIZE,
        max_bytes: int = MAX_BYTES,
    ):
        self.path = None if path is None else Path(path)
        self.max_bytes = max_bytes
        self.written = 0
        self.failed_writes = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=max(1, queue_size))
        self._thread: threading.Thread | None = None
        self._closed = False
        if self.path is not None:
            self._thread = threading.Thread(
                target=self._run, name=f"pflash-trace:{self.path.name}", daemon=True
            )
            self._thread.start()

    @property
    def enabled(self) -> bool:
        return self.path is not None and not self._closed

    def write(self, record: TraceRecord) -> bool:
        """Queue `record`; True when queued, False when off, closed, or dropped (queue full)."""
        if not self.enabled:
            return False
        try:
            self._queue.put_nowait((record, TRACE_TENANT.get()))
        except queue.Full:
            with self._lock:
                self.dropped += 1
                dropped = self.dropped
            if _worth_logging(dropped):
                logger.warning("trace queue full for %s: %d records dropped", self.path, dropped)
            return False
        return True

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until every queued record is written or failed; False on timeout."""
        if self._thread is None:
            return True
        q = self._queue
        with q.all_tasks_done:
            return q.all_tasks_done.wait_for(lambda: q.unfinished_tasks == 0, timeout=timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Drain the queue and stop the thread; later writes are no-ops."""
        if self._thread is None or self._closed:
            self._closed = True
            return
        self._closed = True
        self.flush(timeout)
        try:
            self._queue.put(_STOP, timeout=timeout)
        except queue.Full:
            return
        self._thread.join(timeout)

    # ------------------------------------------------------------------ thread side
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while item is not _STOP:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                batch.append(item)
            try:
                self._append([r for r in batch if r is not _STOP])
            finally:
                for _ in batch:
                    self._queue.task_done()
            if batch[-1] is _STOP:
                return

    def _append(self, records: Sequence[tuple[TraceRecord, str | None]]) -> None:
        if not records:
            return
        lines: list[bytes] = []
        for record, tenant in records:
            try:
                lines.append(trace_line(record, tenant).encode("utf-8"))
            except (TypeError, ValueError, AttributeError) as err:
                self._failed(1, f"record not serialisable: {err}")
        if not lines:
            return
        try:
            fd = self._open()
        except OSError as err:
            self._failed(len(lines), str(err))
            return
        try:
            for i, line in enumerate(lines):
                try:
                    n = os.write(fd, line)
                except OSError as err:
                    self._failed(len(lines) - i, str(err))
                    return
                if n != len(line):
                    self._failed(len(lines) - i, f"short write ({n} of {len(line)} bytes)")
                    return
                with self._lock:
                    self.written += 1
        finally:
            os.close(fd)

    def _open(self) -> int:
        """The trace file for appending, 0600, rotated first when it is full. Several
        writers may rotate at once: a few lines can then land in the rotated file or be
        lost with it, never torn."""
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        info = os.fstat(fd)
        if info.st_size >= self.max_bytes:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):  # another writer rotated it
                os.replace(self.path, f"{self.path}.1")
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, FILE_MODE)
        elif info.st_mode & 0o077:  # O_CREAT's mode applies to a new file only
            with contextlib.suppress(OSError):
                os.fchmod(fd, FILE_MODE)
        return fd

    def _failed(self, n: int, reason: str) -> None:
        with self._lock:
            self.failed_writes += n
            failed = self.failed_writes
        if _worth_logging(failed, n):
            logger.warning("trace write to %s failed (%d so far): %s", self.path, failed, reason)


def _worth_logging(count: int, step: int = 1) -> bool:
    """Log the first failure and then one per thousand, so a dead disk cannot flood logs."""
    return count - step < 1 or (count // 1000) != ((count - step) // 1000)
