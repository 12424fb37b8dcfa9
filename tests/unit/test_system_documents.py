"""Documents inside system messages are compressed; the instructions around them are not.
Pure passage detection first, then the real drafter through the same flow the ingress runs
(the served-prompt harness of test_served_prompts.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pflash.compress.render.passages import instruction_ranges, passages

NEEDLE = "The special magic heron number is: 5520417."
QUESTION = "What is the special magic heron number?"
ROOT = Path(__file__).resolve().parents[2]
RULES = "You are a support assistant. Answer only from the documents and cite them."
CLOSING = "Answer in one short sentence."


def _document(chars: int = 6000) -> str:
    body = Path("/usr/share/common-licenses/GPL-3").read_text()[:chars]
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + NEEDLE + body[mid:]


def _kept(content: str, min_chars: int = 1000) -> str:
    return "".join(content[b:e] for b, e in instruction_ranges(content, min_chars))


@pytest.mark.parametrize(
    "wrap",
    [
        lambda d: f"<documents>\n{d}\n</documents>",
        lambda d: f'<doc id="1" title="GPL">{d}</doc>',
        lambda d: f"```text\n{d}\n```",
        lambda d: f"Context:\n{d}",
        lambda d: f"## Retrieved documents\n\n{d}",
    ],
)
def test_delimited_documents_are_passages_and_the_instructions_stay(wrap):
    content = f"{RULES}\n\n{wrap(_document())}\n\n{CLOSING}"
    kept = _kept(content)
    assert RULES in kept and CLOSING in kept
    assert NEEDLE not in kept and len(kept) < 300


def test_short_blocks_and_long_personas_stay_instructions():
    example = "<example>Q: hi\nA: hello</example>"
    persona = " ".join(["You are patient, precise and kind to every customer."] * 30)  # 1.6K
    assert passages(f"{RULES}\n{example}", 1000) == []
    assert passages(persona, 1000) == []  # one paragraph under twice the passage length
    assert passages(persona * 2, 1000) != []  # a 3K-character paragraph is a document


def test_many_documents_leave_at_most_eight_instruction_pieces():
    docs = "\n".join(f"Note {i}.\n<doc>{_document(1500)}</doc>" for i in range(20))
    pieces = instruction_ranges(f"{RULES}\n{docs}\n{CLOSING}", 1000)
    assert len(pieces) <= 8


# ------------------------------------------------------------------ through the flow


@pytest.fixture(scope="module")
def app(smollm2_tokenizer):
    from test_served_prompts import App

    from pflash.cli.compress import load_drafter

    return App("default", load_drafter("embedded:smollm2-135m"), smollm2_tokenizer)


def _chat(extra=(), rules: str = RULES):
    system = f"{rules}\n\n<documents>\n{_document()}\n</documents>\n\n{CLOSING}"
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": QUESTION},
        *extra,
    ]


@pytest.mark.model
def test_a_system_prompt_document_is_compressed_and_its_instructions_served_verbatim(app):
    served = app.serve("chat", {"messages": _chat(), "pflash_mode": "always"})
    assert served["stats"]["served_ratio"] <= 0.25
    assert RULES in served["prompt"] and CLOSING in served["prompt"]
    assert QUESTION in served["prompt"]


@pytest.mark.model
def test_system_documents_keep_pins_the_whole_system_prompt(app):
    import yaml

    from pflash.config import build_config

    args = yaml.safe_load((ROOT / "serve_config.yaml").read_text())["applications"][0]["args"]
    before = app.config
    app.config = build_config(
        {**args, "return_prompt_enabled": True, "system_documents": "keep"}, env={}
    )
    try:
        # other rules: the app's view of the first test's chat would serve that turn again
        served = app.serve("chat", {"messages": _chat(rules="Be exact."), "pflash_mode": "always"})
    finally:
        app.config = before
    assert NEEDLE in served["prompt"] and served["stats"]["served_ratio"] > 0.9


@pytest.mark.model
def test_the_next_turn_extends_the_view_of_a_compressed_system_prompt(app):
    first = app.serve("chat", {"messages": _chat(), "pflash_mode": "always", "session_id": "s1"})
    follow = _chat(
        [
            {"role": "assistant", "content": "The number is 5520417."},
            {"role": "user", "content": "Thanks. And who may copy the license?"},
        ]
    )
    second = app.serve("chat", {"messages": follow, "pflash_mode": "always", "session_id": "s1"})
    view = second["stats"]["view"]
    assert view["mode"] in ("continue", "continue-compressed") and view["turn"] == 2, second[
        "stats"
    ]
    assert second["prompt"].startswith(first["prompt"].rsplit("<|im_start|>assistant", 1)[0])
    assert view["reused_tokens"] > 0
