"""A request's state as the engine moves it through its kind's walks.

Rows: a request's prompt rows, then one row per generated token (the last may still be on the device while
a step is in flight: a negative placeholder, graphc/runtime/flight.py). `computed` rows have their K/V in
the request's pages. The last generated token is fed by the next decode step, so a decoding request
has computed == rows - 1. Preemption (recompute) drops every page and sets computed to 0: the prompt
and the tokens so far are prefilled again, up to the last token, which a decode step then feeds.
"""
from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from graphc.serving import Piece, Prompt
from graphc.runtime.sampler import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"        # not holding pages: new, or preempted
    RUNNING = "running"        # holding pages for every computed row and the rows in flight
    FINISHED = "finished"


@dataclass
class Request:
    id: str
    kind: str                          # the plan's request kind
    prefill_walks: list[str]           # its prefill stages' walks, in order
    decode_walk: str
    prompt: Prompt
    params: SamplingParams
    max_rows: int                      # prompt rows + max_tokens: the most rows it may ever hold
    arrival: int                       # order of arrival (ties broken by it everywhere)
    output: list[int] = field(default_factory=list)
    computed: int = 0
    pages: list[int] = field(default_factory=list)
    slots: dict[str, int] = field(default_factory=dict)   # linear_state resource -> its slot
    status: Status = Status.WAITING
    finish_reason: str | None = None   # stop, length, abort, error
    error: str | None = None
    preemptions: int = 0
    times: dict[str, float] = field(default_factory=lambda: {"arrived": time.perf_counter()})
    max_tokens: int = 0
    generator: Any = None              # its own seeded torch.Generator, or None (the engine's)
    detok: Any = None                  # its Detokenizer when the engine has a tokenizer
    guide: Any = None                  # its grammar.Matcher when its params have a guide (it took every known token)
    logprobs: list | None = None       # per token, when asked
    prompt_logprobs: list | None = None   # per prompt token when asked (sampler.score's entries; the first None)
    user: Any = None                   # what the engine's caller keeps with it (a stream, ...)
    speech: Any = None                 # its SpeechState when it speaks (graphc/runtime/speech.py)
    closed: bool = False               # the engine is done with it: text (and speech) ended, or it failed
    media_keys: dict = field(default_factory=dict)   # id(piece) -> its content digest (prefix caching)
    cached: int = 0                    # prompt rows its first admission took from the prefix cache

    @property
    def rows(self) -> int:
        return len(self.prompt.ids) + len(self.output)

    @property
    def target(self) -> int:
        """Rows prefill computes: the whole prompt, or after a preemption every row but the last."""
        return len(self.prompt.ids) if not self.output else self.rows - 1

    @property
    def prefilling(self) -> bool:
        return self.computed < self.target

    @property
    def decoding(self) -> bool:
        return bool(self.output) and self.computed == self.rows - 1

    @property
    def scoring(self) -> bool:
        """It asked for prompt logprobs and some prompt token has none yet."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt.ids)

    def scored_rows(self, start: int, end: int) -> tuple[int, int] | None:
        """The rows in [start, end) whose logits score a prompt token not yet scored (row r scores token r + 1),
        as a range, or None."""
        if not self.scoring:
            return None
        a, b = max(start, len(self.prompt_logprobs) - 1), min(end, len(self.prompt.ids) - 1)
        return (a, b) if a < b else None

    @property
    def text_open(self) -> bool:
        """Its text has not ended (no finish_reason yet): a token sampled for it in flight is still wanted. A
        speaking request whose text ended stays open for its speech; a row of it still in flight is void."""
        return self.finish_reason is None

    @property
    def known(self) -> list[int]:
        """The output tokens the host has read: without the placeholder of a token still in flight."""
        return self.output[:-1] if self.output and self.output[-1] < 0 else self.output

    @property
    def exhausted(self) -> bool:
        """Its last token is sampled (max_tokens, or the rows it may hold): no row of it runs again. With a step in
        flight the output may end in a token still on the device (a placeholder, graphc/runtime/flight.py)."""
        return len(self.output) >= self.max_tokens          # rows then reach max_rows (prompt + max_tokens)

    def row_ids(self, start: int, end: int) -> list[int]:
        n = len(self.prompt.ids)
        return (self.prompt.ids[start:min(end, n)] + self.output[max(start - n, 0):max(end - n, 0)])

    def stage_end(self, walk: str) -> int:
        """The row a prefill stage on `walk` runs to: an encoder stage followed by another prefill stage
        stops after its last media row; the last prefill stage runs to the target."""
        i = self.prefill_walks.index(walk)
        if i == len(self.prefill_walks) - 1:
            return self.target
        rows = [p.last + 1 for m in self.prompt.media if m.walk == walk for p in m.pieces]
        return min(max(rows, default=0), self.target)

    def stage(self) -> str | None:
        """The walk of the prefill stage it is in, None when it is not prefilling."""
        if not self.prefilling:
            return None          # else the last stage, which runs to the target, is still open
        return next(w for w in self.prefill_walks if self.stage_end(w) > self.computed)

    def pending_pieces(self, walk: str) -> list[Piece]:
        """Media pieces of `walk` not yet encoded (those starting at or after the computed rows)."""
        out = [p for m in self.prompt.media if m.walk == walk for p in m.pieces if p.first >= self.computed]
        return sorted(out, key=lambda p: p.first)
