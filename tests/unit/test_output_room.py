"""What a request may generate is decided once, and planning and the target read the same
number: a prompt fitted to the target's context leaves room for the answer the target is
then asked for (`max_output_tokens` when the client sends no `max_tokens`, or the cap when
it asks for more)."""

from __future__ import annotations

import asyncio

import numpy as np

from pflash.compress.scoring import ScoreResult
from pflash.config import build_config
from pflash.flow.compressor import Compressor
from pflash.flow.request import compression_request, render_request
from pflash.serving.admission import cap_output
from pflash.serving.chat_completion.serving import parse_chat_request

DOCUMENT = " ".join(f"Clause {i} says the licensee keeps the notice intact." for i in range(300))


def _uniform_scorer(request, conversation):
    future = asyncio.get_running_loop().create_future()
    n = len(request.ids)
    future.set_result(ScoreResult(mass=np.full(n, 1.0 / n, dtype=np.float32)))
    return future


def _serve(tokenizer, body, *, room: int, **overrides):
    """(served target tokens, the target's max_tokens, the context) for `body` on a target
    whose context is the prompt plus `room` tokens."""
    config = build_config(
        {"mode": "auto", "threshold": 10**6, "select_semantic_weight": 0.0, **overrides}, env={}
    )
    req = parse_chat_request(body)
    prompt = render_request(req, "chat", tokenizer)
    params = cap_output(req.sampling_params(), config.max_output_tokens)
    context = len(prompt.ids) + room
    flow = Compressor(
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=_uniform_scorer,
        max_context=context,
    )
    result = flow.run_sync(compression_request(req, prompt, config, "anonymous", params))
    return len(result.served_ids), params.max_tokens, context


def test_a_prompt_fitted_to_the_context_leaves_room_for_the_capped_output(smollm2_tokenizer):
    """No max_tokens: the target may generate max_output_tokens, so planning compresses the
    prompt until that fits (it used to plan for 0 and serve the prompt whole, leaving the
    answer one token of room)."""
    body = {"messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat must they keep?"}]}
    served, max_tokens, context = _serve(smollm2_tokenizer, body, room=200, max_output_tokens=1024)
    assert max_tokens == 1024
    assert served + max_tokens <= context


def test_a_request_asking_past_the_cap_is_planned_for_the_cap(smollm2_tokenizer):
    """Claude Code asks for 32,000 tokens of a model it does not know: the request is
    served (not a 400) with the cap, and the prompt planned for the cap, not for 32,000."""
    body = {
        "messages": [{"role": "user", "content": DOCUMENT + "\n\nWhat must they keep?"}],
        "max_tokens": 32000,
    }
    served, max_tokens, context = _serve(smollm2_tokenizer, body, room=200, max_output_tokens=1024)
    assert max_tokens == 1024
    assert served + max_tokens <= context
