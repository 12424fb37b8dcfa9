"""What a conversation's turn derived from its unchanged text, kept for its next turn.

A later question of a long conversation plans and selects over the whole context again,
although only the newest turns changed. `TurnMemo` keeps, per conversation, the latest turn's
results over that context, by kind:

- `"units"`: the lexical units of the text before the latest user content
  (`words.UnitPrefix`), so `find_lexical_evidence` cuts and reads only the new text;
- `"passages"`: the evidence passages of each region between pinned spans
  (`passage_evidence.evidence_passages`), so a region whose text and tokens are unchanged is
  not cut again.

- Exact, or not used: each caller checks that what it reuses was made from the same text
  (a prefix the prompt still starts with, a region keyed by its text and token offsets), and
  reuse gives what computing it again gives (unit tests, and the reuse test serves a
  conversation byte for byte as without it).
- Keyed by conversation (`compressor.conversation_key`: the tenant's session id or a digest
  of the conversation's start), like drafter sessions and views: one tenant's text never
  serves another's.
- Bounded: least recently used entries leave first once they hold more than `max_chars`
  characters of text. A conversation counts its text twice (units, passages); with the
  token offsets its passages are keyed by (shared with the request while it runs), an entry
  holds about 25 bytes per character counted, the estimate `MAX_CHARS` is sized by.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

MAX_CHARS = 2_000_000  # ~4 conversations of 64K tokens, ~50 MB


class TurnMemo:
    """The latest value of each kind per conversation; thread-safe (planning and selection
    run in threads)."""

    def __init__(self, max_chars: int = MAX_CHARS):
        self.max_chars = max_chars
        self._entries: OrderedDict[tuple[str, str], tuple[Any, int]] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, conversation: str | None, kind: str) -> Any:
        """The conversation's latest value of `kind`, or None."""
        if not conversation:
            return None
        with self._lock:
            entry = self._entries.get((conversation, kind))
            if entry is None:
                return None
            self._entries.move_to_end((conversation, kind))
            return entry[0]

    def put(self, conversation: str | None, kind: str, value: Any, chars: int) -> None:
        """Keep `value` (made from `chars` characters of text) as the conversation's latest
        of `kind`; one larger than the whole memo is not kept."""
        if not conversation or value is None:
            return
        key = (conversation, kind)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._chars -= old[1]
            if chars > self.max_chars:
                return
            self._entries[key] = (value, chars)
            self._chars += chars
            while self._chars > self.max_chars:
                _, (_, dropped) = self._entries.popitem(last=False)
                self._chars -= dropped
