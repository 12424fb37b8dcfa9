"""`/v1/messages` (Anthropic) and `/v1/responses` (OpenAI Responses) on the real Ray Serve
application, through the official `anthropic`, `openai` and `openai-agents` SDKs.

The app is `pflash` of test_serve_app.py's config (the embedded SmolLM2 as drafter and
target, API keys on, `return_prompt_enabled`), plus its key-less `gw2` app, whose
completion route answering is how the cluster knows the main app is up; the Gemma app is
left out. The embedded model writes a tool call when the chat shows the hermes format
(tests/fixtures/tool_chat.py): each API sends that same chat in its own shape.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import anthropic
import httpx
import pytest
import yaml

from pflash.config import build_config
from pflash_lab.bench.launch import ServeCluster, free_port

pytestmark = pytest.mark.integration
sys.path.insert(0, str(Path(__file__).parent))  # test_serve_app.py: the app's config
sys.path.insert(0, str(Path(__file__).parents[1] / "fixtures"))  # tool_chat.py
import tool_chat  # noqa: E402
from test_serve_app import KEY, NEEDLE, QUESTION, _config, _document  # noqa: E402

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")  # no export to OpenAI
AUTH = {"Authorization": f"Bearer {KEY}"}
ANTHROPIC_TOOL = {
    "name": "get_weather",
    "description": "The current weather in a city.",
    "input_schema": tool_chat.WEATHER_TOOL["function"]["parameters"],
}
RESPONSES_TOOL = {"type": "function", **tool_chat.WEATHER_TOOL["function"]}
# the anthropic SDK (2.x) has no sampling parameters: greedy decoding goes in the body
GREEDY = {"temperature": 0}
COUNTS = ("/v1/messages/count_tokens", "/v1/responses/input_tokens")


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("agents")
    port = free_port()
    path = _config(tmp, port)
    config = yaml.safe_load(path.read_text())
    config["applications"] = [a for a in config["applications"] if a["name"] != "xv"]
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cluster = ServeCluster(path, tmp)
    http = f"http://127.0.0.1:{port}"
    ping = {"prompt": "Hi", "max_tokens": 1, "pflash_mode": "off"}
    try:
        cluster.start(f"{http}/gw2/v1/completions", ping)
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        deadline = time.time() + 300
        while True:  # the main app's own route, as test_serve_app.py waits for it
            try:
                r = httpx.post(f"{http}/v1/chat/completions", json=chat, headers=AUTH, timeout=120)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.time() < deadline, "the app did not come up"
            time.sleep(2)
        yield http
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def claude(server):
    # the SDK authenticates with x-api-key
    return anthropic.Anthropic(base_url=server, api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def openai_client(server):
    from openai import OpenAI

    return OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)


def _anthropic_tool_chat(city: str) -> tuple[str, list[dict]]:
    """tool_chat's chat as Anthropic's (system, messages)."""
    system, *messages = tool_chat.tool_messages(city)
    return system["content"], messages


# ----------------------------------------------------------------------------- Messages


def test_messages_create_answers_with_anthropic_usage_and_pflash_stats(claude):
    with_raw = claude.messages.with_raw_response.create(
        model="pflash",
        extra_body=GREEDY,
        max_tokens=12,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    )
    message = with_raw.parse()
    assert with_raw.headers["request-id"].startswith("req-")
    assert message.type == "message" and message.role == "assistant"
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert "Paris" in message.content[0].text
    usage = message.usage
    assert usage.input_tokens + usage.cache_read_input_tokens > 10
    assert 0 < usage.output_tokens <= 12
    stats = usage.model_extra["pflash"]
    assert stats["keep_ratio"] == 1.0
    assert json.loads(with_raw.headers["x-pflash-stats"]) == stats


def test_anthropic_clients_list_the_models_in_anthropics_shape(claude, openai_client, server):
    """Claude Code discovers a gateway's models with the anthropic SDK's call (it sends
    `anthropic-version`); OpenAI clients keep OpenAI's list."""
    (info,) = claude.models.list().data
    assert (info.id, info.type, info.display_name, info.lifecycle) == (
        "pflash",
        "model",
        "pflash",
        "active",
    )
    # the most a request may carry (prompts over the target's context are compressed to fit)
    # and ask to generate: the app's max_prompt_tokens and max_output_tokens (defaults)
    defaults = build_config({}, env={})
    assert (info.max_input_tokens, info.max_tokens) == (
        defaults.max_prompt_tokens,
        defaults.max_output_tokens,
    )
    context = openai_client.models.retrieve("pflash").model_extra["max_model_len"]
    assert 0 < context < info.max_input_tokens
    assert claude.models.retrieve("pflash").id == "pflash"
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.models.retrieve("claude-x")
    assert err.value.body["error"]["type"] == "not_found_error"
    assert [m.id for m in openai_client.models.list().data] == ["pflash"]
    r = httpx.get(f"{server}/v1/models/claude-x", headers=AUTH, timeout=60)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = httpx.get(f"{server}/v1/models", headers={"anthropic-version": "2023-06-01"}, timeout=60)
    _anthropic_error(r, 401, "authentication_error")


def test_messages_stream_sends_the_documented_events(claude):
    with claude.messages.stream(
        model="pflash",
        extra_body=GREEDY,
        max_tokens=12,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_start" in kinds and "message_delta" in kinds
    assert "Paris" in final.content[0].text
    assert final.usage.output_tokens > 0


def test_a_tool_use_answer_and_a_tool_result_turn(claude):
    system, messages = _anthropic_tool_chat("Paris")
    # system as a text block with cache_control (accepted, ignored): the same prompt
    blocks = [{"type": "text", "text": system, "cache_control": {"type": "ephemeral"}}]
    message = claude.messages.create(
        model="pflash",
        max_tokens=40,
        system=blocks,
        messages=messages,
        tools=[ANTHROPIC_TOOL],
        extra_body={**GREEDY, "pflash_mode": "off"},
    )
    assert message.stop_reason == "tool_use", message
    (call,) = [b for b in message.content if b.type == "tool_use"]
    assert (call.name, call.input) == ("get_weather", {"city": "Paris"})
    # count_tokens, as Claude Code calls it (the beta path, `?beta=true`) and as the SDK's
    # plain method does: the prompt this request rendered
    prompt = message.usage.input_tokens + message.usage.cache_read_input_tokens
    conversation = {"system": blocks, "messages": messages, "tools": [ANTHROPIC_TOOL]}
    assert claude.messages.count_tokens(model="pflash", **conversation).input_tokens == prompt
    beta = claude.beta.messages.count_tokens(model="pflash", **conversation)
    assert beta.input_tokens == prompt

    follow = claude.messages.create(
        model="pflash",
        max_tokens=20,
        system=system,
        messages=[
            *messages,
            {
                "role": "assistant",
                "content": [b.model_dump(exclude_none=True) for b in message.content],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "18 C and sunny"}
                ],
            },
        ],
        tools=[ANTHROPIC_TOOL],
        extra_body={**GREEDY, "pflash_mode": "off"},
    )
    assert follow.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert follow.content and follow.usage.output_tokens > 0


def test_a_streamed_tool_use_arrives_as_input_json(claude):
    system, messages = _anthropic_tool_chat("Paris")
    with claude.messages.stream(
        model="pflash",
        max_tokens=40,
        system=system,
        messages=messages,
        tools=[ANTHROPIC_TOOL],
        extra_body={**GREEDY, "pflash_mode": "off"},
    ) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert "input_json" in kinds  # the SDK's event for an input_json_delta
    assert final.stop_reason == "tool_use"
    (call,) = [b for b in final.content if b.type == "tool_use"]
    assert call.input == {"city": "Paris"}


def test_a_long_document_is_compressed_through_messages(claude):
    message = claude.messages.create(
        model="pflash",
        max_tokens=16,
        messages=[{"role": "user", "content": _document(5000) + "\n\n" + QUESTION}],
        extra_body={
            **GREEDY,
            "pflash_mode": "always",
            "pflash_keep_ratio": 0.2,
            "pflash_return_prompt": True,
            "pflash_required": [NEEDLE],
        },
    )
    stats = message.usage.model_extra["pflash"]
    original = message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert 0 < stats["compressed_tokens"] < 0.5 * original
    assert stats["drafter_input_tokens"] == original
    assert NEEDLE in message.model_extra["pflash_prompt"]
    # the count is the client's prompt before compression: what its context holds
    counted = claude.messages.count_tokens(
        model="pflash",
        messages=[{"role": "user", "content": _document(5000) + "\n\n" + QUESTION}],
        extra_body={"pflash_mode": "always"},
    )
    assert counted.input_tokens == original


def _agent_session(claude, document: int, outputs: list[str], question: str, session: str):
    """`usage.pflash` of each step of an agent session through `/v1/messages`: a task over a
    `document`-token text, one `read_file` call and result per output, then `question`."""
    tool = {"name": "read_file", "description": "Read a file.", "input_schema": {"type": "object"}}
    messages = [{"role": "user", "content": _document(document) + "\n\nTidy up this project."}]
    extra = {**GREEDY, "pflash_mode": "always", "pflash_keep_ratio": 0.2, "session_id": session}
    steps = []

    def step():
        message = claude.messages.create(
            model="pflash", max_tokens=8, messages=messages, tools=[tool], extra_body=extra
        )
        steps.append(message.usage.model_extra["pflash"])

    step()
    for n, output in enumerate(outputs):
        call = {"type": "tool_use", "id": f"toolu_{n}", "name": "read_file", "input": {"n": n}}
        result = {"type": "tool_result", "tool_use_id": f"toolu_{n}", "content": output}
        messages += [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": [result]},
        ]
        step()
    messages += [
        {"role": "assistant", "content": "Both files read."},
        {"role": "user", "content": question},
    ]
    step()
    return steps


def test_an_agent_session_through_messages_compresses_each_tool_output_as_it_arrives(claude):
    """A task over a document, two tool results of ~1.5K tokens, then a question: each tool
    output is compressed into the view when it arrives (the target's cached prefix reused,
    the drafter resuming on the new tokens), and the question scores only its own tokens."""
    licence = Path("/usr/share/common-licenses")
    outputs = [
        (licence / "Apache-2.0").read_text()[:6000],
        (licence / "MPL-2.0").read_text()[:6000],
    ]
    question = "What does the first file say about trademarks?"
    steps = _agent_session(claude, 4000, outputs, question, "agent-7")
    first, *tools, question = steps
    assert first["view"]["mode"] == "fresh"
    previous = first
    for stats in tools:
        view = stats["view"]
        assert view["mode"] == "continue-compressed", view
        assert view["reused_tokens"] >= previous["view"]["served_tokens"] - 8  # its cached prefix
        added = stats["drafter_input_tokens"] - previous["drafter_input_tokens"]
        assert added > 1000 and view["delta_tokens"] < 0.5 * added  # compressed, not appended
        assert stats["scorer_resume"] >= previous["drafter_input_tokens"] - 8
        assert stats["scorer_new_tokens"] <= added + 8  # the drafter read the new part only
        previous = stats
    assert question["view"]["mode"] in ("continue", "rebuild")
    assert question["scorer_new_tokens"] < 64  # the question's own tokens
    if question["semantic_passages"]:  # the tool outputs were embedded when they arrived
        assert question["semantic_reused"] >= question["semantic_passages"] - 4


def test_small_tool_results_are_read_ahead_so_the_next_question_scores_only_itself(claude):
    """Tool results under `chat_compress_new_tokens` are appended to the view verbatim,
    without the drafter before the answer; the drafter reads them in the background
    (read-ahead), so the question after them resumes the session past them and scores only
    its own tokens instead of theirs too."""
    licence = Path("/usr/share/common-licenses")
    # ~120 tokens each, with the tool call ~160 new tokens a step: under the default (256)
    outputs = [(licence / "BSD").read_text()[:500], (licence / "Artistic").read_text()[:500]]
    question = "What does the first file say about warranties?"
    steps = _agent_session(claude, 3000, outputs, question, "agent-8")
    first, *tools, question = steps
    assert first["view"]["mode"] == "fresh"
    for stats in tools:
        assert stats["view"]["mode"] == "continue", stats["view"]  # appended verbatim
        assert not stats.get("scorer_new_tokens")  # no drafter before the answer
    # a question in other words recalls what the fresh selection keeps: often a rebuild
    assert question["view"]["mode"] in ("continue", "rebuild"), question["view"]
    added = question["drafter_input_tokens"] - first["drafter_input_tokens"]
    assert added > 250  # the two results and the question
    assert question["scorer_resume"] >= first["drafter_input_tokens"] + added - 64
    assert question["scorer_new_tokens"] < 64  # its own tokens: the results were read ahead


# ----------------------------------------------------------------------------- Responses


def test_responses_create_whole_and_streamed(openai_client):
    response = openai_client.responses.create(
        model="pflash",
        input="What is the capital of France?",
        max_output_tokens=12,
        temperature=0,
        store=True,  # accepted; the server keeps nothing
    )
    assert response.status in ("completed", "incomplete")
    assert "Paris" in response.output_text
    assert response.usage.input_tokens > 10 and response.usage.output_tokens > 0
    assert response.usage.model_extra["pflash"]["keep_ratio"] == 1.0

    events = list(
        openai_client.responses.create(
            model="pflash",
            input="What is the capital of France?",
            max_output_tokens=12,
            temperature=0,
            stream=True,
        )
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert "response.output_text.delta" in kinds
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert events[-1].response.output_text == response.output_text  # greedy: the same answer
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_a_function_call_round_trip_through_responses(openai_client):
    system, *messages = tool_chat.tool_messages("Paris")
    response = openai_client.responses.create(
        model="pflash",
        instructions=system["content"],
        input=messages,
        tools=[RESPONSES_TOOL],
        max_output_tokens=40,
        temperature=0,
        extra_body={"pflash_mode": "off"},
    )
    (call,) = [item for item in response.output if item.type == "function_call"]
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Paris"})
    counted = openai_client.responses.input_tokens.count(
        model="pflash", instructions=system["content"], input=messages, tools=[RESPONSES_TOOL]
    )
    assert (counted.object, counted.input_tokens) == (
        "response.input_tokens",
        response.usage.input_tokens,
    )

    follow = openai_client.responses.create(
        model="pflash",
        instructions=system["content"],
        input=[
            *messages,
            *[item.model_dump(exclude_none=True) for item in response.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "18 C"},
        ],
        tools=[RESPONSES_TOOL],
        max_output_tokens=20,
        temperature=0,
        extra_body={"pflash_mode": "off"},
    )
    assert follow.output and follow.usage.output_tokens > 0

    streamed = list(
        openai_client.responses.create(
            model="pflash",
            instructions=system["content"],
            input=messages,
            tools=[RESPONSES_TOOL],
            max_output_tokens=40,
            temperature=0,
            stream=True,
            extra_body={"pflash_mode": "off"},
        )
    )
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [{"city": "Paris"}]


def test_an_agents_sdk_agent_runs_its_tool_against_the_app(server):
    from agents import (
        Agent,
        MaxTurnsExceeded,
        ModelSettings,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    asked: list[str] = []

    @function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        asked.append(city)
        return f"18 C and sunny in {city}"

    system, *messages = tool_chat.tool_messages("Paris")
    client = AsyncOpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0, timeout=300)
    agent = Agent(
        name="weather",
        instructions=system["content"],
        model=OpenAIResponsesModel(model="pflash", openai_client=client),
        model_settings=ModelSettings(
            temperature=0, max_tokens=40, extra_body={"pflash_mode": "off"}
        ),
        tools=[get_weather],
    )
    try:
        result = Runner.run_sync(agent, messages, max_turns=3)
        responses = result.raw_responses
    except MaxTurnsExceeded as exc:  # the small model may call again after the output
        responses = exc.run_data.raw_responses
    assert asked[0] == "Paris"
    assert len(responses) >= 2  # the call, then a step that read the tool's output
    assert all(r.usage.output_tokens > 0 for r in responses)


# ----------------------------------------------------------------------------- one flow


def test_the_same_conversation_serves_the_same_compressed_prompt_on_every_api(
    server, claude, openai_client
):
    """Chat completions, Messages and Responses are translations of one request: the same
    conversation compresses to the same served prompt (each in its own session, so no
    stored view is reused)."""
    document = _document(5000)
    pflash = {"pflash_mode": "always", "pflash_keep_ratio": 0.2, "pflash_return_prompt": True}
    chat = openai_client.chat.completions.create(
        model="pflash",
        messages=[
            {"role": "system", "content": "Answer from the document."},
            {"role": "user", "content": document + "\n\n" + QUESTION},
        ],
        max_tokens=4,
        temperature=0,
        extra_body={**pflash, "session_id": "same-chat"},
    )
    message = claude.messages.create(
        model="pflash",
        system="Answer from the document.",
        messages=[{"role": "user", "content": document + "\n\n" + QUESTION}],
        max_tokens=4,
        extra_body={**GREEDY, **pflash, "session_id": "same-messages"},
    )
    response = openai_client.responses.create(
        model="pflash",
        instructions="Answer from the document.",
        input=document + "\n\n" + QUESTION,
        max_output_tokens=4,
        temperature=0,
        extra_body={**pflash, "session_id": "same-responses"},
    )
    served = chat.model_extra["pflash_prompt"]
    assert chat.usage.model_extra["timings"]["pflash"]["keep_ratio"] < 0.5
    assert message.model_extra["pflash_prompt"] == served
    assert response.model_extra["pflash_prompt"] == served
    compressed = chat.usage.model_extra["timings"]["pflash"]["compressed_tokens"]
    assert message.usage.model_extra["pflash"]["compressed_tokens"] == compressed
    assert response.usage.model_extra["pflash"]["compressed_tokens"] == compressed


# ----------------------------------------------------------------------------- bad input


def _anthropic_error(r: httpx.Response, status: int, kind: str) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["type"] == "error" and body["error"]["type"] == kind, body
    assert r.headers["request-id"].startswith("req-")
    return body["error"]


def test_bad_messages_requests_are_4xx_in_anthropics_shape(server):
    url = f"{server}/v1/messages"
    key = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    ok = {"model": "pflash", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
    _anthropic_error(httpx.post(url, json=ok, timeout=60), 401, "authentication_error")
    wrong = {"x-api-key": "nope"}
    _anthropic_error(
        httpx.post(url, json=ok, headers=wrong, timeout=60), 401, "authentication_error"
    )
    r = httpx.post(url, content=b"{not json", headers=key, timeout=60)
    assert "not valid JSON" in _anthropic_error(r, 400, "invalid_request_error")["message"]
    image = {**ok, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
    r = httpx.post(url, json=image, headers=key, timeout=60)
    assert (
        "'image' is not supported" in _anthropic_error(r, 400, "invalid_request_error")["message"]
    )
    r = httpx.post(url, json={**ok, "model": "claude-x"}, headers=key, timeout=60)
    _anthropic_error(r, 404, "not_found_error")
    r = httpx.post(
        url, json={k: v for k, v in ok.items() if k != "max_tokens"}, headers=key, timeout=60
    )
    assert "max_tokens" in _anthropic_error(r, 400, "invalid_request_error")["message"]


def test_bad_token_counts_are_4xx_in_each_apis_shape(server):
    count = f"{server}/v1/messages/count_tokens"
    key = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    ok = {"model": "pflash", "messages": [{"role": "user", "content": "Hi"}]}
    _anthropic_error(httpx.post(count, json=ok, timeout=60), 401, "authentication_error")
    image = {**ok, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}
    r = httpx.post(count, json=image, headers=key, timeout=60)
    assert "'image'" in _anthropic_error(r, 400, "invalid_request_error")["message"]
    r = httpx.post(count, json={**ok, "model": "claude-x"}, headers=key, timeout=60)
    _anthropic_error(r, 404, "not_found_error")
    r = httpx.post(count, json=ok, headers=key, timeout=60)
    assert r.status_code == 200 and r.json()["input_tokens"] > 0
    assert r.headers["request-id"].startswith("req-")

    cases = [
        ({"input": "Hi", "conversation": "conv_1"}, "conversation"),
        ({"input": [{"type": "input_image_call"}]}, "input[0]"),
        ({}, "input"),
    ]
    _openai_errors(f"{server}/v1/responses/input_tokens", cases)


def _openai_errors(url: str, cases: list[tuple[dict, str]]) -> None:
    """Each body is a 400 naming its param in the OpenAI envelope; no key is a 401."""
    for body, param in cases:
        r = httpx.post(url, json=body, headers=AUTH, timeout=60)
        assert r.status_code == 400, (body, r.text)
        error = r.json()["error"]
        assert (error["type"], error["param"]) == ("invalid_request_error", param)
    r = httpx.post(url, json={"input": "Hi"}, timeout=60)
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"


def test_bad_responses_requests_are_4xx_in_the_openai_envelope(server):
    url = f"{server}/v1/responses"
    cases = [
        ({"input": "Hi", "previous_response_id": "resp_1"}, "previous_response_id"),
        ({"input": [{"type": "input_image_call"}]}, "input[0]"),
        ({"input": "Hi", "tools": [{"type": "namespace", "name": "n"}]}, "tools[0].tools"),
        ({"input": "Hi", "pflash_mode": "sometimes"}, "pflash_mode"),
        ({"input": "Hi", "max_output_tokens": "5"}, "max_output_tokens"),
    ]
    _openai_errors(url, cases)
    # a hosted tool is not a 400: it is not offered to the model, and the answer says so
    hosted = {"input": "Hi", "max_output_tokens": 2, "tools": [{"type": "web_search"}]}
    r = httpx.post(url, json=hosted, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.headers["x-pflash-tools-not-offered"] == "web_search"


PLACE = {  # a bounded string: the grammar closes the object within max_tokens
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}},
    "required": ["city"],
    "additionalProperties": False,
}


def test_structured_output_is_json_matching_the_schema_on_the_embedded_target(
    claude, openai_client
):
    """Each SDK's structured-output call is answered with JSON that parses against the
    schema: the embedded target masks its sampler with the schema's grammar (Claude Code
    names its sessions with such a request)."""
    hi = [{"role": "user", "content": "Where is the Louvre? Answer with the city."}]
    message = claude.messages.create(
        model="pflash", max_tokens=40, messages=hi, extra_body=GREEDY,
        output_config={"format": {"type": "json_schema", "schema": PLACE}},
    )  # fmt: skip
    assert message.stop_reason == "end_turn"
    assert list(json.loads(message.content[0].text)) == ["city"]
    response = openai_client.responses.create(
        model="pflash", input=hi[0]["content"], max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "place", "schema": PLACE}},
    )  # fmt: skip
    assert response.status == "completed" and list(json.loads(response.output_text)) == ["city"]
    assert response.text.format.type == "json_schema"
    chat = openai_client.chat.completions.create(
        model="pflash", messages=hi, max_tokens=40, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": PLACE}},
    )  # fmt: skip
    assert list(json.loads(chat.choices[0].message.content)) == ["city"]
    served = openai_client.responses.create(
        model="pflash", input="Hi", max_output_tokens=4, text={"format": {"type": "text"}}
    )
    assert served.status in ("completed", "incomplete") and served.text.format.type == "text"


@pytest.mark.parametrize(
    "body",
    [b"", b"[]", b"null", b'{"messages": "x"}', b'{"input": 5}', b'{"model": 5}', "\ud800".encode("utf-8", "surrogatepass")],
)  # fmt: skip
def test_junk_bodies_are_never_a_5xx_on_either_api(server, body):
    for path in ("/v1/messages", "/v1/responses", *COUNTS):
        r = httpx.post(f"{server}{path}", content=body, headers=AUTH, timeout=60)
        assert 400 <= r.status_code < 500, (path, body, r.status_code, r.text)
