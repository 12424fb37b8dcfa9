"""The agent clients' benchmark sessions (pflash_lab/bench/agent_clients.py): what its
numbers rest on. A captured session must carry the client's recorded harness untouched but
for the answer cap, the task, its session id and its opening line; send its steps in the
client's own tool format, with agent_trace's real outputs and planted facts; and grow, step
by step, to its length as the app renders it. No model, no cluster."""

from __future__ import annotations

import json

import pytest

from pflash_lab.bench import agent_clients as ac
from pflash_lab.bench.instruction_lines import instruction_lines, tool_schemas

RECORDED = {n: json.loads((ac.FIXTURES / f"{n}.json").read_text()) for n in ac.CLIENTS}


@pytest.fixture(scope="module")
def sessions(smollm2_tokenizer):
    out = {}
    for name in ac.CLIENTS:
        client = ac.load_client(name, 256)
        harness = ac.harness_tokens(client, 3, smollm2_tokenizer)
        out[name] = ac.captured_session(client, harness + 10000, 3, smollm2_tokenizer)
    return out


def _as_recorded(session: ac.CapturedSession, step: int | None) -> dict:
    """A request of the session under the recorded session id, without an opening line."""
    who = ac.Identity(session.client.session_id, "")
    body = session.request(step, who, {})[1]
    if "system" in body:
        body["system"][0]["text"] = body["system"][0]["text"].removeprefix("\n")
    else:
        first = body["input"][0]["content"][0]
        first["text"] = first["text"].removeprefix("\n")
    return body


@pytest.mark.parametrize("name", ac.CLIENTS)
def test_the_first_request_is_the_recorded_one_but_for_cap_task_and_ids(sessions, name):
    session = sessions[name]
    recorded = RECORDED[name]["requests"][0]["body"]
    body = _as_recorded(session, None)
    cap = "max_tokens" if name == "claude_code" else "max_output_tokens"
    assert body[cap] == 256
    key = ac.conversation_key(body)
    assert set(body) - {cap} == set(recorded) - {cap}
    for field in set(recorded) - {cap, key}:
        assert body[field] == recorded[field], field
    # every turn as recorded, but the user's prompt, which is the trace's task
    assert len(body[key]) == len(recorded[key])
    prompts = [(i, t) for i, t in enumerate(body[key]) if t != recorded[key][i]]
    assert len(prompts) == 1 and session.trace.task in json.dumps(prompts[0][1])
    assert instruction_lines(body) == instruction_lines(recorded)
    assert tool_schemas(body) == tool_schemas(recorded)


@pytest.mark.parametrize("name", ac.CLIENTS)
def test_each_side_has_its_own_session_id_and_first_line(sessions, name):
    session = sessions[name]
    a = ac.Identity("aaaaaaaa-0000-4000-8000-000000000001", "Session A-1")
    b = ac.Identity("bbbbbbbb-0000-4000-8000-000000000002", "Session B-1")
    (ha, ba), (hb, bb) = session.request(2, a, {}), session.request(2, b, {})
    text_a, text_b = json.dumps([ha, ba]), json.dumps([hb, bb])
    assert session.client.session_id not in text_a + text_b
    assert a.session_id in text_a and b.session_id not in text_a
    opening = ba["system"][0] if "system" in ba else ba["input"][0]["content"][0]
    assert opening["text"].startswith("Session A-1\n")  # it opens the first instruction text
    assert ba[ac.conversation_key(ba)][2:] == bb[ac.conversation_key(bb)][2:]


def test_claude_code_steps_are_read_and_bash_tool_uses_with_their_results(sessions):
    session = sessions["claude_code"]
    last = len(session.trace.steps) - 1
    turns = _as_recorded(session, last)["messages"]
    opening = len(RECORDED["claude_code"]["requests"][1]["body"]["messages"])
    assert opening >= 2 and [t["role"] for t in turns[:2]] == ["user", "system"]
    results, uses = {}, {}
    for turn in turns[2:]:
        for block in turn["content"]:
            if block["type"] == "tool_use":
                assert turn["role"] == "assistant" and block["name"] in ("Read", "Bash")
                if block["name"] == "Read":
                    assert block["input"]["file_path"].startswith(ac.REPO + "/Lib/")
                uses[block["id"]] = block
            elif block["type"] == "tool_result":
                assert turn["role"] == "user" and block["tool_use_id"] in uses
                results[block["tool_use_id"]] = block["content"]
    assert set(results) == set(uses) and len(uses) == sum(
        s.kind == "tool" for s in session.trace.steps
    )
    # roles alternate, as the API requires; the cache breakpoint is on the last block only
    assert all(a["role"] != b["role"] for a, b in zip(turns[1:], turns[2:], strict=False))
    marked = [b for t in turns for b in t["content"] if "cache_control" in b]
    assert marked == [turns[-1]["content"][-1]]
    text = json.dumps(turns)
    for fact in session.trace.facts:  # planted whole (a Read numbers its line)
        assert json.dumps(fact.line)[1:-1] in text
    questions = [s for s in session.trace.steps if s.kind == "question"]
    assert questions and all(json.dumps(q.messages[0]["content"]) in text for q in questions)


def test_codex_steps_are_exec_command_calls_with_their_output_envelopes(sessions):
    session = sessions["codex"]
    last = len(session.trace.steps) - 1
    items = _as_recorded(session, last)["input"]
    calls = [i for i in items if i["type"] == "function_call"]
    outputs = {i["call_id"]: i["output"] for i in items if i["type"] == "function_call_output"}
    assert calls and all(c["name"] == "exec_command" for c in calls)
    assert {c["call_id"] for c in calls} == set(outputs)
    assert all(json.loads(c["arguments"])["cmd"] for c in calls)
    assert all(o.startswith("Chunk ID: ") and "\nOutput:\n" in o for o in outputs.values())
    text = json.dumps(items)
    for fact in session.trace.facts:
        assert json.dumps(fact.line)[1:-1] in text
    asked = [i for i in items if i["type"] == "message" and i["role"] == "user"][2:]
    assert [i["content"][0]["text"] for i in asked] == [
        s.messages[0]["content"] for s in session.trace.steps if s.kind == "question"
    ]


@pytest.mark.parametrize("name", ac.CLIENTS)
def test_a_session_grows_step_by_step_to_its_length(sessions, smollm2_tokenizer, name):
    session = sessions[name]
    length = session.harness_tokens + 10000
    key = "messages" if name == "claude_code" else "input"
    previous, sizes = None, []
    for i in range(len(session.trace.steps)):
        body = _as_recorded(session, i)
        turns = json.loads(
            json.dumps(body[key]).replace(', "cache_control": {"type": "ephemeral"}', "")
        )
        # a request extends the one before it (a question joins the last tool result's turn)
        if previous is not None:
            assert turns[: len(previous) - 1] == previous[:-1]
        previous = turns
        sizes.append(ac.render_tokens(session.client, body, smollm2_tokenizer))
    assert sizes == sorted(sizes) and len(set(sizes)) == len(sizes)
    assert session.harness_tokens < sizes[0] and 0.8 * length <= sizes[-1] <= length
