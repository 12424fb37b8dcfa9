"""`pflash plan FILE` on real rendered chats (pflash/cli/plan.py through pflash.cli.main)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pflash.cli import main
from pflash.compress.plan.query import plan_prompt
from pflash.compress.render.chat import render_chat
from pflash.config import build_config

TEMPLATES = Path(__file__).resolve().parents[1] / "fixtures" / "templates"
SYSTEM = "You are a careful analyst."
DOCUMENT = "\n".join(
    f"District {i} reported {100 + 37 * i % 900} units in March." for i in range(1, 30)
)
QUESTION = "Which district reported the most units?"
REQUEST = {
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"},
    ],
    "pflash_required": ["District 7 reported"],
}


def write(tmp_path: Path, payload, name="chat.json") -> str:
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload), encoding="utf-8")
    return str(path)


def expected_plan(tokenizer, request, **overrides):
    text = render_chat(
        tokenizer, request["messages"], chat_template=request.get("chat_template"), **overrides
    )
    return plan_prompt(
        prompt_text=text,
        drafter_tokenizer=tokenizer,
        target_tokenizer=tokenizer,
        config=build_config(env={}),
        messages=request["messages"],
        pflash_query=request.get("pflash_query"),
        pflash_required=request.get("pflash_required", ()),
        chat_template=request.get("chat_template"),
        chat_template_kwargs=overrides.get("template_kwargs"),
    )


def text_of(plan, span) -> str:
    b, e = plan.drafter.char_span(span)
    return plan.drafter.text[b:e]


def test_plan_prints_turns_windows_and_pins_of_a_rendered_chat(tmp_path, capsys, smollm2_tokenizer):
    assert main(["plan", write(tmp_path, REQUEST)]) == 0
    out = capsys.readouterr().out
    plan = expected_plan(smollm2_tokenizer, REQUEST)
    n = plan.n_tokens
    assert out.startswith(f"prompt: {n} drafter tokens (messages;")
    assert (
        f"chat markers: qwen (special tokens); generation prompt at {plan.generation_begin}\n"
        in out
    )
    for k, turn in enumerate(plan.layout.turns):
        assert (
            f"  #{k:<3} {turn.role:<10} [{turn.role_begin}, {turn.turn_end})  content [{turn.content_begin}, {turn.content_end})"
            in out
        )
    assert '        "You are a careful analyst."\n' in out
    assert (
        f'"District 1 reported {100 + 37 % 900} units' in out and " … " in out
    )  # long content previewed
    assert "query rule: prompt_end (parser arbitrary_tail)\n" in out
    assert f'  main     weight 1.000  [{n - 1}, {n})  "\\n"\n' in out
    turn = plan.turn_query
    assert (
        f"  turn     weight 1.000  [{turn.begin}, {turn.end})  {json.dumps(text_of(plan, turn))}\n"
        in out
    )
    for span in plan.system:
        assert (
            f"  system            [{span.begin}, {span.end})" in out and json.dumps(SYSTEM) in out
        )
    for span in plan.required:
        assert (
            f"  required          [{span.begin}, {span.end}) {len(span):>5} tok  {json.dumps(text_of(plan, span))}"
            in out
        )
    assert f"pinned spans ({sum(len(s) for s in plan.pinned())} of {n} tokens):" in out


def test_plan_json_is_one_object_matching_the_planner(tmp_path, capsys, smollm2_tokenizer):
    assert main(["plan", write(tmp_path, REQUEST), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    plan = expected_plan(smollm2_tokenizer, REQUEST)
    assert report["drafter_tokens"] == plan.n_tokens and report["family"] == "qwen"
    assert (
        report["query_rule"] == "prompt_end" and report["query_span"] == plan.query_span.as_list()
    )
    assert [(w["kind"], w["weight"], w["span"]) for w in report["windows"]] == [
        (w.kind, w.weight, w.span.as_list()) for w in plan.windows()
    ]
    for name in ("required", "system", "instruction_role"):
        assert [p["span"] for p in report["pinned"][name]] == [
            s.as_list() for s in getattr(plan, name)
        ]
        assert [p["text"] for p in report["pinned"][name]] == [
            text_of(plan, s) for s in getattr(plan, name)
        ]
    assert [t["role"] for t in report["turns"]] == ["system", "user", "assistant"]
    assert report["turns"][1]["query_turn"] and report["turns"][2]["generation_prompt"]


def test_plan_flags_override_the_file_and_foreign_templates_render(
    tmp_path, capsys, smollm2_tokenizer
):
    request = {
        **REQUEST,
        "chat_template": (TEMPLATES / "laguna.jinja").read_text(),
        "chat_template_kwargs": {"enable_thinking": True},
    }
    path = write(tmp_path, request)
    assert (
        main(["plan", path, "--json", "--query", QUESTION, "--required", "District 3 reported"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert report["family"] == "laguna" and report["special_markers"] is False
    assert report["query_rule"] == "explicit_query_span"
    assert QUESTION in report["query_span_text"]
    required_texts = [p["text"] for p in report["pinned"]["required"]]
    assert any("District 3 reported" in t for t in required_texts)
    assert not any(
        "District 7 reported" in t for t in required_texts
    )  # --required replaced the file's list
    assert (
        report["turns"][-1]["content_preview"] == "<think>"
    )  # thinking switch reached the template


def test_plan_of_plain_text_uses_the_prompt_tail(tmp_path, capsys):
    assert main(["plan", write(tmp_path, f"{DOCUMENT}\n{QUESTION}", "prompt.txt"), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    n = report["drafter_tokens"]
    assert report["input_kind"] == "raw_text" and report["family"] is None
    assert report["query_rule"] == "prompt_tail" and report["query_span"] == [n - 8, n]
    assert report["windows"][0]["text"].endswith("most units?")


@pytest.mark.parametrize(
    ("payload", "args", "message"),
    [
        (REQUEST, ["--query", "Which river floods?"], "query_mapping"),
        ({"model": "x"}, [], "must be an object with"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, [], "robot"),
    ],
)
def test_plan_errors_exit_nonzero_with_the_reason(tmp_path, capsys, payload, args, message):
    assert main(["plan", write(tmp_path, payload), *args]) == 1
    captured = capsys.readouterr()
    assert captured.out == "" and message in captured.err
