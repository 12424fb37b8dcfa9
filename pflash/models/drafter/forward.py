"""`DrafterForward`: the drafter loaded for scoring, and its forward pass (§2, §3.3).

What every scorer over one drafter file shares: the model, loaded once; the profile's
scoring layer L and its attention shape; the trained scoring head or the calibration bound
to this drafter (each checked against the file's sha256); the trunk's attention (dense,
windowed or block-sparse) with the cache each needs; and the chunked pass over tokens
[resume, S) that collects layer L's head keys, the query windows' rows and the tap, or, for
the legacy scorer, runs every layer and captures their query rows. `DrafterScorer`
(`scorer.py`) builds the scorer contract, its sessions and the evidence on top; the tensor
math is `attention.py`'s.

Token indices are drafter tokens.
"""

from __future__ import annotations

import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from pflash.compress.plan.query import QueryWindow
from pflash.config import DrafterScorerPart
from pflash.config.artefacts import resolve_artefact
from pflash.errors import ConfigError
from pflash.models.drafter.attention import (
    attention_shape,
    chunk_bounds,
    decoder_of,
    head_keys,
    run_full_chunk,
    run_trunk_chunk,
)
from pflash.models.drafter.block_sparse import BlockSparseSpec, block_sparse_trunk
from pflash.models.drafter.calibration import Calibration, load_calibration
from pflash.models.drafter.profile import resolve_profile
from pflash.models.drafter.scoring_head import (
    HeadIdentity,
    ScoringHead,
    drafter_sha256,
    load_scoring_head,
)
from pflash.models.drafter.sessions import (
    CHECKPOINT_TAIL,
    cache_has_recurrent_state,
    snapshot_recurrent,
)
from pflash.models.drafter.window import (
    WindowSpec,
    chunk_mask,
    is_windowed,
    stride_cuts,
    windowed_cache,
)
from pflash.models.loading import LoadedModel, load_causal_lm, resolve_device
from pflash.spans import Span


@dataclass
class _Forward:
    """What one pass over tokens [resume, S) produced."""

    keys: list[torch.Tensor] = field(default_factory=list)  # head keys [c, Hk, D] per chunk
    tap: list[torch.Tensor] = field(default_factory=list)  # [c, hidden] per chunk
    rows: dict[Span, list[torch.Tensor]] = field(default_factory=dict)  # window rows at layer L
    legacy_q: dict[int, list[torch.Tensor]] = field(default_factory=dict)  # layer -> [n, H, D] NoPE
    checkpoint: object | None = None
    ms: float = 0.0

    def window_rows(self) -> dict[Span, torch.Tensor]:
        return {span: torch.cat(parts) for span, parts in self.rows.items()}


class DrafterForward:
    """The drafter, loaded once, with its scoring layer resolved: what a scoring pass runs.

    `config` is the DrafterScorer deployment's part, or in process the whole config. One
    pass at a time: the legacy hooks read the chunk in flight from the instance.
    """

    def __init__(self, config: DrafterScorerPart, loaded: LoadedModel | None = None):
        self.config = config
        self.loaded = (
            loaded
            if loaded is not None
            else load_causal_lm(config.drafter, device=resolve_device(config.device))
        )
        self.model = self.loaded.model
        self.model.eval()
        self.device = next(self.model.parameters()).device
        self.calibration = self._load_calibration(config.drafter_calibration)
        self.profile = resolve_profile(
            self.loaded, config, self.calibration.layer if self.calibration else None
        )
        self.layer = decoder_of(self.model).layers[self.profile.head_layer]
        self.n_head, self.n_kv, self.head_dim = attention_shape(self.layer.self_attn, self.model)
        self.scale = float(getattr(self.layer.self_attn, "scaling", self.head_dim**-0.5))
        self.head = self._load_head(config.scoring_head_gguf)
        self.head_weights = (  # [H]: weighted mean over heads (§3.3 step 6), None = plain mean
            torch.tensor(self.calibration.head_weights, device=self.device)
            if self.calibration
            else None
        )
        self._chunk = (0, 0)  # token range of the chunk in flight, read by the legacy hooks

    # ------------------------------------------------------------------ setup
    def head_identity(self) -> HeadIdentity:
        """What a scoring head file for this drafter must state."""
        return HeadIdentity(
            schema=self.profile.schema,
            base_model=self.profile.base_model,
            feature_tap=self.profile.tap,
            runtime_gguf_sha256=drafter_sha256(self.loaded.source.path),
        )

    def _load_calibration(self, value: str | None) -> Calibration | None:
        """The calibration file for this drafter (layer, head weights), checked against its
        sha256 and shape. A trained scoring head is refused with it: the weights were
        measured on the base layer's q_proj/k_proj, not on the head's."""
        if value is None:
            return None
        if self.config.scoring_head_gguf is not None:
            raise ConfigError(
                "drafter_calibration",
                value,
                "not with scoring_head_gguf: its head weights were measured on the base "
                "layer's q_proj/k_proj, not on a trained head",
            )
        text = self.model.config.get_text_config()
        return load_calibration(
            resolve_artefact("calibration", value, self.config.drafter),
            drafter_sha256(self.loaded.source.path),
            text.num_hidden_layers,
            text.num_attention_heads,
        )

    def _load_head(self, path: str | None) -> ScoringHead | None:
        if path is None:
            return None
        if self.config.select_mode == "legacy":
            raise ConfigError(
                "scoring_head_gguf",
                path,
                "a trained scoring head needs strict selection (select_mode not legacy)",
            )
        hidden = self.model.config.get_text_config().hidden_size
        head = load_scoring_head(
            resolve_artefact("head", path, self.config.drafter, self.profile.tap),
            self.head_identity(),
            q_shape=(self.n_head * self.head_dim, hidden),
            k_shape=(self.n_kv * self.head_dim, hidden),
        )
        like = self.layer.self_attn.q_proj.weight  # the head runs where the layer does
        return replace(
            head,
            q_weight=head.q_weight.to(device=like.device, dtype=like.dtype),
            k_weight=head.k_weight.to(device=like.device, dtype=like.dtype),
        )

    def new_cache(self):
        from transformers.cache_utils import DynamicCache

        return DynamicCache(config=self.model.config)

    @property
    def window(self) -> WindowSpec | None:
        """The trunk's windowed attention (`drafter_attention: window`), None = dense. The
        slack lets a session rewind as far as a recurrent checkpoint would (the next turn
        drops the previous generation prompt)."""
        if getattr(self.config, "drafter_attention", "dense") != "window":
            return None
        return WindowSpec(
            sink=self.config.drafter_sink_tokens,
            window=self.config.drafter_window_tokens,
            slack=CHECKPOINT_TAIL,
            sink_positions=getattr(self.config, "drafter_sink_positions", "absolute"),
        )

    @property
    def block_sparse(self) -> BlockSparseSpec | None:
        """The trunk's block-sparse attention (`drafter_attention: block_sparse`), or None."""
        if getattr(self.config, "drafter_attention", "dense") != "block_sparse":
            return None
        return BlockSparseSpec(
            block=self.config.drafter_block_tokens,
            sink=self.config.drafter_sink_tokens,
            window=self.config.drafter_window_tokens,
            top=self.config.drafter_top_blocks,
        )

    def _trunk_attention(self):
        """The context a trunk-only forward runs in: block-sparse attention when configured
        (the cache stays the dense one), else the model's own."""
        spec = self.block_sparse
        return block_sparse_trunk(self.model, spec) if spec is not None else nullcontext()

    def new_trunk_cache(self):
        """The cache of a trunk-only forward (head scorer): windowed when configured; the
        legacy scorer reads every layer's full KV and keeps `new_cache`."""
        spec = self.window
        return windowed_cache(self.model, spec) if spec is not None else self.new_cache()

    def _trunk_mask(self, cache, start: int, length: int) -> torch.Tensor | None:
        """The windowed 4D mask for one chunk, or None (the model's causal mask)."""
        if not is_windowed(cache):
            return None
        eager = self.model.config._attn_implementation == "eager"
        return chunk_mask(
            cache, start, length, self.window, additive=self.model.dtype if eager else None
        )

    def _on_device(self):
        """The context a scoring pass runs in: tensors the scorer and the model code create
        without naming a device land beside the weights (a GPU drafter used in process, where
        no deployment made cuda the default device). A no-op on CPU: the context costs a
        Python dispatch per torch call."""
        return torch.device(self.device) if self.device.type != "cpu" else nullcontext()

    # ------------------------------------------------------------------ the forward pass
    def _forward(
        self,
        ids: tuple[int, ...],
        resume: int,
        cache,
        *,
        windows: tuple[QueryWindow, ...],
        want_tap: bool,
        legacy_rows: Span | None = None,
    ) -> _Forward:
        """Run tokens [resume, S) in chunks; collect head keys, window rows and the tap.

        By default the forward stops at the head layer. With `legacy_rows`, every layer runs:
        the legacy scorer reads all of them (the NoPE query rows `legacy_rows` of each legacy
        layer are captured from its q_norm or q_proj output).
        """
        s = len(ids)
        out = _Forward()
        full = legacy_rows is not None
        checkpoint_at = None
        if not full and cache_has_recurrent_state(cache):
            checkpoint_at = max(resume, s - CHECKPOINT_TAIL)
            if 0 < resume == checkpoint_at < s:
                out.checkpoint = snapshot_recurrent(cache, resume)
        needed = [w.span for w in windows if w.span.begin >= resume]
        handles = self._capture_legacy_queries(out, legacy_rows) if legacy_rows else []
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)
        cuts = (checkpoint_at,) if checkpoint_at is not None else ()
        cuts += stride_cuts(resume, s, self.window if is_windowed(cache) else None)
        t0 = time.perf_counter()
        try:
            for a, b in chunk_bounds(resume, s, self.config.drafter_chunk_tokens, cuts):
                self._chunk = (a, b)
                if full:
                    x, _ = run_full_chunk(
                        self.model, ids_t[a:b], a, cache, tap_layer=self.profile.head_layer
                    )
                else:
                    with self._trunk_attention():
                        x = run_trunk_chunk(
                            self.model,
                            ids_t[a:b],
                            a,
                            cache,
                            tap_layer=self.profile.head_layer,
                            stop_at_tap=True,
                            attention_mask=self._trunk_mask(cache, a, b - a),
                        )
                x = x.float()  # [c, hidden]
                out.keys.append(head_keys(self.layer, x, n_kv=self.n_kv, head=self.head))
                if want_tap:
                    out.tap.append(x)
                for span in needed:
                    lo, hi = max(span.begin, a), min(span.end, b)
                    if lo < hi:
                        out.rows.setdefault(span, []).append(x[lo - a : hi - a])
                if b == checkpoint_at:
                    out.checkpoint = snapshot_recurrent(cache, b)
            if ids_t.is_cuda:  # the forward's kernels are queued: wait for them to be timed
                torch.cuda.synchronize(ids_t.device)
        finally:
            for h in handles:
                h.remove()
        out.ms = (time.perf_counter() - t0) * 1000
        return out

    def _capture_legacy_queries(self, out: _Forward, rows: Span) -> list:
        """Forward hooks keeping the NoPE query rows `rows` of every legacy layer."""
        decoder = decoder_of(self.model)
        handles = []
        for i in self.profile.legacy_layers:
            attn = decoder.layers[i].self_attn
            module = attn.q_norm if hasattr(attn, "q_norm") else attn.q_proj
            out.legacy_q[i] = []

            def keep(module, args, output, i=i):
                a, b = self._chunk
                lo, hi = max(rows.begin, a), min(rows.end, b)
                if lo < hi:  # q_norm output [1, c, H, D]; q_proj output [1, c, H*D]
                    out.legacy_q[i].append(
                        output[0, lo - a : hi - a].reshape(hi - lo, self.n_head, -1)
                    )

            handles.append(module.register_forward_hook(keep))
        return handles

    def _legacy_qk(self, layer: int, cache, q: torch.Tensor, rows: Span):
        """Layer `layer`'s legacy Q [n, H, D] and K [S_lim, Hk, D].

        qwen35 (§3.2): Q rotated at its positions, K the cached post-RoPE keys. Otherwise
        (§3.1) NoPE: Q as captured, K the cached keys rotated back by -theta (rotation is
        orthogonal, so this recovers k_norm's output up to float rounding).
        """
        decoder = decoder_of(self.model)
        attn = decoder.layers[layer].self_attn
        rotate = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        positions = torch.arange(0, rows.end).unsqueeze(0)  # [1, S_lim]
        cos, sin = decoder.rotary_emb(torch.zeros(1), positions)  # [1, S_lim, rotary dims]
        k = cache.layers[layer].keys[:, :, : rows.end].float()  # [1, Hk, S_lim, D] post-RoPE
        if self.profile.legacy_rope:
            qt = q.permute(1, 0, 2).unsqueeze(0)  # [1, H, n, D]
            cq, sq = cos[:, rows.begin : rows.end], sin[:, rows.begin : rows.end]
            q = rotate(qt, qt, cq, sq)[0][0].permute(1, 0, 2)
        else:
            unit = float(getattr(decoder.rotary_emb, "attention_scaling", 1.0)) ** 2
            k = rotate(k, k, cos / unit, -sin / unit)[1]
        return q, k[0].permute(1, 0, 2)
