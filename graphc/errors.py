"""Errors that the CLI turns into exit codes: every one says what, why and how to fix it."""
from __future__ import annotations

EXIT_FITS = 0
EXIT_DOES_NOT_FIT = 1
EXIT_INVALID = 2


class GraphcError(Exception):
    """Base: a message in three parts, what went wrong, why, and the fix."""

    exit_code = EXIT_INVALID

    def __init__(self, what: str, why: str = "", fix: str = ""):
        self.what, self.why, self.fix = what, why, fix
        super().__init__(self.render())

    def render(self) -> str:
        parts = [self.what]
        if self.why:
            parts.append(self.why)
        if self.fix:
            parts.append(f"Fix: {self.fix}")
        return "\n".join(parts)


class InvalidInput(GraphcError):
    """A declaration, override, plan file or request that is malformed or impossible."""

    exit_code = EXIT_INVALID

    def __init__(self, what: str, why: str = "", fix: str = "", param: str | None = None):
        self.param = param            # the request field at fault, when a request is refused
        super().__init__(what, why, fix)


class DoesNotFit(GraphcError):
    """The model, as declared and overridden, does not fit the target; carries ranked remedies."""

    exit_code = EXIT_DOES_NOT_FIT

    def __init__(self, what: str, why: str = "", fix: str = "", remedies: list | None = None, result=None):
        self.remedies = remedies or []
        self.result = result          # the compiler's failing result, for reports
        super().__init__(what, why, fix)


class WorkerDied(GraphcError):
    """A plan device's worker or a tensor-parallel rank ended or failed to boot; the engine cannot go on."""

    exit_code = 3


class Stopped(Exception):
    """A command stopped at once by a signal after it said so on stderr (graphc run's server on a second SIGINT or
    SIGTERM): the CLI prints nothing more and exits 128 + the signal's number, as a shell reports a process the
    signal ended (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(f"stopped by signal {signum}")
