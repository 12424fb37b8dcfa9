"""The harness's smoke mode against the real embedded app (HTTP, official openai client).

Three small cases (single needle, question before the document, three turns) by PFlash,
full prefill, keep-the-tail and random chunks: every turn is scored from the prompt the
server says it served (`pflash_return_prompt`), and the summary and plots are written.
"""

from __future__ import annotations

import pytest

from pflash_lab.bench.smoke import SMOKE_METHODS, SMOKE_SPECS, run_smoke

pytestmark = pytest.mark.integration


def test_smoke_mode_scores_every_turn_through_the_http_api(tmp_path):
    results = run_smoke(tmp_path)
    turns = 1 + 1 + 3
    assert len(results) == turns * len(SMOKE_METHODS)
    assert {r.case_id for r in results} == {s.case_id for s in SMOKE_SPECS}
    by = {(r.case_id, r.turn, r.method): r for r in results}
    for r in results:
        assert r.engine == "http"
        assert r.ttft_ms > 0
        assert r.evidence_total >= 1
    for (case_id, turn, method), r in by.items():
        full = by[(case_id, turn, "full")]
        if method == "full":
            assert r.retention == 1.0 and r.question_kept  # the whole prompt was served
            assert r.served_tokens == r.prompt_tokens
        else:
            assert r.served_tokens < 0.6 * full.served_tokens
    pflash = [r for r in results if r.method == "pflash"]
    assert all(r.question_kept for r in pflash if r.placement == "after")  # the question is pinned
    assert all(r.compress_ms == 0.0 for r in pflash)  # server-side: inside the TTFT
    summary = (tmp_path / "summary.md").read_text()
    assert "### Evidence retention" in summary and "### TTFT ratio" in summary
    assert (tmp_path / "results.jsonl").read_text().count("\n") == len(results)
    try:
        import matplotlib  # noqa: F401 - optional (the bench extra)
    except ImportError:
        return
    assert (tmp_path / "ttft_vs_length.png").is_file()
