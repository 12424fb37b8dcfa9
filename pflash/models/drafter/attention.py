"""The scorer's tensor math (ALGORITHM §2, §3): the early-exit trunk forward, the NoPE head,
attention mass over the visible keys, and the legacy tail scorer. Pure functions of a model's
modules and tensors; names are transformers' (q_proj, k_norm, input_layernorm), so this file
reads next to `modeling_qwen3.py`. Token indices are drafter tokens."""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from pflash.compress.plan.query import QueryWindow
from pflash.errors import CompressionFailed
from pflash.models.drafter.scoring_head import (
    ScoringHead,
)
from pflash.spans import Span

log = logging.getLogger(__name__)

KEY_BLOCK_ELEMENTS = 1 << 22  # logits per key block: heads x rows x keys (16 MB fp32)
HELD_LOGITS = 1 << 24  # a whole window's logits taken at once, one softmax (64 MB fp32)


class NonFiniteScores(RuntimeError):
    """Probabilities with NaN/inf: the scorer rescores once from scratch, then fails."""


# --------------------------------------------------------------------------- 2. trunk forward


class _ReachedScoringLayer(Exception):
    """Raised by the pre-hook on the scoring layer: the layers after it never run."""


def decoder_of(model):
    return model.model


def run_trunk_chunk(
    model,
    ids: torch.Tensor,
    start: int,
    cache,
    *,
    tap_layer: int,
    stop_at_tap: bool,
    attention_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """Run one chunk `ids` [c] at positions [start, start+c) and return the hidden states
    entering layer `tap_layer`, [c, hidden]. The cache grows by c tokens for every layer
    that ran. With `stop_at_tap`, layer `tap_layer` and everything after it are skipped.
    `attention_mask`: a prepared 4D mask against the cache's keys (windowed attention,
    `pflash.models.drafter.window.chunk_mask`); None = the model's own causal mask."""
    decoder = decoder_of(model)
    captured: dict[str, torch.Tensor] = {}

    def grab(module, args, kwargs):
        captured["x"] = args[0] if args else kwargs["hidden_states"]
        if stop_at_tap:
            raise _ReachedScoringLayer

    handle = decoder.layers[tap_layer].register_forward_pre_hook(grab, with_kwargs=True)
    positions = torch.arange(start, start + ids.shape[0]).unsqueeze(0)  # [1, c]
    try:
        decoder(
            input_ids=ids.unsqueeze(0),
            attention_mask=attention_mask,
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
    except _ReachedScoringLayer:
        pass
    finally:
        handle.remove()
    return captured["x"][0]  # [c, hidden]


def run_full_chunk(
    model, ids: torch.Tensor, start: int, cache, *, tap_layer: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every layer over one chunk `ids` [c] at positions [start, start+c): the hidden states
    entering `tap_layer` and the decoder's final (normed) hidden states, both [c, hidden]."""
    decoder = decoder_of(model)
    captured: dict[str, torch.Tensor] = {}

    def grab(module, args, kwargs):
        captured["x"] = args[0] if args else kwargs["hidden_states"]

    handle = decoder.layers[tap_layer].register_forward_pre_hook(grab, with_kwargs=True)
    positions = torch.arange(start, start + ids.shape[0]).unsqueeze(0)  # [1, c]
    try:
        out = decoder(
            input_ids=ids.unsqueeze(0), position_ids=positions, cache=cache, use_cache=True
        )
    finally:
        handle.remove()
    return captured["x"][0], out.last_hidden_state[0]


def chunk_bounds(
    begin: int, end: int, chunk: int, cuts: tuple[int, ...] = ()
) -> list[tuple[int, int]]:
    """[begin, end) in steps of `chunk`, also cut at each position in `cuts`."""
    points = set(range(begin, end, chunk)) | {c for c in cuts if begin < c < end} | {end}
    points = sorted(p for p in points if begin <= p <= end)
    return [(a, b) for a, b in zip(points, points[1:], strict=False) if b > a]


# --------------------------------------------------------------------------- 3. NoPE head


def attention_shape(attn, model) -> tuple[int, int, int]:
    """(query heads H, key heads Hk, head_dim D) of an attention module."""
    cfg = model.config.get_text_config()
    d = attn.head_dim
    return cfg.num_attention_heads, cfg.num_key_value_heads, d


def weight_dtype(layer) -> torch.dtype:
    """The dtype of a decoder layer's attention weights (float32 on CPU, bfloat16 on a GPU)."""
    return layer.self_attn.q_proj.weight.dtype


def head_keys(
    layer, x: torch.Tensor, *, n_kv: int, head: ScoringHead | None = None
) -> torch.Tensor:
    """K_j = k_norm(k_proj(input_layernorm(x_j))), no rotary. x [c, hidden] -> [c, Hk, D] fp32.
    The projections run in the layer's own dtype (bfloat16 on a GPU), as the model's do."""
    attn = layer.self_attn
    h = layer.input_layernorm(x.to(weight_dtype(layer)))
    k = F.linear(h, head.k_weight) if head is not None else attn.k_proj(h)  # [c, Hk*D]
    k = k.view(x.shape[0], n_kv, -1)  # [c, Hk, D]
    if hasattr(attn, "k_norm"):
        k = attn.k_norm(k)
    return k.float()


def head_queries(
    layer, x: torch.Tensor, *, n_head: int, gated: bool, head: ScoringHead | None = None
) -> torch.Tensor:
    """Q = q_norm(query half of q_proj(input_layernorm(x))), no rotary. x [n, hidden] -> [n, H, D]
    fp32; the projections run in the layer's own dtype, as in `head_keys`."""
    attn = layer.self_attn
    h = layer.input_layernorm(x.to(weight_dtype(layer)))
    if head is not None:  # the trained head holds query rows only
        q = F.linear(h, head.q_weight).view(x.shape[0], n_head, -1)  # [n, H, D]
    else:
        q = attn.q_proj(h)
        if gated:  # per head [q (D) ; gate (D)]
            q = q.view(x.shape[0], n_head, -1)[..., : attn.head_dim]
        else:
            q = q.view(x.shape[0], n_head, -1)
    if hasattr(attn, "q_norm"):
        q = attn.q_norm(q)
    return q.float()


# --------------------------------------------------------------------------- 4. attention mass


def visible_keys(
    n_tokens: int, query: Span, window: QueryWindow, *, suffix_candidates: bool
) -> torch.Tensor:
    """Key mask for one window (§3.3 step 4), bool [S]: keys before the main query, keys after
    it when suffix candidates are scored, minus a turn/history window's own tokens."""
    visible = torch.zeros(n_tokens, dtype=torch.bool)
    visible[: query.begin] = True
    if suffix_candidates:
        visible[query.end :] = True
    if window.kind != "main":
        visible[window.span.begin : window.span.end] = False
    return visible


def mean_head_mass(probs: torch.Tensor, head_weights: torch.Tensor | None = None) -> torch.Tensor:
    """probs [H, n, K] -> mass [K]: mean over heads and rows (§3.3 step 6).

    With `head_weights` [H] (a calibration's, summing to 1) the mean over heads becomes
    the weighted mean sum_h w_h * mean_t P_h,t; the mass still sums to 1 over visible keys.
    """
    if head_weights is None:
        return probs.sum(dim=(0, 1)) / (probs.shape[0] * probs.shape[1])
    return torch.einsum("h,hk->k", head_weights, probs.sum(dim=1)) / probs.shape[1]


def visible_runs(visible: torch.Tensor) -> list[tuple[int, int]]:
    """The maximal runs [begin, end) of True in a key mask: keys before the query, maybe keys
    after it, with a window's own tokens cut out, so one to three runs. Logits are taken over
    slices of the keys, not over a gathered copy of every visible one."""
    edges = torch.diff(
        visible.to(torch.int8),
        prepend=torch.zeros(1, dtype=torch.int8),
        append=torch.zeros(1, dtype=torch.int8),
    )
    begins = (edges == 1).nonzero().squeeze(1).tolist()
    ends = (edges == -1).nonzero().squeeze(1).tolist()
    return list(zip(begins, ends, strict=True))


def window_probs(q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, scale: float):
    """Softmax over the visible keys per (head, row) in fp32.

    q [n, H, D], keys [S, Hk, D], visible bool [S]. Head h reads key head h // (H/Hk).
    Yields (keys slice, probs [H, n, B]) over the visible keys in order. When the whole
    window's logits fit `HELD_LOGITS` (a later turn's few rows over a long prompt), one
    product and one fused softmax over all of them: computing them block by block in two
    passes costs several times as much (two exp passes and a finiteness scan over every
    logit). Otherwise two passes over key blocks, a running log-sum-exp per (head,
    row) and then each block's probabilities, so memory is one block of logits whatever S
    is. Non-finite logits give non-finite probabilities: the callers check their sums.
    """
    n, n_head, _ = q.shape
    n_kv = keys.shape[1]
    group = n_head // n_kv
    runs = visible_runs(visible)
    if not runs:
        raise CompressionFailed("drafter", "query window out of range: no visible keys")
    qg = q.permute(1, 0, 2).reshape(n_kv, group * n, -1) * scale  # [Hk, group*n, D], head-major
    kt = keys.permute(1, 2, 0)  # [Hk, D, S], a view

    def logits(begin: int, end: int) -> torch.Tensor:
        return torch.bmm(qg, kt[:, :, begin:end])  # [Hk, group*n, B]

    if n_head * n * sum(e - b for b, e in runs) <= HELD_LOGITS:
        z = (
            torch.cat([logits(b, e) for b, e in runs], dim=-1)
            if len(runs) > 1
            else logits(*runs[0])
        )
        probs = torch.softmax(z, dim=-1).view(n_head, n, -1)
        at = 0
        for b, e in runs:
            yield slice(b, e), probs[..., at : at + e - b]
            at += e - b
        return
    block = max(256, KEY_BLOCK_ELEMENTS // (n_head * n))
    blocks = [(b0, min(b0 + block, e)) for b, e in runs for b0 in range(b, e, block)]
    # pass 1: log-sum-exp over visible keys per (head, row)
    m = torch.full((n_kv, group * n, 1), -torch.inf)
    s = torch.zeros((n_kv, group * n, 1))
    for b, e in blocks:
        z = logits(b, e)
        m_new = torch.maximum(m, z.amax(dim=-1, keepdim=True))
        s = s * torch.exp(m - m_new) + torch.exp(z - m_new).sum(dim=-1, keepdim=True)
        m = m_new
    lse = m + torch.log(s)
    # pass 2: probabilities
    for b, e in blocks:
        yield slice(b, e), torch.exp(logits(b, e) - lse).view(n_head, n, -1)  # [H, n, B]


def window_mass(
    q: torch.Tensor,
    keys: torch.Tensor,
    visible: torch.Tensor,
    scale: float,
    head_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention mass of one window over all keys, fp32 [S]; 0 on masked keys.

    q [n, H, D], keys [S, Hk, D], visible bool [S]: the mean over heads and rows of
    `window_probs` (or the `head_weights`-weighted mean over heads, see `mean_head_mass`).
    """
    mass = torch.zeros(keys.shape[0])
    for idx, p in window_probs(q, keys, visible, scale):
        mass[idx] = mean_head_mass(p, head_weights)
    if not torch.isfinite(mass).all():
        raise NonFiniteScores("non-finite probabilities in the head scorer")
    return mass


def window_head_masses(
    q: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Per-head attention mass of one window, fp32 [H, S]: the mean over rows only, so
    `pflash calibrate` can rank chunks by each head on its own."""
    mass = torch.zeros(q.shape[1], keys.shape[0])
    for idx, p in window_probs(q, keys, visible, scale):
        mass[:, idx] = p.mean(dim=1)
    if not torch.isfinite(mass).all():
        raise NonFiniteScores("non-finite probabilities in the head scorer")
    return mass


def mix_window_masses(masses: list[torch.Tensor], weights: list[float]) -> torch.Tensor:
    """mass = sum_w weight_w * mass_w / sum_w weight_w over the windows scored (§3.3 step 7)."""
    total = sum(weights)
    out = torch.zeros_like(masses[0], dtype=torch.float64)
    for m, w in zip(masses, weights, strict=True):
        out += w * m.double()
    return (out / total).float()


# --------------------------------------------------------------------------- 5. legacy scorer


def smooth_in_range(score: torch.Tensor, kernel: int) -> torch.Tensor:
    """Mean of score[j-r .. j+r] over in-range neighbours only (r = kernel // 2), §3.1 step 6."""
    r = kernel // 2
    if r <= 0:
        return score.clone()
    c = torch.cat([torch.zeros(1, dtype=torch.float64), torch.cumsum(score.double(), 0)])
    s = score.shape[0]
    j = torch.arange(s)
    lo, hi = (j - r).clamp(min=0), (j + r + 1).clamp(max=s)
    return ((c[hi] - c[lo]) / (hi - lo)).float()


def tail_running_max(
    running: torch.Tensor, q: torch.Tensor, keys: torch.Tensor, rows_begin: int, scale: float
) -> None:
    """Fold one layer into the legacy running max, in place.

    running [n, S_lim] (init -inf); q [n, H, D] rows at positions rows_begin + t; keys
    [S_lim, Hk, D]. Row t sees keys j <= rows_begin + t (causal), softmax per head in fp32.
    """
    n, n_head, _ = q.shape
    s_lim, n_kv, _ = keys.shape
    group = n_head // n_kv
    causal = torch.arange(s_lim).unsqueeze(0) <= (rows_begin + torch.arange(n)).unsqueeze(
        1
    )  # [n, S_lim]
    for kv in range(n_kv):
        qh = q[:, kv * group : (kv + 1) * group].permute(1, 0, 2)  # [group, n, D]
        z = torch.matmul(qh, keys[:, kv].T) * scale  # [group, n, S_lim]
        z = z.masked_fill(~causal, -torch.inf)
        p = torch.softmax(z, dim=-1)
        if not torch.isfinite(p).all():
            raise NonFiniteScores("non-finite probabilities in the legacy scorer")
        torch.maximum(running, p.amax(dim=0), out=running)
