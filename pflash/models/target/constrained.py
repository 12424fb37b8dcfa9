"""Structured output for the in-process target: the answer held to JSON (any object, or one
matching a schema) by masking, at every step, the tokens the grammar forbids.

vLLM compiles an OpenAI `response_format` into a grammar and masks its sampler with it; the
transformers target does the same with llguidance (the library behind vLLM's `guidance`
backend): the schema becomes a grammar, and before each token is sampled the logits of every
token that cannot continue it are set to -inf. The answer is therefore valid JSON for the
schema when it ends by itself (the grammar admits the end-of-sequence token only once the value
is complete); one cut off by `max_tokens` ends early, as on vLLM. Clients ask for it without
knowing the target (Claude Code names its sessions with a JSON-schema request), so the
embedded target serves it rather than refusing.

Speculative decoding is off for such a request: the assistant's drafts would need a mask
each, and the verification would have to follow the grammar too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pflash.errors import InvalidRequest
from pflash.models.target.protocol import OutputFormat

if TYPE_CHECKING:
    import torch


class FormatGuide:
    """The grammar side of one target: its tokenizer as llguidance reads it, built on the
    first request that asks for a format (for a large vocabulary, too slow to build per
    request), then shared."""

    def __init__(self, tokenizer: Any, n_vocab: int, eos_ids: Iterable[int]):
        self.tokenizer = tokenizer
        self.n_vocab = n_vocab
        self.eos_ids = sorted(eos_ids)
        self._ll = None

    def _tokenizer(self):
        if self._ll is None:
            import llguidance.hf

            eos = self.eos_ids[0] if len(self.eos_ids) == 1 else self.eos_ids or None
            self._ll = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=self.n_vocab, eos_token=eos
            )
        return self._ll

    def mask(self, fmt: OutputFormat) -> TokenMask:
        """A fresh mask for one answer in `fmt`; a schema llguidance cannot compile is the
        client's error (a 400 naming `response_format`)."""
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema(schema_text(fmt))
        matcher = llguidance.LLMatcher(self._tokenizer(), grammar)
        if matcher.is_error():
            raise InvalidRequest(
                f"the JSON schema cannot be followed: {matcher.get_error()}",
                param="response_format",
                code="invalid_value",
            )
        return TokenMask(matcher, self.n_vocab)


class TokenMask:
    """The grammar's state over one answer: `apply` masks the logits of the next token,
    `accept` advances past the token sampled from them."""

    def __init__(self, matcher: Any, n_vocab: int):
        import llguidance.torch as lt

        self.matcher = matcher
        self.bits = lt.allocate_token_bitmask(1, n_vocab)  # [1, ceil(V / 32)] int32

    def apply(self, logits: torch.Tensor) -> None:
        """Set the logits [V] of every token the grammar forbids to -inf, in place."""
        import llguidance.torch as lt

        lt.fill_next_token_bitmask(self.matcher, self.bits, 0)
        lt.apply_token_bitmask_inplace(logits.unsqueeze(0), self.bits)

    def accept(self, token: int) -> None:
        self.matcher.consume_token(token)


def schema_text(fmt: OutputFormat) -> str:
    """The JSON schema a format holds the answer to (any object for `json_object`)."""
    return (
        fmt.schema if fmt.kind == "json_schema" and fmt.schema else json.dumps({"type": "object"})
    )
