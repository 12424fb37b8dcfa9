"""`pflash compress FILE` with the real embedded drafter (pflash/cli/compress.py via pflash.cli).

Prompts are ~1K target tokens so one compression takes a couple of seconds on one thread;
the drafter is loaded once for the module (`load_drafter` caches it per process).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pflash.cli import main
from pflash.compress.render.chat import render_chat
from pflash.config import EMBEDDED_SMOLLM2
from pflash.serving.usage import PFlashStats

GENERATION_PROMPT = "<|im_start|>assistant\n"
STATS_NAMES = {"prompt_tokens", *PFlashStats.model_fields} - {"view"}
DOCUMENT = "\n".join(
    f"District {i} reported {100 + 37 * i % 900} units of grain in March, after a dry winter."
    for i in range(1, 45)
)
QUESTION = "Which district reported the most units?"
REQUIRED = "District 37 reported 569 units"
CHAT = {
    "messages": [
        {"role": "system", "content": "You are a careful analyst."},
        {"role": "user", "content": f"{DOCUMENT}\n\n{QUESTION}"},
    ],
    "pflash_required": [REQUIRED],
}
PLAIN = f"{DOCUMENT}\n\nQuestion: {QUESTION}\nAnswer:"


@pytest.fixture(autouse=True)
def no_pflash_env(monkeypatch):
    import os

    for key in [k for k in os.environ if k.startswith("PFLASH_")]:
        monkeypatch.delenv(key)


@pytest.fixture(scope="module")
def drafter():
    import torch

    from pflash.cli.compress import load_drafter

    torch.set_num_threads(1)
    yield load_drafter(EMBEDDED_SMOLLM2)
    load_drafter.cache_clear()


def write(tmp_path: Path, payload, name="chat.json") -> str:
    path = tmp_path / name
    path.write_text(payload if isinstance(payload, str) else json.dumps(payload), encoding="utf-8")
    return str(path)


def chat_prompt_tokens(tokenizer) -> int:
    text = render_chat(tokenizer, CHAT["messages"])
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def target_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


@pytest.mark.model
def test_chat_file_prints_the_compressed_prompt_then_its_stats(
    tmp_path, capsys, drafter, smollm2_tokenizer
):
    code = main(["compress", write(tmp_path, CHAT), "--keep-ratio", "0.2", "--chunk-size", "64"])
    out = capsys.readouterr().out
    assert code == 0
    header, _, rest = out.partition("\n")
    prompt, _, stats_text = rest.rpartition("=== stats ===\n")
    stats = dict(line.split(None, 1) for line in stats_text.splitlines())
    n = chat_prompt_tokens(smollm2_tokenizer)
    compressed = target_tokens(smollm2_tokenizer, prompt)
    assert header == f"=== compressed prompt: {n} -> {compressed} target tokens ==="
    assert set(stats) == STATS_NAMES
    assert (int(stats["prompt_tokens"]), int(stats["compressed_tokens"])) == (n, compressed)
    assert compressed < n
    assert int(stats["segments"]) > 2  # the 64-token grid, not the length schedule
    assert prompt.startswith("<|im_start|>system\nYou are a careful analyst.<|im_end|>\n")
    assert prompt.endswith(f"{QUESTION}<|im_end|>\n{GENERATION_PROMPT}")


@pytest.mark.model
def test_json_stats_count_the_served_prompt_in_target_tokens(
    tmp_path, capsys, drafter, smollm2_tokenizer
):
    config = write(tmp_path, "mode: 'off'\nselect_chunk_size: 64\nkeep_ratio: 0.1\n", "c.yaml")
    assert main(["compress", write(tmp_path, CHAT), "--config", config, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    prompt, stats = report["prompt"], report["stats"]
    assert set(report) == {"prompt", "stats"} and set(stats) == STATS_NAMES
    assert stats["prompt_tokens"] == chat_prompt_tokens(smollm2_tokenizer)
    assert stats["compressed_tokens"] == target_tokens(smollm2_tokenizer, prompt)
    assert stats["compressed_tokens"] < stats["prompt_tokens"]  # mode off in YAML: still always
    assert stats["drafter_input_tokens"] == stats["prompt_tokens"]  # one tokenizer for both
    assert stats["query_rule"] == "prompt_end" and stats["stop_reason"] == "budget_reached"
    assert REQUIRED in prompt  # pflash_required is pinned
    assert prompt.endswith(GENERATION_PROMPT)


@pytest.mark.model
def test_plain_text_file_is_compressed_as_a_raw_prompt(
    tmp_path, capsys, drafter, smollm2_tokenizer
):
    path = write(tmp_path, PLAIN, "prompt.txt")
    assert main(["compress", path, "--json", "--chunk-size", "64"]) == 0
    report = json.loads(capsys.readouterr().out)
    stats = report["stats"]
    assert stats["prompt_tokens"] == len(smollm2_tokenizer(PLAIN)["input_ids"])
    assert stats["compressed_tokens"] == target_tokens(smollm2_tokenizer, report["prompt"])
    assert stats["compressed_tokens"] < stats["prompt_tokens"]
    assert stats["query_rule"] == "prompt_tail"
    assert report["prompt"].endswith("Answer:")


def run_failing(capsys, argv) -> str:
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Traceback" not in captured.err and captured.err.count("\n") == 1
    return captured.err


def test_missing_file_exits_2_with_one_line(tmp_path, capsys):
    missing = tmp_path / "absent.json"
    err = run_failing(capsys, ["compress", str(missing)])
    assert err.startswith("pflash compress: ") and str(missing) in err
    assert "No such file" in err


def test_bad_config_exits_2_naming_the_key(tmp_path, capsys):
    chat = write(tmp_path, CHAT)
    config = write(tmp_path, "keep_ratio: 2\n", "c.yaml")
    err = run_failing(capsys, ["compress", chat, "--config", config])
    assert err.startswith("pflash compress: invalid config keep_ratio=2:")
    err = run_failing(capsys, ["compress", chat, "--chunk-size", "0"])
    assert err.startswith("pflash compress: invalid config select_chunk_size=0:")
    err = run_failing(
        capsys, ["compress", chat, "--config", write(tmp_path, "bogus: 1\n", "b.yaml")]
    )
    # an unknown key's value is never shown: it may be a misspelt secret
    assert err.startswith("pflash compress: invalid config bogus='<redacted>': unknown key")


def test_bad_environment_value_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("PFLASH_KEEP_RATIO", "half")
    err = run_failing(capsys, ["compress", write(tmp_path, CHAT)])
    assert err == "pflash compress: invalid config keep_ratio='half': a number\n"


def test_json_without_messages_exits_2(tmp_path, capsys):
    err = run_failing(capsys, ["compress", write(tmp_path, {"input": "hi"})])
    assert err.endswith('a JSON file must be an object with "messages" (or "prompt")\n')
