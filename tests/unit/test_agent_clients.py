"""What Claude Code and Codex CLI send, read the way their users expect.

The bodies are the clients' own, recorded from the pinned binaries
(tests/fixtures/agent_clients: `record.py`); the synthetic ones below each isolate one field
the clients send, and what it means here. Responses and events are validated against the
official SDKs' types.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import openai.types.responses as rtypes
import pytest
from pydantic import TypeAdapter

from pflash.config import build_config
from pflash.models.target.protocol import GenerationTimings
from pflash.serving.chat_completion.serving import chat_chunk, chat_response, chat_usage_chunk
from pflash.serving.edge import NOT_OFFERED_HEADER
from pflash.serving.messages.translate import DOCUMENT_LEFT_OUT, IMAGE_LEFT_OUT
from pflash.serving.messages.translate import EDGE as MESSAGES
from pflash.serving.protocol import ResponseMeta
from pflash.serving.responses.translate import EDGE as RESPONSES
from pflash.serving.tool_calls import with_index
from pflash.serving.usage import PFlashStats, build_usage

FIXTURES = Path(__file__).parents[1] / "fixtures" / "agent_clients"
sys.path.insert(0, str(FIXTURES))
import session  # noqa: E402

CLAUDE = json.loads((FIXTURES / "claude_code.json").read_text())
CODEX = json.loads((FIXTURES / "codex.json").read_text())
EVENT = TypeAdapter(rtypes.ResponseStreamEvent)
META = ResponseMeta("chatcmpl-00ff", "pflash", 1_700_000_000)


def _usage():
    timings = GenerationTimings(
        prompt_n=90, prompt_ms=5.0, predicted_n=7, predicted_ms=9.0, cache_n=10
    )
    return build_usage(100, timings, PFlashStats(compressed_tokens=60, keep_ratio=0.5))


def _messages(**fields):
    return {"model": "pflash", "max_tokens": 64, "messages": [{"role": "user", "content": "Hi"}], **fields}  # fmt: skip


# ----------------------------------------------------------------------------- the recordings


def test_the_fixtures_come_from_the_pinned_client_versions():
    """Bumping a client in clients.json without re-recording its requests fails here."""
    assert CLAUDE["versions"] == CODEX["versions"] == session.CLIENTS
    assert len(CLAUDE["requests"]) >= 6 and len(CODEX["requests"]) >= 6


@pytest.mark.parametrize("i", range(len(CLAUDE["requests"])))
def test_every_claude_code_request_is_served_as_its_users_expect(i):
    recorded = CLAUDE["requests"][i]
    exchange = MESSAGES.parse(json.dumps(recorded["body"]), recorded["headers"])
    chat, body = exchange.chat, recorded["body"]
    messages = chat.template_messages()
    # the session it names in metadata.user_id routes the conversation (affinity)
    user_id = json.loads(body["metadata"]["user_id"])
    assert (
        chat.session_id == user_id["session_id"] == recorded["headers"]["x-claude-code-session-id"]
    )
    # a client that cannot know the output cap asks for 32,000: served (capped later)
    assert body["max_tokens"] == 32000 and chat.sampling_params().max_tokens == 32000
    # its mid-conversation system turn is a system message where it stands
    system_turns = [k for k, m in enumerate(messages) if m["role"] == "system"]
    assert len(system_turns) == 2 and system_turns[0] == 0
    middle = body["messages"][1]
    assert middle["role"] == "system"
    text = middle["content"] if isinstance(middle["content"], str) else middle["content"][0]["text"]
    assert messages[system_turns[1]]["content"] == text
    # every tool it declares is offered, under its own name
    assert [t.function.name for t in chat.tools] == [t["name"] for t in body["tools"]]
    assert exchange.headers == {}
    # each tool result is a tool message, in order
    results = [b for m in body["messages"] if isinstance(m["content"], list) for b in m["content"] if b.get("type") == "tool_result"]  # fmt: skip
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == [r["tool_use_id"] for r in results]  # fmt: skip


@pytest.mark.parametrize("i", range(len(CODEX["requests"])))
def test_every_codex_request_is_served_as_its_users_expect(i):
    recorded = CODEX["requests"][i]
    exchange = RESPONSES.parse(json.dumps(recorded["body"]), recorded["headers"])
    chat, body = exchange.chat, recorded["body"]
    assert chat.session_id == body["prompt_cache_key"] == recorded["headers"]["session-id"]
    # a namespace's functions are offered under <namespace>__<name>; hosted tools are not
    offered = {t.function.name for t in chat.tools}
    for tool in body["tools"]:
        if tool["type"] == "namespace":
            assert {f"{tool['name']}__{inner['name']}" for inner in tool["tools"]} <= offered
        elif tool["type"] == "function":
            assert tool["name"] in offered
    hosted = [
        t["type"] for t in body["tools"] if t["type"] not in ("function", "namespace", "custom")
    ]
    assert hosted and exchange.not_offered == tuple(hosted)
    assert exchange.headers == {NOT_OFFERED_HEADER: ", ".join(hosted)}
    # developer messages stay developer messages (instructions, kept verbatim downstream)
    developer = [it for it in body["input"] if it.get("role") == "developer"]
    assert [m for m in chat.template_messages() if m["role"] == "developer"]
    assert len([m for m in chat.template_messages() if m["role"] == "developer"]) == len(developer)


# ----------------------------------------------------------------------------- Messages fields


def test_thinking_fields_and_blocks_are_accepted_and_earlier_thoughts_dropped():
    body = _messages(
        thinking={"type": "adaptive", "display": "omitted"},
        context_management={"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
        output_config={"effort": "high"},
        messages=[
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "let me see", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Hello."},
            ]},
            {"role": "user", "content": "Again?"},
        ],
    )  # fmt: skip
    messages = MESSAGES.parse(body).chat.template_messages()
    assert messages[1] == {"role": "assistant", "content": "Hello."}


def test_a_tool_results_image_is_a_note_and_a_text_document_its_text():
    body = _messages(
        messages=[
            {"role": "user", "content": "Read the files"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
                {"type": "text", "text": "a.png:"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "notes"}},
                {"type": "document", "source": {"type": "base64", "media_type": "application/pdf", "data": "JVBER"}},
            ]}]},
        ]
    )  # fmt: skip
    tool = MESSAGES.parse(body).chat.template_messages()[2]
    assert tool["content"] == "\n".join(["a.png:", IMAGE_LEFT_OUT, "notes", DOCUMENT_LEFT_OUT])


def test_server_tools_are_not_offered_and_the_response_says_so():
    body = _messages(
        tools=[
            {"name": "Read", "input_schema": {"type": "object"}},
            {"type": "web_search_20250305", "name": "web_search", "max_uses": 3},
        ]
    )
    exchange = MESSAGES.parse(body)
    assert [t.function.name for t in exchange.chat.tools] == ["Read"]
    assert exchange.headers == {NOT_OFFERED_HEADER: "web_search"}


@pytest.mark.parametrize(
    ("metadata", "headers", "extra", "expected"),
    [
        ({"user_id": json.dumps({"device_id": "d", "session_id": "s-json"})}, {}, {}, "s-json"),
        ({"user_id": "user_abc_account__session_9f2c"}, {}, {}, "9f2c"),
        ({"user_id": "plain-user"}, {"x-claude-code-session-id": "s-header"}, {}, "s-header"),
        ({"user_id": json.dumps({"session_id": "s-json"})}, {}, {"session_id": "mine"}, "mine"),
        ({"user_id": json.dumps({"session_id": "bad id\n"})}, {}, {}, None),
        (None, {}, {}, None),
    ],
)
def test_claude_codes_session_id_names_the_conversation(metadata, headers, extra, expected):
    body = _messages(**({"metadata": metadata} if metadata else {}), **extra)
    assert MESSAGES.parse(body, headers).chat.session_id == expected


# ----------------------------------------------------------------------------- Responses fields


NAMESPACE = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for sub-agents.",
    "tools": [
        {"type": "function", "name": "close_agent", "description": "Close an agent.",
         "parameters": {"type": "object", "properties": {"target": {"type": "string"}}}},
    ],
}  # fmt: skip
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": 'start: "*** Begin Patch"'},
}


def _call(name, arguments):
    return {"id": "call_1f", "type": "function", "function": {"name": name, "arguments": arguments}}


def test_a_namespaces_functions_are_offered_by_qualified_name_and_called_back_by_their_own():
    source = {"input": "close agent a1", "tools": [NAMESPACE, {"type": "web_search"}]}
    exchange = RESPONSES.parse(source)
    (tool,) = exchange.chat.tools
    assert tool.function.name == "multi_agent_v1__close_agent"
    assert tool.function.description == "Tools for sub-agents.\n\nClose an agent."
    answer = chat_response(
        META, None, "tool_calls", _usage(),
        tool_calls=[_call("multi_agent_v1__close_agent", '{"target": "a1"}')],
    )  # fmt: skip
    body, _ = exchange.respond(answer)
    (item,) = body["output"]
    assert (item["type"], item["name"], item["namespace"]) == (
        "function_call",
        "close_agent",
        "multi_agent_v1",
    )
    assert rtypes.Response.model_validate(body).output[0].name == "close_agent"
    # the client replays the call with its namespace: it is the same chat function again
    replay = RESPONSES.parse({"tools": [NAMESPACE], "input": [
        {"role": "user", "content": "close agent a1"},
        {"type": "function_call", "call_id": "call_1f", "name": "close_agent",
         "namespace": "multi_agent_v1", "arguments": '{"target": "a1"}'},
        {"type": "function_call_output", "call_id": "call_1f", "output": "closed"},
    ]}).chat.template_messages()  # fmt: skip
    assert replay[1]["tool_calls"][0]["function"]["name"] == "multi_agent_v1__close_agent"


def test_a_custom_tool_takes_its_input_as_text_and_answers_a_custom_tool_call():
    exchange = RESPONSES.parse({"input": "patch it", "tools": [PATCH]})
    (tool,) = exchange.chat.tools
    assert tool.function.parameters["required"] == ["input"]
    assert 'start: "*** Begin Patch"' in tool.function.description
    patch = "*** Begin Patch\n*** End Patch"
    calls = [_call("apply_patch", json.dumps({"input": patch}))]
    body, _ = exchange.respond(chat_response(META, None, "tool_calls", _usage(), tool_calls=calls))
    (item,) = body["output"]
    assert (item["type"], item["name"], item["input"]) == ("custom_tool_call", "apply_patch", patch)
    assert isinstance(rtypes.Response.model_validate(body).output[0], rtypes.ResponseCustomToolCall)

    async def events():
        async def items():
            yield chat_chunk(META, role="assistant", content="")
            yield chat_chunk(META, tool_calls=with_index(calls))
            yield chat_chunk(META, finish_reason="tool_calls")
            yield chat_usage_chunk(META, _usage())

        return [e async for e in exchange.stream(items())]

    parsed = [
        EVENT.validate_python(json.loads(e.split("data: ", 1)[1])) for e in asyncio.run(events())
    ]
    kinds = [e.type for e in parsed]
    assert "response.custom_tool_call_input.done" in kinds
    done = next(e for e in parsed if e.type == "response.custom_tool_call_input.done")
    assert done.input == patch


def test_reasoning_items_are_dropped_and_custom_calls_replayed_as_tool_turns():
    chat = RESPONSES.parse({"tools": [PATCH], "input": [
        {"role": "user", "content": "patch it"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAAA"},
        {"type": "custom_tool_call", "call_id": "call_2", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_2", "output": "Done!"},
        {"type": "function_call_output", "call_id": "call_3", "output": [
            {"type": "input_text", "text": "shot:"}, {"type": "input_image", "image_url": "data:x"}]},
    ]}).chat  # fmt: skip
    messages = chat.template_messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    call = messages[1]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == (
        "apply_patch",
        {"input": "*** Begin Patch"},
    )
    assert messages[3]["content"] == "shot:\n[image left out: this server reads text only]"


def test_codexs_other_fields_are_accepted_and_its_session_names_the_conversation():
    chat = RESPONSES.parse(
        {
            "input": "Hi",
            "reasoning": {"summary": "auto"},
            "include": ["reasoning.encrypted_content"],
            "store": False,
            "prompt_cache_key": "thread-7",
            "client_metadata": {"turn_id": "t"},
            "text": {"verbosity": "low"},
            "tool_choice": {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "f"}]},
            "tools": [{"type": "function", "name": "f", "parameters": {"type": "object"}}],
        },
        {"session-id": "other"},
    ).chat  # fmt: skip
    assert chat.session_id == "thread-7" and chat.tool_choice == "required"
    assert RESPONSES.parse({"input": "Hi"}, {"session-id": "from-header"}).chat.session_id == (
        "from-header"
    )


def test_claude_codes_session_title_request_asks_the_target_for_its_json_schema():
    """Interactive Claude Code names each session with a structured-output request (no
    tools, `output_config.format`): every target backend constrains its answer to the
    schema (models/target/constrained.py in process), so it is served, not refused."""
    recorded = json.loads((FIXTURES / "claude_code_title.json").read_text())
    (title,) = recorded["requests"]
    assert (
        recorded["versions"]["@anthropic-ai/claude-code"]
        == session.CLIENTS["@anthropic-ai/claude-code"]
    )
    chat = MESSAGES.parse(json.dumps(title["body"]), title["headers"]).chat
    fmt = chat.sampling_params().output_format
    assert fmt.kind == "json_schema" and json.loads(fmt.schema)["required"] == ["title"]
    assert chat.tools is None and chat.session_id == title["headers"]["x-claude-code-session-id"]
    chat.check_allowed(build_config({}, env={}))  # the embedded (transformers) target
