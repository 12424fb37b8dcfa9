"""The drafter scorer: how strongly the query windows attend to every prompt token (§2, §3).

Reading order, top-down (1 in `profile.py`, 2-5 in `attention.py`, 6 in `forward.py`, 7
here):

1. `resolve_profile`: which layer scores (the head layer L), which layers the legacy
   scorer reads, where the probe tap is. Profiles: `qwen3` (Qwen3-0.6B: head at block 13,
   legacy tail scorer over all layers, NoPE), `qwen35` (Qwen3.5-0.8B: blocks 0..14, then
   block 15's NoPE Q/K with the query half of the gated q_proj; legacy running max at the
   full-attention layers, post-RoPE), `generic` (any decoder with `self_attn.q_proj/k_proj`:
   head at 57% of depth, layer 17 of SmolLM2's 30, measured by `pflash_lab.bench.drafter_speed`).
2. `run_trunk_chunk`: the model's own forward over one chunk of tokens with a KV cache,
   stopped by a pre-hook when it reaches layer L, so layers after the scoring layer are
   never computed and memory grows linearly with the prompt. With `drafter_attention:
   window` (`window.py`) layers 0..L-1 attend to the first sink tokens and a sliding
   window only (a 4D mask per chunk, a KV cache that evicts what no later query reads), so
   time is linear and the cache bounded; layer L's NoPE Q/K still cover every token. With
   `block_sparse` (`block_sparse.py`) each block of queries reads the sink, the window and
   the earlier blocks its mean query ranks highest: time linear, the cache the dense one.
3. `head_keys` / `head_queries`: layer L's `input_layernorm`, `k_proj`/`q_proj` (or the
   trained head's weights), `k_norm`/`q_norm`, no rotary: the NoPE head (§3.3 steps 1, 3).
4. `window_mass`: per window, softmax over the visible keys per (head, row) in fp32,
   computed over key blocks (`window_probs`: never a [rows, S] matrix per head larger than
   a block), mean over heads and rows (`mean_head_mass`; a calibration from `pflash
   calibrate` makes it a weighted mean over heads and picks the layer,
   `pflash.models.drafter.calibration`); `mix_window_masses` mixes windows by weight.
5. `tail_running_max` / `smooth_in_range`: the legacy tail scorer (§3.1/§3.2): running
   max over layers and heads, mean over the tail rows, in-range smoothing.
6. `DrafterForward`: loads the drafter once, binds its trained head or calibration, and
   runs the chunked pass that collects layer L's keys, the windows' rows and the tap.
7. `DrafterScorer`: a `DrafterForward` that owns the session table and implements the
   scorer contract `ScoreRequest -> ScoreResult`, rescoring once from scratch on
   non-finite probabilities.

Token indices are drafter tokens. Module names are transformers' (q_proj, k_norm,
input_layernorm), so these files read next to `modeling_qwen3.py` / `modeling_qwen3_5.py`.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from dataclasses import replace

import numpy as np
import torch

from pflash.compress.scoring import ScoreRequest, ScoreResult, skipped_read_ahead
from pflash.config import DrafterScorerPart
from pflash.errors import CompressionFailed
from pflash.models.drafter.attention import (
    NonFiniteScores,
    decoder_of,
    head_queries,
    mix_window_masses,
    smooth_in_range,
    tail_running_max,
    visible_keys,
    window_mass,
)
from pflash.models.drafter.forward import DrafterForward
from pflash.models.drafter.sessions import (
    DrafterSession,
    ResumePlan,
    SessionTable,
    cache_is_croppable,
    cache_resume_floor,
    crop_cache,
    extend_rows,
    plan_resume,
    restore_recurrent,
)
from pflash.models.drafter.window import is_windowed
from pflash.models.embedder import (
    EmbeddingMemo,
    SentenceEmbedder,
    cosine,
    embedder_dtype,
    load_embedder,
    this_cpu_native_bf16,
)
from pflash.models.loading import LoadedModel
from pflash.models.projection import TapProjection, projection_for
from pflash.spans import Span

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- 7. the scorer


class DrafterScorer(DrafterForward):
    """The drafter, loaded once, as a scorer: `scorer(ScoreRequest) -> ScoreResult`.

    Owns a session table of `config.drafter_sessions` conversations (LRU by
    `ScoreRequest.session_key`); a request sharing a session's prefix runs only its new
    tokens. Not thread-safe: one request at a time per instance (the deployment serialises).
    `config` is the DrafterScorer deployment's part, or in process the whole config.
    """

    def __init__(self, config: DrafterScorerPart, loaded: LoadedModel | None = None):
        super().__init__(config, loaded)
        # One pass at a time: passes share the layer hooks that capture the tap (a second
        # pass's hook grabs the first's tensor and stops it) and the session table.
        self._one_pass = threading.Lock()
        self.sessions: SessionTable[DrafterSession] = SessionTable(config.drafter_sessions)
        self.embeddings = EmbeddingMemo(config.drafter_sessions)
        self._embedder: SentenceEmbedder | None = None
        if getattr(config, "select_semantic_weight", 0.0) > 0:
            self.embedder()  # a missing embedder fails at startup, not on the first request
        self._projection: TapProjection | None = None
        if getattr(config, "select_projection_weight", 0.0) > 0:
            self.tap_projection()  # a missing or mismatched file fails at startup
        log.info(
            "drafter %s: profile %s, head layer %d of %d, tap %s%s",
            config.drafter,
            self.profile.name,
            self.profile.head_layer,
            self.profile.n_layers,
            self.profile.tap,
            f", trained head {self.head.path}" if self.head else "",
        )
        if self.calibration:
            log.info(
                "drafter calibration %s: layer %d, head weights %s",
                self.calibration.path,
                self.calibration.layer,
                self.calibration.head_weights,
            )

    # ------------------------------------------------------------------ contract
    def __call__(self, req: ScoreRequest) -> ScoreResult:
        _validate(req)
        with self._one_pass:
            if req.read_ahead and self._moved_on(req):
                return skipped_read_ahead()
            return self._score_checked(req)

    def _moved_on(self, req: ScoreRequest) -> bool:
        """The conversation's session already covers a longer prompt than this read-ahead
        (its next turn came first): scoring it would rewind the session that turn left."""
        session = self.sessions.get(req.session_key) if req.session_key else None
        return session is not None and len(session.ids) > len(req.ids)

    def _score_checked(self, req: ScoreRequest) -> ScoreResult:
        """One scoring, rescored once from scratch when the scores are not finite."""
        try:
            return self._score(req, use_session=True)
        except NonFiniteScores as first:
            log.warning("drafter: %s; rescoring once from scratch", first)
            self._forget(req.session_key)
            try:
                result = self._score(req, use_session=False)
            except NonFiniteScores as second:
                self._forget(req.session_key)
                raise CompressionFailed(
                    "drafter", f"non-finite scores after one rescore: {second}"
                ) from second
            result.extras["rescored"] = True
            return result
        except Exception:
            self._forget(req.session_key)  # on failure the session restarts
            raise

    def _forget(self, key: str | None) -> None:
        """Drop what the conversation `key` reuses: its drafter session and embeddings."""
        self.sessions.drop(key)
        self.embeddings.drop(key)

    def _score(self, req: ScoreRequest, *, use_session: bool) -> ScoreResult:
        asked_tap = req.want_tap
        if req.projection_passages:  # the projection reads the tap of this same pass
            req = replace(req, want_tap=True)
        with torch.inference_mode(), self._on_device():
            if req.scorer == "head":
                result = self._score_head(req, use_session=use_session)
            else:
                result = self._score_legacy(req, with_head=req.scorer == "split")
            if req.projection_passages:
                result = self._with_projection(req, result, use_session=use_session)
                result = result if asked_tap else replace(result, tap=None)
            if req.semantic_texts:
                return self._with_semantic(req, result, use_session=use_session)
            return result

    def _with_projection(
        self, req: ScoreRequest, result: ScoreResult, *, use_session: bool
    ) -> ScoreResult:
        """`result` with each asked passage's tap-projection cosine to the question; the
        passages of the rows this pass reused are pooled once per conversation."""
        t0 = time.perf_counter()
        session = (
            self.sessions.get(req.session_key)
            if use_session and req.scorer == "head" and req.session_key
            else None
        )
        try:
            sims = self.tap_projection().similarity(
                result.tap,
                req.projection_question,
                req.projection_passages,
                memo=session.pooled if session is not None else None,
                reusable_end=result.scorer_resume,
            )
        except ValueError as exc:
            raise CompressionFailed("drafter", f"projection: {exc}") from exc
        if not np.all(np.isfinite(sims)):
            raise NonFiniteScores("projection: non-finite similarities")
        ms = (time.perf_counter() - t0) * 1000
        result.extras["projection_ms"] = round(ms, 1)
        result.extras["projection_passages"] = len(req.projection_passages)
        sims = np.asarray(sims, dtype=np.float32)
        return replace(result, projection=sims, scorer_forward_ms=result.scorer_forward_ms + ms)

    def _with_semantic(
        self, req: ScoreRequest, result: ScoreResult, *, use_session: bool
    ) -> ScoreResult:
        """`result` with each asked text's cosine to each question under the sentence
        embedder (`semantic_embedder`, loaded on first use and kept); the conversation's
        earlier embeddings are reused (`EmbeddingMemo`) unless this is a rescore."""
        t0 = time.perf_counter()
        texts = [*req.semantic_questions, *req.semantic_texts]
        key = req.session_key if use_session and self.embeddings.conversations > 0 else None
        prefetch = list(req.semantic_prefetch) if key is not None else []
        vectors = self.embeddings.embed(key, texts + prefetch, self.embedder().embed)
        sims = cosine(vectors[: len(texts)], len(req.semantic_questions))
        if not np.all(np.isfinite(sims)):
            raise NonFiniteScores("semantic: non-finite similarities")
        ms = (time.perf_counter() - t0) * 1000
        result.extras["semantic_ms"] = round(ms, 1)
        result.extras["semantic_passages"] = len(req.semantic_passages)
        result.extras["semantic_blocks"] = len(req.evidence_blocks)
        result.extras["semantic_reused"] = self.embeddings.hits
        result.extras["semantic_prefetched"] = len(prefetch)
        return replace(result, semantic=sims, scorer_forward_ms=result.scorer_forward_ms + ms)

    def tap_projection(self) -> TapProjection:
        """The tap projection for projection evidence (`projection_gguf`, loaded on first
        use and kept); a missing or mismatched file is ModelUnavailable."""
        if self._projection is None:
            self._projection = projection_for(self.config, self)
        return self._projection

    def embedder(self) -> SentenceEmbedder:
        """The sentence embedder for semantic evidence; a missing one is ModelUnavailable."""
        spec = getattr(self.config, "semantic_embedder", "embedded:all-minilm-l6-v2")
        choice = getattr(self.config, "semantic_embedder_dtype", "auto")
        on_gpu = self.device.type == "cuda"
        dtype = embedder_dtype(choice, native=on_gpu or this_cpu_native_bf16())
        device = str(self.device)
        held = self._embedder
        if held is None or (held.spec, held.dtype, str(held.device)) != (spec, dtype, device):
            self._embedder = load_embedder(spec, dtype, device)
        return self._embedder

    # ------------------------------------------------------------------ head scorer
    def _score_head(self, req: ScoreRequest, *, use_session: bool) -> ScoreResult:
        """Head mass (§3.3), resuming from the conversation's session when one fits."""
        ids = tuple(req.ids)
        key = req.session_key if use_session and self.sessions.capacity > 0 else None
        session = self.sessions.get(key) if key is not None else None
        croppable = session is None or cache_is_croppable(session.cache)
        plan = plan_resume(
            session,
            ids,
            req.windows,
            croppable=croppable,
            want_tap=req.want_tap,
            keys_from_head=self.head is not None,
            floor=cache_resume_floor(session.cache) if session is not None else 0,
        )
        if session is not None and plan.resume == 0:
            session = None
        if session is None:
            cache = self.new_trunk_cache()
        else:
            cache = session.cache
            self._rewind(session, plan, croppable)

        fwd = self._forward(ids, plan.resume, cache, windows=req.windows, want_tap=req.want_tap)
        prefix = plan.resume if session is not None else 0
        keys_buffer, keys = extend_rows(  # keys [S, Hk, D]
            _buffer_of(session, "keys"), len(session.ids) if session else 0, prefix, fwd.keys
        )
        tap = tap_buffer = None
        if req.want_tap:
            held = session.tap if session is not None else None
            tap_buffer, tap = extend_rows(
                _buffer_of(session, "tap"),
                int(held.shape[0]) if held is not None else 0,
                prefix if held is not None else 0,
                fwd.tap,
            )
        rows = fwd.window_rows() | {span: session.rows[span] for span in plan.stored}
        mass, scored = self._head_mass(req, keys, rows, skipped=plan.skipped)
        tap_id = tap_parent = None
        if key is not None:
            new = self._next_session(session, plan, ids, cache, keys, tap, rows, fwd, req.windows)
            new.keys_buffer, new.tap_buffer = keys_buffer, tap_buffer
            self.sessions.put(key, new)
            tap_id = new.tap_id
            tap_parent = session.tap_id if session is not None and plan.resume > 0 else None
        return ScoreResult(
            mass=mass,
            tap=tap.cpu().numpy() if tap is not None else None,
            tap_id=tap_id,
            tap_parent=tap_parent,
            scorer_resume=plan.resume,
            scorer_new_tokens=len(ids) - plan.resume,
            scorer_forward_ms=fwd.ms,
            extras=self._extras(
                windows=scored,
                skipped_windows=[s.as_list() for s in plan.skipped],
                drafter_attention="window"
                if is_windowed(cache)
                else "block_sparse"
                if self.block_sparse is not None
                else "dense",
            ),
        )

    def _head_mass(self, req, keys, rows, *, skipped=()) -> tuple[np.ndarray, int]:
        """Mix the windows' masses (§3.3 steps 3-7). Windows in `skipped` (history rows a
        session no longer has) are left out; the others keep their positional weights."""
        windows = [(w, rows[w.span]) for w in req.windows if w.span not in skipped]
        masses, weights = [], []
        for w, x in windows:
            q = head_queries(
                self.layer, x, n_head=self.n_head, gated=self.profile.gated_q, head=self.head
            )
            visible = visible_keys(
                len(req.ids), req.query, w, suffix_candidates=req.suffix_candidates
            )
            masses.append(window_mass(q, keys, visible, self.scale, self.head_weights))
            weights.append(w.weight)
        if not masses:
            raise CompressionFailed("drafter", "no query window could be scored")
        return mix_window_masses(masses, weights).cpu().numpy().astype(np.float32), len(masses)

    def _extras(self, **kw) -> dict:
        return {
            "profile": self.profile.name,
            "head_layer": self.profile.head_layer,
            "trained_head": self.head is not None,
            "calibration": self.calibration.path if self.calibration else None,
        } | kw

    def _next_session(self, old, plan, ids, cache, keys, tap, rows, fwd, windows) -> DrafterSession:
        """The session state after scoring `ids`: everything now covers the whole prompt."""
        checkpoint = fwd.checkpoint
        if checkpoint is None and old is not None and old.checkpoint is not None:
            checkpoint = old.checkpoint if old.checkpoint.position <= plan.resume else None
        new = DrafterSession(
            ids=ids,
            cache=cache,
            keys=keys,
            keys_from_head=self.head is not None,
            tap=tap,
            checkpoint=checkpoint,
            pooled=old.pooled if old is not None else {},  # entries past the resume go unread
            tap_id=uuid.uuid4().hex if tap is not None else None,
        )
        if old is not None:  # rows computed on the reused prefix stay valid
            for span, r in old.rows.items():
                if span.end <= plan.resume:
                    new.remember_rows(span, r)
        for w in reversed(windows):  # the main window ends up most recent
            if w.span in rows:
                new.remember_rows(w.span, rows[w.span])
        return new

    def _rewind(self, session: DrafterSession, plan: ResumePlan, croppable: bool) -> None:
        """Bring the session's cache back to `plan.resume` tokens."""
        if plan.restore_checkpoint:
            restore_recurrent(session.cache, session.checkpoint)
        elif croppable:
            crop_cache(session.cache, plan.resume)

    # ------------------------------------------------------------------ legacy scorer
    def _score_legacy(self, req: ScoreRequest, *, with_head: bool) -> ScoreResult:
        """Legacy tail scorer (§3.1, §3.2) over all layers, from scratch; `with_head` also
        returns the head mass from the same forward (the split scorer)."""
        ids = tuple(req.ids)
        s, q_end = len(ids), req.query.end
        rows = Span(q_end - min(self.config.legacy_query_tokens, q_end), q_end)
        cache = self.new_cache()
        windows = req.windows if with_head else ()
        fwd = self._forward(ids, 0, cache, windows=windows, want_tap=req.want_tap, legacy_rows=rows)
        running = torch.full((len(rows), q_end), -torch.inf)  # [n, S_lim]
        for i in self.profile.legacy_layers:
            q, k = self._legacy_qk(i, cache, torch.cat(fwd.legacy_q[i]).float(), rows)
            scale = float(decoder_of(self.model).layers[i].self_attn.scaling)
            tail_running_max(running, q, k, rows.begin, scale)
        score = torch.zeros(s)
        score[:q_end] = running.mean(dim=0)
        kernel = self.config.legacy_pool_kernel
        if self.profile.legacy_rope:
            kernel = max(3, kernel)  # §3.2: minimum 3
        mass = (
            self._head_mass(req, torch.cat(fwd.keys), fwd.window_rows())[0] if with_head else None
        )
        return ScoreResult(
            mass=mass,
            legacy=smooth_in_range(score, kernel).cpu().numpy().astype(np.float32),
            tap=torch.cat(fwd.tap).cpu().numpy() if req.want_tap else None,
            scorer_resume=0,
            scorer_new_tokens=s,
            scorer_forward_ms=fwd.ms,
            extras=self._extras(legacy_rows=len(rows)),
        )


def _validate(req: ScoreRequest) -> None:
    """§3.3 step 10: the query window must lie inside the prompt and leave context before it."""
    s = len(req.ids)
    q = req.query
    if req.scorer not in ("head", "legacy", "split"):
        raise CompressionFailed("drafter", f"unknown scorer {req.scorer!r}: head, legacy or split")
    if q.empty or q.begin < 0 or q.end > s:
        raise CompressionFailed(
            "drafter", f"query window out of range: {q.as_list()} over {s} tokens"
        )
    if s < len(q) + 1:
        raise CompressionFailed(
            "drafter", f"input is too short: {s} tokens for a {len(q)}-token query"
        )
    for w in req.windows:
        if w.span.empty or w.span.begin < 0 or w.span.end > s:
            raise CompressionFailed(
                "drafter", f"query window out of range: {w.kind} {w.span.as_list()} over {s} tokens"
            )
    if req.scorer in ("head", "split") and not req.windows:
        raise CompressionFailed("drafter", "the head scorer needs at least one query window")
    if req.semantic_texts and not all(q.strip() for q in req.semantic_questions or ("",)):
        raise CompressionFailed("drafter", "semantic scores need the question's text")
    if req.semantic_texts and len(req.semantic_texts) != len(req.semantic_passages) + len(
        req.evidence_blocks
    ):
        raise CompressionFailed(
            "drafter",
            f"{len(req.semantic_texts)} semantic texts for {len(req.semantic_passages)} "
            f"passages and {len(req.evidence_blocks)} code blocks",
        )
    pq = req.projection_question
    if req.projection_passages and (pq is None or pq.empty or pq.begin < 0 or pq.end > s):
        raise CompressionFailed("drafter", f"projection needs a question inside the prompt: {pq}")
    for p in req.projection_passages:
        if p.empty or p.begin < 0 or p.end > s:
            raise CompressionFailed(
                "drafter", f"evidence passage out of range: {p.as_list()} over {s} tokens"
            )


def _buffer_of(session: DrafterSession | None, name: str):
    """The storage a session's `keys` or `tap` views (the tensor itself when it was built
    without one), or None: what `extend_rows` appends to."""
    if session is None:
        return None
    held = getattr(session, name)
    buffer = getattr(session, f"{name}_buffer")
    return buffer if buffer is not None else held
