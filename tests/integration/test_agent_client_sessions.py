"""Claude Code and Codex CLI, unmodified, through multi-step sessions against the real app.

The binaries come from npm at the versions the fixtures were recorded with
(`bash scripts/agent_clients.sh`, run by `scripts/test.sh`). Each client is pointed at the
app by base URL and key alone. Two applications run in one cluster:

- `agents` (route `/`): the embedded drafter in front of a scripted target behind the real
  `openai` upstream backend (tests/fixtures/agent_clients/scripted_target.py): it answers
  each step with the script's tool call, so the clients really read files, grep, list and
  run Python in a repository the test makes, and each session grows to ~30K tokens of real
  tool output. A recording proxy sits between each client and the app, so every request the
  client sent is paired with the prompt the target was served for it.
- `embedded` (route `/embedded`): the shipped embedded configuration (SmolLM2 as drafter
  and target), one session per client, end to end.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from pflash_lab.bench.instruction_lines import instruction_lines, missing, tool_schemas
from pflash_lab.bench.launch import ROOT, ServeCluster, free_port

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).parents[1] / "fixtures" / "agent_clients"
sys.path.insert(0, str(FIXTURES))
import session  # noqa: E402
from scripted_target import RecordingProxy, ScriptedTarget, stream_usage  # noqa: E402

KEY = "sk-agents-0123456789"
CONTEXT = 65536
if not session.installed():
    # only a machine without npm may skip: there the clients cannot be installed at all;
    # with npm, a missing client is a failed setup step, not a pass
    if shutil.which("npm") is None:
        pytest.skip(
            "npm is not installed: the agent clients (Claude Code, Codex CLI) come from npm "
            "through `bash scripts/agent_clients.sh`",
            allow_module_level=True,
        )
    pytest.fail(
        "npm is here but the agent clients are not installed: run `bash scripts/agent_clients.sh`",
        pytrace=False,
    )


def _config(tmp: Path, port: int, upstream: str) -> Path:
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    base["http_options"]["port"] = port
    template = base["applications"][0]
    agents = copy.deepcopy(template)
    agents["name"] = "agents"
    agents["args"].update(
        target_backend="openai",
        upstream_base_url=upstream,
        upstream_model="scripted",
        max_context=CONTEXT,
        api_keys=[KEY],
    )
    shares = {"Ingress": 0.15, "DrafterScorer": 0.6, "SegmentProbe": 0.05, "TargetModel": 0.05}
    for dep in agents["deployments"]:
        dep["ray_actor_options"]["num_cpus"] = shares[dep["name"]]
    embedded = copy.deepcopy(template)
    embedded.update(name="embedded", route_prefix="/embedded")
    # the embedded 135M model rambles at the clients' temperature: a small cap bounds each
    # answer's decode on the CPU (the clients report a cut-off answer themselves)
    embedded["args"].update(api_keys=[KEY], max_output_tokens=48)
    shares = {"Ingress": 0.15, "DrafterScorer": 0.35, "SegmentProbe": 0.05, "TargetModel": 0.55}
    for dep in embedded["deployments"]:
        dep["ray_actor_options"]["num_cpus"] = shares[dep["name"]]
    base["applications"] = [agents, embedded]
    path = tmp / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    root = tmp_path_factory.mktemp("agent-repo") / "repo"
    names = session.make_repository(root)
    return root, names


@pytest.fixture(scope="module")
def target(repo):
    root, names = repo
    scripts = {
        "claude": session.claude_steps(root, names),
        "codex": session.codex_steps(root, names),
    }
    scripted = ScriptedTarget(scripts, session.FINAL_ANSWER, CONTEXT)
    yield scripted
    scripted.close()


@pytest.fixture(scope="module")
def app(tmp_path_factory, target):
    tmp = tmp_path_factory.mktemp("agents-app")
    port = free_port()
    upstream = f"http://127.0.0.1:{target.port}/v1"
    cluster = ServeCluster(_config(tmp, port, upstream), tmp)
    http = f"http://127.0.0.1:{port}"
    ping = {"model": "pflash", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
    try:
        cluster.start(f"{http}/embedded/v1/messages", ping, headers={"x-api-key": KEY})
        deadline = time.time() + 300
        while httpx.post(f"{http}/v1/messages", json=ping, headers={"x-api-key": KEY}, timeout=120).status_code != 200:  # fmt: skip
            assert time.time() < deadline, "the agents app did not come up"
            time.sleep(2)
        target.served.clear()
        yield http
    finally:
        cluster.stop()


def _run(cmd: list[str], cwd: Path, env: dict, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def _session(client: str, app: str, repo, tmp: Path, target: ScriptedTarget | None = None):
    """Run `client` (claude or codex) through a recording proxy to `app`: (the completed
    process, the proxy's exchanges, the prompts the target was served for them)."""
    root, _ = repo
    home = tmp / f"home-{client}"
    home.mkdir()
    proxy = RecordingProxy(app)
    first = len(target.served) if target is not None else 0
    base = f"http://127.0.0.1:{proxy.port}"
    try:
        if client == "claude":
            done = _run(session.claude_command(), root, session.claude_env(base, home, KEY))
        else:
            session.codex_home(home, base + "/v1")
            done = _run(session.codex_command(), root, session.codex_env(home, KEY))
    finally:
        proxy.close()
    served = target.served[first:] if target is not None else []
    return done, proxy.exchanges, served


def _generations(exchanges: list[dict]) -> list[dict]:
    return [e for e in exchanges if e["path"].split("?")[0] in ("/v1/messages", "/v1/responses")]


def _check_session(exchanges: list[dict], served: list[dict], client: str) -> list[dict]:
    """What every session must show; returns each step's pflash stats."""
    assert [e["status"] for e in exchanges if e["status"] >= 400] == []
    steps = _generations(exchanges)
    assert len(steps) >= 6, [e["path"] for e in exchanges]  # 5+ tool steps and the answer
    assert len(served) == len(steps)
    stats = []
    for exchange, prompt in zip(steps, served, strict=True):
        body = exchange["request"]
        assert prompt["client"] == client
        # 100% of the instruction lines and every tool schema, in every served prompt
        assert missing(prompt["prompt"], instruction_lines(body)) == []
        assert missing(prompt["prompt"], tool_schemas(body)) == []
        usage = stream_usage(exchange["response"])
        stats.append(usage["pflash"])
    # the first request (harness and question) is served as sent, without the drafter
    first, last = stats[0], stats[-1]
    assert first["served_ratio"] == 1.0
    assert first["stop_reason"] in ("droppable_below_threshold", "nothing_to_drop")
    # the tool output grew the session by 30K+ tokens, and was compressed
    totals = [round(s["compressed_tokens"] / s["served_ratio"]) for s in stats]
    print(client, [(t, round(s["served_ratio"], 3), s["view"]["mode"]) for t, s in zip(totals, stats, strict=True)])  # fmt: skip
    assert totals[-1] - totals[0] > 30_000
    assert last["served_ratio"] < 0.75
    # once a view exists it continues across steps: never rebuilt
    modes = [s["view"]["mode"] for s in stats]
    assert "fresh" in modes and "rebuild" not in modes
    after = modes[modes.index("fresh") + 1 :]
    assert after and set(after) <= {"continue", "continue-compressed", "repeat"}
    return stats


def test_claude_code_runs_a_multi_step_session_with_its_instructions_intact(
    app, repo, target, tmp_path
):
    done, exchanges, served = _session("claude", app, repo, tmp_path, target)
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["subtype"], result["is_error"]) == ("success", False), done.stderr[-3000:]
    assert result["result"] == session.FINAL_ANSWER
    _check_session(exchanges, served, "claude")
    # the session's own count and the model discovery Claude Code uses answer
    last = _generations(exchanges)[-1]["request"]
    counted = {k: last[k] for k in ("model", "messages", "system", "tools")}
    headers = {"x-api-key": KEY, "anthropic-version": "2023-06-01"}
    r = httpx.post(f"{app}/v1/messages/count_tokens?beta=true", json=counted, headers=headers)
    usage = stream_usage(_generations(exchanges)[-1]["response"])
    assert r.status_code == 200
    assert r.json()["input_tokens"] == usage["input_tokens"] + usage["cache_read_input_tokens"]
    models = httpx.get(f"{app}/v1/models", headers=headers).json()
    assert [m["id"] for m in models["data"]] == ["pflash"]


def test_codex_runs_a_multi_step_session_with_its_instructions_intact(app, repo, target, tmp_path):
    done, exchanges, served = _session("codex", app, repo, tmp_path, target)
    events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert events[-1]["type"] == "turn.completed", done.stdout[-3000:] + done.stderr[-3000:]
    answers = [
        e["item"]["text"] for e in events if e.get("item", {}).get("type") == "agent_message"
    ]
    assert answers == [session.FINAL_ANSWER]
    commands = [e["item"] for e in events if e.get("item", {}).get("type") == "command_execution" and e["type"] == "item.completed"]  # fmt: skip
    assert len(commands) >= 5 and all(c["exit_code"] == 0 for c in commands)
    _check_session(exchanges, served, "codex")
    last = _generations(exchanges)[-1]["request"]
    auth = {"authorization": f"Bearer {KEY}"}
    counted = {k: last[k] for k in ("model", "input", "tools", "instructions") if k in last}
    r = httpx.post(f"{app}/v1/responses/input_tokens", json=counted, headers=auth)
    usage = stream_usage(_generations(exchanges)[-1]["response"])
    assert r.status_code == 200 and r.json()["input_tokens"] == usage["input_tokens"]
    assert httpx.get(f"{app}/v1/models", headers=auth).json()["data"][0]["id"] == "pflash"


@pytest.mark.parametrize("client", ["claude", "codex"])
def test_a_session_on_the_embedded_model_is_answered_end_to_end(app, repo, tmp_path, client):
    """The shipped embedded configuration serves each client's real harness: every request
    is answered (200, the whole stream, a stop reason), the harness's first request is
    served as sent, and the client reaches its own end of the run. The 135M model's answers
    are noise that runs until the cap (48 tokens here); Claude Code and Codex report such a
    cut-off answer as their own error, which is the model's length, not a failed request."""
    done, exchanges, _ = _session(client, app + "/embedded", repo, tmp_path)
    steps = _generations(exchanges)
    assert steps and [e["status"] for e in exchanges if e["status"] >= 400] == []
    for exchange in steps:
        usage = stream_usage(exchange["response"])
        assert usage is not None and usage["output_tokens"] > 0, exchange["response"][-500:]
    first = stream_usage(steps[0]["response"])["pflash"]
    assert first["served_ratio"] == 1.0
    assert first["stop_reason"] in ("droppable_below_threshold", "nothing_to_drop")
    if client == "claude":
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert result["type"] == "result" and result["subtype"] == "success", done.stdout[-3000:]
    else:
        events = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
        last = events[-1]
        assert last["type"] == "turn.completed" or (
            last["type"] == "turn.failed" and "max_output_tokens" in last["error"]["message"]
        ), done.stdout[-3000:]
