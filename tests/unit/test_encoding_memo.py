"""A conversation's earlier pieces are not encoded again, and nothing encoded changes."""

from __future__ import annotations

import pytest
from conftest import stdlib_texts
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pflash.compress.render.rendered import render_chat_prompt
from pflash.compress.text.encoding import _vocab, encode_with_offsets, find_controls
from pflash.compress.text.encoding_memo import EncodingMemo, piecewise

DOC = stdlib_texts(3)[2][:6000]


def _chat(turns: int) -> list[dict]:
    messages = [
        {"role": "system", "content": "You answer from the files."},
        {"role": "user", "content": DOC + "\n\nWhat does this module do?"},
    ]
    for i in range(turns):
        messages += [
            {"role": "assistant", "content": f"Answer {i}: it parses things.  "},
            {
                "role": "user",
                "content": f"Here is more:\n{DOC[i * 700 : i * 700 + 900]}\nAnd step {i}?",
            },
        ]
    return messages


def _same(a, b) -> None:
    assert a.ids == b.ids
    assert a.encoding.offsets == b.encoding.offsets
    assert a.encoding.controls == b.encoding.controls
    assert a.snapshot_cut == b.snapshot_cut


def test_each_turn_of_a_conversation_encodes_as_without_the_memo_and_reuses_its_pieces(
    smollm2_tokenizer,
):
    memo = EncodingMemo()
    hits = []
    for turns in range(4):
        messages = _chat(turns)
        _same(
            render_chat_prompt(smollm2_tokenizer, messages, memo=memo, scope="tenant-a"),
            render_chat_prompt(smollm2_tokenizer, messages),
        )
        hits.append(memo.hits)
    # the document's piece, then each earlier turn's long piece, come from the memo
    assert hits[0] == 0 and hits[1] >= 1 and hits[3] > hits[2] > hits[1]


def test_a_tenant_never_reads_pieces_another_tenant_encoded(smollm2_tokenizer):
    memo = EncodingMemo()
    messages = _chat(1)
    render_chat_prompt(smollm2_tokenizer, messages, memo=memo, scope="tenant-a")
    before = memo.hits
    _same(
        render_chat_prompt(smollm2_tokenizer, messages, memo=memo, scope="tenant-b"),
        render_chat_prompt(smollm2_tokenizer, messages),
    )
    assert memo.hits == before
    render_chat_prompt(smollm2_tokenizer, messages, memo=memo, scope="tenant-a")
    assert memo.hits > before


def test_the_memo_holds_at_most_its_characters_least_recently_used_out(smollm2_tokenizer):
    memo = EncodingMemo(max_chars=2000, min_chars=300)
    vocab = _vocab(smollm2_tokenizer)
    for i in range(6):
        text = f"<|im_start|>user\n{DOC[i * 900 : i * 900 + 900]}<|im_end|>\n"
        memo.encode(
            smollm2_tokenizer, text, find_controls(smollm2_tokenizer, text), vocab.tokens, "s"
        )
    assert len(memo) == 2 and memo._chars <= 2000


piece = st.lists(
    st.sampled_from(list("ab c\n\t.é数😀") + ["  ", "\n\n", "def f(x):", "<|im_end|>"]),
    max_size=40,
).map("".join)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(piece, min_size=1, max_size=5))
def test_text_between_control_tokens_encodes_the_same_through_the_memo(smollm2_tokenizer, parts):
    text = "<|im_start|>".join(parts)
    controls = find_controls(smollm2_tokenizer, text)
    memo = EncodingMemo(min_chars=1)
    for _ in range(2):  # a miss, then every piece from the memo
        got = encode_with_offsets(smollm2_tokenizer, text, controls, memo=memo, scope="s")
        want = encode_with_offsets(smollm2_tokenizer, text, controls)
        assert (got.ids, got.offsets) == (want.ids, want.offsets)


def test_a_tokenizer_whose_control_tokens_strip_spaces_is_always_encoded_whole(bpe_tokenizer):
    import copy

    from transformers import AddedToken

    stripping = copy.deepcopy(bpe_tokenizer)
    stripping.add_special_tokens(
        {"additional_special_tokens": [AddedToken("<|tool|>", lstrip=True, rstrip=True)]}
    )
    assert piecewise(bpe_tokenizer, _vocab(bpe_tokenizer).tokens)
    assert not piecewise(stripping, _vocab(stripping).tokens)
    text = "call  <|tool|>  run it <|im_end|>" + DOC[:400]
    controls = find_controls(stripping, text)
    memo = EncodingMemo(min_chars=1)
    got = encode_with_offsets(stripping, text, controls, memo=memo, scope="s")
    want = encode_with_offsets(stripping, text, controls)
    assert (got.ids, got.offsets) == (want.ids, want.offsets) and len(memo) == 0


@pytest.mark.parametrize("scope", ["", "tenant-a"])
def test_a_prompt_without_control_tokens_does_not_use_the_memo(smollm2_tokenizer, scope):
    memo = EncodingMemo(min_chars=1)
    text = DOC[:1000]
    got = encode_with_offsets(smollm2_tokenizer, text, (), memo=memo, scope=scope)
    assert got.ids == encode_with_offsets(smollm2_tokenizer, text, ()).ids and len(memo) == 0
