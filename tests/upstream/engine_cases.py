"""What every real-engine test module asks of PFlash in front of that engine (vLLM by URL,
Ray Serve LLM by handle): the documents, the questions and the checks, so both engines are
held to exactly the same answers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from pflash_lab.bench.multiturn import QUESTIONS, document

NEEDLE = "The special magic quokka number is: 7318842."
QUESTION = "What is the special magic quokka number?"


def needle_document(chars: int = 10000) -> str:
    body = Path("/usr/share/common-licenses/GPL-3").read_text()[:chars]
    mid = body.index("\n\n", len(body) // 2)
    return body[:mid] + "\n\n" + NEEDLE + body[mid:]


def pflash_stats(r) -> dict:
    return r.usage.model_extra["timings"]["pflash"]


def envelope(r: httpx.Response, status: int) -> dict:
    """The OpenAI error body of `r`, asserting its status and shape."""
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    return err


# The three-turn view test pins view mechanics against a real engine (continue, the served
# prefix extended, the engine's prefix cache hit) with the attention-only selection: with
# semantic evidence (the default since it was measured) the third turn's fresh selection differs from
# the view by more than a third and rebuilds (measured; a finding for the recall policy, §6.2).
VIEW_ARGS = {"select_semantic_weight": 0.0}


def three_turns(http: httpx.Client) -> list[dict]:
    """Three turns over one document (~3.7K tokens, facts at 20/40/60/80%), each later turn
    asking a fact the earlier served prompts may have dropped (pflash_lab.bench.multiturn's)."""
    doc = document(16000, "Document A")  # fixed: the same turns every run (a fresh cluster)
    messages = [{"role": "user", "content": doc + "\n\n" + QUESTIONS[0][0]}]
    turns = []
    for t, (question, _) in enumerate(QUESTIONS[:3]):
        if t:
            messages = messages + [{"role": "user", "content": question}]
        r = http.post(
            "/v1/chat/completions",
            json={
                "messages": messages,
                "max_tokens": 16,
                "temperature": 0,
                "pflash_mode": "always",
                "pflash_return_prompt": True,
            },
        )
        assert r.status_code == 200, f"turn {t + 1}: {r.text}"
        body = r.json()
        turns.append(body)
        messages = messages + [
            {"role": "assistant", "content": body["choices"][0]["message"]["content"]}
        ]
    return turns


def assert_later_turns_extend_the_cached_prefix(turns: list[dict]) -> str:
    """Turns 2 and 3 came from the view, their served prompt extends the previous one, and
    the engine's prefix cache (128-token blocks) held the previous turn's served prompt.
    Returns the per-turn line the tests print."""
    views = [b["usage"]["timings"]["pflash"]["view"] for b in turns]
    cached = [b["usage"]["prompt_tokens_details"]["cached_tokens"] for b in turns]
    assert views[0]["mode"] == "fresh"
    for t in (1, 2):
        assert views[t]["mode"] in ("continue", "continue-compressed"), views[t]
        assert views[t]["turn"] == t + 1
        prev, cur = turns[t - 1]["pflash_prompt"], turns[t]["pflash_prompt"]
        assert cur.startswith(prev[: len(prev) - len("<|im_start|>assistant\n")])
        assert cached[t] >= 128
        assert cached[t] >= (views[t - 1]["served_tokens"] // 128 - 1) * 128
    return (
        f"per-turn view modes {[v['mode'] for v in views]}, "
        f"served {[v['served_tokens'] for v in views]}, cached_tokens {cached}"
    )


def compressed_needle_chat(client):
    """A compressed chat whose answer is in the kept needle; returns (response, stats)."""
    r = client.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": needle_document() + "\n\n" + QUESTION}],
        max_tokens=16,
        temperature=0,
        extra_body={"pflash_mode": "always", "pflash_return_prompt": True},
    )
    stats, served = pflash_stats(r), r.model_extra["pflash_prompt"]
    assert 2000 < r.usage.prompt_tokens < 3200  # the original, in target tokens
    assert 0 < stats["compressed_tokens"] < 0.3 * r.usage.prompt_tokens
    assert NEEDLE in served
    assert served.endswith(QUESTION + "<|im_end|>\n<|im_start|>assistant\n")
    # the engine's usage came back: it prefilled exactly the served prompt
    timings = r.usage.model_extra["timings"]
    assert timings["prompt_n"] + timings["cache_n"] == stats["compressed_tokens"]
    assert "7318842" in r.choices[0].message.content  # greedy: deterministic on this model
    return r, stats


def streamed_compressed_chat(client) -> None:
    """Streaming with include_usage: several content chunks, a finish, then usage alone."""
    stream = client.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": needle_document(9000) + "\n\n" + QUESTION}],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"pflash_mode": "always"},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text.strip()
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens >= 1
    assert usage.model_extra["timings"]["pflash"]["compressed_tokens"] < 0.3 * usage.prompt_tokens


QUOKKA = {
    "type": "object",
    "properties": {"number": {"type": "integer"}},
    "required": ["number"],
    "additionalProperties": False,
}


def structured_compressed_chat(client) -> dict:
    """A compressed chat asking for JSON matching a schema: the engine constrains its
    decoding to it, so the answer parses and has the schema's fields, whatever the model
    would have said in free text. Returns the parsed answer."""
    r = client.chat.completions.create(
        model="pflash",
        messages=[{"role": "user", "content": needle_document() + "\n\n" + QUESTION}],
        max_tokens=24,
        temperature=0,
        response_format={
            "type": "json_schema",
            "json_schema": {"name": "quokka", "schema": QUOKKA, "strict": True},
        },
        extra_body={"pflash_mode": "always"},
    )
    stats = pflash_stats(r)
    assert 0 < stats["compressed_tokens"] < 0.3 * r.usage.prompt_tokens
    answer = json.loads(r.choices[0].message.content)
    assert set(answer) == {"number"} and isinstance(answer["number"], int), answer
    # the Responses API's text.format reaches the engine the same way
    response = client.responses.create(
        model="pflash",
        input=needle_document() + "\n\n" + QUESTION,
        max_output_tokens=24,
        temperature=0,
        text={"format": {"type": "json_schema", "name": "quokka", "schema": QUOKKA}},
        extra_body={"pflash_mode": "always"},
    )
    assert response.text.format.type == "json_schema"
    assert json.loads(response.output_text) == answer
    return answer
