"""The engine thread: one thread steps the engine; handlers hand it requests through a queue and read
their events from per-request asyncio queues.

Saturation: requests wait for the engine in order of arrival; at most `max_waiting` may wait (default:
8 times the sequences the decode walk runs at once), beyond that a request is refused at once with 429
and Retry-After (the seconds in which, at the rate requests have been finishing, one leaves the queue).

Gathering: requests that arrive together prepare in parallel (Engine.prepare in worker threads) and finish it
a little apart. An idle engine that takes the first would run its prefill (a clip's encoder and prompt: hundreds
of ms) alone, and the others after it. So when the engine had nothing running and others submitted are still
preparing, it waits for them, at most `gather_ms` (default 50; 0: never), and one step takes them all. A
running engine never waits: its next step takes whatever has arrived.
"""
from __future__ import annotations

import asyncio
import logging
import os
import queue
import threading
import time

from graphc.errors import InvalidInput
from graphc.runtime.engine import Engine, Event
from graphc.runtime.workers import WorkerDied
from graphc.serve.errors import QueueFull

log = logging.getLogger("graphc.server")


GATHER_MS = 50.0              # the longest an idle engine waits for requests still preparing beside the first


def gather_window(ms: float | None) -> float:
    """Seconds an idle engine waits for requests still preparing (graphc run --gather-ms; None: GATHER_MS),
    refused outside 0 to 10,000 ms."""
    ms = GATHER_MS if ms is None else ms
    if not 0 <= ms <= 10_000:
        raise InvalidInput(f"--gather-ms {ms:g}", "an idle engine waits that long for requests still preparing; it "
                           "must be between 0 and 10,000 ms", "pass e.g. --gather-ms 50, or 0 to never wait")
    return ms / 1e3


class EngineFailed(WorkerDied):
    """The engine's own step raised (a bug, or the device failed): what was in flight is failed and the
    server ends as when a device's worker died, rather than hang with requests nobody steps."""


class Driver:
    """The engine thread: adds submitted requests, steps while there is work, routes events. Observers
    (graphc/serve/ops.py's metrics) are called in it with each Event, and with a finished one when an
    abort frees a request."""

    RATE_WINDOW = 64          # the finished requests the Retry-After estimate looks at

    def __init__(self, engine: Engine, on_death=None, max_waiting: int | None = None, gather_ms: float | None = None):
        """on_death(WorkerDied): what ends the server when a device's worker died (default: exit 3);
        max_waiting: the most requests waiting for the engine (default: 8 x the decode walk's sequences);
        gather_ms: the longest an idle engine waits for requests still preparing (gather_window)."""
        self.engine = engine
        self.gather_s = gather_window(gather_ms)
        self.on_death = on_death or self._die
        self.max_waiting = max_waiting if max_waiting is not None else 8 * engine.max_running
        if self.max_waiting < 1:
            raise InvalidInput(f"max_waiting is {self.max_waiting}", "at least one request must be able to wait",
                               "give --max-waiting 1 or more")
        self.observers: list = []
        self.inbox: queue.Queue = queue.Queue()
        self.pending = 0                  # submitted, not yet taken by the engine thread
        self.lock = threading.RLock()      # submit() holds it while admit() reads the finishing rate
        self.finished: list[float] = []   # monotonic times of the last RATE_WINDOW finished requests
        self.wake = threading.Event()
        self.stopping = False
        self.thread = threading.Thread(target=self._loop, name="graphc-engine", daemon=True)
        self.thread.start()

    def close(self, timeout: float = 10.0) -> None:
        """Stop the engine thread after the step it is in (the server shuts down): the engine is then
        its owner's again, to step or close."""
        self.stopping = True
        self.wake.set()
        if threading.current_thread() is not self.thread:
            self.thread.join(timeout)

    def waiting(self) -> int:
        """Requests submitted and not yet running: the server's queue."""
        return self.pending + self.engine.load()["waiting"]

    def retry_after(self) -> int:
        """Seconds in which one waiting request should leave the queue, at the rate they have been finishing."""
        with self.lock:
            done = list(self.finished)
        if len(done) < 2 or done[-1] <= done[0]:
            return 1
        per = (done[-1] - done[0]) / (len(done) - 1)
        return max(1, min(60, int(per + 0.999)))

    def admit(self) -> None:
        """Raise QueueFull when the queue is full (the server checks before it decodes any media)."""
        waiting = self.waiting()
        if waiting >= self.max_waiting:
            raise QueueFull(waiting, self.max_waiting, self.retry_after())

    def submit(self, loop, kwargs: dict) -> tuple[asyncio.Future, asyncio.Queue]:
        """Hand a request to the engine thread; the future fails at once with QueueFull when the queue is full."""
        fut, events = loop.create_future(), asyncio.Queue()
        with self.lock:
            try:
                self.admit()
            except QueueFull as e:
                fut.set_exception(e)
                return fut, events
            self.pending += 1
        loop.run_in_executor(None, self._prepare, loop, kwargs, fut, events)
        return fut, events

    def _prepare(self, loop, kwargs: dict, fut: asyncio.Future, events: asyncio.Queue) -> None:
        """In a worker thread: the request's prompt and media (Engine.prepare), then to the engine thread; a
        refusal settles its future here. Requests prepare in parallel, and the engine steps meanwhile."""
        try:
            prepared = self.engine.prepare(**kwargs, user=(loop, events))
        except Exception as e:               # refused: InvalidInput with the numbers, or a bad input
            with self.lock:
                self.pending -= 1
            self.wake.set()                  # an engine gathering need not wait for it
            loop.call_soon_threadsafe(_settle, fut, None, e)
            return
        self.inbox.put(("add", loop, prepared, fut, events))
        self.wake.set()

    def abort(self, request_id: str) -> None:
        """Free a request (its client went away), in the engine thread."""
        self.inbox.put(("abort", request_id))
        self.wake.set()

    def fail_all(self, what: str) -> None:
        """End every request in flight or waiting with an error event saying what (the server is stopping),
        in the engine thread."""
        self.inbox.put(("fail", what))
        self.wake.set()

    def _observe(self, ev: Event) -> None:
        for observer in self.observers:
            try:
                observer(ev)
            except Exception:                 # an observer never stops the engine
                log.exception("observer %r failed", observer)

    def _abort(self, request_id: str) -> None:
        req = self.engine.request(request_id)
        self.engine.abort(request_id)
        if req is not None and req.finish_reason == "abort":
            self._observe(Event(req, [], "", True))

    def _take_inbox(self) -> None:
        """Add the submitted requests and do the aborts asked for, in order."""
        while True:
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return
            if item[0] == "abort":
                self._abort(item[1])
                continue
            if item[0] == "fail":
                for ev in self.engine.fail_all(item[1]):
                    self._route(ev)
                continue
            _, loop, prepared, fut, events = item
            try:
                req = self.engine.admit(prepared)
                loop.call_soon_threadsafe(_settle, fut, req, None)
            except Exception as e:            # refused: InvalidInput with the numbers, or a bad input
                loop.call_soon_threadsafe(_settle, fut, None, e)
            finally:
                with self.lock:
                    self.pending -= 1

    def _gather(self) -> None:
        """The idle engine took a request: while others submitted are still preparing, take them as they come,
        for at most gather_s, so that its first step runs them together."""
        deadline = time.monotonic() + self.gather_s
        while self.pending > 0 and not self.stopping and (left := deadline - time.monotonic()) > 0:
            self.wake.wait(left)
            self.wake.clear()
            self._take_inbox()

    def _step(self) -> tuple[list[Event], WorkerDied | None]:
        """One engine step: its events, and what ends the server when the step failed."""
        try:
            return self.engine.step(), None
        except WorkerDied as e:              # a device's worker died: fail what is in flight, then exit
            return e.events, e
        except Exception as e:               # the step itself failed: the same, with its traceback logged
            log.exception("graphc: the engine's step failed")
            what = f"the engine's step failed ({type(e).__name__}: {e})"
            return self.engine.fail_all(what), EngineFailed(what, "the engine cannot go on",
                                                             "see the log above; restart the server")

    def _route(self, ev: Event) -> None:
        """An event to its observers and to the handler that waits for it."""
        if ev.finished:
            with self.lock:
                self.finished = self.finished[-(self.RATE_WINDOW - 1):] + [time.monotonic()]
        self._observe(ev)
        if ev.request.user is None:       # added to the engine directly, not through this server
            return
        loop, events = ev.request.user
        try:
            loop.call_soon_threadsafe(events.put_nowait, ev)
        except RuntimeError:              # its event loop is gone (shutdown): nobody reads it any more
            self._abort(ev.request.id)

    def _loop(self) -> None:
        from graphc.runtime.replicas import on_device

        with on_device(self.engine):        # a replica's engine steps on its own GPU
            self._run()

    def _run(self) -> None:
        while not self.stopping:
            idle = not self.engine.has_work()
            self._take_inbox()
            if idle and self.engine.has_work():
                self._gather()
            if not self.engine.has_work():
                self.wake.wait(0.05)
                self.wake.clear()
                if not self.engine.has_workers:
                    continue                      # else an idle step: it looks at the devices' workers
            events, dead = self._step()
            for ev in events:
                self._route(ev)
            if dead is not None:
                self.on_death(dead)
                return

    @staticmethod
    def _die(e: WorkerDied) -> None:
        log.critical("graphc: %s; the server exits with code %d", e, e.exit_code)
        threading.Timer(1.0, os._exit, (e.exit_code,)).start()       # a moment to send the errors


def _settle(fut: asyncio.Future, value, exc) -> None:
    if not fut.done():
        fut.set_exception(exc) if exc is not None else fut.set_result(value)
