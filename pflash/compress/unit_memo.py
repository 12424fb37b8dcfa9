"""Each conversation's lexical units, kept from one turn to the next (`lexical.UnitPrefix`).

A later question of a long conversation anchors its words against the whole context; the
units of the text before it are the turn before's, plus what was added. `UnitMemo` keeps the
latest `UnitPrefix` per conversation, so `find_lexical_evidence` cuts and reads only the
new text.

- Exact, or not used: a prefix is reused only where the prompt's text starts with its
  text, and reuse gives the units, words and counts of cutting the whole text again.
- Keyed by conversation (`compressor.conversation_key`: the tenant's session id or a digest
  of the conversation's start), like drafter sessions and views: one tenant's text never
  serves another's.
- Bounded: least recently used conversations leave first once the prefixes held exceed
  `max_chars` characters of text (a prefix holds ~40 bytes per character: its units, word
  lists, sets and counts).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from pflash.compress.lexical import UnitPrefix

MAX_CHARS = 2_000_000  # ~8 conversations of 64K tokens, ~80 MB


class UnitMemo:
    """The latest `UnitPrefix` per conversation; thread-safe (selection runs in threads)."""

    def __init__(self, max_chars: int = MAX_CHARS):
        self.max_chars = max_chars
        self._prefixes: OrderedDict[str, UnitPrefix] = OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._prefixes)

    def get(self, conversation: str | None) -> UnitPrefix | None:
        if not conversation:
            return None
        with self._lock:
            prefix = self._prefixes.get(conversation)
            if prefix is not None:
                self._prefixes.move_to_end(conversation)
            return prefix

    def put(self, conversation: str | None, prefix: UnitPrefix | None) -> None:
        """Keep `prefix` as the conversation's latest; one larger than the whole memo is
        not kept."""
        if not conversation or prefix is None:
            return
        with self._lock:
            old = self._prefixes.pop(conversation, None)
            if old is not None:
                self._chars -= len(old.text)
            if len(prefix.text) > self.max_chars:
                return
            self._prefixes[conversation] = prefix
            self._chars += len(prefix.text)
            while self._chars > self.max_chars:
                _, dropped = self._prefixes.popitem(last=False)
                self._chars -= len(dropped.text)
