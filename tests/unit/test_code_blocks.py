"""Code blocks read whole (pflash/compress/evidence/code_blocks.py, and its use in passage evidence).

The pure steps on real drafter text (which passages make a function, the text the embedder
reads for it, how its passages are lifted), then the product flow with a deterministic
scorer standing in for the embedder: what is asked of the drafter, that the function the
block score points at is served whole, and that a reply or request out of step fails closed.
"""

from __future__ import annotations

import colorsys
import inspect
from types import SimpleNamespace

import numpy as np
import pytest

from pflash.compress.evidence.code_blocks import (
    BLOCK_MAX_CHARS,
    WHOLE_LIFT,
    CodeBlock,
    block_texts,
    lift_blocks,
    passage_blocks,
)
from pflash.compress.evidence.passage_evidence import evidence_passages, passage_signals
from pflash.compress.render.chat import render_chat
from pflash.compress.render.rendered import RenderedPrompt
from pflash.compress.scoring import ScoreResult
from pflash.compress.text.code_headers import code_lines
from pflash.compress.text.encoding import encode_as_written_with_offsets
from pflash.config import build_config
from pflash.errors import CompressionFailed
from pflash.flow.in_process import compress_in_process
from pflash.spans import Span

SIGNATURE = (
    "def create_cache(\n"
    "    size: int,\n"
    ") -> dict:\n"
    '    """Return the cache class for the given size."""\n'
    "    if size == 0:\n"
    "        return None\n"
    "    return {}\n"
    "\n"
    "x = 1\n"
)


def _header_of_each_line(text: str) -> dict[str, int]:
    """Each non-blank line (stripped) and the header char `code_lines` gives it."""
    starts, headers = code_lines(text, 0, len(text))
    return {text[b:].split("\n", 1)[0].strip(): h for b, h in zip(starts, headers, strict=True)}


def test_a_signature_over_several_lines_belongs_to_its_definition():
    line = _header_of_each_line(SIGNATURE)
    assert line["def create_cache("] == -1
    assert line["size: int,"] == 0
    assert line[") -> dict:"] == 0  # at the def's indentation, inside its brackets
    assert line['"""Return the cache class for the given size."""'] == 0
    assert line["return None"] == 0 and line["return {}"] == 0
    assert line["x = 1"] == -1  # the block ends where the indentation does


def test_a_brace_after_a_signature_over_several_lines_does_not_hold_it_open():
    text = "function pad(text,\n    width) {\n  return text;\n}\nconst x = 1;\n"
    line = _header_of_each_line(text)
    assert line["width) {"] == 0 and line["return text;"] == 0
    assert line["const x = 1;"] == -1


def test_an_unclosed_bracket_holds_a_signature_open_for_a_bounded_number_of_lines():
    text = "def broken(\n" + "".join(f"    arg{i},\n" for i in range(100)) + "y = 2\n"
    line = _header_of_each_line(text)
    assert line["arg0,"] == 0
    assert line["y = 2"] == -1  # read as code again after `SIGNATURE_LINES`


CODE = "\n\n".join(
    inspect.getsource(f)
    for f in (colorsys.rgb_to_yiq, colorsys.yiq_to_rgb, colorsys.hls_to_rgb, colorsys.rgb_to_hsv)
)


def _passages(tokenizer, text: str, pinned=()):
    drafter = encode_as_written_with_offsets(tokenizer, text)
    return drafter, evidence_passages(drafter, len(drafter), list(pinned), max_tokens=12)


def test_a_functions_passages_make_one_block_with_its_def_line(smollm2_tokenizer):
    drafter, passages = _passages(smollm2_tokenizer, CODE)
    blocks = passage_blocks(drafter, passages)
    assert [drafter.text[b.header :].split("(", 1)[0] for b in blocks] == [
        "def rgb_to_yiq",
        "def yiq_to_rgb",
        "def hls_to_rgb",
        "def rgb_to_hsv",
    ]
    for block, text in zip(blocks, block_texts(drafter, blocks), strict=True):
        head = block.passages[0]
        b, e = drafter.char_span(passages[head])
        assert b <= block.header < e  # the passage holding the def line comes first
        assert list(block.passages) == sorted(block.passages)
        end = drafter.char_span(passages[block.passages[-1]])[1]
        assert text == drafter.text[block.header : end][:BLOCK_MAX_CHARS]
        assert all(block.header < drafter.char_span(passages[i])[1] for i in block.passages)
    hls = blocks[2]
    source = inspect.getsource(colorsys.hls_to_rgb).strip()
    assert block_texts(drafter, [hls])[0].strip() == source  # the whole function, nothing else


def test_a_pinned_def_line_opens_no_block(smollm2_tokenizer):
    drafter = encode_as_written_with_offsets(smollm2_tokenizer, CODE)
    at = CODE.index("def hls_to_rgb")
    pin = [i for i, (b, e) in enumerate(drafter.offsets) if b < at + 20 and e > at]
    _, passages = _passages(smollm2_tokenizer, CODE, [Span(pin[0], pin[-1] + 1)])
    blocks = passage_blocks(drafter, passages)
    assert "def hls_to_rgb" not in [drafter.text[b.header :][:14] for b in blocks]
    assert len(blocks) == 3


def test_the_text_read_for_a_long_function_is_bounded(smollm2_tokenizer):
    body = "".join(f"    value_{i} = compute(value_{i - 1})\n" for i in range(1, 400))
    text = "def long_one(value_0):\n" + body + "    return value_399\n"
    drafter, passages = _passages(smollm2_tokenizer, text)
    (block,) = passage_blocks(drafter, passages)
    (read,) = block_texts(drafter, [block])
    assert len(read) == BLOCK_MAX_CHARS and read.startswith("def long_one(value_0):")
    assert len(block.passages) == len(passages)


def test_prose_has_no_blocks(smollm2_tokenizer):
    text = "A plain paragraph about ferries.\nAnother line: the harbour opens at six.\n" * 20
    drafter, passages = _passages(smollm2_tokenizer, text)
    assert passage_blocks(drafter, passages) == ()


def test_a_small_block_rises_whole_in_its_own_order_and_a_large_one_to_its_score():
    small = CodeBlock(0, Span(0, 30), (0, 1, 2))
    large = CodeBlock(50, Span(30, 300), (3, 4, 5))
    values = np.array([0.0, 1.0, 0.2, 0.0, 0.9, 0.1, 0.5])
    out = lift_blocks(values, [small, large], np.array([0.3, 0.4]), whole_tokens=100)
    assert out[1] == 1.0  # its best passage stays where it was
    assert out[0] == pytest.approx(WHOLE_LIFT) and out[2] == pytest.approx(WHOLE_LIFT + 0.04)
    assert out[2] > out[0]  # its own order inside
    assert out[3:6].tolist() == pytest.approx([0.4, 0.9, 0.4])  # the block's score, no more
    assert out[6] == 0.5  # outside any block: unchanged
    assert lift_blocks(values, [small], np.array([0.0]), whole_tokens=0)[0] == 0.0


# ------------------------------------------------------------------------- product flow

PROSE = open("/usr/share/common-licenses/GPL-3").read()[:9000]
QUESTION = "Which routine turns hue, lightness and saturation into red, green and blue?"
CFG = dict(
    mode="always",
    keep_ratio=0.2,
    select_chunk_size=64,
    select_lexical="off",
    select_semantic_weight=1.0,
)


def _block_scorer(answer: str, break_reply: str | None = None):
    """Attention spread evenly; the embedder's cosine 0.9 for the block text that is
    `answer`'s whole function, 0.5 for the passage holding its docstring's first words,
    0.1 for every other text. `break_reply`: "passages_only" drops the blocks' columns."""

    def scorer(req):
        mass = np.full(len(req.ids), 1.0, dtype=np.float32)
        mass[req.query.begin :] = 0.0
        n = len(req.semantic_passages)
        sims = [
            0.9 if k >= n and t.startswith(answer) else 0.5 if "Convert" in t else 0.1
            for k, t in enumerate(req.semantic_texts)
        ]
        sims = np.array([sims] * len(req.semantic_questions), dtype=np.float32)
        if break_reply == "passages_only":
            sims = sims[:, :n]
        return ScoreResult(mass=mass / mass.sum(), semantic=sims)

    return scorer


def _compress(tokenizer, cfg, scorer):
    code = "\n\n".join(inspect.getsource(f) for f in _colorsys_functions())
    messages = [{"role": "user", "content": PROSE + "\n\n" + code + "\n\n" + QUESTION}]
    ids = tokenizer(render_chat(tokenizer, messages), add_special_tokens=False)["input_ids"]
    asked = []

    def score(req):
        asked.append(req)
        return scorer(req)

    out = compress_in_process(
        RenderedPrompt("chat", tuple(ids), tokenizer, messages=messages),
        cfg,
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=score,
        max_context=8192,
        max_output=64,
    )
    return out, asked[0]


def _colorsys_functions():
    names = ("rgb_to_yiq", "yiq_to_rgb", "rgb_to_hls", "hls_to_rgb", "rgb_to_hsv", "hsv_to_rgb")
    return [getattr(colorsys, n) for n in names]


def test_the_function_the_block_score_points_at_is_served_whole(smollm2_tokenizer):
    cfg = build_config(CFG, env={})
    out, req = _compress(smollm2_tokenizer, cfg, _block_scorer("def hls_to_rgb"))
    assert len(req.evidence_blocks) == 6  # one per function, its text after the passages'
    assert len(req.semantic_texts) == len(req.semantic_passages) + 6
    assert req.semantic_texts[-3].startswith("def hls_to_rgb")
    assert inspect.getsource(colorsys.hls_to_rgb).strip() in out.served_text


def test_without_its_block_score_the_function_is_not_served_whole(smollm2_tokenizer):
    cfg = build_config(CFG, env={})
    out, _ = _compress(smollm2_tokenizer, cfg, _block_scorer("no block matches"))
    assert inspect.getsource(colorsys.hls_to_rgb).strip() not in out.served_text


def test_a_reply_without_the_blocks_scores_fails_closed(smollm2_tokenizer):
    cfg = build_config(CFG, env={})
    scorer = _block_scorer("def hls_to_rgb", break_reply="passages_only")
    with pytest.raises(CompressionFailed, match="semantic scores of shape") as err:
        _compress(smollm2_tokenizer, cfg, scorer)
    assert err.value.stage == "drafter"


def test_blocks_out_of_step_with_the_passages_fail_closed(smollm2_tokenizer):
    drafter, passages = _passages(smollm2_tokenizer, CODE)
    blocks = passage_blocks(drafter, passages)
    cfg = build_config(CFG, env={})
    req = SimpleNamespace(
        semantic_passages=passages,
        semantic_texts=("x",) * (len(passages) + len(blocks)),
        semantic_questions=(QUESTION,),
        projection_passages=(),
        evidence_blocks=tuple(b.span for b in blocks[:-1]),
    )
    scores = SimpleNamespace(semantic=np.zeros((1, len(passages) + len(blocks))), projection=None)
    with pytest.raises(CompressionFailed, match="code blocks") as err:
        passage_signals(req, scores, cfg, drafter)
    assert err.value.stage == "selection"
