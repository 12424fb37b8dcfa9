"""The answer path (`pflash.serving.answer`): a served prompt's target events made into chat
completions' or completions' answer, whole or streamed, by the same path with the API's
strategy, against a scripted target; usage, metrics and in-band errors as the ingress gives
them."""

from __future__ import annotations

import asyncio
import json

import openai.types
import openai.types.chat

from pflash.compress.pipeline import Compressed
from pflash.config import build_config
from pflash.models.target.protocol import GenerationDone, GenerationTimings, TokenDelta
from pflash.serving.answer import Answers, Call
from pflash.serving.chat_completion.serving import ChatAnswer, parse_chat_request
from pflash.serving.completion.serving import CompletionAnswer, parse_completion_request
from pflash.serving.envelope import SSE_KEEPALIVE, StreamError, openai_frames
from pflash.serving.protocol import ResponseMeta

TIMINGS = GenerationTimings(
    prompt_n=40, prompt_ms=12.0, predicted_n=5, predicted_ms=30.0, cache_n=60
)
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {}}}
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SERVED = Compressed(
    compressed=True,
    served_ids=tuple(range(100)),
    served_text="<served prompt>",
    kept_spans=(),
    candidate_lifts=(),
    stats={"kept_tokens": 90},
    original_tokens=400,
)


class Target:
    """The target's stream as the ingress's handle gives it: the scripted events, or a
    wait past every deadline once they run out (`hang`)."""

    def __init__(self, events, *, hang: bool = False):
        self.events, self.hang, self.cancelled, self.asked = list(events), hang, False, None

    def __call__(self, ids, params, cut, conversation):
        self.asked = (tuple(ids), params, cut, conversation)
        return self

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self.events:
            return self.events.pop(0)
        if self.hang:
            await asyncio.sleep(3600)
        raise StopAsyncIteration

    def cancel(self):
        self.cancelled = True


def answered(*texts: str, finish: str = "stop") -> list:
    return [*(TokenDelta(t) for t in texts), GenerationDone(finish, TIMINGS)]


def run(body: dict, events, *, answer=ChatAnswer, stream: bool = False, tenant="key-a", **kw):
    """(the whole response's body or the stream's frames, the metric events, the target)."""
    target = Target(events, hang=kw.pop("hang", False))
    metrics: list[tuple] = []
    answers = Answers(
        target, lambda name, value=1.0, **tags: metrics.append((name, value, tags)), _no_feedback
    )
    config = build_config({"remote_call_timeout_s": kw.pop("gap_s", 30.0)}, env={})
    req = answer.parse(body)

    async def go():
        compression = asyncio.get_running_loop().create_future()
        compression.set_result(SERVED)
        call = Call(
            request_id="req-0123",
            request=req,
            answer=answer,
            config=config,
            params=req.sampling_params(),
            meta=ResponseMeta("chatcmpl-00ff", "pflash", 1_700_000_000),
            conversation=f"{tenant}:conversation",
            started=0.0,
            deadline=asyncio.get_running_loop().time() + 60,
            compression=compression,
        )
        if not stream:
            return (await answers.whole(call)).model_dump(mode="json")
        return [frame async for frame in openai_frames(answers.stream(call, keepalive=False))]

    return asyncio.run(go()), metrics, target


async def _no_feedback(compressed, session, accept):
    return None


def data(frames: list[str]) -> list[dict]:
    assert frames[-1] == "data: [DONE]\n\n"
    return [json.loads(f[len("data: ") :]) for f in frames[:-1]]


CHAT = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER]}


def test_a_whole_chat_answer_reads_its_tool_call_and_reports_original_prompt_tokens():
    body, metrics, target = run({**CHAT, "pflash_return_prompt": True}, answered("Sure. ", CALL))
    parsed = openai.types.chat.ChatCompletion.model_validate(body)
    assert parsed.choices[0].message.content == "Sure."
    assert parsed.choices[0].message.tool_calls[0].function.name == "get_weather"
    assert parsed.choices[0].finish_reason == "tool_calls"
    assert (
        parsed.usage.prompt_tokens == 400 and parsed.usage.prompt_tokens_details.cached_tokens == 60
    )
    assert body["usage"]["timings"]["pflash"]["kept_tokens"] == 90
    assert body["pflash_prompt"] == "<served prompt>"
    assert target.asked[0] == tuple(range(100)) and target.asked[3] == "key-a:conversation"
    assert ("pflash_requests", 1.0, {"endpoint": "chat", "compressed": "true"}) in metrics
    assert [m[0] for m in metrics] == [
        "pflash_ttft_seconds",
        "pflash_target_prefill_seconds",
        "pflash_input_tokens",
        "pflash_kept_tokens",
        "pflash_keep_ratio",
        "pflash_requests",
    ]


def test_a_chat_stream_holds_a_tool_call_back_until_the_answer_ends():
    body = {**CHAT, "stream": True, "stream_options": {"include_usage": True}}
    frames, _, _ = run(body, answered("Sure. <tool", "_call>\n", CALL[12:]), stream=True)
    chunks = [openai.types.chat.ChatCompletionChunk.model_validate(c) for c in data(frames)]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[1].choices[0].delta.content == "Sure. "
    assert chunks[2].choices[0].delta.tool_calls[0].function.name == "get_weather"
    assert chunks[3].choices[0].finish_reason == "tool_calls"
    assert chunks[4].choices == [] and chunks[4].usage.prompt_tokens == 400
    assert len(chunks) == 5


def test_a_completion_streams_its_text_and_the_served_prompt_on_the_last_chunk():
    body = {"prompt": "Once upon", "stream": True, "pflash_return_prompt": True}
    frames, metrics, _ = run(
        body, answered(" a", " time", finish="length"), answer=CompletionAnswer, stream=True
    )
    chunks = data(frames)
    assert [c["choices"][0]["text"] for c in chunks] == [" a", " time", ""]
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None, None, "length"]
    assert chunks[-1]["pflash_prompt"] == "<served prompt>"
    assert "pflash_prompt" not in chunks[0]
    assert ("pflash_requests", 1.0, {"endpoint": "completion", "compressed": "true"}) in metrics


def test_a_whole_completion_keeps_a_tool_call_block_as_text():
    body, _, _ = run({"prompt": "Call it:"}, answered(CALL), answer=CompletionAnswer)
    parsed = openai.types.Completion.model_validate(body)
    assert parsed.choices[0].text == CALL and parsed.choices[0].finish_reason == "stop"


def test_an_anonymous_caller_sees_no_cached_tokens():
    body, _, _ = run(CHAT, answered("Hi"), tenant="anon-1")
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_a_target_that_ends_without_finishing_is_an_in_band_500_naming_the_request():
    frames, _, _ = run({**CHAT, "stream": True}, [TokenDelta("Hi")], stream=True)
    *chunks, error = data(frames)
    assert error["error"]["message"] == "pflash target failed (request id req-0123)"
    assert chunks[-1]["choices"][0]["delta"] == {"content": "Hi"}


def test_a_hung_target_is_cancelled_and_a_504_in_band():
    frames, _, target = run(
        {**CHAT, "stream": True}, [TokenDelta("Hi")], stream=True, hang=True, gap_s=0.05
    )
    error = data(frames)[-1]["error"]
    assert error["code"] == "pflash_target_timeout" and "req-0123" in error["message"]
    assert target.cancelled


def test_the_stream_keeps_the_connection_alive_while_compressing(monkeypatch):
    monkeypatch.setattr("pflash.serving.answer.KEEPALIVE_EVERY_S", 0.01)
    req = parse_chat_request({**CHAT, "stream": True})

    async def go():
        loop = asyncio.get_running_loop()
        compression = loop.create_future()
        call = Call(
            "req-1", req, ChatAnswer, build_config({}, env={}), req.sampling_params(),
            ResponseMeta.new("pflash", ChatAnswer.id_prefix), "key-a:c", 0.0,
            loop.time() + 60, compression,
        )  # fmt: skip
        answers = Answers(Target(answered("Hi")), lambda *a, **k: None, _no_feedback)
        items = []
        async for item in answers.stream(call, keepalive=True):
            items.append(item)
            if item == SSE_KEEPALIVE and len(items) == 2:  # compressed after two keep-alives
                compression.set_result(SERVED)
        return items

    items = asyncio.run(go())
    assert items[:2] == [SSE_KEEPALIVE, SSE_KEEPALIVE] and SSE_KEEPALIVE not in items[2:]
    assert not any(isinstance(i, StreamError) for i in items)
    assert items[-1].choices[0].finish_reason == "stop"


def test_each_api_parses_its_own_request():
    assert ChatAnswer.parse(CHAT).messages[0].content == "Weather in Paris?"
    assert CompletionAnswer.parse({"prompt": "x"}).prompt == "x"
    assert parse_completion_request({"prompt": [1, 2]}).prompt == [1, 2]
    assert ResponseMeta.new("m", CompletionAnswer.id_prefix).id.startswith("cmpl-")
