"""JSONL traces: exact round trips, and a writer that never breaks or blocks a request."""

from __future__ import annotations

import asyncio
import json
import logging
import math
import stat
import threading

import numpy as np
import pytest

from pflash.spans import Span
from pflash.trace import (
    SelectionTrace,
    TraceWriter,
    ViewTrace,
    read_traces,
    trace_line,
    trace_tenant,
)

SCORES = (0.1, 1 / 3, 2.0**-1074, 1.7976931348623157e308, float(np.float32(0.7)), -2.5)


def strict_trace(**overrides) -> SelectionTrace:
    fields = dict(
        schema_version=3,
        input_tokens=600,
        keep_ratio=0.14505,
        input_ids=tuple(range(1000, 1600)),
        query_begin=590,
        query_end=598,
        selector_mode="budget_only",
        query_parser="arbitrary_tail",
        token_budget=87,
        top_k=0,
        retained_tokens=84,
        required_instruction_spans=(Span(0, 12), Span(590, 600)),
        stop_reason="budget",
        retained_mass=0.8125,
        segmentation="fixed",
        candidate_score="sum",
        scorer="head",
        split_fraction=0.0,
        other_chunk_scores=(),
        segments=(Span(0, 128), Span(128, 256), Span(256, 384), Span(384, 512), Span(512, 540))
        + (Span(540, 600),),
        chunk_size=128,
        n_lookahead=8,
        pool_kernel=0,
        n_keep=3,
        chunk_scores=SCORES,
        selected_chunks=(0, 2, 5),
        forced_chunks=(True, False, False, False, False, True),
        compressed_ids=tuple(range(1000, 1084)),
    )
    fields.update(overrides)
    return SelectionTrace(**fields)


def view_trace(text: str = "<|im_start|>user\nhi<|im_end|>\n", **stats) -> ViewTrace:
    pflash = {"compress_ms": 12.5, "keep_ratio": 0.05, "view": {"mode": "fresh", "turn": 1}}
    pflash.update(stats)
    return ViewTrace(prompt_tokens=9000, served_tokens=450, pflash=pflash, served_text=text)


def written(path, records, **kwargs) -> TraceWriter:
    writer = TraceWriter(path, **kwargs)
    for r in records:
        assert writer.write(r) is True
    assert writer.flush()
    return writer


# --------------------------------------------------------------------------- records


def test_selection_trace_round_trips_with_exact_values(tmp_path):
    path = tmp_path / "selection.jsonl"
    record = strict_trace()
    writer = written(path, [record])
    assert writer.written == 1 and writer.failed_writes == 0

    [back] = read_traces(path)
    assert back == record
    assert [s.hex() for s in back.chunk_scores] == [s.hex() for s in SCORES]

    raw = json.loads(path.read_text().splitlines()[0])
    assert list(raw) == [
        "schema_version", "input_tokens", "keep_ratio", "input_ids", "query_begin",
        "query_end", "selector_mode", "query_parser", "token_budget", "top_k",
        "retained_tokens", "required_instruction_spans", "stop_reason", "retained_mass",
        "segmentation", "candidate_score", "scorer", "split_fraction", "other_chunk_scores",
        "segments", "chunk_size", "n_lookahead", "pool_kernel", "n_keep", "chunk_scores",
        "selected_chunks", "forced_chunks", "compressed_ids",
    ]  # fmt: skip
    assert raw["required_instruction_spans"] == [[0, 12], [590, 600]]
    assert raw["segments"][-1] == [540, 600]
    assert raw["forced_chunks"] == [True, False, False, False, False, True]
    assert raw["chunk_scores"][1] == 1 / 3


def test_numpy_inputs_are_stored_as_plain_exact_values():
    scores = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6], dtype=np.float32)
    record = strict_trace(
        chunk_scores=scores,
        input_ids=np.arange(600, dtype=np.int64),
        segments=[[0, 300], [300, 600]] + [[600, 600]] * 4,
    )
    assert record.chunk_scores == tuple(float(x) for x in scores)
    assert type(record.input_ids[0]) is int
    assert record.segments[1] == Span(300, 600)
    assert json.loads(trace_line(record))["chunk_scores"][0] == float(np.float32(0.1))


def test_non_finite_scores_are_written_as_null_and_read_back_as_nan(tmp_path):
    path = tmp_path / "t.jsonl"
    record = strict_trace(chunk_scores=(1.0, -math.inf, math.nan, 0.0, 0.5, 0.25))
    written(path, [record])
    assert json.loads(path.read_text())["chunk_scores"][:3] == [1.0, None, None]
    [back] = read_traces(path)
    assert back.chunk_scores[0] == 1.0
    assert math.isnan(back.chunk_scores[1]) and math.isnan(back.chunk_scores[2])


def test_legacy_trace_is_schema_1_with_null_retained_mass(tmp_path):
    path = tmp_path / "legacy.jsonl"
    record = strict_trace(schema_version=1, selector_mode="legacy", retained_mass=None)
    written(path, [record])
    assert json.loads(path.read_text())["retained_mass"] is None
    assert read_traces(path) == [record]


def test_invalid_selection_traces_are_rejected():
    with pytest.raises(ValueError, match="schema_version 2"):
        strict_trace(schema_version=2)
    with pytest.raises(ValueError, match="retained_mass"):
        strict_trace(schema_version=1, retained_mass=0.5)
    with pytest.raises(ValueError, match="forced_chunks"):
        strict_trace(forced_chunks=(True, False))


def test_view_trace_round_trips(tmp_path):
    path = tmp_path / "view.jsonl"
    record = view_trace("Dokument 1: Zürich 東京\n[...]\n<|im_start|>assistant\n")
    written(path, [record])
    raw = json.loads(path.read_text())
    assert raw == {
        "schema_version": 1,
        "prompt_tokens": 9000,
        "served_tokens": 450,
        "pflash": {"compress_ms": 12.5, "keep_ratio": 0.05, "view": {"mode": "fresh", "turn": 1}},
        "served_text": "Dokument 1: Zürich 東京\n[...]\n<|im_start|>assistant\n",
    }
    assert read_traces(path) == [record]


def test_mixed_trace_file_reads_each_record_as_its_type(tmp_path):
    path = tmp_path / "mixed.jsonl"
    written(path, [strict_trace(), view_trace(), strict_trace(n_keep=4)])
    kinds = [type(r).__name__ for r in read_traces(path)]
    assert kinds == ["SelectionTrace", "ViewTrace", "SelectionTrace"]


def test_read_traces_names_a_bad_line_or_skips_it(tmp_path):
    path = tmp_path / "torn.jsonl"
    path.write_text(trace_line(view_trace()) + '{"schema_version": 1, "prompt_tok')
    with pytest.raises(ValueError, match="torn.jsonl:2"):
        read_traces(path)
    assert read_traces(path, skip_bad=True) == [view_trace()]
    path.write_text(trace_line(view_trace()) + '{"schema_version": 1}\n')
    with pytest.raises(ValueError, match=":2: .*keys differ"):
        read_traces(path)


# --------------------------------------------------------------------------- writer


def test_writer_without_path_is_off(tmp_path):
    writer = TraceWriter(None)
    assert writer.enabled is False
    assert writer.write(view_trace()) is False
    assert writer.flush() is True
    assert (writer.written, writer.failed_writes, writer.dropped) == (0, 0, 0)
    assert list(tmp_path.iterdir()) == []


def test_unwritable_path_is_counted_not_raised(tmp_path, caplog):
    path = tmp_path / "missing-dir" / "trace.jsonl"
    with caplog.at_level(logging.WARNING, logger="pflash.trace"):
        writer = written(path, [view_trace(), strict_trace()])
    assert writer.failed_writes == 2
    assert writer.written == 0
    assert not path.exists()
    assert "trace write to" in caplog.text and "missing-dir" in caplog.text


def test_directory_as_path_is_counted_not_raised(tmp_path):
    writer = written(tmp_path, [view_trace()])
    assert (writer.written, writer.failed_writes) == (0, 1)


def test_unserialisable_record_fails_alone(tmp_path):
    path = tmp_path / "t.jsonl"
    bad = view_trace(extra=object())
    writer = written(path, [bad, view_trace()])
    assert (writer.written, writer.failed_writes) == (1, 1)
    assert read_traces(path) == [view_trace()]


class StalledWriter(TraceWriter):
    """A writer whose thread stalls inside its first append until released."""

    def __init__(self, *args, **kwargs):
        self.entered = threading.Event()
        self.release = threading.Event()
        super().__init__(*args, **kwargs)

    def _append(self, records):
        self.entered.set()
        assert self.release.wait(10)
        super()._append(records)


def test_full_queue_drops_and_counts_without_blocking(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = StalledWriter(path, queue_size=2)
    assert writer.write(view_trace("first")) is True
    assert writer.entered.wait(10)  # the thread holds "first"; the queue is empty
    assert writer.write(view_trace("second")) is True
    assert writer.write(view_trace("third")) is True
    assert writer.write(view_trace("fourth")) is False
    assert writer.dropped == 1
    writer.release.set()
    assert writer.flush()
    assert [r.served_text for r in read_traces(path)] == ["first", "second", "third"]
    assert (writer.written, writer.failed_writes) == (3, 0)


def test_concurrent_writers_produce_whole_lines(tmp_path):
    """Two writers on one file (two replicas) and four threads each, lines > PIPE_BUF."""
    path = tmp_path / "t.jsonl"
    writers = [TraceWriter(path, queue_size=4096), TraceWriter(path, queue_size=4096)]
    n_per_thread = 40
    filler = "x" * 9000

    def produce(w: TraceWriter, tag: str) -> None:
        for i in range(n_per_thread):
            assert w.write(view_trace(f"{tag}:{i}:{filler}"))

    threads = [
        threading.Thread(target=produce, args=(w, f"w{k}t{t}"))
        for k, w in enumerate(writers)
        for t in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for w in writers:
        assert w.flush()
        w.close()
    records = read_traces(path)
    assert len(records) == 8 * n_per_thread == len(path.read_text().splitlines())
    assert {r.served_text.rsplit(":", 1)[0] for r in records} == {
        f"w{k}t{t}:{i}" for k in range(2) for t in range(4) for i in range(n_per_thread)
    }
    assert sum(w.written for w in writers) == 8 * n_per_thread
    assert all(w.failed_writes == 0 and w.dropped == 0 for w in writers)


def test_closed_writer_ignores_writes(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = written(path, [view_trace()])
    writer.close()
    assert writer.write(view_trace()) is False
    assert len(read_traces(path)) == 1


# --------------------------------------------------------------------------- privacy


def test_a_trace_file_is_readable_by_its_owner_only(tmp_path):
    """Traces hold every tenant's prompt token ids: they were created 0644."""
    path = tmp_path / "t.jsonl"
    written(path, [strict_trace()]).close()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    older = tmp_path / "older.jsonl"
    older.write_text("")
    older.chmod(0o644)
    written(older, [strict_trace()]).close()
    assert stat.S_IMODE(older.stat().st_mode) == 0o600


def test_each_line_names_the_tenant_of_the_request_that_wrote_it(tmp_path):
    path = tmp_path / "t.jsonl"
    writer = TraceWriter(path)

    async def request(tenant: str, ratio: float) -> None:
        trace_tenant(tenant)  # as the ingress does, once per request task
        # the pipeline writes from a worker thread (the ingress offloads it)
        await asyncio.to_thread(writer.write, strict_trace(keep_ratio=ratio))

    async def both() -> None:
        await asyncio.gather(request("key-aaa", 0.25), request("anon-bbb", 0.5))

    asyncio.run(both())
    writer.write(view_trace())  # outside any request: no tenant
    assert writer.flush()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    tenants = {line["keep_ratio"]: line["tenant"] for line in lines if "keep_ratio" in line}
    assert tenants == {0.25: "key-aaa", 0.5: "anon-bbb"}
    assert "tenant" not in lines[-1]
    assert [type(r) for r in read_traces(path)] == [SelectionTrace, SelectionTrace, ViewTrace]


def test_a_full_trace_file_is_rotated_keeping_one_previous_file(tmp_path):
    path = tmp_path / "t.jsonl"
    line = len(trace_line(strict_trace()).encode())
    writer = TraceWriter(path, max_bytes=3 * line)
    for _ in range(8):
        writer.write(strict_trace())
        assert writer.flush()
    writer.close()
    rotated = tmp_path / "t.jsonl.1"
    assert path.stat().st_size <= 3 * line and rotated.stat().st_size <= 3 * line
    assert len(read_traces(path)) + len(read_traces(rotated)) >= 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.jsonl", "t.jsonl.1"]
    assert stat.S_IMODE(rotated.stat().st_mode) == 0o600
