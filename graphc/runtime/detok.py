"""Incremental detokenization and stop strings: token ids in, text out as it becomes final.

A token can end inside a UTF-8 character (byte-level BPE splits an emoji or a CJK character over
several tokens), so the text of a prefix is not a prefix of the text: each step decodes a small
window of recent tokens twice (before and after the new ones) and emits only the difference, and
holds it back while it ends in U+FFFD, the mark of an incomplete character. A window that starts a
few tokens back keeps word-boundary spaces (SentencePiece, byte-level) right.

Stop strings (OpenAI semantics): the text ends just before the first one found and does not hold
it. Text that could still be the start of a stop string is held back until it is not.
"""
from __future__ import annotations

from tokenizers import Tokenizer

REPLACEMENT = "\ufffd"
CONTEXT_TOKENS = 5          # how far back the decode window starts


class Detokenizer:
    """One request's output text. `add(ids)` returns the text that became final; `text` is all of it."""

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = (), skip_special_tokens: bool = True):
        self.tok, self.stop, self.skip = tokenizer, tuple(stop), skip_special_tokens
        self.ids: list[int] = []
        self._prefix = 0           # the decode window starts here
        self._read = 0             # tokens before this are in `_decoded`
        self._decoded = ""         # the text of every token before `_read`
        self._sent = 0             # characters of `_decoded` already returned
        self.stopped: str | None = None   # the stop string that ended the text

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip)

    def add(self, ids: list[int]) -> str:
        """Append new token ids; the text that is now final (nothing after a stop string)."""
        if self.stopped is not None:
            return ""
        self.ids.extend(ids)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) > len(before) and not after.endswith(REPLACEMENT):
            self._decoded += after[len(before):]
            self._read = len(self.ids)
            self._prefix = max(0, self._read - CONTEXT_TOKENS)
        return self._release(final=False)

    def finish(self) -> str:
        """The request ended: whatever is left, incomplete characters included (as U+FFFD)."""
        if self.stopped is None and self._read < len(self.ids):
            before = self._decode(self.ids[self._prefix:self._read])
            self._decoded += self._decode(self.ids[self._prefix:])[len(before):]
            self._read = len(self.ids)
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        if self.stopped is None:
            cut = self._first_stop()
            if cut is not None:
                self._decoded = self._decoded[:cut]
                final = True
        end = len(self._decoded) if final else len(self._decoded) - self._held()
        out = self._decoded[self._sent:max(end, self._sent)]
        self._sent += len(out)
        return out

    def _first_stop(self) -> int | None:
        """Where the earliest stop string starts in the text not yet returned (searched from a
        stop string's length back, so one split over two steps is found), or None."""
        start = max(0, self._sent - max((len(s) for s in self.stop), default=0))
        best = None
        for s in self.stop:
            i = self._decoded.find(s, start)
            if i >= 0 and (best is None or i < best[0]):
                best = (i, s)
        if best is None:
            return None
        self.stopped = best[1]
        return best[0]

    def _held(self) -> int:
        """Characters at the end that are the start of some stop string: not final yet."""
        held = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(self._decoded)), held, -1):
                if self._decoded.endswith(s[:n]):
                    held = n
                    break
        return held

    @property
    def text(self) -> str:
        return self._decoded[:self._sent]
