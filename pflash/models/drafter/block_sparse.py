"""Block-sparse drafter attention for long prompts (in the spirit of FlashPrefill): the layers below
the scoring layer read, for each block of `block` queries, only

- the sink blocks (the first `sink` tokens, rounded up to whole blocks),
- the local blocks (the `window` tokens before the query block, and the block itself,
  causally), and
- the `top` other earlier blocks whose mean key scores highest against the query block's
  mean query (per KV head, from the mean of the query heads sharing it),

so a query block costs `block x (sink + window + top x block)` keys: time linear in the
prompt. The estimate is one dot product per (query block, key block, KV head) with block
means, about `block x heads` times cheaper than the attention it prunes.

Why a block estimate and not only a window (`window.py`): a window drops every distant key,
whatever the query asks; the estimate lets a query block reach the few distant blocks it
would have attended to (the question's block reaching its evidence, code reaching its
definitions) at the price of `top` extra blocks. Unlike the window, the KV cache keeps
every key (each is a candidate): memory stays linear, as dense.

With `top` at least the number of earlier blocks every key is read: the dense causal result,
up to float rounding (a test holds it to 1e-6). RoPE positions stay absolute, as dense.

The selection is made per query block and chunk, from the mean of the block's queries in
that chunk, so a block split by a chunk boundary is decided once per part. The defaults
(1024-token chunks, 128-token blocks) split none; a resumed session whose shared prefix
ends mid-block splits one, so it scores like a fresh pass exactly only at block boundaries.

It runs through transformers' attention interface: `block_sparse_trunk(model, spec)`
registers `block_sparse_attention` under `ATTENTION_NAME` (and a mask function that builds
no mask: causality is applied per gathered block here) and points the model's
`_attn_implementation` at it for the trunk forward only.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
import torch.nn.functional as F

ATTENTION_NAME = "pflash_block_sparse"


@dataclass(frozen=True)
class BlockSparseSpec:
    """Which key blocks each query block reads (see the module docstring)."""

    block: int = 128
    sink: int = 64
    window: int = 1024
    top: int = 8

    def __post_init__(self):
        if self.block < 1 or self.sink < 0 or self.window < 0 or self.top < 0:
            raise ValueError(f"bad block-sparse spec {self}: block >= 1, the rest >= 0")

    def keys_per_query_block(self) -> int:
        """Most keys one query block reads (the linear cost's constant)."""
        sink_blocks = math.ceil(self.sink / self.block)
        local_blocks = math.ceil(self.window / self.block) + 1
        return (sink_blocks + local_blocks + self.top) * self.block


def block_means(keys: torch.Tensor, block: int) -> torch.Tensor:
    """Mean key of every block, [KVH, blocks, D] from keys [KVH, K, D] (the last block may
    be partial: the mean of the tokens it has)."""
    kvh, k, d = keys.shape
    n = math.ceil(k / block)
    pad = n * block - k
    padded = F.pad(keys, (0, 0, 0, pad)) if pad else keys
    sums = padded.reshape(kvh, n, block, d).sum(dim=2)
    counts = torch.full((n,), float(block), dtype=keys.dtype, device=keys.device)
    counts[-1] = block - pad
    return sums / counts[None, :, None]


def selected_blocks(
    q_mean: torch.Tensor, means: torch.Tensor, q_block: int, spec: BlockSparseSpec
) -> torch.Tensor:
    """Key blocks query block `q_block` reads, sorted, [KVH, m] (the same m for every head).

    `q_mean` [KVH, D]: the block's mean query per KV head; `means` [KVH, blocks, D] for
    blocks 0..q_block at least. Sink and local blocks are always read; of the blocks
    between them the `top` highest `q_mean . mean` are."""
    kvh = q_mean.shape[0]
    sink_end = min(q_block + 1, math.ceil(spec.sink / spec.block))
    local_start = max(sink_end, q_block - math.ceil(spec.window / spec.block))
    fixed = torch.cat([torch.arange(sink_end), torch.arange(local_start, q_block + 1)])
    n_candidates = local_start - sink_end
    take = min(spec.top, n_candidates)
    if take == 0:
        return fixed.unsqueeze(0).expand(kvh, -1)
    scores = torch.einsum("hd,hnd->hn", q_mean, means[:, sink_end:local_start])
    picked = scores.topk(take, dim=1).indices + sink_end  # [KVH, take]
    chosen = torch.cat([fixed.unsqueeze(0).expand(kvh, -1), picked], dim=1)
    return chosen.sort(dim=1).values


def attend(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor, scale: float
) -> torch.Tensor:
    """Softmax attention per KV head: q [KVH, R, D] (the rows of every query head sharing
    that KV head), k/v [KVH, M, D], allowed bool [KVH, R, M] -> [KVH, R, D]. Plain matmuls:
    with a mask, torch's CPU SDPA takes the same math path and adds copies."""
    scores = torch.bmm(q, k.transpose(1, 2)).mul_(scale)
    scores.masked_fill_(~allowed, float("-inf"))
    return torch.bmm(torch.softmax(scores, dim=-1), v)


def block_sparse_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    spec: BlockSparseSpec,
    scaling: float | None = None,
) -> torch.Tensor:
    """Attention of the chunk's queries [1, H, c, D] (the last c positions of the keys)
    over keys/values [1, KVH, K, D] held for positions 0..K-1, reading only the blocks
    `selected_blocks` picks; returns [1, c, H, D] (transformers' attention output layout).
    Query head h reads KV head h // (H / KVH), as transformers' `repeat_kv` does."""
    _, n_head, c, d = query.shape
    kvh, k_len = key.shape[1], key.shape[2]
    group = n_head // kvh
    scale = scaling if scaling is not None else d**-0.5
    start = k_len - c
    b = spec.block
    q, keys, values = query[0], key[0], value[0]
    means = block_means(keys, b)
    offsets = torch.arange(b)
    heads = torch.arange(kvh).unsqueeze(1)
    outs = []
    for q_block in range(start // b, math.ceil(k_len / b)):
        qa, qb = max(start, q_block * b), min(k_len, (q_block + 1) * b)
        n = qb - qa
        qg = q[:, qa - start : qb - start].reshape(kvh, group * n, d)  # rows: head-major
        blocks = selected_blocks(qg.mean(dim=1), means, q_block, spec)  # [KVH, m]
        pos = (blocks.unsqueeze(-1) * b + offsets).reshape(kvh, -1)  # [KVH, m*b]
        safe = pos.clamp(max=k_len - 1)
        q_pos = torch.arange(qa, qb).repeat(group)  # the position of every row of qg
        allowed = pos.unsqueeze(1) <= q_pos[None, :, None]
        out = attend(qg, keys[heads, safe], values[heads, safe], allowed, scale)
        outs.append(out.reshape(n_head, n, d))
    return torch.cat(outs, dim=1).transpose(0, 1).unsqueeze(0)  # [1, c, H, D]


# ---------------------------------------------------------------------- transformers wiring

_SPEC: ContextVar[BlockSparseSpec | None] = ContextVar("pflash_block_sparse_spec", default=None)
_registered = False


def _attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    spec = _SPEC.get()
    if spec is None:
        raise RuntimeError(f"{ATTENTION_NAME} attention used outside block_sparse_trunk")
    return block_sparse_attention(query, key, value, spec, scaling), None


def _no_mask(*args, **kwargs):
    return None  # causality is applied per gathered block in block_sparse_attention


def _register() -> None:
    global _registered
    if _registered:
        return
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _attention)
    AttentionMaskInterface.register(ATTENTION_NAME, _no_mask)
    _registered = True


@contextlib.contextmanager
def block_sparse_trunk(model, spec: BlockSparseSpec) -> Iterator[None]:
    """Within the block, `model`'s attention layers run `block_sparse_attention` with
    `spec` (layers without softmax attention, e.g. Qwen3.5's linear ones, are untouched)."""
    _register()
    configs = {id(c): c for c in (model.config, model.config.get_text_config())}.values()
    before = [(c, c._attn_implementation) for c in configs]
    token = _SPEC.set(spec)
    try:
        for c, _ in before:
            c._attn_implementation = ATTENTION_NAME
        yield
    finally:
        for c, old in before:
            c._attn_implementation = old
        _SPEC.reset(token)
