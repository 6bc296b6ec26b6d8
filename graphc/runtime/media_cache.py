"""Encoder output rows of repeated media, kept on the LLM's device in the plan's `media_cache.<node>` lines
(graphc/media_rows.py sizes them): an encoder step runs only the pieces the cache does not hold.

A piece is keyed by its encoder input, prefix_cache.digest() of the host's preprocessed patches or features
(shared with prefix caching through the request's media_keys); a piece digest() cannot name is never
cached. Before an encoder step, each piece whose key is held takes its rows from the cache; the encoder runs
the others alone at the step's planned size (none left: no encoder step at all). The step's rows for the LLM
are then each piece's rows in the step's order, held ones copied from the cache and new ones from the
encoder's outputs (its static output or receive buffers), exactly as the encoder wrote them. A step with no
held piece hands the LLM the encoder's outputs as they are. Each new piece's rows are then copied into the
cache, least recently used pieces evicted first when rows are short; a piece with more rows than the cache
holds is not stored.
"""
from __future__ import annotations

from collections import OrderedDict

import torch

from graphc.media_rows import SECTION, RowPort, llm_of, row_ports
from graphc.runtime.prefix_cache import piece_key
from graphc.runtime.sampler import on_device
from graphc.step import TORCH_DTYPES


def allocate_caches(boot) -> None:
    """The device's media_cache lines in the ledger's order: a zeroed rows-first buffer for each port cached
    (media_rows.row_ports), its rows the line's bytes over a row's (measured: the buffers' storages)."""
    for comp, nbytes in boot.plan.devices[boot.index].ledger.items():
        if not comp.startswith(SECTION + "."):
            continue
        node = comp.split(".", 1)[1]
        ports = row_ports(boot.ir.model, node)
        rows = nbytes // sum(p.row_bytes for p in ports)
        bufs = {p.port: torch.zeros((rows, *p.row_shape), dtype=TORCH_DTYPES[p.dtype], device=boot.device)
                for p in ports}
        boot.media[node] = bufs
        boot.measured[comp] = sum(b.untyped_storage().nbytes() for b in bufs.values())


def _rows(out: torch.Tensor, port: RowPort, start: int, n: int) -> torch.Tensor:
    """Rows [start, start + n) of an encoder output, rows first."""
    return out.movedim(port.dim, 0).narrow(0, start, n)


class MediaCache:
    """One encoder's cache (the module's docstring)."""

    def __init__(self, node: str, ports: list[RowPort], buffers: dict[str, torch.Tensor]):
        self.node, self.ports, self.buf = node, ports, buffers
        self.capacity = buffers[ports[0].port].shape[0]
        self.free = list(range(self.capacity))
        # key -> its rows (on the device, and as a list), least recently used first
        self.entries: OrderedDict[bytes, tuple[torch.Tensor, list[int]]] = OrderedDict()
        self.row_bytes = sum(p.row_bytes for p in ports)
        self.hits = self.misses = self.evicted = self.skipped_steps = 0

    @property
    def stored_bytes(self) -> int:
        return (self.capacity - len(self.free)) * self.row_bytes

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "stored_bytes": self.stored_bytes,
                "capacity_bytes": self.capacity * self.row_bytes, "pieces": len(self.entries),
                "evicted": self.evicted, "skipped_steps": self.skipped_steps}

    def splice(self, pieces: list, encode) -> tuple[dict, dict]:
        """(outputs, {(request id, row): output row}) of a step's pieces [(request, piece)]; encode(pieces) runs
        the encoder on some of them and answers the same."""
        keys = [piece_key(req, p) for req, p in pieces]
        held = [self.entries[k][0] if k in self.entries else None for k in keys]
        for k, h in zip(keys, held):
            if h is not None:
                self.entries.move_to_end(k)
        todo = [(x, k) for x, k, h in zip(pieces, keys, held) if h is None]
        self.hits += len(pieces) - len(todo)
        self.misses += len(todo)
        out, where = encode([x for x, _ in todo]) if todo else ({}, {})
        self.skipped_steps += not todo
        if len(todo) < len(pieces):
            out, where = self._compose(pieces, held, out, where)
        for (req, p), k in todo:
            self._store(k, out, where[(req.id, p.rows[0])], len(p.rows))
        return out, where

    def _compose(self, pieces: list, held: list, out: dict, where: dict) -> tuple[dict, dict]:
        """Each piece's rows in step order: held ones from the cache, the others from the encoder's outputs."""
        new_where, parts, at = {}, {p.port: [] for p in self.ports}, 0
        for (req, piece), h in zip(pieces, held):
            n = len(piece.rows)
            for port in self.ports:
                buf = self.buf[port.port]
                parts[port.port].append(buf.index_select(0, h) if h is not None else
                                        _rows(out[port.port], port, where[(req.id, piece.rows[0])], n).to(buf.dtype))
            for j, row in enumerate(piece.rows):
                new_where[(req.id, row)] = at + j
            at += n
        return {p.port: torch.cat(parts[p.port]).movedim(0, p.dim).contiguous() for p in self.ports}, new_where

    def _store(self, key: bytes | None, out: dict, start: int, n: int) -> None:
        """Copy a new piece's n rows (from output row `start`) in, evicting least recently used pieces."""
        if key is None or key in self.entries or n > self.capacity:
            return
        while len(self.free) < n:
            _, (_, rows) = self.entries.popitem(last=False)
            self.free += rows
            self.evicted += 1
        taken, self.free = self.free[len(self.free) - n:], self.free[:len(self.free) - n]
        rows = on_device(taken, torch.int64, self.buf[self.ports[0].port].device)
        for port in self.ports:
            buf = self.buf[port.port]
            buf.index_copy_(0, rows, _rows(out[port.port], port, start, n).to(buf.dtype))
        self.entries[key] = (rows, taken)


def media_caches(boot) -> dict[str, MediaCache]:
    """The booted device's caches by encoder node (none without media_cache lines; the LLM's line is
    graphc/runtime/follow_rows.py's)."""
    llm = llm_of(boot.ir.model)
    return {node: MediaCache(node, row_ports(boot.ir.model, node), bufs) for node, bufs in boot.media.items()
            if node != llm and next(iter(bufs.values())).shape[0] > 0}
