"""`TransformersTarget`: a loaded causal LM in this process (the embedded default).

It keeps KV prefix snapshots so a conversation's served prefix is prefilled once: the
snapshot is cut at the view's generation-prompt start (`snapshot_cut`, ALGORITHM §6.3), and
the next turn, which extends that prefix, prefills only its new tokens. With an assistant
model it decodes greedy requests speculatively and reports the draft acceptance
(`GenerationDone.accept_rate`) that the adaptive keep ratio follows (§6.6). Torch is
imported lazily.

The model-free steps of its decode loop (sampling, speculative acceptance, streamed
detokenising with stop strings) are `decoding.py`'s.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pflash.errors import ConfigError, InvalidRequest, PFlashError

if TYPE_CHECKING:
    import torch

    from pflash.config import TargetModelPart

from pflash.models.target.constrained import FormatGuide, TokenMask
from pflash.models.target.decoding import StreamingDecoder, accept_drafts, sample_token
from pflash.models.target.protocol import (
    FinishReason,
    GenerationDone,
    GenerationEvent,
    GenerationFailed,
    GenerationTimings,
    SamplingParams,
    TargetBackend,
    TokenDelta,
    max_new_tokens,
)

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------- transformers target


@dataclass
class _Snapshot:
    ids: torch.Tensor  # [T] token ids the snapshot covers
    layers: list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values): [1, Hkv, T, D]
    scope: str | None = None  # the tenant whose prompt it is


class PrefixSnapshots:
    """LRU of KV snapshots keyed by the token prefix they cover (full-attention caches).

    `lookup` finds the snapshot sharing the longest common prefix with a prompt; any
    common prefix is reusable because a causal model's KV at position i depends only on
    tokens <= i. A stored prefix that a newer snapshot extends is dropped (the newer one
    covers it). Not thread-safe: the owning target touches it from its one worker thread.

    Snapshots are scoped by tenant: a prompt only reuses its own tenant's snapshots, since
    the reused length shows in `cache_n` and in the time to first token, and would let one
    tenant test guesses about another's prompts token by token.
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

    def lookup(self, ids: torch.Tensor, scope: str | None = None) -> tuple[int, _Snapshot | None]:
        """(common prefix length, snapshot) of the best match in `scope`; (0, None) when none."""
        best, best_key = 0, None
        for key, snap in self._items.items():
            if snap.scope != scope:
                continue
            n = self._common_prefix(snap.ids, ids)
            if n > best:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        self._items.move_to_end(best_key)
        return best, self._items[best_key]

    def store(
        self,
        ids: torch.Tensor,
        layers: list[tuple[torch.Tensor, torch.Tensor]],
        scope: str | None = None,
    ) -> None:
        if self.capacity <= 0 or ids.numel() == 0:
            return
        for key, snap in list(self._items.items()):
            if snap.scope != scope:
                continue
            n = self._common_prefix(snap.ids, ids)
            if n == ids.numel():  # an existing snapshot already covers this prefix
                self._items.move_to_end(key)
                return
            if n == snap.ids.numel():  # the new snapshot extends this one
                del self._items[key]
        self._items[self._next_key] = _Snapshot(ids, layers, scope)
        self._next_key += 1
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)


@dataclass
class _Decoding:
    """One generation's live state; owned by the worker thread between steps.

    `tokens` are the prompt and every token sampled so far (target vocabulary); the target's
    `cache` covers all of them but the last sampled one, which the next step feeds. When the
    request speculates, `draft_cache` is the assistant's KV cache over a prefix of `tokens`
    (it catches up on the rest at its next draft) and `proposed` / `accepted` count draft
    tokens; otherwise `draft_cache` is None.
    """

    cache: Any  # transformers DynamicCache, appending in place (`kv_buffer`)
    logits: torch.Tensor  # [V] logits the last sampled token was drawn from
    generator: torch.Generator | None
    cache_n: int = 0
    prompt_ms: float = 0.0
    params: SamplingParams = field(default_factory=SamplingParams)
    tokens: list[int] = field(default_factory=list)
    draft_cache: Any = None  # the assistant's DynamicCache
    proposed: int = 0
    accepted: int = 0
    mask: TokenMask | None = None  # the output format's grammar, when the request asks one

    @property
    def accept_rate(self) -> float | None:
        return self.accepted / self.proposed if self.proposed else None


def vocabulary_mismatch(target_tokenizer: Any, assistant_tokenizer: Any) -> str | None:
    """Why an assistant's tokenizer cannot draft for this target, or None when it can.

    Speculation feeds target token ids to the assistant and its draft ids back to the target
    unmapped, so both must use one vocabulary: the same token for every id.
    """
    target, draft = target_tokenizer.get_vocab(), assistant_tokenizer.get_vocab()
    if target == draft:
        return None
    if len(target) != len(draft):
        return f"the drafter's tokenizer has {len(draft)} tokens, the target's {len(target)}"
    token = min((t for t, i in target.items() if draft.get(t) != i), key=target.__getitem__)
    return (
        f"token {token!r} is id {target[token]} for the target but {draft.get(token)} "
        "for the drafter"
    )


def _refuse_assistant(name: str, why: str) -> ConfigError:
    return ConfigError(
        "speculative_drafter",
        name,
        f"speculative decoding needs a drafter that shares the target's tokenizer "
        f"(same vocabulary); {why}",
    )


class TransformersTarget(TargetBackend):
    """In-process generation with a transformers causal LM, with KV prefix snapshots.

    All torch work runs on one dedicated worker thread, one step at a time (prefill, then
    one call per decode step), so the event loop stays responsive and concurrent generations
    interleave step by step. The prompt's snapshot is copied right after prefill, before
    any token is generated, so it holds exactly `prompt_ids[:snapshot_cut]` and is there
    even if the client leaves mid-answer. Snapshots need a plain full-attention `DynamicCache`
    (llama, qwen2/3, SmolLM2); for models with sliding-window or linear-attention layers
    they are off and every prompt is prefilled whole.

    Speculative decoding (an `assistant`: a second causal LM sharing the target's tokenizer)
    runs for **greedy** requests only. Each step the assistant proposes up to
    `speculative_tokens` tokens greedily, the target verifies them in one forward, the
    longest agreeing prefix plus the target's own next token is kept, and both KV caches are
    cropped back to the kept tokens. The answer is token for token the one plain greedy
    decoding gives (up to floating-point near-ties between a one-token and a k-token
    forward); each step's accepted tokens stream as one delta, and `GenerationDone`
    reports the acceptance. **Sampling requests decode without speculation** (no rejection
    sampling here) and report `accept_rate` None. The assistant keeps its own prefix
    snapshots, cut like the target's; its prefill is counted in `prompt_ms`, while
    `prompt_n` and `cache_n` stay the target's.
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
        assistant: Any | None = None,
        assistant_tokenizer: Any | None = None,
        speculative_tokens: int = 4,
        assistant_snapshot_capacity: int | None = None,
    ):
        import torch

        self.model = model
        self.tokenizer = tokenizer
        config = model.config.get_text_config(decoder=True)
        self.max_context = int(
            max_context
            or getattr(config, "max_position_embeddings", 0)
            or tokenizer.model_max_length
        )
        self.vocab_size = int(model.get_input_embeddings().weight.shape[0])
        self.formats = FormatGuide(tokenizer, self.vocab_size, self._eos_ids(model, tokenizer))
        self.prefill_chunk = prefill_chunk
        self.device = next(model.parameters()).device
        self.eos_ids = self._eos_ids(model, tokenizer)
        self.snapshots = PrefixSnapshots(
            snapshot_capacity if self._full_attention(model, "target") else 0
        )
        self.assistant = assistant
        self.speculative_tokens = speculative_tokens
        if assistant is not None:
            self._check_assistant(assistant, assistant_tokenizer)
            capacity = (
                snapshot_capacity
                if assistant_snapshot_capacity is None
                else (assistant_snapshot_capacity)
            )
            full = self._full_attention(assistant, "assistant")
            self.draft_snapshots = PrefixSnapshots(capacity if full else 0)
            draft_config = assistant.config.get_text_config(decoder=True)
            self._assistant_context = int(
                getattr(draft_config, "max_position_embeddings", 0) or self.max_context
            )
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
        cls, config: TargetModelPart, *, num_threads: int | None = None
    ) -> TransformersTarget:
        """The target (and, with `speculative_tokens` > 0, its assistant) from the config:
        the TargetModel deployment's part, or in process the whole config.

        The assistant is `speculative_drafter`, by default the drafter model; one sharing the
        target's source shares its weights. A drafter whose tokenizer differs from the
        target's is refused here, before its weights are loaded.
        """
        from pflash.models.loading import load_causal_lm, resolve_device
        from pflash.models.source import load_tokenizer

        device = resolve_device(config.device)
        tokenizer = load_tokenizer(config.target_tokenizer or config.target)
        # getattr: the speculative knobs are new; a config without them means "off"
        draft_tokens = config.speculative_tokens
        spec = config.speculative_drafter or config.drafter
        assistant_tokenizer = None
        if draft_tokens > 0:
            own_tokenizer = spec == config.drafter and config.drafter_tokenizer
            assistant_tokenizer = load_tokenizer(own_tokenizer or spec)
            why = vocabulary_mismatch(tokenizer, assistant_tokenizer)
            if why:
                raise _refuse_assistant(spec, why)
        loaded = load_causal_lm(config.target, device=device)
        assistant = None
        if draft_tokens > 0:
            same_as_target = spec == config.target
            assistant = (
                loaded.model if same_as_target else load_causal_lm(spec, device=device).model
            )
        return cls(
            loaded.model,
            tokenizer,
            max_context=config.max_context,
            num_threads=num_threads,
            assistant=assistant,
            assistant_tokenizer=assistant_tokenizer,
            speculative_tokens=draft_tokens or 4,
        )

    @staticmethod
    def _eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
        ids: set[int] = set()
        gen = getattr(model, "generation_config", None)
        eos = getattr(gen, "eos_token_id", None)
        ids.update(eos if isinstance(eos, list | tuple) else [eos] if eos is not None else [])
        if tokenizer.eos_token_id is not None:
            ids.add(int(tokenizer.eos_token_id))
        return frozenset(int(i) for i in ids)

    @staticmethod
    def _full_attention(model: Any, role: str) -> bool:
        from transformers import DynamicCache
        from transformers.cache_utils import DynamicLayer

        probe = DynamicCache(config=model.config)
        full = all(type(layer) is DynamicLayer for layer in probe.layers)
        if not full:
            log.info("%s cache is not plain full attention: prefix snapshots are off", role)
        return full

    def _check_assistant(self, assistant: Any, assistant_tokenizer: Any | None) -> None:
        """Refuse an assistant that cannot draft for this target (at startup, not mid-answer)."""
        from transformers import DynamicCache

        if not 1 <= self.speculative_tokens <= 16:
            raise ConfigError(
                "speculative_tokens", self.speculative_tokens, "1..16 draft tokens per step"
            )
        name = str(getattr(assistant, "name_or_path", "") or type(assistant).__name__)
        why = None
        if assistant_tokenizer is not None:
            why = vocabulary_mismatch(self.tokenizer, assistant_tokenizer)
        rows = int(assistant.get_input_embeddings().weight.shape[0])
        if why is None and rows < len(self.tokenizer):
            why = (
                f"the drafter's embedding has {rows} rows, "
                f"the target's tokenizer {len(self.tokenizer)} tokens"
            )
        if why:
            raise _refuse_assistant(name, why)
        for role, model in (("target", self.model), ("drafter", assistant)):
            if not DynamicCache(config=model.config).is_croppable:
                raise _refuse_assistant(
                    name, f"the {role}'s KV cache cannot be rolled back (crop) after a rejection"
                )

    async def aclose(self) -> None:
        self._worker.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ stages (worker thread)

    def _prefill_cache(
        self,
        model: Any,
        snapshots: PrefixSnapshots,
        ids: torch.Tensor,
        snapshot_cut: int,
        scope: str | None = None,
    ) -> tuple[Any, torch.Tensor, int]:
        """Run `ids` [S] through `model` from the longest cached prefix; store `ids[:cut]`.

        Returns (the cache over all S tokens, the next-token logits [V], tokens reused).
        """
        import torch

        from pflash.models.kv_buffer import buffered_cache

        reused, snap = snapshots.lookup(ids, scope)
        reused = min(reused, ids.numel() - 1)  # the last token must run to give logits
        if snap is not None and reused > 0:
            cache = buffered_cache(
                model, [(k[:, :, :reused], v[:, :, :reused]) for k, v in snap.layers]
            )
        else:
            reused, cache = 0, buffered_cache(model)
        rest = ids[reused:].to(model.device).unsqueeze(0)  # [1, S - reused]
        with torch.inference_mode():
            for begin in range(0, rest.shape[1], self.prefill_chunk):
                chunk = rest[:, begin : begin + self.prefill_chunk]
                out = model(input_ids=chunk, cache=cache, use_cache=True, logits_to_keep=1)
        if snapshot_cut > 0 and snapshots.capacity > 0:
            layers = [
                (k[:, :, :snapshot_cut].clone(), v[:, :, :snapshot_cut].clone())
                for k, v, *_ in cache
            ]
            snapshots.store(ids[:snapshot_cut].clone(), layers, scope)
        return cache, out.logits[0, -1], reused

    def _prefill(
        self,
        prompt_ids: list[int],
        snapshot_cut: int,
        params: SamplingParams,
        speculate: bool,
        scope: str | None = None,
    ) -> _Decoding:
        """Prefill the target (and, when speculating, the assistant) from cached prefixes."""
        import torch

        t0 = time.perf_counter()
        ids = torch.tensor(prompt_ids, dtype=torch.long)  # [S]
        cache, logits, reused = self._prefill_cache(
            self.model, self.snapshots, ids, snapshot_cut, scope
        )
        draft_cache = None
        if speculate:
            draft_cache, _, _ = self._prefill_cache(
                self.assistant, self.draft_snapshots, ids, snapshot_cut, scope
            )
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(
                params.seed if params.seed is not None else random.getrandbits(63)
            )
        prompt_ms = (time.perf_counter() - t0) * 1000
        mask = self.formats.mask(params.output_format) if params.output_format else None
        return _Decoding(
            cache, logits, generator, reused, prompt_ms, params, list(prompt_ids), draft_cache,
            mask=mask,
        )  # fmt: skip

    def _decode_step(self, state: _Decoding, prev: int | None, room: int) -> list[int]:
        """The next 1..`room` answer tokens: speculatively when the request drafts, else one."""
        k = 0
        if state.draft_cache is not None and prev is not None:
            k = min(self.speculative_tokens, room - 1, self._assistant_context - len(state.tokens))
        tokens = self._speculate(state, k) if k > 0 else [self._decode_one_token(state, prev)]
        state.tokens.extend(tokens)
        return tokens

    def _decode_one_token(self, state: _Decoding, prev: int | None) -> int:
        """Feed the previous token (if any) and sample the next one."""
        import torch

        if prev is not None:
            with torch.inference_mode():
                token = torch.tensor([[prev]], dtype=torch.long, device=self.device)  # [1, 1]
                out = self.model(input_ids=token, cache=state.cache, use_cache=True)
            state.logits = out.logits[0, -1]
        if state.mask is not None:
            state.mask.apply(state.logits)
        token = sample_token(state.logits, state.params, state.generator)
        if state.mask is not None:
            state.mask.accept(token)
        return token

    def _draft(self, state: _Decoding, k: int) -> list[int]:
        """The assistant's `k` greedy tokens after `state.tokens`; its cache first catches up
        on the committed tokens it has not seen (the last one, or two after a full accept)."""
        import torch

        device = self.assistant.device
        seen = state.draft_cache.get_seq_length()
        feed = torch.tensor([state.tokens[seen:]], dtype=torch.long, device=device)  # [1, n]
        drafts: list[int] = []
        with torch.inference_mode():
            for _ in range(k):
                out = self.assistant(
                    input_ids=feed, cache=state.draft_cache, use_cache=True, logits_to_keep=1
                )
                drafts.append(int(torch.argmax(out.logits[0, -1, : self.vocab_size])))
                feed = torch.tensor([[drafts[-1]]], dtype=torch.long, device=device)  # [1, 1]
        return drafts

    def _speculate(self, state: _Decoding, k: int) -> list[int]:
        """One speculative greedy step: draft `k` tokens, verify them in one target forward,
        keep the agreeing prefix plus the target's next token, crop both caches to it."""
        import torch

        committed = len(state.tokens)  # the last one (prev) is not in the target cache yet
        drafts = self._draft(state, k)
        with torch.inference_mode():
            block = torch.tensor(
                [[state.tokens[-1], *drafts]], dtype=torch.long, device=self.device
            )  # [1, k + 1]
            out = self.model(input_ids=block, cache=state.cache, use_cache=True)
        verified = out.logits[0].argmax(dim=-1).tolist()  # [k + 1] the target's greedy tokens
        accepted = accept_drafts(drafts, verified)
        n = len(accepted) - 1
        keep = committed + n  # prev and the n accepted drafts
        for cache in (state.cache, state.draft_cache):
            excess = cache.get_seq_length() - keep
            if excess > 0:
                cache.crop(-excess)
        state.logits = out.logits[0, n]
        state.proposed += k
        state.accepted += n
        return accepted

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
        tenant: str | None = None,
    ) -> AsyncIterator[GenerationEvent]:
        prompt_ids = [int(t) for t in prompt_ids]
        cut = self._check_prompt(prompt_ids, snapshot_cut)
        budget = max_new_tokens(len(prompt_ids), params, self.max_context)
        speculate = (
            self.assistant is not None
            and params.greedy
            and params.output_format is None
            and budget > 1
            and len(prompt_ids) < self._assistant_context
        )
        loop = asyncio.get_running_loop()
        decoder = StreamingDecoder(self.tokenizer, params.stop, context=prompt_ids)
        try:
            state = await loop.run_in_executor(
                self._worker, self._prefill, prompt_ids, cut, params, speculate, tenant
            )
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
                tokens = await loop.run_in_executor(
                    self._worker, self._decode_step, state, prev, budget - predicted
                )
            except Exception as exc:
                raise GenerationFailed(f"decode: {type(exc).__name__}: {exc}") from exc
            text, ended = "", False
            for token in tokens:
                predicted += 1
                if token in self.eos_ids:
                    ended = True
                    break
                pending.append(token)
                text += decoder.push(token)
                if decoder.stopped:
                    ended = True
                    break
            if text:
                yield TokenDelta(text, tuple(pending))
                pending = []
            if ended:
                finish = "stop"
                break
            prev = tokens[-1]
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
        yield GenerationDone(finish, timings, state.accept_rate)
