"""A step in flight: its sampled tokens still on the device while the host builds the next step.

The engine launches step N+1 before it reads step N's tokens back (vLLM's async scheduling, SGLang's
overlap scheduler), so the host's work (scheduling, building inputs, planning attention, detokenising,
streaming) runs while the GPU computes. A token sampled by the step in flight is known to the host only
as a placeholder in its request's output: -(i + 1) for the step's i-th sampled row. The next step's
token ids are resolved on the device from the flight's token tensor (resolve()); the host writes the
real ids when it reads the flight (Flight.read()).

A request that stops on a token read back this way already has its next row in the following step:
that row's token is void (read() skips requests whose text ended, Request.text_open; ending the text drops the
placeholder), and its K/V lands in pages the request holds until its release, which the stream orders after
that step. A speaking request's text rows stay in flight too: the follow stage reads only the tokens before
the placeholder (graphc/runtime/speech.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphc.runtime.request import Request
from graphc.runtime.sampler import Sampled


def placeholder(i: int) -> int:
    """The output id of a step's i-th sampled row before the host reads it."""
    return -(i + 1)


def resolve(ids: list[int], pending: torch.Tensor | None) -> torch.Tensor:
    """A step's token ids with every placeholder taken from `pending` (the flight's sampled tokens, on the
    device), without a host sync: the known ids go to the device with the placeholders, and one gather
    fills them in stream order, after the flight's sampling."""
    host = torch.tensor(ids, dtype=torch.int64)
    if not any(i < 0 for i in ids):
        return host
    if pending is None:
        raise RuntimeError(f"token ids {[i for i in ids if i < 0][:4]} are placeholders of a step that is "
                           f"not in flight")
    dev = host.to(pending.device, non_blocking=True)
    take = (-dev - 1).clamp(min=0)
    return torch.where(dev < 0, pending[take], dev)


def _pinned(t: torch.Tensor) -> torch.Tensor:
    """An async copy of t on the host (page-locked when t is on a GPU, so the copy does not block)."""
    if t.device.type == "cpu":
        return t
    out = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


def to_host(parts: tuple) -> tuple[tuple, object]:
    """Async copies of `parts` on the host and the CUDA event recorded after them (None on CPU)."""
    host = tuple(_pinned(t) for t in parts)
    done = None
    if parts[0].is_cuda:
        done = torch.cuda.Event()
        done.record(torch.cuda.current_stream(parts[0].device))
    return host, done


def wait(done) -> None:
    """Wait for copies made by to_host (on the host thread; the stream goes on with later work)."""
    if done is not None:
        done.synchronize()


@dataclass
class Flight:
    """One launched step's sampled rows: (request, index in its output) each, and what they sampled."""

    rows: list[tuple[Request, int]]
    sampled: Sampled                                 # on the device
    host: tuple                                      # the copies on their way to the host
    done: object = None                              # the CUDA event after the copies (None on CPU)
    stays: bool = False                              # may stay in flight while the next step launches

    @classmethod
    def launch(cls, rows: list[tuple[Request, int]], sampled: Sampled) -> "Flight":
        logprobs = any(r.logprobs is not None for r, _ in rows)
        parts = (sampled.tokens, sampled.logprobs, sampled.top_ids, sampled.top_logprobs) if logprobs \
            else (sampled.tokens,)
        return cls(rows, sampled, *to_host(parts))

    def live(self) -> bool:
        """Some request it sampled for still waits for its token (its text not ended since)."""
        return any(req.text_open for req, _ in self.rows)

    @property
    def tokens(self) -> torch.Tensor:
        """The sampled tokens on the device (what the next step's placeholders resolve from)."""
        return self.sampled.tokens

    def read(self) -> list[tuple[Request, int, int]]:
        """Wait for the copies, write each live request's token over its placeholder, its logprob entry (when
        asked) first, so that a reader in another thread that sees the token sees its entry: (request, index,
        token) for each, skipping requests whose text ended since the launch (closed, or a speaking request's
        text done: its row here is void)."""
        wait(self.done)
        tokens = self.host[0].tolist()
        out = []
        for i, ((req, pos), tok) in enumerate(zip(self.rows, tokens)):
            if not req.text_open:
                continue
            if req.logprobs is not None:
                req.logprobs.append(self._logprob(i, req, tok))
            req.output[pos] = tok
            out.append((req, pos, tok))
        return out

    def _logprob(self, i: int, req: Request, tok: int) -> dict:
        _, lp, top_ids, top_lp = self.host
        n = req.params.top_logprobs
        return {"token_id": tok, "logprob": float(lp[i]),
                "top": list(zip(top_ids[i, :n].tolist(), top_lp[i, :n].tolist()))}
