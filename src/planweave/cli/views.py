"""Rich rendering for the command line: the live view of a run, step and run tables, and a text Gantt timeline.

Everything here is a function of a :class:`~planweave.core.state.RunState` (plus a notion of "now"), so the live
view of a running engine and ``planweave show`` of a journaled run draw the same picture.
"""

from __future__ import annotations

import asyncio
import functools
import heapq
import json
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from rich.console import Console, Group, JustifyMethod, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text

from planweave.core.clock import Clock
from planweave.core.events import Event
from planweave.core.plan.defaults import may_wait_forever
from planweave.core.state import ACTIVE, RunState, StepRecord
from planweave.engine.runtime import Run
from planweave.tools.safety import SecretRedactor

STATUS_STYLE: Mapping[str, str] = {
    "pending": "dim",
    "ready": "cyan",
    "running": "bold yellow",
    "waiting_approval": "bold cyan",
    "waiting_input": "bold cyan",
    "succeeded": "green",
    "failed": "bold red",
    "cancelled": "magenta",
    "skipped": "dim red",
    "unknown": "bold magenta",
    "interrupted": "yellow",
    "speculative": "dim cyan",
}
_COUNT_LABEL: Mapping[str, str] = {"waiting_approval": "waiting for approval", "waiting_input": "waiting for input"}
# The order counts are listed in, most urgent first.
STATUS_ORDER = ("waiting_approval", "waiting_input", "running", "interrupted", "ready",
                "unknown", "failed", "cancelled", "skipped", "succeeded", "pending")

# Timeline glyphs, distinct without colour so retries stay visible in logs and plain terminals.
BAR_GLYPH: Mapping[str, str] = {
    "succeeded": "█",
    "running": "█",
    "failed": "▓",
    "interrupted": "▒",
    "cancelled": "░",
    "speculative": "╌",
}
RETRY_WAIT_GLYPH = "·"
SPECULATIVE_MARK = "≈"
"""Beside a step whose attempt started speculatively, on predicted inputs, and was adopted (docs/speculation.md)."""

# A timestamp this large is seconds since the Unix epoch; smaller ones come from a virtual clock starting at 0.
_EPOCH_THRESHOLD = 1e9
UNBOUNDED_MARK = "⚠ no timeout"
"""Beside a step that may still wait forever: it has no timeout, or one longer than a day."""
_YEAR = 365 * 86400.0


OFF_TERMINAL_WIDTH = 10_000
"""The width of the views off a terminal (a CI log, a pipe) when $COLUMNS does not say: wide enough that a row of a
table stays one line, as a log or a grep needs it (Rich's default there is 80)."""
OFF_TERMINAL_TIMELINE = 120  # the width of a timeline off a terminal without $COLUMNS: its bars scale to it


def console(*, stderr: bool = False) -> Console:
    """A console for the command line's views: a terminal's own width; off a terminal $COLUMNS if set, else
    :data:`OFF_TERMINAL_WIDTH` (no wrapping)."""
    out = Console(stderr=stderr, highlight=False)
    if not out.is_terminal and not os.environ.get("COLUMNS", "").strip().isdigit():
        out.width = OFF_TERMINAL_WIDTH
    return out


def timeline_width(out: Console) -> int:
    """How wide a timeline drawn on ``out`` is: the console's width, or :data:`OFF_TERMINAL_TIMELINE` on a console
    of :func:`console` off a terminal (bars that wide say nothing more)."""
    return OFF_TERMINAL_TIMELINE if out.width >= OFF_TERMINAL_WIDTH else out.width


def format_duration(seconds: float | None) -> str:
    """A compact human duration (``0.42s``, ``3m05s``, ``2h03m``, ``12d04h``, ``3.0y``); ``-`` for None."""
    if seconds is None:
        return "-"
    s = max(0.0, seconds)
    if s < 10:
        return f"{s:.2f}s"
    if s < 60:
        return f"{s:.1f}s"
    if s < 3600:
        return f"{int(s // 60)}m{int(s % 60):02d}s"
    if s < 86400:
        return f"{int(s // 3600)}h{int(s % 3600 // 60):02d}m"
    if s < _YEAR:
        return f"{int(s // 86400)}d{int(s % 86400 // 3600):02d}h"
    return f"{s / _YEAR:.1f}y"


def format_instant(at: float | None) -> str:
    """A timestamp for people: local date and time for wall-clock stamps, ``t=...`` for virtual-clock ones."""
    if at is None:
        return "-"
    if at >= _EPOCH_THRESHOLD:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"t={format_duration(at)}"


def format_offset(at: float | None, origin: float | None) -> str:
    """``at`` relative to the run's start (``+1.20s``)."""
    if at is None or origin is None:
        return "-"
    return "+" + format_duration(at - origin)


def status_text(status: str) -> Text:
    return Text(status, style=STATUS_STYLE.get(status, ""))


def shown_status(status: str, interrupted: bool) -> str:
    """A step's status as the views show it: in a run whose process stopped (``interrupted``), a step it was
    running is ``interrupted``, not running (a resume re-runs it, or finds its outcome unknown)."""
    return "interrupted" if interrupted and status == "running" else status


def counts_text(counts: Mapping[str, int], interrupted: bool = False) -> Text:
    """``3 running · 5 succeeded · 1 failed`` with each state in its colour (``interrupted``: of a run whose
    process stopped, :func:`shown_status`)."""
    if interrupted and counts.get("running"):
        counts = {**counts, "interrupted": counts.get("interrupted", 0) + counts["running"], "running": 0}
    out = Text()
    for status in STATUS_ORDER:
        n = counts.get(status, 0)
        if n:
            if out:
                out.append(" · ", style="dim")
            out.append(f"{n} {_COUNT_LABEL.get(status, status)}", style=STATUS_STYLE[status])
    return out


def step_elapsed(rec: StepRecord, now: float | None, state: RunState | None = None) -> float | None:
    """Time from the step's first start to its end (or to ``now`` while it is not finished); given the run's
    ``state``, the time it ran: less the run's downtime between (a resume re-ran it)."""
    if rec.started_at is None:
        return None
    end = rec.finished_at if rec.finished_at is not None else now
    if state is not None and state.downtime:
        return state.ran_s(rec.started_at, end)
    return None if end is None else end - rec.started_at


def elapsed_text(state: RunState, end: float | None) -> str:
    """How long the run has run until ``end``: its live spans summed, then the wall-clock span when a resume left
    a time no process ran it (``12.0s (wall clock 2h05m)``); empty without a start or an end."""
    ran = state.ran_s(state.created_at, end)
    if ran is None or state.created_at is None or end is None:
        return ""
    wall = end - state.created_at
    if wall - ran < 0.01:
        return format_duration(ran)
    return f"{format_duration(ran)} (wall clock {format_duration(wall)})"


def _attempt_text(state: RunState, rec: StepRecord) -> str:
    allowed = state.plan.steps[rec.id].retries.max + 1
    if rec.attempts == 0:
        return "-"
    return f"{rec.attempts}/{allowed}" if allowed > 1 else str(rec.attempts)


def _error_text(rec: StepRecord) -> Text:
    if rec.error is None:
        return Text("")
    first_line = rec.error.strip().splitlines()[0] if rec.error.strip() else rec.error
    if rec.status == "ready" and rec.retry_at is not None:
        return Text(f"retrying after: {first_line}", style="yellow")
    return Text(first_line, style="red" if rec.status in ("failed", "unknown") else "dim")


def _hidden_counts(state: RunState, chosen: set[str]) -> dict[str, int]:
    hidden = state.counts()
    for sid in chosen:
        status = state.records[sid].status
        hidden[status] -= 1
    return {status: n for status, n in hidden.items() if n}


_URGENCY: Mapping[str, int] = {"waiting_approval": 0, "waiting_input": 0,
                               "running": 0, "failed": 1, "unknown": 1, "ready": 2, "cancelled": 3,
                               "succeeded": 4, "skipped": 4, "pending": 5}


def _visible_steps(state: RunState, max_rows: int | None) -> tuple[list[str], dict[str, int]]:
    """The steps worth a row when not all fit: active and failed ones first, then the latest finished, then pending.

    Returns the chosen ids in plan order and the counts, by state, of the ones left out. One pass over the steps:
    the live view of a 10,000-step run redraws several times a second.
    """
    order = state.plan.order
    if max_rows is None or len(order) <= max_rows:
        return list(order), {}
    buckets: list[list[StepRecord]] = [[] for _ in range(6)]
    for rec in state.records.values():
        buckets[_URGENCY.get(rec.status, 5)].append(rec)
    chosen: set[str] = set()
    for urgency, bucket in enumerate(buckets):
        room = max_rows - len(chosen)
        if room <= 0:
            break
        if len(bucket) > room and urgency == 4:  # finished: the latest ones
            bucket = heapq.nlargest(room, bucket, key=lambda r: r.finished_at or 0.0)
        chosen.update(rec.id for rec in bucket[:room])
    return [sid for sid in order if sid in chosen], _hidden_counts(state, chosen)


def summary_steps(state: RunState, now: float | None, top: int = 10) -> tuple[list[str], dict[str, int]]:
    """The rows of a run's final view: the failed (and unknown) steps, the running ones, then the ``top`` slowest.

    Each group holds at most ``top`` steps; a run of at most ``2 * top`` steps shows every one, in plan order.
    Returns the chosen ids (failed, running, then slowest first) and the counts, by state, of the others.
    """
    order = state.plan.order
    if len(order) <= 2 * top:
        return list(order), {}
    failed: list[str] = []
    running: list[str] = []
    timed: list[tuple[float, str]] = []
    for rec in state.records.values():  # one pass: a final view must stay cheap next to a 10,000-step run
        if rec.status in ("failed", "unknown"):
            failed.append(rec.id)
        elif rec.status in ("running", "waiting_approval", "waiting_input"):
            running.append(rec.id)
        elif rec.started_at is not None:
            elapsed = step_elapsed(rec, now, state)
            if elapsed is not None:
                timed.append((elapsed, rec.id))
    slowest = [sid for _elapsed, sid in heapq.nlargest(top, timed, key=lambda item: item[0])]
    shown = [*failed[:top], *running[:top], *slowest]
    return shown, _hidden_counts(state, set(shown))


def still_unbounded(state: RunState, sid: str) -> bool:
    """Whether step ``sid`` has not finished and :func:`~planweave.core.plan.defaults.may_wait_forever` (a finished step
    waits for nothing more, whatever its timeout was)."""
    step = state.plan.steps.get(sid)
    rec = state.records.get(sid)
    return (step is not None and rec is not None and (rec.status in ACTIVE or rec.status == "pending")
            and may_wait_forever(step))


def unbounded_hint(state: RunState, shown: int = 5) -> Text | None:
    """One line naming the unfinished steps that may wait forever, and what bounds them; None if there are none."""
    ids = [sid for sid in state.plan.order if still_unbounded(state, sid)]
    if not ids:
        return None
    more = f" and {len(ids) - shown} more" if len(ids) > shown else ""
    line = Text(f"{UNBOUNDED_MARK}: {len(ids)} step{'s' if len(ids) > 1 else ''} may wait forever ", style="yellow")
    line.append(f"({', '.join(ids[:shown])}{more})", style="bold yellow")
    line.append(": no timeout, or one over a day; set the step's timeout (or the plan's defaults.timeout, or run "
                "--step-timeout S)", style="dim")
    return line


def steps_table(
    state: RunState, now: float | None, *, max_rows: int | None = None, detailed: bool = False,
    top: int | None = None, more_hint: str = "", cached: Mapping[str, Mapping[str, Any]] | None = None,
    interrupted: bool = False,
) -> RenderableType:
    """One row per step: state, attempt, elapsed and error (``detailed`` adds started and finished offsets).

    ``cached`` (step -> the ``cache`` of its ``step_succeeded``) marks the steps whose output was reused from the
    result cache, naming the run and step it came from. ``interrupted``: the run's process stopped
    (:func:`shown_status`).

    Which rows: with ``top``, :func:`summary_steps`; else at most ``max_rows`` (None: every step). A last row counts
    the steps left out, followed by ``more_hint``, is printed below the table.
    """
    table = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    table.add_column("step", no_wrap=True)
    table.add_column("state", no_wrap=True)
    table.add_column("attempt", justify="right", no_wrap=True)
    if detailed:
        table.add_column("started", justify="right", no_wrap=True)
        table.add_column("finished", justify="right", no_wrap=True)
    table.add_column("elapsed", justify="right", no_wrap=True)
    table.add_column("error", overflow="fold")
    shown, hidden = summary_steps(state, now, top) if top is not None else _visible_steps(state, max_rows)
    origin = state.created_at
    for sid in shown:
        rec = state.records[sid]
        status = status_text(shown_status(rec.status, interrupted))
        if still_unbounded(state, sid):
            status.append(f" {UNBOUNDED_MARK}", style="yellow")
        hit = cached.get(sid) if cached else None
        if hit is not None and rec.status == "succeeded":
            status.append(f" (cached: {hit.get('run')}/{hit.get('step')})", style="cyan")
        cells: list[RenderableType] = [sid, status, _attempt_text(state, rec)]
        if detailed:
            cells += [format_offset(rec.started_at, origin), format_offset(rec.finished_at, origin)]
        cells += [format_duration(step_elapsed(rec, now, state)), _error_text(rec)]
        table.add_row(*cells)
    if hidden:
        more = Text(f"… {sum(hidden.values())} more: ", style="dim")
        more.append_text(counts_text(hidden, interrupted))
        if more_hint:
            more.append(f" ({more_hint})", style="dim")
        return Group(table, more)
    return table


@functools.cache
def _secrets() -> SecretRedactor:
    return SecretRedactor()


def hide_secrets(text: str) -> str:
    """``text`` with this process's secrets as ``***``: the live plan (its name, prompts) holds them as written."""
    hide = _secrets()
    return str(hide(text)) if hide else text


def run_header(state: RunState, now: float | None, status: str | None = None) -> Text:
    """``run ID · plan name · status · counts · elapsed`` (secrets in the name hidden)."""
    head = Text()
    head.append(f"run {state.run_id}", style="bold")
    name = state.plan.spec.shown_name()  # a goal run: its goal
    if name:
        head.append(f" · {hide_secrets(name)}")
    if state.plan.version > 1:
        head.append(f" · plan v{state.plan.version}")
    shown = status or state.status
    head.append(" · ")
    head.append_text(status_text(shown))
    head.append(" · ")
    head.append_text(counts_text(state.counts(), shown == "interrupted"))
    elapsed = elapsed_text(state, state.finished_at if state.finished_at is not None else now)
    if elapsed:
        head.append(f" · {elapsed}", style="bold")
    return head


def waiting_line(state: RunState, step_id: str, journal_flag: str = "") -> Text:
    """``waiting for approval: deploy · Deploy v1? — planweave approve RUN deploy``: what a person is asked, and the
    command that answers it (``journal_flag`` is appended, e.g. `` --journal URL``)."""
    rec = state.records[step_id]
    prompt = rec.prompt if isinstance(rec.prompt, str) and rec.prompt else None
    if rec.status == "waiting_approval":
        what, command = "approval", f"planweave approve {state.run_id} {step_id}"
    else:
        what, command = "input", f"planweave send {state.run_id} {step_id} --value JSON"
    line = Text(f"waiting for {what}: ", style=STATUS_STYLE.get(rec.status, ""))
    line.append(step_id, style="bold")
    if prompt:
        line.append(f" · {hide_secrets(prompt)}")
    line.append(f" — {command}{journal_flag}", style="dim")
    return line


def live_view(state: RunState, now: float | None, max_rows: int | None, journal_flag: str = "",
              forecast: Mapping[str, Any] | None = None) -> RenderableType:
    """What the live display of a running run shows: a header, the forecast (if any), the steps table, the steps
    waiting for people and the model endpoints' admission queues."""
    waiting = [waiting_line(state, sid, journal_flag) for sid in state.waiting_steps()]
    head = [run_header(state, now), *([forecast_line(forecast)] if forecast else [])]
    return Group(*head, steps_table(state, now, max_rows=max_rows), *waiting, *admission_lines())


def forecast_line(data: Mapping[str, Any]) -> Text:
    """The run's last ``forecast`` event in one line: the chances of its deadline and budget, makespan p50/p90."""
    line = Text("forecast: ", style="bold")
    parts = []
    for key, label in (("p_deadline", "in time"), ("p_budget", "within budget")):
        value = data.get(key)
        if value is not None:
            parts.append(f"{label} {value:.0%}")
    success = data.get("p_success")
    parts.append("succeeds: unknown (no history)" if success is None else f"succeeds {success:.0%}")
    span = data.get("makespan") or {}
    parts.append(f"makespan p50 {format_duration(span.get('p50'))} p90 {format_duration(span.get('p90'))}")
    line.append(" · ".join(parts))
    line.append(f" ({data.get('runs', 0)} simulated)", style="dim")
    return line


def admission_lines() -> list[Text]:
    """One line per model endpoint this process has called: queue length and wait, calls in flight of the window,
    the load signals (429s, 5xx, slow first tokens)."""
    from planweave.models.admission import live_endpoints

    lines = []
    for endpoint in live_endpoints():
        s = endpoint.stats()
        if not s.admitted and not s.queued:
            continue
        mean = s.wait_sum / s.admitted if s.admitted else 0.0
        limit = "∞" if s.limit is None else str(s.limit)
        line = Text(f"model {endpoint.model}: ", style="bold")
        line.append(f"{s.queued} queued" + (f" (oldest {format_duration(s.oldest_wait)})" if s.queued else ""))
        line.append(f" · {s.in_flight}/{limit} in flight · wait mean {format_duration(mean)}, "
                    f"max {format_duration(s.wait_max)}")
        bad = {k: v for k, v in s.signals.items() if k in ("rate_limited", "server_error", "slow_first_token")}
        if bad:
            line.append(" · " + ", ".join(f"{v} {k.replace('_', ' ')}" for k, v in sorted(bad.items())),
                        style="yellow")
        lines.append(line)
    return lines


SUMMARY_TOP = 10  # failed and slowest steps a final view shows by default
ALL_HINT = "--all shows every step"


def final_view(state: RunState, now: float | None, *, all_rows: bool = False,
               interrupted: bool = False) -> RenderableType:
    """The last frame of a run's live display: header and counts, then the failed and slowest steps (or all);
    ``interrupted``: the run was interrupted (its running steps shown so)."""
    table = (steps_table(state, now, interrupted=interrupted) if all_rows
             else steps_table(state, now, top=SUMMARY_TOP, more_hint=ALL_HINT, interrupted=interrupted))
    hint = unbounded_hint(state)
    header = run_header(state, now, "interrupted" if interrupted else None)
    return Group(header, table, *([hint] if hint is not None else []))


_ASKING = frozenset({"approval_requested", "input_requested"})
DRAW_SHARE = 0.025  # the most of the event loop's time the live view may spend drawing


class LiveRunView:
    """Keeps a Rich live display of one run up to date from the run's events, at most ``rate`` redraws a second.

    Event-driven: each event marks the view stale and schedules one redraw (events of the same loop iteration
    share it). Redraws also keep to a budget: after a frame that took ``d`` seconds the next waits at least
    ``d / DRAW_SHARE``, so however big the run, drawing it takes at most that share of the loop. With ``ticking``
    (real time only), the elapsed times also advance once a second while nothing happens; on a virtual clock a
    ticking timer would be a timer the clock jumps to forever, so there the view only follows events and draws the
    final state on exit. Off a terminal only the final frame is drawn (it is the only one printed).
    """

    def __init__(
        self, console: Console, clock: Clock, *, rate: float = 8.0, ticking: bool = True, all_rows: bool = False,
        journal_flag: str = "", flush: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._console = console
        self._journal_flag = journal_flag  # appended to the approve/send commands shown
        self._flush = flush  # makes the journal durable: a question is printed only once it can be answered
        self._asking: set[asyncio.Task[None]] = set()
        self._all_rows = all_rows
        self._clock = clock
        self._rate_interval = 1.0 / rate
        self._interval = self._rate_interval  # grows with the cost of a frame (DRAW_SHARE)
        self._ticking = ticking
        self._state: RunState | None = None
        self._forecast: Mapping[str, Any] | None = None  # the run's last forecast event (the fold ignores them)
        self._interrupted = False  # the run was stopped before it ended: its final frame says so
        self._live: Live | None = None
        self._last_draw = 0.0
        self._redraw: asyncio.Handle | None = None
        self._tick: asyncio.TimerHandle | None = None
        self._max_rows = max(5, console.height - 6)
        self._terminal = console.is_terminal  # a property that asks the OS each time: read it once

    @contextmanager
    def follow(self, run: Run) -> Iterator[None]:
        """Display ``run`` until the block exits.

        The first frame is drawn from the run's state, so events emitted before this call (``Engine.start`` returns
        after the run's first steps have started) are shown too; later ones arrive through the subscription.
        """
        self._state = run.state
        run.subscribe(self.on_event)
        live = Live(console=self._console, auto_refresh=False, redirect_stdout=False, redirect_stderr=False,
                    vertical_overflow="visible")
        self._live = live
        with live:
            self._draw()
            if not self._terminal:  # steps that began waiting before this call (e.g. a first step asking)
                for sid in run.state.waiting_steps():
                    self._say(waiting_line(run.state, sid, self._journal_flag))
            stopped = False  # the block was left by an interrupt (or an error): the run did not end
            try:
                yield
            except BaseException:
                stopped = True
                raise
            finally:
                for handle in (self._redraw, self._tick, *self._asking):
                    if handle is not None:
                        handle.cancel()
                self._redraw = self._tick = None
                self._interrupted = stopped and run.state.finished_at is None
                self._draw(final=True)
                self._live = None
                if not self._terminal:  # off a terminal Live prints its last frame without ending the line
                    live.stop()
                    self._console.line()  # (an interrupt too: what follows starts on a line of its own)

    def on_event(self, event: Event) -> None:
        """Listener for the run's events: schedule a redraw, throttled to the rate.

        Off a terminal, where no frame but the last is printed, a step starting to wait for a person is printed as
        it happens: the person has to know what to type.
        """
        if event.kind == "forecast":
            self._forecast = event.data
        if not self._terminal and event.kind in _ASKING and self._state is not None and self._live is not None:
            self._say(waiting_line(self._state, event.step or "", self._journal_flag))
        if self._redraw is not None or self._live is None or not self._terminal:
            return  # off a terminal only the last frame is printed
        loop = asyncio.get_running_loop()
        wait = self._last_draw + self._interval - time.monotonic()
        if wait <= 0:
            self._redraw = loop.call_soon(self._scheduled_draw)
        elif self._ticking:
            self._redraw = loop.call_later(wait, self._scheduled_draw)
        # else (virtual time): a later event or the final draw shows this one.

    def _say(self, line: Text) -> None:
        """Print what a person is asked, once the journal holds the question (so the printed command works)."""
        if self._flush is None:
            self._console.print(line, soft_wrap=True)
        else:
            task = asyncio.get_running_loop().create_task(self._ask(line, self._flush))
            self._asking.add(task)
            task.add_done_callback(self._asking.discard)

    async def _ask(self, line: Text, flush: Callable[[], Awaitable[None]]) -> None:
        await flush()
        if self._live is not None:
            self._console.print(line, soft_wrap=True)

    def _scheduled_draw(self) -> None:
        self._redraw = None
        self._draw()

    def _draw(self, final: bool = False) -> None:
        if self._live is None or self._state is None:
            return
        if not final and not self._terminal:
            return  # off a terminal only the last frame is printed: building the others is waste
        began = time.monotonic()
        try:
            now: float | None = self._clock.now()
        except RuntimeError:  # no loop to read a virtual clock from (the final draw after it stopped)
            now = None
        frame = (final_view(self._state, now, all_rows=self._all_rows, interrupted=self._interrupted) if final
                 else live_view(self._state, now, self._max_rows, self._journal_flag, self._forecast))
        self._live.update(frame, refresh=True)
        self._last_draw = time.monotonic()
        self._interval = max(self._rate_interval, (self._last_draw - began) / DRAW_SHARE)
        if self._ticking and not final and self._state.finished_at is None:
            if self._tick is not None:
                self._tick.cancel()
            self._tick = asyncio.get_running_loop().call_later(max(1.0, self._interval), self._draw)


# -- timelines ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Segment:
    start: int
    end: int
    glyph: str
    style: str


def _segments(rec: StepRecord, t0: float, span: float, width: int, horizon: float,
              thrown: Sequence[tuple[float, float | None]] = (), interrupted: bool = False) -> list[_Segment]:
    """Columns of each attempt of ``rec`` on a bar ``width`` wide; attempts never share a column while space lasts.

    ``thrown`` are the (start, end) of the step's speculative attempts that were thrown away, drawn ``╌``;
    ``interrupted``: the run's process stopped, so an attempt still running is drawn interrupted.
    """
    out: list[_Segment] = []
    floor = 0
    attempts: list[tuple[float, float | None, str]] = [(a[1], a[2], shown_status(str(a[3]), interrupted))
                                                       for a in rec.attempt_log]
    if thrown:
        attempts = sorted([*attempts, *((start, end, "speculative") for start, end in thrown)], key=lambda a: a[0])
    for started, finished, outcome in attempts:
        end_at = finished if finished is not None else horizon
        start = max(int((started - t0) / span * width), floor)
        end = max(start + 1, round((end_at - t0) / span * width))
        start, end = min(start, width - 1), min(end, width)
        if end <= start:
            continue
        style = STATUS_STYLE.get(str(outcome), "")
        out.append(_Segment(start, end, BAR_GLYPH.get(str(outcome), "█"), style))
        floor = end
    return out


def timeline(state: RunState, width: int, horizon: float | None = None, steps: Sequence[str] | None = None, *,
             interrupted: bool = False) -> Text:
    """A text Gantt chart: a row per step (of ``steps``, default all), bars scaled to ``width``, a segment per attempt
    (``interrupted``: of a run whose process stopped, :func:`shown_status`).

    Retries show as separate segments (``▓`` a failed attempt, ``·`` the wait before the next); ``horizon`` is where
    unfinished attempts end (default: the run's end or its last recorded moment). The scale is the whole run's.
    """
    order = state.plan.order if steps is None else steps
    starts = [a[1] for r in state.records.values() for a in r.attempt_log]
    ends = [a[2] for r in state.records.values() for a in r.attempt_log if a[2] is not None]
    t0 = state.created_at if state.created_at is not None else min(starts, default=0.0)
    t1 = horizon if horizon is not None else state.finished_at
    if t1 is None:
        t1 = max([*starts, *ends], default=t0)
    # A floor of a millisecond: a run with nothing finished yet (or only instant steps) still gets a sane scale.
    span = max(t1 - t0, 1e-3)
    label_width = min(max((len(s) for s in order), default=4), 28)
    bar_width = max(10, width - label_width - 16)
    out = Text()
    thrown: dict[str, list[tuple[float, float | None]]] = {}
    for entry in state.speculations:
        if entry["outcome"] != "adopted" and entry["step"] is not None:
            thrown.setdefault(entry["step"], []).append((entry["started_at"], entry["finished_at"]))
    for sid in order:
        rec = state.records[sid]
        out.append(sid[:label_width].ljust(label_width) + " │", style="bold" if rec.status == "running" else "")
        cursor = 0
        previous_end: int | None = None
        for seg in _segments(rec, t0, span, bar_width, t1, thrown.get(sid, ()), interrupted):
            gap = seg.start - cursor
            if gap > 0:
                # Between two attempts of one step: the step was waiting to retry.
                filler = RETRY_WAIT_GLYPH if previous_end is not None else " "
                out.append(filler * gap, style="dim")
            out.append(seg.glyph * (seg.end - seg.start), style=seg.style)
            cursor = previous_end = seg.end
        out.append(" " * (bar_width - cursor) + "│ ")
        if rec.attempt_log:
            note = format_duration(step_elapsed(rec, t1, state))
            if len(rec.attempt_log) > 1:
                note += f" x{len(rec.attempt_log)}"
            if rec.speculative:
                note += " " + SPECULATIVE_MARK
            out.append(note, style=STATUS_STYLE.get(shown_status(rec.status, interrupted), ""))
        else:
            out.append(rec.status, style=STATUS_STYLE.get(rec.status, ""))
        out.append("\n")
    left, right = "0", format_duration(span)
    out.append(" " * label_width + " └" + left + "─" * max(1, bar_width - len(left) - len(right)) + right + "┘\n",
               style="dim")
    out.append(" " * (label_width + 2))
    for outcome, label in (("succeeded", "succeeded"), ("failed", "failed attempt"),
                           ("interrupted", "interrupted"), ("cancelled", "cancelled")):
        out.append(BAR_GLYPH[outcome], style=STATUS_STYLE[outcome])
        out.append(f" {label}  ")
    out.append(RETRY_WAIT_GLYPH + " waiting to retry", style="dim")
    if state.speculations:
        out.append("  " + BAR_GLYPH["speculative"], style=STATUS_STYLE["speculative"])
        out.append(f" speculative, thrown away  {SPECULATIVE_MARK} started speculatively, adopted")
    return out


# -- one step ----------------------------------------------------------------------------------------------------
def _json_block(value: Any) -> Text:
    return Text(json.dumps(value, indent=2, ensure_ascii=False, default=str))


def step_panel(detail: Mapping[str, Any], origin: float | None) -> RenderableType:
    """``show --step``: the step's tool and state, its arguments, every attempt with its error, and its output.

    ``detail`` is :func:`planweave.engine.report.step_detail`'s object (already redacted and truncated).
    """
    head = Text(f"step {detail['step']}", style="bold")
    head.append(f" · {detail['tool']} · ")
    head.append_text(status_text(str(detail["status"])))
    parts: list[RenderableType] = [head]
    label = "arguments" if detail.get("args_resolved") else "arguments (as written: not every reference resolved)"
    parts += [Text(label, style="bold"), _json_block(detail.get("args"))]
    parts.append(Text("attempts", style="bold"))
    if not detail.get("attempts"):
        parts.append(Text("  none", style="dim"))
    for attempt in detail.get("attempts", ()):
        outcome = str(attempt.get("outcome"))
        line = Text(f"  attempt {attempt['attempt']}  {format_offset(attempt.get('started_at'), origin)}"
                    f"..{format_offset(attempt.get('finished_at'), origin)}  ")
        line.append_text(status_text(outcome))
        error_text = str(attempt.get("error") or "")
        first, _, rest = error_text.partition("\n")
        if first:
            line.append(f"  {first}", style="red")
        hit = attempt.get("cache")
        if isinstance(hit, Mapping):
            line.append(f"  cached: the output of run {hit.get('run')} step {hit.get('step')}", style="cyan")
        parts.append(line)
        if rest and error_text != detail.get("error"):  # what an earlier attempt's program printed (the last's: below)
            parts.append(Text("    " + rest.replace("\n", "\n    "), style="dim"))
    if detail.get("error"):
        parts += [Text("error", style="bold red"), Text(str(detail["error"]))]
    if detail.get("status") == "succeeded":
        parts += [Text("output", style="bold"), _json_block(detail.get("output"))]
    return Group(*parts)


# -- runs ------------------------------------------------------------------------------------------------------
def runs_table(rows: Sequence[Mapping[str, Any]]) -> Table:
    """The ``planweave runs`` table, from the objects ``runs --json`` prints."""
    table = Table(box=None, pad_edge=False, header_style="bold")
    columns: tuple[tuple[str, JustifyMethod], ...] = (
        ("run", "left"), ("name", "left"), ("status", "left"), ("started", "left"), ("wall clock", "right"),
        ("steps", "left"),
    )
    for name, justify in columns:
        table.add_column(name, justify=justify, no_wrap=name != "steps")
    for row in rows:
        steps: Text = (counts_text(row.get("steps") or {}, row.get("status") == "interrupted") if row.get("steps")
                       else Text(str(row.get("error") or ""), "red"))
        for sid, status in (row.get("waiting") or {}).items():
            what = "approval" if status == "waiting_approval" else "input"
            steps.append(f" · waiting for {what}: {sid}", style=STATUS_STYLE.get(status, ""))
        if row.get("unbounded") and row.get("status") in ("running", "interrupted"):
            steps.append(f" · {UNBOUNDED_MARK}: {', '.join(row['unbounded'][:3])}"
                         f"{' …' if len(row['unbounded']) > 3 else ''}", style="yellow")
        started = row.get("started_at")
        finished = row.get("finished_at")
        duration = format_duration(finished - started) if started is not None and finished is not None else "-"
        table.add_row(
            str(row["run_id"]),
            str(row.get("plan") or ""),
            status_text(str(row["status"])),
            format_instant(started),
            duration,
            steps,
        )
    return table


def versions_table(state: RunState) -> Table:
    """Each plan version as a diff against the one before: what it added, kept, adopted, cancelled, dropped."""
    table = Table(title="plan versions", title_justify="left", title_style="bold", box=None, pad_edge=False,
                  header_style="bold")
    for column in ("version", "trigger", "model", "spliced", "added", "kept", "adopted", "cancelled", "dropped"):
        table.add_column(column)
    origin = state.created_at or 0.0

    def at(value: float | None) -> str:
        return "—" if value is None else f"+{value - origin:.2f}s"

    def ids(items: list[str]) -> str:
        return ", ".join(items[:8]) + (f" (+{len(items) - 8})" if len(items) > 8 else "") if items else "—"

    for v in state.versions:
        started, finished = v.get("model_started_at"), v.get("model_finished_at")
        model = "—" if started is None else f"{at(started)}..{at(finished)}"
        table.add_row(str(v["version"]), str(v.get("trigger")), model, at(v.get("spliced_at")),
                      Text(ids(v.get("added", [])), style="green"), ids(v.get("kept", [])),
                      ids(v.get("adopted", [])), Text(ids(v.get("cancelled", [])), style="red"),
                      ids(v.get("dropped", [])))
    return table


def allocations_table(allocations: Sequence[Mapping[str, Any]]) -> Table:
    """The allocator's decisions (``allocation`` events): per step and attempt, the tier and samples chosen, the
    estimated P(within budget and deadline) of the choice, and the candidates it was compared with."""
    table = Table(title="allocations", title_justify="left", title_style="bold", box=None, pad_edge=False,
                  header_style="bold")
    for column in ("step", "attempt", "choice", "policy", "P(all)", "P(budget)", "P(deadline)", "compared"):
        table.add_column(column)

    def pct(value: Any) -> str:
        return "—" if value is None else f"{100 * float(value):.0f}%"

    for a in allocations:
        compared = sorted(a.get("compared", []), key=lambda c: -float(c.get("p_all", 0.0)))
        others = ", ".join(f"{c.get('tier')}x{c.get('samples')} {pct(c.get('p_all'))}"
                           + ("" if c.get("fits", True) else " (no room)") for c in compared[:4])
        if len(compared) > 4:
            others += f" (+{len(compared) - 4})"
        table.add_row(str(a.get("step")), str(a.get("attempt", 1)), f"{a.get('tier')} x{a.get('samples')}",
                      str(a.get("policy", "")), pct(a.get("p_all")), pct(a.get("p_budget")),
                      pct(a.get("p_deadline")), others)
    return table
