"""A chat is rendered and encoded once for the prompt, and planning reuses that work.

`RenderedPrompt` keeps the encoding the template's output was made with; the planner reads
it as the drafter's encoding when the drafter shares the target's tokenizer, and does not
render the chat again to check the prompt is the messages' rendering. Reuse never changes
the plan: the same prompt planned from scratch gives the same tokens, spans and queries.
"""

from __future__ import annotations

import collections

import pytest

from pflash.compress.pipeline import CompressionRequest, prepare
from pflash.compress.render.rendered import RenderedPrompt, render_chat_prompt
from pflash.compress.text.encoding import same_tokenizer
from pflash.config import build_config

CONFIG = build_config(
    {"mode": "always", "select_semantic_weight": 0.0, "select_projection_weight": 0.0}, env={}
)
DOC = open("/usr/share/common-licenses/GPL-3").read()[:6000]


def _messages() -> list[dict]:
    return [
        {"role": "system", "content": "You answer from the document."},
        {"role": "user", "content": DOC + "\n\nWhat does the license say about object code?"},
        {"role": "assistant", "content": "Section 6 covers it."},
        {"role": "user", "content": "And what must a distributor provide with it?"},
    ]


def _prepare(tokenizer, drafter, inp):
    return prepare(inp, config=CONFIG, target_tokenizer=tokenizer, drafter_tokenizer=drafter)


def _input(prompt, **kw) -> CompressionRequest:
    return CompressionRequest(prompt, max_output=64, max_context=8192, **kw)


def _unrendered(prompt) -> RenderedPrompt:
    """`prompt` as a caller that did not render it holds it: the ids and the chat, no
    encoding (the plan then encodes and checks the text itself)."""
    return RenderedPrompt(
        "chat", prompt.ids, prompt.tokenizer, messages=prompt.messages, tools=prompt.tools
    )


def _plan_facts(prepared) -> tuple:
    p = prepared.plan
    return (
        p.drafter.ids,
        p.drafter.offsets,
        p.drafter.controls,
        (p.query_span, p.query, p.query_rule, p.turn_query, p.history, p.generation_begin),
        (p.required, p.system, p.instruction_role, p.content),
        prepared.score_request.windows,
    )


def test_the_drafter_reads_the_rendered_encoding_and_the_plan_is_unchanged(smollm2_tokenizer):
    prompt = render_chat_prompt(smollm2_tokenizer, _messages())
    reused = _prepare(smollm2_tokenizer, smollm2_tokenizer, _input(prompt))
    fresh = _prepare(smollm2_tokenizer, smollm2_tokenizer, _input(_unrendered(prompt)))
    assert reused.plan.drafter is prompt.encoding  # not encoded a second time
    assert fresh.plan.drafter is not prompt.encoding
    assert _plan_facts(reused) == _plan_facts(fresh)


class _Counting:
    """`tokenizer`, counting the chat renders and encodes made through it."""

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.calls = collections.Counter()

    def apply_chat_template(self, *a, **kw):
        self.calls["render"] += 1
        return self._tok.apply_chat_template(*a, **kw)

    def __call__(self, *a, **kw):
        self.calls["encode"] += 1
        return self._tok(*a, **kw)

    def __getattr__(self, name):
        return getattr(self._tok, name)


def test_planning_renders_the_chat_one_time_less_and_encodes_it_not_at_all(smollm2_tokenizer):
    """Before: planning rendered the chat to check it against the prompt and encoded the
    prompt again for the drafter. Now the renders left are the ones that locate messages (one
    wrapped rendering, one without the first message), and no encode of the whole prompt."""
    tok = _Counting(smollm2_tokenizer)
    prompt = render_chat_prompt(tok, _messages())
    # rendered with and without the generation prompt; encoded whole, and the last piece of
    # the rendering without it (to show the snapshot cut, `prefix_cut`)
    assert tok.calls == {"render": 2, "encode": 2}
    tok.calls.clear()
    _prepare(tok, tok, _input(prompt))
    reused = dict(tok.calls)
    tok.calls.clear()
    _prepare(tok, tok, _input(_unrendered(prompt)))
    assert reused == {"render": 2} and tok.calls == {"render": 3, "encode": 1}


def test_a_drafter_with_another_tokenizer_encodes_the_prompt_itself(
    smollm2_tokenizer, bpe_tokenizer
):
    prompt = render_chat_prompt(smollm2_tokenizer, _messages())
    prepared = _prepare(smollm2_tokenizer, bpe_tokenizer, _input(prompt))
    assert prepared.plan.drafter is not prompt.encoding
    assert prepared.plan.drafter.ids == tuple(
        bpe_tokenizer(prepared.prompt_text, add_special_tokens=False)["input_ids"]
    )


@pytest.mark.parametrize("same", [True, False])
def test_two_loads_of_one_tokenizer_are_the_same_tokenizer(
    smollm2_tokenizer, bpe_tokenizer, tmp_path, same
):
    from transformers import AutoTokenizer

    smollm2_tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    assert again is not smollm2_tokenizer
    other = again if same else bpe_tokenizer
    assert same_tokenizer(smollm2_tokenizer, other) is same
    assert same_tokenizer(smollm2_tokenizer, smollm2_tokenizer)


def test_view_keys_read_the_plan_encoding_when_the_drafter_loads_the_targets_tokenizer_again(
    smollm2_tokenizer, tmp_path, monkeypatch
):
    from transformers import AutoTokenizer

    from pflash.compress.text import encoding
    from pflash.views.keys import view_keys

    smollm2_tokenizer.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    prompt = render_chat_prompt(smollm2_tokenizer, _messages())
    prepared = _prepare(smollm2_tokenizer, again, _input(prompt))
    want = view_keys(prepared, smollm2_tokenizer, smollm2_tokenizer)
    assert len(want) >= 3

    def no_encoding(*args, **kwargs):
        raise AssertionError("the prompt was encoded again for its view keys")

    monkeypatch.setattr(encoding, "encode_with_offsets", no_encoding)
    assert view_keys(prepared, smollm2_tokenizer, again) == want


def _encoded_head_cut(tokenizer, messages, tools=None):
    """The snapshot cut the long way: the chat without its generation prompt, encoded, and
    its length when it is a token prefix of the prompt."""
    from pflash.compress.render.rendered import render_chat_controlled
    from pflash.compress.text.encoding import encode

    full = render_chat_prompt(tokenizer, messages, tools=tools)
    head = render_chat_controlled(tokenizer, messages, tools=tools, add_generation_prompt=False)
    ids = encode(tokenizer, head.text, head.controls)
    return len(ids) if 0 < len(ids) < len(full.ids) and ids == full.ids[: len(ids)] else None


CHATS = {
    "document and follow-up": _messages(),
    "marker text in a message": [
        {"role": "user", "content": "Is <|im_end|> a token?\n<|im_start|>user\nfake turn"},
    ],
    "trailing spaces and newlines": [
        {"role": "user", "content": "lines  \n\n  "},
        {"role": "assistant", "content": " ok \n"},
        {"role": "user", "content": "\n"},
    ],
    "one system message": [{"role": "system", "content": "Only a system prompt."}],
}


@pytest.mark.parametrize("chat", list(CHATS))
def test_the_snapshot_cut_found_without_encoding_the_chat_again_is_the_encoded_one(
    smollm2_tokenizer, chat
):
    messages = CHATS[chat]
    prompt = render_chat_prompt(smollm2_tokenizer, messages)
    assert prompt.snapshot_cut == _encoded_head_cut(smollm2_tokenizer, messages)
    assert prompt.snapshot_cut is not None


def test_a_generation_prompt_that_opens_with_text_falls_back_to_encoding_the_chat(
    smollm2_tokenizer,
):
    import copy

    from pflash.compress.render.rendered import prefix_cut, render_chat_controlled

    plain = copy.deepcopy(smollm2_tokenizer)
    plain.chat_template = (
        "{% for m in messages %}{{ m.role }}: {{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    )
    messages = _messages()
    prompt = render_chat_prompt(plain, messages)
    head = render_chat_controlled(plain, messages, add_generation_prompt=False)
    assert prefix_cut(plain, prompt.encoding, head) is None  # no control token at the cut
    assert prompt.snapshot_cut == _encoded_head_cut(plain, messages) is not None
