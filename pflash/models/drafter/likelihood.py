"""Question-conditioned likelihood: how much each passage raises the drafter's likelihood of
the question (LongLLMLingua's coarse ranking, on our drafter and our passages).

Why: on evidence the question does not name (a paraphrased question, code described by what
it does) layer-L attention keeps what it keeps for an unrelated question; the language model
itself, reading a passage and then the question, is the signal LongLLMLingua's coarse step
ranks documents by. For each passage u (drafter tokens `ids[u]`), the sequence
`ids[u] + question` runs through the whole drafter, and

    gain_u = mean_t log p(q_t | u, q_<t) - mean_t log p(q_t | q_<t),   t = 1 .. |q|-1

(the first question token has no context in the baseline, so no sequence scores it). Units:
nats per question token. A passage that makes the question more expected scores above 0.

Cost: every passage token and `|q|` question tokens per passage through every layer, once per
request (no session: the question changes every turn). Sequences are batched by length,
right-padded with no attention mask: a causal model's real tokens never see the pads after
them, so each row equals its own unpadded forward (a test checks this on llama, qwen3 and
qwen3_5). Only the question rows go through the output head, so memory is
`batch x |q| x vocab` logits, never `tokens x vocab`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from pflash.models.drafter.attention import decoder_of
from pflash.spans import Span

# Tokens per batch (padded length x rows) and logits per batch (rows x question tokens x
# vocab): about 60 MB of hidden states and 256 MB of fp32 logits at SmolLM2's sizes.
BATCH_TOKENS = 8192
BATCH_LOGITS = 64 * 1024 * 1024


def question_likelihood_gain(
    model, ids: Sequence[int], units: Sequence[Span], question: Span
) -> np.ndarray:
    """gain_u per unit, float32 [len(units)] (see the module docstring). `ids` and the spans
    are drafter tokens; `question` needs at least 2 tokens."""
    q = list(ids[question.begin : question.end])
    if len(q) < 2:
        raise ValueError(f"the question window has {len(q)} tokens; likelihood needs 2")
    seqs = [list(ids[u.begin : u.end]) + q for u in units] + [q]  # the last: no passage
    mean_logp = _question_logprob(model, seqs, len(q))
    return (mean_logp[:-1] - mean_logp[-1]).astype(np.float32)


def _question_logprob(model, seqs: list[list[int]], nq: int) -> np.ndarray:
    """Mean log-probability of each sequence's last `nq - 1` tokens, float64 [len(seqs)]."""
    decoder = decoder_of(model)
    head = model.get_output_embeddings()
    vocab = int(head.weight.shape[0])
    out = np.zeros(len(seqs), dtype=np.float64)
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    for batch in _batches(order, seqs, nq * vocab):
        length = max(len(seqs[i]) for i in batch)
        pad = seqs[batch[0]][-1]
        x = torch.tensor([seqs[i] + [pad] * (length - len(seqs[i])) for i in batch])  # [B, L]
        hidden = decoder(input_ids=x, use_cache=False).last_hidden_state  # [B, L, hidden]
        ends = torch.tensor([len(seqs[i]) for i in batch])  # [B]
        # rows predicting q_1 .. q_{nq-1}: positions end-nq .. end-2
        pos = ends[:, None] - nq + torch.arange(nq - 1)[None, :]  # [B, nq-1]
        rows = hidden[torch.arange(len(batch))[:, None], pos]  # [B, nq-1, hidden]
        logp = torch.log_softmax(head(rows).float(), dim=-1)  # [B, nq-1, V]
        targets = x[torch.arange(len(batch))[:, None], pos + 1]  # [B, nq-1]
        picked = logp.gather(-1, targets[..., None])[..., 0]  # [B, nq-1]
        if not torch.isfinite(picked).all():
            raise FloatingPointError("non-finite question log-probabilities")
        out[batch] = picked.double().mean(dim=1).cpu().numpy()
    return out


def _batches(order: list[int], seqs: list[list[int]], logits_per_row: int):
    """Consecutive runs of `order` (sorted by length) within BATCH_TOKENS and BATCH_LOGITS."""
    batch: list[int] = []
    for i in order:
        rows = len(batch) + 1
        if batch and (rows * len(seqs[i]) > BATCH_TOKENS or rows * logits_per_row > BATCH_LOGITS):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch
