"""Reuse equals recompute: what a conversation's later turns reuse (the drafter session,
the passage embeddings, the lexical units) never changes what is served.

Two compressors serve the same agent conversation turn by turn, each with its own view
store and its own drafter: one keeps drafter sessions, the embedding memo and the units
memo, the other (`drafter_sessions: 0`, `reuse_memo=False`) computes every turn from
scratch. The drafter is a tiny random-weight
llama over SmolLM2's vocabulary (the reuse mechanics, not the weights, are under test), the
sentence embedder the real shipped one, the tokenizer SmolLM2's.
"""

from __future__ import annotations

from conftest import UNTUNED, license_text, serve_turns, tool_step

from pflash.config import build_config
from pflash.models.drafter.scorer import DrafterScorer

FACT = "The archive password for the blue vault is heliotrope-42."
PLANTED = "The build cache lives in /var/cache/orbit and is wiped every Tuesday."


def _with(fact: str, body: str) -> str:
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + fact + body[mid:]


def _turns() -> list[list[dict]]:
    """A task over a document, two tool outputs (one with a planted fact), then questions."""
    task = [
        {"role": "system", "content": "You are a coding agent. Answer briefly."},
        {
            "role": "user",
            "content": _with(FACT, license_text("GPL-3", 6000)) + "\n\nTidy the build.",
        },
    ]
    tool1 = [*task, *tool_step("read_file", _with(PLANTED, license_text("Apache-2.0", 5000)), 1)]
    tool2 = [*tool1, *tool_step("run_tests", license_text("MPL-2.0", 4000), 2)]
    question = [
        *tool2,
        {"role": "assistant", "content": "Tests ran."},
        {"role": "user", "content": "Where does the build cache live, and when is it cleared?"},
    ]
    again = [
        *question,
        {"role": "assistant", "content": "In /var/cache/orbit."},
        {"role": "user", "content": "What is the password of the blue vault?"},
    ]
    return [task, tool1, tool2, question, again]


def _serve(tokenizer, loaded, sessions: int) -> list[tuple]:
    config = build_config(
        UNTUNED
        | {
            "mode": "always",
            "keep_ratio": 0.2,
            "drafter_head_layer": 2,
            "drafter_chunk_tokens": 64,
            "drafter_sessions": sessions,
            "chat_compress_new_tokens": 256,
            "select_semantic_weight": 0.3,
            "semantic_embedder_dtype": "float32",
        },
        env={},
    )
    scorer = DrafterScorer(config, loaded)
    results = serve_turns(tokenizer, scorer, config, _turns(), "agent-1", reuse_memo=sessions > 0)
    return [(r.served_ids, r.served_text, r.stats) for r in results]


def test_a_conversation_served_with_reuse_equals_it_computed_from_scratch(
    smollm2_tokenizer, tiny_llama_drafter
):
    reused = _serve(smollm2_tokenizer, tiny_llama_drafter, sessions=2)
    scratch = _serve(smollm2_tokenizer, tiny_llama_drafter, sessions=0)
    modes = [stats["view"]["mode"] for *_, stats in reused]
    assert modes == ["fresh", "continue-compressed", "continue-compressed", "continue", "continue"]
    assert modes == [stats["view"]["mode"] for *_, stats in scratch]
    for turn, ((ids, text, _), (ids0, text0, _)) in enumerate(zip(reused, scratch, strict=True)):
        assert text == text0, f"turn {turn}"
        assert ids == ids0, f"turn {turn}"
    # and reuse did happen: the drafter resumed, the embeddings came from earlier turns
    later = [stats for *_, stats in reused[1:]]
    assert all(s["scorer_resume"] > 0 for s in later)
    assert all(s["scorer_new_tokens"] < s["scorer_resume"] for s in later[2:])
    assert all(s["semantic_reused"] > 0 for s in later)
    assert all(s["lexical_units_reused"] > 0 for s in later)
    assert all(
        s["scorer_resume"] == 0 and s["semantic_reused"] == 0 and s["lexical_units_reused"] == 0
        for *_, s in scratch
    )
    # the tool outputs were embedded as they arrived: the questions embed little else
    assert reused[3][2]["semantic_reused"] >= reused[3][2]["semantic_passages"] - 2
