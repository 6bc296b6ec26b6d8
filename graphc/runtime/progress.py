"""Boot progress: each phase of a boot (kernels compiled, weights loaded or seeded, steps run, graphs warmed
and captured) reported as one INFO line on the `graphc.boot` logger when it ends, with its size and time
(bytes and bytes/s for weights), and one last line with the whole boot's time.

Who sees what:
- The CLI (`graphc run`, `graphc check`) runs in shown(): the lines go to stderr, and while a phase runs a
  tqdm bar draws on stderr when it is a terminal (the bar is cleared and the phase's line stays).
  `-q` shows nothing.
- A library user (graphc.Engine in a script or a test) sees nothing: the lines are INFO on `graphc.boot`,
  which logging drops unless asked (`logging.basicConfig(level=logging.INFO)` shows them, and the bars on
  a terminal). No bar draws while `graphc.boot` is not enabled for INFO.
- One process reports: the one that drives the boot (the engine's). A plan device's worker process boots
  without a line (nothing shows its logger); the engine's `workers` line says when they all are booted. Several
  replicas boot one after another, each line prefixed with its replica; a multi-device plan's lines name
  the engine's device. Under Ray the engine actor shows its lines and Ray forwards them (ray_run.py).
"""
from __future__ import annotations

import logging
import sys
import time
from contextlib import contextmanager
from typing import Iterator

from tqdm import tqdm

from graphc.units import fmt_bytes

log = logging.getLogger("graphc.boot")


def phase_line(name: str, done: float, unit: str, verb: str, seconds: float) -> str:
    """One finished phase: 'weights: 1.50 GiB loaded in 2.0 s (768.00 MiB/s)', 'graphs: 12 captured in 3.1 s'."""
    if unit == "B":
        rate = f" ({fmt_bytes(done / seconds)}/s)" if seconds > 0 else ""
        return f"{name}: {fmt_bytes(done)} {verb} in {seconds:.1f} s{rate}"
    plural = unit if done == 1 else f"{unit}s"
    return f"{name}: {int(done):,} {plural} {verb} in {seconds:.1f} s"


class Phase:
    """A running phase: what it has done so far (units), drawn on its bar if it has one."""

    def __init__(self, bar: tqdm | None):
        self.bar, self.done = bar, 0

    def update(self, n: float = 1) -> None:
        self.done += n
        if self.bar is not None:
            self.bar.update(n)


def bars_on() -> bool:
    """Bars draw when the boot's lines are shown and stderr is a terminal."""
    return log.isEnabledFor(logging.INFO) and sys.stderr.isatty()


class BootProgress:
    """The phases of one boot, each reported as it ends; done() reports the boot's time since this was made.
    where: what the lines name before the phase ('device 1', 'replica 0'; '' for a plan of one device)."""

    def __init__(self, where: str = ""):
        self.t0 = time.perf_counter()
        self.prefix = f"boot {where}: " if where else "boot: "
        self.lines: list[str] = []           # the phases reported, in order

    @contextmanager
    def phase(self, name: str, total: float | None, unit: str, verb: str) -> Iterator[Phase]:
        """A phase of `total` units (None: unknown); its line is reported when it ends without an error, unless
        it had nothing to do (a total of 0)."""
        bar = None
        if bars_on():
            scaled = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
            bar = tqdm(total=total, desc=f"{self.prefix}{name}", unit=unit, file=sys.stderr, leave=False, **scaled)
        p, t = Phase(bar), time.perf_counter()
        try:
            yield p
        finally:
            if bar is not None:
                bar.close()
        if total == 0 and not p.done:
            return
        self.report(phase_line(name, p.done, unit, verb, time.perf_counter() - t))

    def report(self, line: str) -> None:
        self.lines.append(line)
        log.info("%s%s", self.prefix, line)

    def done(self, what: str = "done") -> float:
        """Report the boot's end ('boot: done in 4.1 s'); its seconds."""
        seconds = time.perf_counter() - self.t0
        log.info("%s%s in %.1f s", self.prefix, what, seconds)
        return seconds


class _Stderr(logging.StreamHandler):
    """Writes to sys.stderr as it is when a line is logged (a test may have swapped it since)."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


@contextmanager
def shown(quiet: bool = False) -> Iterator[None]:
    """The CLI's setting while a command runs: boot lines on stderr (bars on a terminal), or none with quiet.
    The logger is as it was again after it (a test that runs the CLI in its process leaves no handler)."""
    level, propagate = log.level, log.propagate
    handler = _Stderr()
    handler.setFormatter(logging.Formatter("%(message)s"))
    log.addHandler(handler)
    log.propagate = False               # a root handler (basicConfig) would print each line twice
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    try:
        yield
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
        log.propagate = propagate
