"""Read-ahead: a small addition appended verbatim is scored in the background, so the next
turn that needs the drafter resumes on its own tokens, and what is served never changes.

The drafter is a tiny random-weight llama over SmolLM2's vocabulary (the session mechanics,
not the weights, are under test); the flow, views and tokenizer are the real ones.
"""

from __future__ import annotations

import numpy as np
from conftest import UNTUNED, license_text, serve_turns, tool_step

from pflash.compress.plan.query import QueryWindow
from pflash.compress.scoring import ScoreRequest, is_skipped_read_ahead
from pflash.config import build_config
from pflash.models.drafter.scorer import DrafterScorer
from pflash.spans import Span

FACT = "The archive password for the blue vault is heliotrope-42."


def _turns() -> list[list[dict]]:
    """A task over a document, two small tool outputs (appended verbatim), a question."""
    body = license_text("GPL-3", 6000)
    mid = body.index("\n\n", len(body) // 2)
    task = [
        {"role": "system", "content": "You are a coding agent. Answer briefly."},
        {"role": "user", "content": body[:mid] + "\n\n" + FACT + body[mid:] + "\n\nTidy up."},
    ]
    tool1 = [*task, *tool_step("ls", license_text("BSD", 500), 1)]
    tool2 = [*tool1, *tool_step("git_status", license_text("Apache-2.0", 600), 2)]
    question = [
        *tool2,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "What is the password of the blue vault?"},
    ]
    return [task, tool1, tool2, question]


def _config(**over):
    return build_config(
        UNTUNED
        | {
            "mode": "always",
            "keep_ratio": 0.2,
            "drafter_head_layer": 2,
            "drafter_chunk_tokens": 64,
            "drafter_sessions": 2,
            "chat_compress_new_tokens": 512,
            "select_semantic_weight": 0.0,
        }
        | over,
        env={},
    )


def _serve(tokenizer, loaded, *, scorer_wrap=None, **over):
    config = _config(**over)
    scorer = DrafterScorer(config, loaded)
    events: list[tuple[str, dict]] = []
    score = scorer if scorer_wrap is None else scorer_wrap(scorer)
    record = lambda name, value=1.0, **tags: events.append((name, tags))  # noqa: E731
    results = serve_turns(tokenizer, score, config, _turns(), "a1", record=record)
    served = [(r.served_ids, r.stats) for r in results]
    read_aheads = [tags["outcome"] for name, tags in events if name == "pflash_read_aheads"]
    return served, read_aheads


def test_the_question_after_verbatim_steps_scores_only_its_own_tokens(
    smollm2_tokenizer, tiny_llama_drafter
):
    ahead, outcomes = _serve(smollm2_tokenizer, tiny_llama_drafter)
    behind, none = _serve(smollm2_tokenizer, tiny_llama_drafter, chat_read_ahead=False)
    scratch, _ = _serve(smollm2_tokenizer, tiny_llama_drafter, drafter_sessions=0)
    modes = [stats["view"]["mode"] for _, stats in ahead]
    assert modes == ["fresh", "continue", "continue", "continue"]
    assert outcomes == ["done", "done"] and none == []
    # what is served is the same with read-ahead, without it, and from scratch
    for turn in range(4):
        assert ahead[turn][0] == behind[turn][0] == scratch[turn][0], f"turn {turn}"
    # the two tool outputs (~300 tokens) were scored in the background of their own steps:
    # the question resumes after them; without read-ahead it pays for them
    q_ahead, q_behind = ahead[3][1], behind[3][1]
    assert q_ahead["scorer_new_tokens"] < 60 < 250 < q_behind["scorer_new_tokens"]
    assert q_ahead["scorer_resume"] > q_behind["scorer_resume"]


def test_a_failed_read_ahead_changes_nothing_served_and_is_counted(
    smollm2_tokenizer, tiny_llama_drafter
):
    def failing(scorer):
        def score(request: ScoreRequest):
            if request.read_ahead:
                raise RuntimeError("drafter replica lost")
            return scorer(request)

        return score

    failed, outcomes = _serve(smollm2_tokenizer, tiny_llama_drafter, scorer_wrap=failing)
    plain, _ = _serve(smollm2_tokenizer, tiny_llama_drafter, chat_read_ahead=False)
    assert outcomes == ["failed", "failed"]
    assert [ids for ids, _ in failed] == [ids for ids, _ in plain]
    # the question scored the verbatim steps itself
    assert failed[3][1]["scorer_new_tokens"] == plain[3][1]["scorer_new_tokens"]


def _request(ids: tuple[int, ...], read_ahead: bool) -> ScoreRequest:
    query = Span(len(ids) - 20, len(ids))
    return ScoreRequest(
        ids=ids,
        windows=(QueryWindow(query, 1.0, "main"),),
        query=query,
        session_key="conv",
        read_ahead=read_ahead,
    )


def test_a_read_ahead_the_conversation_outran_is_skipped_and_leaves_the_session(
    smollm2_tokenizer, tiny_llama_drafter
):
    scorer = DrafterScorer(_config(), tiny_llama_drafter)
    rng = np.random.default_rng(3)
    later = tuple(int(i) for i in rng.integers(100, 5000, size=300))
    scorer(_request(later, read_ahead=False))  # the conversation's next turn came first
    stale = scorer(_request(later[:200], read_ahead=True))
    assert is_skipped_read_ahead(stale) and stale.mass is None
    assert scorer.sessions.get("conv").ids == later  # not rewound
    # a read-ahead that extends the session runs, resuming it
    longer = later + tuple(int(i) for i in rng.integers(100, 5000, size=40))
    ran = scorer(_request(longer, read_ahead=True))
    assert not is_skipped_read_ahead(ran)
    assert ran.scorer_resume > 0 and scorer.sessions.get("conv").ids == longer
