"""`pflash trace view`: a real trace renders into valid, self-contained HTML that shows
every kept segment; crafted traces check the marks (kept, dropped, mandatory, rank)."""

from __future__ import annotations

import html
from html.parser import HTMLParser

import pytest

from pflash.cli import main
from pflash.cli.trace_view import page_paths, render_selection, render_view, segment_views
from pflash.spans import Span, decode_ids
from pflash.trace import SelectionTrace, TraceWriter, ViewTrace, read_traces, trace_line

VOID = {"meta", "br", "img", "hr", "link", "input"}


class _Checker(HTMLParser):
    """Fails on a closing tag that does not match the open one; collects text and links."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.external: list[str] = []
        self.tags: list[tuple[str, dict]] = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.tags.append((tag, attrs))
        for key in ("src", "href"):
            if attrs.get(key):
                self.external.append(attrs[key])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"unexpected </{tag}> with open {self.stack[-3:]}")
        else:
            self.stack.pop()


def _check(page: str) -> _Checker:
    checker = _Checker()
    checker.feed(page)
    checker.close()
    assert page.startswith("<!DOCTYPE html>")
    assert not checker.errors, checker.errors
    assert checker.stack == []
    assert checker.external == []  # self-contained: no scripts, styles or images to fetch
    return checker


def _crafted(tok) -> SelectionTrace:
    ids = tok("alpha beta gamma delta epsilon zeta eta theta iota kappa", add_special_tokens=False)[
        "input_ids"
    ]
    n = len(ids)
    cuts = [0, n // 3, 2 * n // 3, n]
    segments = [Span(a, b) for a, b in zip(cuts, cuts[1:], strict=False)]
    return SelectionTrace(
        schema_version=3,
        input_tokens=n,
        keep_ratio=0.5,
        input_ids=ids,
        query_begin=cuts[2],
        query_end=n,
        selector_mode="budget_only",
        query_parser="arbitrary_tail",
        token_budget=n // 2,
        top_k=0,
        retained_tokens=n - cuts[1],
        required_instruction_spans=(Span(cuts[2], n),),
        stop_reason="budget_reached",
        retained_mass=1.0,
        segmentation="fixed",
        candidate_score="sum",
        scorer="head",
        split_fraction=0.0,
        other_chunk_scores=(),
        segments=segments,
        chunk_size=cuts[1],
        n_lookahead=n - cuts[2],
        pool_kernel=1,
        n_keep=2,
        chunk_scores=[0.1, 0.7, 0.2],
        selected_chunks=[1, 2],
        forced_chunks=[False, False, True],
        compressed_ids=ids[cuts[1] :],
    )


def test_crafted_trace_marks_kept_dropped_mandatory_and_rank(smollm2_tokenizer):
    trace = _crafted(smollm2_tokenizer)
    views = segment_views(trace, smollm2_tokenizer)
    assert [(v.index, v.kept, v.mandatory) for v in views] == [
        (0, False, False),
        (1, True, False),
        (2, True, True),
    ]
    assert [v.rank for v in views] == [0.0, 1.0, 0.5]
    assert "".join(v.text for v in views) == decode_ids(smollm2_tokenizer, trace.input_ids)
    page = render_selection(trace, smollm2_tokenizer)
    checker = _check(page)
    classes = [a.get("class", "") for t, a in checker.tags if a.get("data-index") is not None]
    assert classes == ["seg dropped", "seg kept", "seg kept mandatory"]
    assert "budget_reached" in page and "2 of 3" in page


def test_view_trace_page_shows_the_served_text_and_stats():
    trace = ViewTrace(100, 20, {"keep_ratio": 0.2, "view": {"mode": "fresh"}}, "a <b> & c")
    page = render_view(trace)
    _check(page)
    assert html.escape("a <b> & c") in page and "mode=fresh" in page


def test_several_records_get_numbered_pages(tmp_path):
    out = tmp_path / "page.html"
    assert page_paths(out, 1) == [out]
    assert page_paths(out, 2) == [tmp_path / "page-1.html", tmp_path / "page-2.html"]


@pytest.mark.model
def test_real_trace_renders_valid_html_containing_every_kept_segment(tmp_path, smollm2_tokenizer):
    from pflash.cli.compress import load_drafter
    from pflash.compress.render.rendered import RenderedPrompt
    from pflash.config import build_config
    from pflash.flow.in_process import compress_in_process
    from pflash.models.drafter.scorer import DrafterScorer
    from pflash_lab.corpus.cases import CaseSpec, token_counter
    from pflash_lab.corpus.families import generate

    config = build_config({"mode": "always", "keep_ratio": 0.2, "select_chunk_size": 64}, env={})
    case = generate(CaseSpec("single_needle", 21, 1024, 0.5), token_counter(smollm2_tokenizer))
    messages = case.messages(0)
    text = smollm2_tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    )
    ids = tuple(smollm2_tokenizer(text, add_special_tokens=False)["input_ids"])
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path)
    compress_in_process(
        RenderedPrompt("chat", ids, smollm2_tokenizer, messages=messages),
        config,
        target_tokenizer=smollm2_tokenizer,
        drafter_tokenizer=smollm2_tokenizer,
        scorer=DrafterScorer(config, load_drafter(config.drafter)),
        trace=writer,
    )
    writer.close()
    (trace,) = read_traces(path)
    out = tmp_path / "page.html"
    assert main(["trace", "view", str(path), "-o", str(out)]) == 0
    page = out.read_text(encoding="utf-8")
    checker = _check(page)
    kept = [v for v in segment_views(trace, smollm2_tokenizer) if v.kept]
    assert kept and len(kept) == len(trace.selected_chunks)
    for v in kept:
        assert html.escape(v.text) in page
    segments = [a for _, a in checker.tags if "data-index" in a]
    assert len(segments) == len(trace.segments)
    marked = [a for a in segments if "kept" in a["class"].split()]
    assert len(marked) == len(kept)
    assert any("mandatory" in a["class"].split() for a in segments)
    assert f"{trace.retained_tokens}" in page and trace.stop_reason in page

    # two records (the same line twice) -> two numbered pages
    path.write_text(trace_line(trace) * 2)
    assert main(["trace", "view", str(path), "-o", str(out)]) == 0
    assert (tmp_path / "page-1.html").is_file() and (tmp_path / "page-2.html").is_file()
