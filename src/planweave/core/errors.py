"""The planweave error hierarchy: every error a user can see derives from :class:`PlanweaveError`."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


class PlanweaveError(Exception):
    """Base of every error planweave raises on purpose."""


class PlanError(PlanweaveError):
    """A plan could not be read or is not valid."""


@dataclass(frozen=True, slots=True)
class PlanProblem:
    """One thing wrong with a plan, located by step id and field (either may be empty) and, for a plan read from a
    file, by the 1-based ``line`` and ``column`` of the step or field it concerns (None where unknown)."""

    step: str
    field: str
    message: str
    line: int | None = None
    column: int | None = None

    @property
    def position(self) -> str:
        """``line 12, column 7`` (or ``line 12``), or an empty string where the position is unknown."""
        if self.line is None:
            return ""
        return f"line {self.line}" if self.column is None else f"line {self.line}, column {self.column}"

    @property
    def detail(self) -> str:
        """The message without the position it may open with (syntax errors name theirs in the message too)."""
        position = self.position
        if position and self.message.startswith(position + ": "):
            return self.message[len(position) + 2:]
        return self.message

    def unplaced(self) -> str:
        """The problem as text without its position: ``step 'fetch', args.url: message``."""
        where = []
        if self.step:
            where.append(f"step '{self.step}'")
        if self.field:
            where.append(self.field)
        prefix = ", ".join(where)
        return f"{prefix}: {self.detail}" if prefix else self.detail

    def __str__(self) -> str:
        position = self.position
        return f"{position}: {self.unplaced()}" if position else self.unplaced()


class PlanInvalid(PlanError):
    """Raised when validation finds problems; ``problems`` lists every one of them."""

    def __init__(self, problems: Iterable[PlanProblem], source: str = "plan") -> None:
        self.problems = tuple(problems)
        self.source = source
        lines = [f"{source} is not valid ({len(self.problems)} problem{'s' if len(self.problems) != 1 else ''}):"]
        lines += [f"  - {p}" for p in self.problems]
        super().__init__("\n".join(lines))


class RunError(PlanweaveError):
    """A run could not be started, resumed or controlled."""


class RunNotFound(RunError):
    """The journal holds no run with the given id."""


class ReplyRefused(RunError):
    """A person's reply came after the one that stands for the step: the first reply is final.

    ``decision`` describes the reply that stands: ``by``, ``at`` (epoch seconds), ``approve`` and ``reason`` or
    ``value``, and ``applied`` (whether the run has applied it yet).
    """

    def __init__(self, message: str, decision: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.decision = dict(decision)


class InputRejected(PlanweaveError):
    """A value given to a step waiting for input does not satisfy its schema; the step keeps waiting."""


class JournalError(PlanweaveError):
    """The journal could not be opened, read or written, or its contents are inconsistent."""


class EventNotRecorded(JournalError):
    """Raised by ``Journal.append`` when an event's data cannot be stored (e.g. a lone surrogate in a string).

    The event is refused before it is buffered: nothing of it is recorded and the journal keeps working for every
    other event. The message names the event, its run and where in its data the problem is.
    """


class ToolError(PlanweaveError):
    """A tool call failed; ``kind`` classifies the failure for retry policies.

    Tools raise this (or any other exception, which is classified as ``error``) to fail a step.
    ``retryable=False`` makes the failure final regardless of the step's retry policy.
    """

    def __init__(self, message: str, *, kind: str = "error", retryable: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.retryable = retryable


class StepFailed(PlanweaveError):
    """A step failed for good; carries the step id and the last error text."""

    def __init__(self, step: str, error: str) -> None:
        super().__init__(f"step '{step}' failed: {error}")
        self.step = step
        self.error = error


def did_you_mean(name: str, candidates: Iterable[str]) -> str:
    """Return `` (did you mean 'x'?)`` for the closest candidate, or an empty string."""
    close = difflib.get_close_matches(name, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
