"""The server's front for a plan of several replicas (graphc/runtime/replicas.py): a Driver, its own
engine thread, per replica, and the Driver surface over them. A request goes to the replica with the most
free decode slots, then KV pages (replicas.pick), counting what was handed to each and not yet taken; the
queue's bound is the server's, over all of them."""
from __future__ import annotations

import asyncio
import threading

from graphc.errors import InvalidInput
from graphc.runtime.replicas import Replicas
from graphc.serve.driver import Driver
from graphc.serve.errors import QueueFull


class Router:
    """The Driver surface over one Driver per replica."""

    def __init__(self, replicas: Replicas, on_death=None, max_waiting: int | None = None,
                 gather_ms: float | None = None):
        self.replicas = replicas
        self.max_waiting = max_waiting if max_waiting is not None else 8 * replicas.max_running
        if self.max_waiting < 1:
            raise InvalidInput(f"max_waiting is {self.max_waiting}", "at least one request must be able to wait",
                               "give --max-waiting 1 or more")
        self.drivers = [Driver(e, on_death, self.max_waiting, gather_ms) for e in replicas.engines]
        self.observers: list = []
        for d in self.drivers:                  # one list: an observer added here sees every replica's events
            d.observers = self.observers
        self.lock = threading.Lock()

    def fail_all(self, what: str) -> None:
        for d in self.drivers:
            d.fail_all(what)

    def close(self, timeout: float = 10.0) -> None:
        for d in self.drivers:
            d.close(timeout)

    def waiting(self) -> int:
        return sum(d.waiting() for d in self.drivers)

    def retry_after(self) -> int:
        return min(d.retry_after() for d in self.drivers)

    def admit(self) -> None:
        waiting = self.waiting()
        if waiting >= self.max_waiting:
            raise QueueFull(waiting, self.max_waiting, self.retry_after())

    def submit(self, loop, kwargs: dict) -> tuple[asyncio.Future, asyncio.Queue]:
        """Driver.submit on the replica route() names; fails at once with QueueFull when the server's queue is full."""
        with self.lock:
            try:
                self.admit()
            except QueueFull as e:
                fut = loop.create_future()
                fut.set_exception(e)
                return fut, asyncio.Queue()
            r = self.replicas.route(kwargs.get("request_id"), [d.pending for d in self.drivers], kwargs)
            return self.drivers[r].submit(loop, kwargs)

    def abort(self, request_id: str) -> None:
        """Free the request on whichever replica holds it (the others do not know the id)."""
        for d in self.drivers:
            d.abort(request_id)
