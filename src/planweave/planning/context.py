"""A planner context that stays bounded: outputs by reference, the run's report, the active frontier (pure).

The state summary of :mod:`planweave.planning.prompts` lists every step and cuts the text at a fixed size, so a long
run either overflows the cut (the remaining plan and the failures, listed last, fall off) or shows each output in a
few characters. Here the planner is told instead:

- the run's **report**, the notes document it rewrites at each re-plan (a ``{"report": "..."}`` line of its reply),
  bounded to ``report_chars``;
- the **active frontier**: failed, running and waiting steps (failures first), at most ``frontier`` of them;
- **references** to the ``refs`` most recently finished steps: id, tool, size and a short summary, cached per
  output (:class:`ReferenceBook`); older ones are counted, not listed; the detail of any output is fetched with the
  ``context.read`` tool, whose own recent outputs are shown whole (up to ``read_chars``).

The size of this text does not grow with the number of finished steps: every part has its own bound.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from planweave.core.state import RunState

__all__ = ["ContextLimits", "OutputRef", "RedactedOutputs", "ReferenceBook", "bounded_context", "summarize_output"]

#: The tool whose outputs are detail the planner asked for: shown whole (bounded), not as a reference.
READ_TOOL = "context.read"


@dataclass(frozen=True)
class ContextLimits:
    """The bound of each part of the planner's context (characters or counts)."""

    summary_chars: int = 160  # one output's summary
    refs: int = 30  # finished steps listed by reference (the most recent)
    frontier: int = 40  # failed / running / waiting steps listed
    report_chars: int = 2000
    read_chars: int = 2000  # a recent context.read output, shown whole up to this
    reads: int = 3  # recent context.read outputs shown


@dataclass(frozen=True)
class OutputRef:
    """What the planner sees of one output: the step, its tool, the output's size (canonical JSON characters) and
    a short summary."""

    step: str
    tool: str
    size: int
    summary: str

    def line(self) -> str:
        return f"- {self.step} ({self.tool}, {self.size} chars): {self.summary}"


def _canonical(value: Any) -> str:
    return json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)


def summarize_output(value: Any, limit: int) -> tuple[str, int]:
    """A short summary of ``value`` and its size: the tool's own ``summary`` field when it has one (a mapping with a
    string ``summary``), else its canonical JSON cut to ``limit`` characters (deterministic)."""
    text = _canonical(value)
    if isinstance(value, Mapping) and isinstance(value.get("summary"), str):
        summary = " ".join(str(value["summary"]).split())
    else:
        summary = text
    if len(summary) > limit:
        summary = summary[: max(0, limit - 3)] + "..."
    return summary, len(text)


class RedactedOutputs(Mapping[str, Any]):
    """A run's outputs with the engine's secrets hidden, each output redacted when it is read (lazily: a context
    reads a few outputs, not all of them).

    A context cuts outputs to a few characters (the state summary's per-output share, a reference's summary); cut
    first and redacted after, a secret that straddles the cut is no longer whole and its first characters reach the
    model: the contexts read outputs through this view, so what they cut is redacted already.
    """

    def __init__(self, outputs: Mapping[str, Any], redact: Callable[[Any], Any]) -> None:
        self._outputs = outputs
        self._redact = redact

    def __getitem__(self, key: str) -> Any:
        return self._redact(self._outputs[key])

    def __contains__(self, key: object) -> bool:
        return key in self._outputs

    def __iter__(self) -> Iterator[str]:
        return iter(self._outputs)

    def __len__(self) -> int:
        return len(self._outputs)


class ReferenceBook:
    """The references of a run's finished outputs, in the order they finished, each summarised once (cached)."""

    def __init__(self, limits: ContextLimits = ContextLimits()) -> None:
        self.limits = limits
        self._refs: dict[str, OutputRef] = {}
        self.reads: list[str] = []  # the context.read steps noted, in order
        self.summarised = 0  # summaries computed (a cache miss each): the cache's own figure

    def note(self, step: str, tool: str, output: Any) -> OutputRef:
        """The reference of ``step``'s output, computed the first time only (an output never changes once finished;
        a step re-run by a re-plan under the same id is noted again with :meth:`forget` first)."""
        ref = self._refs.get(step)
        if ref is None:
            summary, size = summarize_output(output, self.limits.summary_chars)
            ref = self._refs[step] = OutputRef(step, tool, size, summary)
            self.summarised += 1
            if tool == READ_TOOL:
                self.reads.append(step)
        return ref

    def forget(self, step: str) -> None:
        self._refs.pop(step, None)

    def __len__(self) -> int:
        return len(self._refs)

    def recent(self, n: int) -> list[OutputRef]:
        refs = list(self._refs.values())
        return refs[-n:] if n > 0 else []

    def sync(self, state: RunState, outputs: Mapping[str, Any]) -> None:
        """Note every succeeded step not noted yet (a resumed run, or steps that finished between two looks)."""
        for sid, rec in state.records.items():
            if rec.status == "succeeded" and sid not in self._refs and sid in state.plan.steps:
                self.note(sid, state.plan.steps[sid].tool, outputs.get(sid))


def _step_line(state: RunState, sid: str) -> str:
    step = state.plan.steps[sid]
    return _canonical(step.model_dump(exclude_defaults=True))


def bounded_context(state: RunState, outputs: Mapping[str, Any], book: ReferenceBook, report: str, *,
                    redact: Callable[[Any], Any] | None = None, rewrite: bool = True) -> str:
    """The run as the planner is told it: report, frontier, references, recent reads; every part bounded. With
    ``redact`` (the engine's), errors are redacted before they are cut (give ``outputs`` as :class:`RedactedOutputs`
    for the same with outputs). ``rewrite`` False (the joiner, which answers but writes no plan lines): the report
    without the instruction to rewrite it."""
    limits = book.limits
    book.sync(state, outputs)
    failed, running, waiting = [], [], []
    for sid, rec in state.records.items():
        if rec.status in ("failed", "skipped", "cancelled", "unknown"):
            if rec.status == "cancelled" and rec.error is None:
                continue
            error = str(rec.error if redact is None else redact(str(rec.error)))
            failed.append(f"- {sid} ({state.plan.steps[sid].tool}) {rec.status}: {error[:300]}")
        elif rec.status == "running":
            running.append(f"- {sid} ({state.plan.steps[sid].tool}) running")
        elif rec.status != "succeeded":
            waiting.append(f"- {_step_line(state, sid)}")
    parts: list[str] = []
    notes = report.strip()
    if len(notes) > limits.report_chars:
        notes = notes[: limits.report_chars] + "...[report cut]"
    header = ("Report (your notes so far; rewrite it with a {\"report\": \"...\"} line):" if rewrite
              else "Report (the planner's notes on the run):")
    parts.append(header + "\n" + (notes or "(empty)"))
    frontier = [*failed, *running, *waiting]
    if frontier:
        shown = frontier[: limits.frontier]
        more = len(frontier) - len(shown)
        parts.append("Active frontier (failed, running, remaining):\n" + "\n".join(shown)
                     + (f"\n- ... and {more} more" if more else ""))
    refs = book.recent(limits.refs)
    older = len(book) - len(refs)
    if refs:
        head = (f"Done ({len(book)} finished steps; reuse them by id, do not repeat them; read an output's detail "
                "with a context.read step {\"step\": id, \"path\": \"key[0]\", \"max_chars\": n}"
                + (f"; {older} older ones not listed" if older else "") + "):")
        parts.append(head + "\n" + "\n".join(r.line() for r in refs))
    reads = [sid for sid in book.reads if sid in outputs][-limits.reads:] if limits.reads > 0 else []
    if reads:
        shown_reads = []
        for sid in reads:
            text = _canonical(outputs.get(sid))
            if len(text) > limits.read_chars:
                text = text[: limits.read_chars] + "...[cut]"
            shown_reads.append(f"- {sid}: {text}")
        parts.append("Detail you read:\n" + "\n".join(shown_reads))
    return "\n\n".join(parts)
