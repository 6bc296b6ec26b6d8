"""A step's simulated trace: what graphc/simulate.py records and the allocator model replays. No torch: a
plan whose traces are all in the disk cache (graphc/memo.py) reads them without importing it."""
from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from functools import cached_property


@dataclass(frozen=True)
class Trace:
    events: tuple[tuple[int, int, int], ...]   # (1 alloc | 0 free, key, nbytes)
    peak_bytes: int                            # peak of live raw bytes during the step
    output_bytes: int                          # bytes of the returned outputs
    num_ops: int
    launches: int = 0                          # ops that write memory (not pure views): kernels a graph holds
    convs: tuple[tuple[int, str], ...] = ()    # (events before it, signature) of each convolution

    @cached_property
    def digest(self) -> str:
        """The allocation events' content: what memo keys of allocator replays are made of."""
        return hashlib.sha256(repr(self.events).encode()).hexdigest()

    def __reduce__(self):
        """Pickled (the disk cache, the tracing workers' answers) as the events in one int64 array with the digest:
        a cached plan builds the event tuples from it several times faster than pickle builds its own tuples
        (0.06 s against 0.37 s for 300 traces), and computes no digest again (0.3 s for 300)."""
        rest = (self.peak_bytes, self.output_bytes, self.num_ops, self.launches, self.convs, self.digest)
        try:
            flat = array("q", [x for event in self.events for x in event])
        except OverflowError:           # a value past int64: pickled as tuples
            return _trace_from_events, (self.events, *rest)
        return _trace_from_events, (flat.tobytes(), *rest)


def _trace_from_events(events: bytes | tuple, peak_bytes: int, output_bytes: int, num_ops: int, launches: int,
                       convs: tuple, digest: str) -> Trace:
    """Trace.__reduce__'s inverse: events as int64 triples in bytes, or as tuples."""
    if isinstance(events, bytes):
        flat = array("q")
        flat.frombytes(events)
        it = iter(flat)
        events = tuple(zip(it, it, it))
    trace = Trace(events, peak_bytes, output_bytes, num_ops, launches, convs)
    trace.__dict__["digest"] = digest          # cached_property's slot
    return trace
