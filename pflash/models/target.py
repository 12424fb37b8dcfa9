"""Target backends: the model that prefills the (compressed) prompt and generates the answer.

One contract (`TargetBackend`), two backends:

- `TransformersTarget` runs a loaded causal LM in this process (the embedded default). It
  keeps KV prefix snapshots so a conversation's served prefix is prefilled once: the
  snapshot is cut at the view's generation-prompt start (`snapshot_cut`, ALGORITHM §6.3),
  and the next turn, which extends that prefix, prefills only its new tokens.
- `OpenAITarget` forwards to an OpenAI-compatible upstream (vLLM, SGLang, llama.cpp server,
  another PFlash gateway). The served prompt already carries the chat template, so it goes
  out as a raw `/v1/completions` prompt; the upstream's own prefix cache does the reuse.

Torch is imported lazily, so the ingress can import the contract types without it.
"""

from __future__ import annotations

import abc
import asyncio
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pflash.errors import InvalidRequest, PFlashError

if TYPE_CHECKING:
    import httpx
    import torch

    from pflash.config import PFlashConfig

log = logging.getLogger(__name__)

FinishReason = Literal["stop", "length", "tool_calls"]


# ---------------------------------------------------------------------- contract data


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. `temperature == 0` is greedy; `max_tokens=None` means up to the context."""

    max_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequest("max_tokens must be at least 1", param="max_tokens")
        if not 0 <= self.temperature <= 2:
            raise InvalidRequest("temperature must be in [0, 2]", param="temperature")
        if not 0 < self.top_p <= 1:
            raise InvalidRequest("top_p must be in (0, 1]", param="top_p")
        if any(not s for s in self.stop):
            raise InvalidRequest("stop strings must not be empty", param="stop")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class TokenDelta:
    """A piece of the answer: `text` is complete UTF-8 (never a broken character).

    `token_ids` are the target tokens the piece came from (empty when the backend does not
    know them, e.g. an upstream server). `tool_calls` carries OpenAI tool-call deltas
    verbatim from a chat passthrough; the text is then often empty.
    """

    text: str
    token_ids: tuple[int, ...] = ()
    tool_calls: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class GenerationTimings:
    """llama.cpp-style timings of one generation, in tokens and milliseconds.

    `prompt_n` is the prompt tokens actually prefilled; `cache_n` the prompt tokens reused
    from a cached prefix (so `prompt_n + cache_n` is the served prompt length);
    `predicted_n` every sampled token, including the one that ended generation.
    """

    prompt_n: int
    prompt_ms: float
    predicted_n: int
    predicted_ms: float
    cache_n: int


@dataclass(frozen=True)
class GenerationDone:
    """The last event of every successful generation."""

    finish_reason: FinishReason
    timings: GenerationTimings


GenerationEvent = TokenDelta | GenerationDone


@dataclass
class GenerationResult:
    """A whole generation collected from its events (for non-streaming responses)."""

    text: str
    token_ids: list[int]
    tool_calls: list[dict[str, Any]]
    finish_reason: FinishReason
    timings: GenerationTimings


async def collect_generation(events: AsyncIterator[GenerationEvent]) -> GenerationResult:
    """Drain a generation stream into one result."""
    pieces: list[str] = []
    ids: list[int] = []
    calls: list[dict[str, Any]] = []
    async for event in events:
        if isinstance(event, GenerationDone):
            return GenerationResult("".join(pieces), ids, calls, event.finish_reason, event.timings)
        pieces.append(event.text)
        ids.extend(event.token_ids)
        calls.extend(event.tool_calls)
    raise GenerationFailed("the generation stream ended without a final event")


class GenerationFailed(PFlashError):
    """The target failed while generating (a model error, not bad input)."""

    http_status = 500
    error_type = "target_error"

    def __init__(self, message: str):
        super().__init__(f"target generation failed: {message}", code="target_generation")


class UpstreamError(PFlashError):
    """The upstream OpenAI-compatible server failed: an HTTP error, a broken stream, no answer.

    `upstream_status` is the upstream's HTTP status when it sent one. The client gets 502
    (504 for `UpstreamTimeout`) with a message naming the upstream and what it said.
    """

    http_status = 502
    error_type = "upstream_error"

    def __init__(
        self, message: str, *, upstream_status: int | None = None, code: str = "upstream_error"
    ):
        super().__init__(message, code=code)
        self.upstream_status = upstream_status


class UpstreamTimeout(UpstreamError):
    """The upstream did not answer (connect or read) within the configured time."""

    http_status = 504
    error_type = "upstream_timeout"


def max_new_tokens(prompt_len: int, params: SamplingParams, max_context: int) -> int:
    """Tokens this generation may produce: `max_tokens` clamped to the context left.

    A prompt that leaves no room is a 400 ("context overflow", ALGORITHM §8.2).
    """
    room = max_context - prompt_len
    if room <= 0:
        raise InvalidRequest(
            f"context overflow: the prompt has {prompt_len} tokens and the target's context is "
            f"{max_context}",
            code="context_length_exceeded",
        )
    return room if params.max_tokens is None else min(params.max_tokens, room)


# ---------------------------------------------------------------------- the contract


class TargetBackend(abc.ABC):
    """The target model behind PFlash. Every backend keeps exactly this contract.

    `generate(prompt_ids, params, *, snapshot_cut, session_id)` is an async iterator of
    `GenerationEvent`s:

    - zero or more `TokenDelta`s, in order, each with non-empty `text` of complete UTF-8
      characters (or tool-call deltas); joined they are the answer. Stop strings are never
      part of the text; an EOS token is never part of the text or the token ids;
    - then exactly one `GenerationDone` with `finish_reason` ("stop": EOS or a stop string;
      "length": `max_tokens` or the context ran out; "tool_calls": only from a chat
      passthrough) and `timings` (`prompt_n` tokens actually prefilled, `cache_n` prefix
      tokens reused, `predicted_n` tokens sampled, milliseconds for both phases).

    `prompt_ids` are target-vocabulary tokens of the fully rendered prompt: the chat
    template and generation prompt are already applied, and a backend never applies them
    again. `snapshot_cut` is the token index where the view's generation prompt starts
    (ALGORITHM §6.3): a backend that keeps prefix snapshots stores `prompt_ids[:cut]` (the
    whole prompt when None) and never the generated tokens. `session_id` is an affinity and
    cache hint only; a backend must give the same answer without it.

    Failures raise typed `PFlashError`s, before the first event or mid-stream: bad input
    (`InvalidRequest`, e.g. a prompt longer than the context), a failing model
    (`GenerationFailed`), a failing upstream (`UpstreamError`, `UpstreamTimeout`). Closing
    the iterator early (client went away) stops the generation.

    `tokenizer` is the target tokenizer the prompt ids come from; `max_context` the target's
    context length in tokens (prompt plus answer).
    """

    tokenizer: Any
    max_context: int

    @abc.abstractmethod
    def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        snapshot_cut: int | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        """Stream the answer to `prompt_ids` (see the class docstring for the contract)."""

    async def aclose(self) -> None:  # noqa: B027 - optional hook, most backends hold nothing
        """Release threads, connections and caches."""


# ---------------------------------------------------------------------- detokenising


class StreamingDecoder:
    """Token ids in, safe text out: complete UTF-8 only, stop strings cut, never emitted.

    Incremental detokenisation decodes a short window of recent tokens twice (with and
    without the newest) and emits the difference, holding it back while it ends in a
    replacement character (a multi-byte character split across tokens). The last prompt
    tokens seed the window so tokenizers that drop a leading space at the start of a
    decode still render the first answer token right.

    Stop strings: text is emitted only up to the longest suffix that could still start a
    stop string, so a stop string is cut cleanly even when it spans several tokens.
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = (), *, context: Sequence[int] = ()):
        self._tok = tokenizer
        self._stop = tuple(stop)
        self._ids: list[int] = list(context)[-5:]
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._text = ""  # decoded answer text so far
        self._sent = 0  # characters of _text already emitted
        self.stopped = False

    def _decode(self, ids: list[int]) -> str:
        return self._tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def push(self, token_id: int) -> str:
        """Add one token; return the text that is now safe to emit (may be empty)."""
        if self.stopped:
            return ""
        self._ids.append(token_id)
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._text += full[len(prefix) :]
            self._prefix_offset = self._read_offset
            self._read_offset = len(self._ids)
        return self._release()

    def finish(self) -> str:
        """End of generation: return the rest, including text held back for stop strings."""
        if self.stopped:
            return ""
        prefix = self._decode(self._ids[self._prefix_offset : self._read_offset])
        full = self._decode(self._ids[self._prefix_offset :])
        self._text += full[len(prefix) :]
        self._prefix_offset = self._read_offset = len(self._ids)
        out = self._text[self._sent :]
        self._sent = len(self._text)
        return out

    def _release(self) -> str:
        text, start = self._text, self._sent
        hits = [i for i in (text.find(s, start) for s in self._stop) if i >= 0]
        if hits:
            self.stopped = True
            self._sent = len(text)
            return text[start : min(hits)]
        hold = 0
        for s in self._stop:
            for k in range(min(len(s) - 1, len(text) - start), hold, -1):
                if text.endswith(s[:k]):
                    hold = k
                    break
        end = len(text) - hold
        self._sent = end
        return text[start:end]


# ---------------------------------------------------------------------- transformers target


@dataclass
class _Snapshot:
    ids: torch.Tensor  # [T] token ids the snapshot covers
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values): [1, Hkv, T, D]


class PrefixSnapshots:
    """LRU of KV snapshots keyed by the token prefix they cover (full-attention caches).

    `lookup` finds the snapshot sharing the longest common prefix with a prompt; any
    common prefix is reusable because a causal model's KV at position i depends only on
    tokens <= i. A stored prefix that a newer snapshot extends is dropped (the newer one
    covers it). Not thread-safe: the owning target touches it from its one worker thread.
    """

    def __init__(self, capacity: int):
        self.capacity = capacity
        self._items: OrderedDict[int, _Snapshot] = OrderedDict()
        self._next_key = 0

    def __len__(self) -> int:
        return len(self._items)

    @staticmethod
    def _common_prefix(a: torch.Tensor, b: torch.Tensor) -> int:
        n = min(a.numel(), b.numel())
        diff = (a[:n] != b[:n]).nonzero()
        return int(diff[0]) if diff.numel() else n

    def lookup(self, ids: torch.Tensor) -> tuple[int, _Snapshot | None]:
        """(common prefix length, snapshot) of the best match; (0, None) when none."""
        best, best_key = 0, None
        for key, snap in self._items.items():
            n = self._common_prefix(snap.ids, ids)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        self._items.move_to_end(best_key)
        return best, self._items[best_key]

    def store(self, ids: torch.Tensor, layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        if self.capacity <= 0 or ids.numel() == 0:
            return
        for key, snap in list(self._items.items()):
            n = self._common_prefix(snap.ids, ids)
            if n == ids.numel():  # an existing snapshot already covers this prefix
                self._items.move_to_end(key)
                return
            if n == snap.ids.numel():  # the new snapshot extends this one
                del self._items[key]
        self._items[self._next_key] = _Snapshot(ids, layers)
        self._next_key += 1
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


@dataclass
class _Decoding:
    """One generation's live state; owned by the worker thread between steps."""

    cache: Any  # transformers DynamicCache
    logits: torch.Tensor  # [V] next-token logits
    generator: torch.Generator | None
    cache_n: int = 0
    prompt_ms: float = 0.0
    params: SamplingParams = field(default_factory=SamplingParams)


def sample_token(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> int:
    """Greedy at temperature 0; otherwise temperature, then nucleus (top_p), then a draw."""
    import torch

    if params.greedy:
        return int(torch.argmax(logits))
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)  # [V]
    if params.top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True)
        outside = torch.cumsum(sorted_probs, dim=-1) - sorted_probs > params.top_p
        sorted_probs[outside] = 0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator))


class TransformersTarget(TargetBackend):
    """In-process generation with a transformers causal LM, with KV prefix snapshots.

    All torch work runs on one dedicated worker thread, one step at a time (prefill, then
    one call per token), so the event loop stays responsive and concurrent generations
    interleave token by token. The prompt's snapshot is copied right after prefill, before
    any token is generated, so it holds exactly `prompt_ids[:snapshot_cut]` and is there
    even if the client leaves mid-answer. Snapshots need a plain full-attention `DynamicCache`
    (llama, qwen2/3, SmolLM2); for models with sliding-window or linear-attention layers
    they are off and every prompt is prefilled whole.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_context: int | None = None,
        num_threads: int | None = None,
        snapshot_capacity: int = 4,
        prefill_chunk: int = 1024,
    ):
        import torch
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        self.model = model
        self.tokenizer = tokenizer
        config = model.config.get_text_config(decoder=True)
        self.max_context = int(
            max_context
            or getattr(config, "max_position_embeddings", 0)
            or tokenizer.model_max_length
        )
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self.eos_ids = self._eos_ids(model, tokenizer)
        probe = DynamicCache(config=model.config)
        full_attention = all(type(layer) is DynamicLayer for layer in probe.layers)
        self.snapshots = PrefixSnapshots(snapshot_capacity if full_attention else 0)
        if not full_attention:
            log.info("target cache is not plain full attention: prefix snapshots are off")
        if num_threads is not None:
            torch.set_num_threads(num_threads)
        # intra-op thread counts can be per thread (OpenMP), so set it in the worker too
        self._worker = ThreadPoolExecutor(
            max_workers=1,
            thread_name_prefix="pflash-target",
            initializer=torch.set_num_threads if num_threads is not None else None,
            initargs=(num_threads,) if num_threads is not None else (),
        )

    @classmethod
    def from_config(
        cls, config: PFlashConfig, *, num_threads: int | None = None
    ) -> TransformersTarget:
        from pflash.models.loading import load_causal_lm, resolve_device
        from pflash.models.source import load_tokenizer

        loaded = load_causal_lm(config.target, device=resolve_device(config.device))
        tokenizer = load_tokenizer(config.target_tokenizer or config.target)
        return cls(loaded.model, tokenizer, max_context=config.max_context, num_threads=num_threads)

    @staticmethod
    def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
        ids: set[int] = set()
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list | tuple) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        return frozenset(int(i) for i in ids)

    async def aclose(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ stages (worker thread)

    def _prefill(
        self, prompt_ids: list[int], snapshot_cut: int, params: SamplingParams
    ) -> _Decoding:
        """Reuse the longest cached prefix, run the rest, store the prompt's snapshot."""
        import torch
        from transformers import DynamicCache

        t0 = time.perf_counter()
        ids = torch.tensor(prompt_ids, dtype=torch.long)  # [S]
        reused, snap = self.snapshots.lookup(ids)
        reused = min(reused, len(prompt_ids) - 1)  # the last token must run to give logits
        if snap is not None and reused > 0:
            cache = DynamicCache(
                ddp_cache_data=[(k[:, :, :reused], v[:, :, :reused]) for k, v in snap.layers],
                config=self.model.config,
            )
        else:
            reused, cache = 0, DynamicCache(config=self.model.config)
        rest = ids[reused:].to(self.device).unsqueeze(0)  # [1, S - reused]
        with torch.inference_mode():
            for begin in range(0, rest.shape[1], self.prefill_chunk):
                chunk = rest[:, begin : begin + self.prefill_chunk]
                out = self.model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1)
        logits = out.logits[0, -1]  # [V]
        if snapshot_cut > 0 and self.snapshots.capacity > 0:
            layers = [
                (k[:, :, :snapshot_cut].clone(), v[:, :, :snapshot_cut].clone())
                for k, v, *_ in cache
            ]
            self.snapshots.store(ids[:snapshot_cut].clone(), layers)
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(
                params.seed if params.seed is not None else random.getrandbits(63)
            )
        prompt_ms = (time.perf_counter() - t0) * 1000
        return _Decoding(cache, logits, generator, reused, prompt_ms, params)

    def _decode_one_token(self, state: _Decoding, prev: int | None) -> int:
        """Feed the previous token (if any) and sample the next one."""
        import torch

        if prev is not None:
            with torch.inference_mode():
                token = torch.tensor([[prev]], dtype=torch.long, device=self.device)  # [1, 1]
                out = self.model(input_ids=token, cache=state.cache, use_cache=True)
            state.logits = out.logits[0, -1]
        return sample_token(state.logits, state.params, state.generator)

    # ------------------------------------------------------------------ the contract

    def _check_prompt(self, prompt_ids: list[int], snapshot_cut: int | None) -> int:
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        bad = next((t for t in prompt_ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise InvalidRequest(
                f"token id {bad} is outside the target vocabulary [0, {self.vocab_size})",
                param="prompt",
            )
        cut = len(prompt_ids) if snapshot_cut is None else snapshot_cut
        if not 0 <= cut <= len(prompt_ids):
            raise ValueError(f"snapshot_cut {snapshot_cut} outside [0, {len(prompt_ids)}]")
        return cut

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        snapshot_cut: int | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        prompt_ids = [int(t) for t in prompt_ids]
        cut = self._check_prompt(prompt_ids, snapshot_cut)
        budget = max_new_tokens(len(prompt_ids), params, self.max_context)
        loop = asyncio.get_running_loop()
        decoder = StreamingDecoder(self.tokenizer, params.stop, context=prompt_ids)
        try:
            state = await loop.run_in_executor(self._worker, self._prefill, prompt_ids, cut, params)
        except PFlashError:
            raise
        except Exception as exc:
            raise GenerationFailed(f"prefill: {type(exc).__name__}: {exc}") from exc
        t_decode = time.perf_counter()
        finish: FinishReason = "length"
        pending: list[int] = []
        predicted, prev = 0, None
        while predicted < budget:
            try:
                token = await loop.run_in_executor(
                    self._worker, self._decode_one_token, state, prev
                )
            except Exception as exc:
                raise GenerationFailed(f"decode: {type(exc).__name__}: {exc}") from exc
            predicted += 1
            if token in self.eos_ids:
                finish = "stop"
                break
            pending.append(token)
            text = decoder.push(token)
            if text:
                yield TokenDelta(text, tuple(pending))
                pending = []
            if decoder.stopped:
                finish = "stop"
                break
            prev = token
        tail = decoder.finish()
        if tail:
            yield TokenDelta(tail, tuple(pending))
        timings = GenerationTimings(
            prompt_n=len(prompt_ids) - state.cache_n,
            prompt_ms=state.prompt_ms,
            predicted_n=predicted,
            predicted_ms=(time.perf_counter() - t_decode) * 1000,
            cache_n=state.cache_n,
        )
        yield GenerationDone(finish, timings)


# ---------------------------------------------------------------------- OpenAI upstream


class _UpstreamStream:
    """Turns upstream completion/chat chunks into our events and measures what it can."""

    def __init__(self, prompt_len: int, t_start: float):
        self.prompt_len = prompt_len
        self.t_start = t_start
        self.t_first: float | None = None
        self.finish: FinishReason = "stop"
        self.usage: dict[str, Any] | None = None
        self.timings: dict[str, Any] | None = None
        self.pieces = 0

    def feed(self, chunk: dict[str, Any]) -> TokenDelta | None:
        if "error" in chunk:
            err = chunk["error"]
            message = err.get("message") if isinstance(err, dict) else str(err)
            raise UpstreamError(f"upstream failed mid-stream: {message}")
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            if isinstance(self.usage.get("timings"), dict):  # a PFlash gateway upstream
                self.timings = self.usage["timings"]
        if isinstance(chunk.get("timings"), dict):  # llama.cpp server
            self.timings = chunk["timings"]
        choices = chunk.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        reason = choice.get("finish_reason")
        if reason:
            self.finish = reason if reason in ("stop", "length", "tool_calls") else "stop"
        if "message" in choice or "delta" in choice:
            body = choice.get("delta") or choice.get("message") or {}
            text, calls = body.get("content") or "", tuple(body.get("tool_calls") or ())
        else:
            text, calls = choice.get("text") or "", ()
        if not text and not calls:
            return None
        if self.t_first is None:
            self.t_first = time.perf_counter()
        self.pieces += 1
        return TokenDelta(text, (), calls)

    def done(self) -> GenerationDone:
        t_end = time.perf_counter()
        t_first = self.t_first if self.t_first is not None else t_end
        usage = self.usage or {}
        cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        t = self.timings or {}
        timings = GenerationTimings(
            prompt_n=int(
                t.get("prompt_n", max(0, usage.get("prompt_tokens", self.prompt_len) - cached))
            ),
            prompt_ms=float(t.get("prompt_ms", (t_first - self.t_start) * 1000)),
            predicted_n=int(t.get("predicted_n", usage.get("completion_tokens", self.pieces))),
            predicted_ms=float(t.get("predicted_ms", (t_end - t_first) * 1000)),
            cache_n=int(t.get("cache_n", cached)),
        )
        return GenerationDone(self.finish, timings)


class OpenAITarget(TargetBackend):
    """An upstream OpenAI-compatible server as the target.

    `generate` sends the served prompt to `{base_url}/completions` as a raw prompt: as text
    (`prompt_format="text"`, works with every server; a leading BOS is dropped when the
    tokenizer adds one itself, so it is not doubled) or as token ids
    (`prompt_format="token_ids"`, exact; vLLM, SGLang and llama.cpp accept it).
    `generate_chat` passes an uncompressed chat through to `{base_url}/chat/completions`.
    With `stream=True` (default) the upstream streams SSE and deltas are forwarded as they
    arrive; with False one response is read and yielded as a single delta.

    Timings: the upstream's llama.cpp-style `timings` when it sends them; otherwise
    `cache_n` from `usage.prompt_tokens_details.cached_tokens`, `prompt_ms` is the time to
    the first delta and `predicted_ms` the time from there to the end, as seen here.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        tokenizer: Any,
        max_context: int,
        *,
        api_key: str | None = None,
        prompt_format: Literal["text", "token_ids"] = "text",
        stream: bool = True,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        client: httpx.AsyncClient | None = None,
    ):
        import httpx

        self.base_url = base_url.rstrip("/")
        self.model = model
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.prompt_format = prompt_format
        self.stream = stream
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout_s, connect=connect_timeout_s), headers=headers
        )
        encoded = tokenizer("x", add_special_tokens=True)["input_ids"]
        bos = tokenizer.bos_token_id
        self._upstream_adds_bos = bos is not None and bool(encoded) and encoded[0] == bos

    @classmethod
    def from_config(cls, config: PFlashConfig, tokenizer: Any, max_context: int) -> OpenAITarget:
        if not config.upstream_base_url:
            raise ValueError("OpenAITarget needs upstream_base_url")
        return cls(
            config.upstream_base_url,
            config.upstream_model or config.target,
            tokenizer,
            max_context,
            api_key=config.upstream_api_key,
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    def _prompt(self, prompt_ids: list[int]) -> str | list[int]:
        if self.prompt_format == "token_ids":
            return prompt_ids
        if self._upstream_adds_bos and prompt_ids[0] == self.tokenizer.bos_token_id:
            prompt_ids = prompt_ids[1:]
        return self.tokenizer.decode(
            prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )

    @staticmethod
    def _sampling_body(params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {"temperature": params.temperature, "top_p": params.top_p}
        if params.stop:
            body["stop"] = list(params.stop)
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    async def generate(
        self,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        snapshot_cut: int | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty", param="prompt")
        body = {
            "model": self.model,
            "prompt": self._prompt(prompt_ids),
            "max_tokens": max_new_tokens(len(prompt_ids), params, self.max_context),
            **self._sampling_body(params),
        }
        async for event in self._request("/completions", body, len(prompt_ids), session_id):
            yield event

    async def generate_chat(
        self,
        messages: list[dict[str, Any]],
        params: SamplingParams,
        *,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        prompt_tokens: int | None = None,
        session_id: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        """Pass an uncompressed chat through; the upstream applies its own chat template.

        Same events as `generate`. `prompt_tokens` (the rendered prompt length, when known)
        clamps `max_tokens` to the context and fills `prompt_n` if the upstream sends no usage.
        """
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            **self._sampling_body(params),
        }
        if prompt_tokens is not None:
            body["max_tokens"] = max_new_tokens(prompt_tokens, params, self.max_context)
        elif params.max_tokens is not None:
            body["max_tokens"] = params.max_tokens
        if tools:
            body["tools"] = tools
        if chat_template_kwargs:
            body["chat_template_kwargs"] = chat_template_kwargs
        async for event in self._request("/chat/completions", body, prompt_tokens or 0, session_id):
            yield event

    async def _request(
        self, path: str, body: dict[str, Any], prompt_len: int, session_id: str | None
    ) -> AsyncIterator[GenerationEvent]:
        import httpx

        url = self.base_url + path
        headers = {"x-session-id": session_id} if session_id else {}
        body = {**body, "stream": self.stream}
        if self.stream:
            body["stream_options"] = {"include_usage": True}
        state = _UpstreamStream(prompt_len, time.perf_counter())
        try:
            if not self.stream:
                response = await self._client.post(url, json=body, headers=headers)
                if response.status_code >= 400:
                    raise self._status_error(url, response.status_code, response.text)
                delta = state.feed(self._json(url, response.text))
                if delta is not None:
                    yield delta
                yield state.done()
                return
            async with self._client.stream("POST", url, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    text = (await response.aread()).decode("utf-8", "replace")
                    raise self._status_error(url, response.status_code, text)
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, ": keep-alive" comments, event: lines
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    delta = state.feed(self._json(url, data))
                    if delta is not None:
                        yield delta
            yield state.done()
        except httpx.TimeoutException as exc:
            raise UpstreamTimeout(
                f"upstream {url} timed out ({type(exc).__name__})", code="upstream_timeout"
            ) from exc
        except httpx.ConnectError as exc:
            raise UpstreamError(
                f"cannot connect to upstream {url}: {exc}", code="upstream_unreachable"
            ) from exc
        except httpx.HTTPError as exc:
            raise UpstreamError(f"upstream {url} failed: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    def _json(url: str, text: str) -> dict[str, Any]:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UpstreamError(f"upstream {url} sent invalid JSON: {text[:200]!r}") from exc
        if not isinstance(data, dict):
            raise UpstreamError(f"upstream {url} sent a non-object: {text[:200]!r}")
        return data

    @staticmethod
    def _status_error(url: str, status: int, text: str) -> UpstreamError:
        message = text.strip()[:500]
        try:
            err = json.loads(text).get("error")
            message = err.get("message", message) if isinstance(err, dict) else str(err or message)
        except (json.JSONDecodeError, AttributeError):
            pass
        return UpstreamError(
            f"upstream {url} returned HTTP {status}: {message}",
            upstream_status=status,
            code=f"upstream_http_{status}",
        )
