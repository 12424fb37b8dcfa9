"""Store keys of a prompt: digests of its raw prefixes at turn boundaries (target tokens),
and the digest of the options a view was selected under.

A view is stored under the digest of everything before its generation prompt; in the next
turn that index is a turn boundary again, so a prompt is looked up by its prefixes at its
own turn starts (`view_keys`): O(turns) probes and one pass over the tokens. The prefix finds
a view; `selection_digest` says whether it may be reused for this request's options.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pflash.compress.pipeline import Prepared
from pflash.compress.plan.query import Plan
from pflash.compress.text import encoding
from pflash.config import ViewPart


def token_digest(ids: Sequence[int]) -> str:
    """Hex digest of a token list (blake2b-128 over little-endian int64 ids)."""
    return hashlib.blake2b(_token_bytes(ids), digest_size=16).hexdigest()


# The config components whose fields change what a fresh compression keeps: the gate (mode,
# threshold, keep ratio, curve), selection, the legacy scorer's (`select_scorer: split`),
# lexical evidence and the scorer. Views settings (recall, compress-new) change how a view
# is extended, not what it holds.
SELECTION_COMPONENTS = ("gate", "selection", "legacy", "lexical", "scoring")


def selection_digest(prepared: Prepared, config: ViewPart) -> str:
    """Hex digest of what decides a selection besides the prompt: the request's
    `pflash_query` and `pflash_required`, and the effective config (request overrides
    applied) of `SELECTION_COMPONENTS`.

    A view holds what was selected under these options; a request with other options (a
    required string, another query, keep ratio or mode, a reconfigured scorer) must not be
    served it. The adaptive keep ratio is not part of it: it moves a conversation's ratio
    turn by turn, and the conversation's view continues across those moves."""
    inp = prepared.input
    options = {
        "pflash_query": inp.pflash_query,
        "pflash_required": list(inp.pflash_required),
        **{name: getattr(config, name).model_dump(mode="json") for name in SELECTION_COMPONENTS},
    }
    payload = json.dumps(options, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(payload, digest_size=16).hexdigest()


def _token_bytes(ids: Sequence[int]) -> bytes:
    return np.asarray(ids, dtype="<i8").tobytes()


@dataclass(frozen=True, order=True)
class PrefixHash:
    """The digest of `raw_ids[:length]` (target tokens): a store key."""

    length: int
    digest: str


def boundary_hashes(
    raw_ids: Sequence[int], turn_boundaries: Sequence[int]
) -> tuple[PrefixHash, ...]:
    """Digests of the raw prompt's prefixes at each turn boundary (**target** tokens).

    A view is stored under the digest of `raw[:raw_gen_begin]` (everything before its
    generation prompt). In the next turn that index is a turn boundary again (the start of
    the assistant turn that answered), so a prompt's lookup keys are its prefixes at its
    own turn boundaries: a lookup costs O(turns) probes and one pass over the tokens.
    Boundaries outside (0, len(raw_ids)] are ignored; the result is sorted by length.
    """
    arr = np.asarray(raw_ids, dtype="<i8")
    cuts = sorted({int(b) for b in turn_boundaries if 0 < int(b) <= len(arr)})
    h = hashlib.blake2b(digest_size=16)
    out, prev = [], 0
    for b in cuts:
        h.update(arr[prev:b].tobytes())
        out.append(PrefixHash(b, h.copy().hexdigest()))
        prev = b
    return tuple(out)


def target_turn_boundaries(
    plan: Plan, raw_ids: Sequence[int], target_tokenizer, drafter_tokenizer=None
) -> tuple[int, ...]:
    """Turn starts of the prompt as **target** token indices (role_begin of every turn).

    Turns are parsed in drafter tokens; their character offsets are mapped through the
    target's own encoding of the same text. A boundary that falls inside a target token, or
    a prompt whose text does not re-encode to `raw_ids` (e.g. a BOS the template did not
    write), yields no key: a missed lookup costs a fresh compression, never a wrong view.
    When the drafter's tokenizer is the target's (the same object, or the same serialised
    tokenizer, as a Qwen3-0.6B drafter has for a Qwen3 target), the plan's encoding is that
    encoding already and is not made again.
    """
    layout = plan.layout
    if layout is None:
        return ()
    if drafter_tokenizer is not None and encoding.same_tokenizer(
        drafter_tokenizer, target_tokenizer
    ):
        target = plan.drafter
    else:
        target = encoding.encode_with_offsets(
            target_tokenizer,
            plan.drafter.text,
            encoding.prompt_controls(target_tokenizer, plan.drafter),
        )
    if target.ids != tuple(map(int, raw_ids)):
        return ()
    out = []
    for turn in layout.turns:
        k = target.token_at_or_after(turn.char_role_begin)
        if k < len(target) and target.offsets[k][0] == turn.char_role_begin:
            out.append(k)
    return tuple(sorted(set(out)))


def view_keys(
    prepared: Prepared, target_tokenizer, drafter_tokenizer=None
) -> tuple[PrefixHash, ...]:
    """The store keys to look this prompt up with: `boundary_hashes` at its turn starts."""
    raw = prepared.input.prompt.ids
    turns = target_turn_boundaries(prepared.plan, raw, target_tokenizer, drafter_tokenizer)
    return boundary_hashes(raw, turns)
