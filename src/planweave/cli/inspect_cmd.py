"""``planweave runs``, ``show`` and ``output``: reading runs back from a journal."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.text import Text

from planweave.cli import views
from planweave.cli.common import (
    ExitCode,
    JournalOption,
    JsonOption,
    UsageError,
    clean_errors,
    journal_file_missing,
    journal_flag,
    print_json,
    shown_redaction,
)
from planweave.core.errors import JournalError, PlanweaveError, RunNotFound
from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.engine.report import StepNotFound, find_step, step_detail
from planweave.engine.runtime import (
    process_alive,
)
from planweave.journal import default_journal_url, open_journal, redact_url
from planweave.journal.summary import RunSummary
from planweave.runtree import child_ids, parent_link, run_tree
from planweave.runview import list_overviews, parse_since, run_overview, run_report, shown_cost, stored_outputs


# -- reading runs back from a journal ----------------------------------------------------------------------------
def fold_run(run_id: str, events: Sequence[Event]) -> RunState:
    """Rebuild a run's state from its journaled events, the way resume does, without any tools.

    The plan comes from ``run_created`` (a document in durable journals, a PlanSpec in memory) and is validated
    without tool or capacity checks, since the tools it used may not be importable here.
    """
    if not events:
        raise RunNotFound(f"no run '{run_id}' in the journal")
    return RunState.from_events(run_id, events)


@dataclass(frozen=True)
class JournaledRun:
    """A run as its journal tells it: the folded state, who ran it last and when it last changed."""

    run_id: str
    state: RunState | None
    owner: Mapping[str, Any] = field(default_factory=dict)
    last_at: float | None = None
    problem: str | None = None  # why the events could not be folded (state is None then)
    outputs: Mapping[str, Any] = field(default_factory=dict)  # of succeeded steps, if read with outputs=True
    events: Sequence[Event] = ()  # the run's events, if read with outputs=True (for every attempt's error)
    allocations: Sequence[Mapping[str, Any]] = ()  # the allocator's decisions (allocation events), in order
    cached: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # step -> where its reused output came from

    @property
    def status(self) -> str:
        """The fold's status, except ``interrupted`` for a ``running`` run whose process is gone."""
        if self.state is None:
            return "unreadable"
        if self.state.status == "running" and not process_alive(self.owner):
            return "interrupted"
        return self.state.status

    @property
    def horizon(self) -> float | None:
        """Where a timeline of this run ends: its end, now while it runs on wall-clock time, or its last event."""
        if self.state is None:
            return None
        if self.state.finished_at is not None:
            return self.state.finished_at
        if self.status == "running" and self.last_at is not None and self.last_at >= 1e9:
            return time.time()
        return self.last_at

    def overview(self) -> dict[str, Any]:
        """The ``runs --json`` object (as ``GET /runs``): :func:`planweave.runview.run_overview`."""
        return run_overview(self.run_id, self.state, self.status, self.problem)

    def report(self) -> dict[str, Any]:
        """The ``show --json`` object: :func:`planweave.runview.run_report` (as ``GET /runs/{id}``) plus the owner."""
        assert self.state is not None
        report = run_report(self.state, self.status, self.outputs, redact=shown_redaction())  # as GET /runs/{id}
        report["owner"] = dict(self.owner)
        if self.allocations:
            report["allocations"] = [dict(a) for a in self.allocations]
        if self.state.escalations and "escalations" not in report:
            report["escalations"] = [dict(e) for e in self.state.escalations]
        hide = shown_redaction()
        shown: dict[str, Any] = report if hide is None else hide(report)
        return shown


def _journaled(run_id: str, events: Sequence[Event]) -> JournaledRun:
    owner: Mapping[str, Any] = {}
    allocations: list[Mapping[str, Any]] = []
    cached: dict[str, Mapping[str, Any]] = {}
    for event in events:
        if event.kind in ("run_created", "run_resumed"):
            owner = event.data.get("owner", {})
        elif event.kind == "allocation":
            allocations.append({"step": event.step, "at": event.at, **event.data})
        elif event.kind == "step_succeeded" and event.step is not None:
            if "cache" in event.data:  # the result cache served it (docs/caching.md)
                cached[event.step] = event.data["cache"]
            else:
                cached.pop(event.step, None)
    last_at = events[-1].at if events else None
    try:
        return JournaledRun(run_id, fold_run(run_id, events), owner, last_at, allocations=allocations,
                            cached=cached)
    except (PlanweaveError, KeyError, TypeError, ValueError) as exc:  # a damaged run must not hide the others
        return JournaledRun(run_id, None, owner, last_at, problem=f"cannot read this run: {exc}")


async def read_run(url: str, run_id: str, *, outputs: bool = False) -> JournaledRun:
    """One run of the journal at ``url`` (with ``outputs``: also its events and succeeded outputs); raises
    RunNotFound."""
    if journal_file_missing(url):
        raise RunNotFound(f"no run '{run_id}': the journal {url} does not exist")
    async with open_journal(url) as journal:
        events = await journal.read(run_id)
        if not events:
            raise RunNotFound(f"no run '{run_id}' in the journal {url}")
        run = _journaled(run_id, events)
        if run.state is None:
            raise JournalError(f"run '{run_id}' in the journal {url}: {run.problem}")
        if outputs:
            run = dataclasses.replace(run, outputs=await stored_outputs(journal, run.state), events=events)
    return run


def _hide_secrets(state: RunState) -> None:
    """Redact, in place, the texts ``show`` prints of a state folded only to be shown: errors, answer, escalations.

    The journal holds them as the running process redacted them; this process may know more secrets.
    """
    hide = shown_redaction()
    if hide is None:
        return
    for rec in state.records.values():
        rec.error = hide(rec.error)
    state.error, state.answer = hide(state.error), hide(state.answer)
    state.escalations = hide(state.escalations)


async def read_runs(url: str) -> list[JournaledRun]:
    """Every run in the journal at ``url``, oldest first (none if the journal file does not exist)."""
    if journal_file_missing(url):
        return []
    async with open_journal(url) as journal:
        events = await journal.read(None)
    by_run: dict[str, list[Event]] = {}
    for event in events:
        by_run.setdefault(event.run_id, []).append(event)
    return [_journaled(run_id, run_events) for run_id, run_events in by_run.items()]


async def list_runs(url: str, statuses: list[str] | None, since: float | None, limit: int | None,
                    cursor: int | None, *, roots_only: bool = False) -> tuple[list[dict[str, Any]], int | None]:
    """A page of the ``runs`` list from the journal's run summaries, newest first, and the next page's cursor
    (``roots_only``: without the sub-plans' child runs, still ``limit`` rows when the journal has them)."""
    if journal_file_missing(url):
        return [], None
    async with open_journal(url) as journal:
        found = await list_overviews(journal, _shown_status, statuses=statuses, since=since, limit=limit,
                                     cursor=cursor, skip=(lambda ids: child_ids(journal, ids)) if roots_only else None)
    return found.rows, found.next


def _tree_status(state: RunState, events: Sequence[Event]) -> str:
    """A child run's status as ``show`` lists it: ``interrupted`` for a running one whose process is gone."""
    owner: Mapping[str, Any] = {}
    for event in events:
        if event.kind in ("run_created", "run_resumed"):
            owner = event.data.get("owner", {})
    return "interrupted" if state.status == "running" and not process_alive(owner) else state.status


async def read_tree(url: str, run_id: str) -> tuple[Mapping[str, Any] | None, list[dict[str, Any]]]:
    """The parent link of run ``run_id`` (None for a root) and its sub-plans' child runs, nested
    (:func:`planweave.runtree.run_tree`)."""
    async with open_journal(url) as journal:
        parent = parent_link(await journal.read(run_id, kind="run_created"))
        return parent, await run_tree(journal, run_id, status_of=_tree_status)


def _with_tree(report: dict[str, Any], parent: Mapping[str, Any] | None,
               children: list[dict[str, Any]]) -> dict[str, Any]:
    """``show --json``'s report with the run's ``parent`` link (a child run) and its ``subplans`` (if any)."""
    if parent is not None:
        report["parent"] = dict(parent)
    if children:
        report["subplans"] = children
    return report


def _print_parent(console: Console, parent: Mapping[str, Any] | None) -> None:
    if parent is not None:
        console.print(Text(f"sub-plan of run '{parent.get('run')}', step '{parent.get('step')}' (depth "
                           f"{parent.get('depth')})", style="dim"))


def _print_subplans(console: Console, children: Sequence[Mapping[str, Any]]) -> None:
    if children:
        console.print()
        console.print(Text("sub-plans", style="bold"))
        for line in _tree_lines(children):
            console.print(line)


def _tree_lines(children: Sequence[Mapping[str, Any]], indent: int = 1) -> list[Text]:
    """The ``sub-plans`` section of ``show``: one line per child run, indented by depth, status and answer."""
    lines = []
    for child in children:
        line = Text("  " * indent + f"{child['run']}  ")
        line.append_text(views.status_text(str(child["status"])))
        what = child.get("answer") or child.get("error")
        if what:
            line.append(f"  {what}", style="" if child.get("answer") else "red")
        lines.append(line)
        lines.extend(_tree_lines(child.get("children") or (), indent + 1))
    return lines


def _shown_status(summary: RunSummary) -> str:
    """``interrupted`` for a running run whose process is gone, else the stored status."""
    if summary.status == "running" and not process_alive(summary.owner):
        return "interrupted"
    return summary.status


StatusOption = Annotated[list[str] | None, typer.Option(
    "--status", metavar="STATUS", help="Only runs in this status (repeatable or comma-separated): running, "
                                       "interrupted, succeeded, failed, cancelled.")]


def runs(
    journal: JournalOption = None, json_output: JsonOption = False, status: StatusOption = None,
    since: Annotated[str | None, typer.Option("--since", metavar="WHEN", help=(
        "Only runs started since: an age (30m, 2h, 7d) or an ISO date or time (UTC unless it says)."))] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="At most this many runs (newest first).")]
    = None,
    cursor: Annotated[int | None, typer.Option("--cursor", min=0, help=(
        "Continue a list cut by --limit (the cursor it printed on stderr)."))] = None,
    all_runs: Annotated[bool, typer.Option("--all", help=(
        "Also the child runs of sub-plans (tool: plan); default: root runs only."))] = False,
) -> None:
    """List the runs in the journal, newest first: status, start, duration and steps by state.

    Read from the journal's run summaries, so a page costs the runs shown however big the journal is.
    """
    with clean_errors(json_output):
        url = journal or default_journal_url()
        statuses = None if status is None else [s.strip() for item in status for s in item.split(",") if s.strip()]
        try:
            started = None if since is None else parse_since(since, time.time())
            rows, following = asyncio.run(list_runs(url, statuses, started, limit, cursor, roots_only=not all_runs))
        except ValueError as exc:
            raise UsageError(f"--{'since' if 'since' in str(exc) else 'status'}: {exc}") from None
    if following is not None:
        flags = [*(["--status", ",".join(statuses)] if statuses else []), *(["--since", since] if since else []),
                 "--limit", str(limit), "--cursor", str(following)]
        typer.echo(f"more runs: planweave runs {' '.join(flags)}", err=True)
    if json_output:
        print_json(rows)
        return
    console = views.console()
    if not rows:
        console.print(f"no runs in the journal {url}" + (" match" if statuses or since else ""), markup=False)
        return
    console.print(views.runs_table(rows))


def _no_output(rec_status: str) -> str:
    """Why a step in ``rec_status`` has no output, as the end of a sentence."""
    return {"failed": "it failed", "skipped": "it was skipped", "cancelled": "it was cancelled",
            "pending": "it has not started", "ready": "it has not started", "running": "it is still running",
            "unknown": "its outcome is unknown (it was running when the run was interrupted)",
            "succeeded": "its output is missing from the journal"}.get(rec_status, f"it is {rec_status}")


def _step_or_exit(found: JournaledRun, step: str, *, need_output: bool, json_output: bool = False) -> None:
    """Exit 1 with a message if ``found`` has no step ``step`` (or, with ``need_output``, no output for it)."""
    assert found.state is not None
    try:
        rec = find_step(found.state, step)
        problem = None
    except StepNotFound as exc:
        problem = str(exc)
    else:
        if need_output and (rec.status != "succeeded" or step not in found.outputs):
            problem = f"step '{step}' of run '{found.run_id}' has no output: {_no_output(rec.status)}"
    if problem is not None:
        typer.echo(f"error: {problem}", err=True)
        if json_output:
            print_json({"status": "error", "error": problem})
        raise typer.Exit(ExitCode.FAILED)


def output(
    run_id: Annotated[str, typer.Argument(help="The run.", show_default=False)],
    step: Annotated[str, typer.Argument(help="The step whose output to print.", show_default=False)],
    journal: JournalOption = None,
) -> None:
    """Print one step's whole output as JSON on stdout; exit 1 if the step does not exist or has no output."""
    with clean_errors():
        found = asyncio.run(read_run(journal or default_journal_url(), run_id, outputs=True))
    _step_or_exit(found, step, need_output=True)
    hide = shown_redaction()
    value = found.outputs[step]
    print_json(value if hide is None else hide(value))


def speculation_line(spec: Mapping[str, Any]) -> str:
    """The one line ``show`` prints of a run's ``speculation`` summary (:meth:`RunState.speculation_summary`)."""
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(spec["discarded_by_reason"].items()))
    parts = [f"{spec['started']} started", f"{spec['adopted']} adopted",
             f"{spec['discarded']} discarded" + (f" ({reasons})" if reasons else "")]
    if spec.get("interrupted"):
        parts.append(f"{spec['interrupted']} interrupted")
    parts.append(f"{spec.get('extra_model_calls', 0)} extra model calls, {spec.get('extra_tokens', 0):,} tokens")
    parts.append(f"${spec.get('total_extra_cost_usd', spec['extra_cost_usd']):.4f} extra")
    parts.append(f"{views.format_duration(spec.get('head_start_s', 0.0))} head start")
    return "speculation: " + " · ".join(parts)


def _print_speculation(console: Console, state: RunState) -> None:
    """One dim line of how the run speculated, when anything did."""
    if state.speculations:
        console.print(Text(speculation_line(state.speculation_summary()), style="dim"))


def show(
    run_id: Annotated[str, typer.Argument(help="The run to show.", show_default=False)],
    journal: JournalOption = None,
    json_output: JsonOption = False,
    step: Annotated[str | None, typer.Option(
        "--step", metavar="ID", help="Show this step: its arguments, every attempt, errors and output.")] = None,
    all_rows: Annotated[bool, typer.Option("--all", help="A row for every step (default: counts, the failed and "
                                                         "the slowest steps).")] = False,
) -> None:
    """Show one run: its steps, its error and root cause, and a timeline of every attempt (or one ``--step``)."""
    with clean_errors(json_output):
        url = journal or default_journal_url()
        found = asyncio.run(read_run(url, run_id, outputs=json_output or step is not None))
    assert found.state is not None
    if step is not None:
        _step_or_exit(found, step, need_output=False, json_output=json_output)
        detail = step_detail(found.state, found.outputs, step, events=found.events, redact=shown_redaction())
        if json_output:
            print_json(detail)
        else:
            views.console().print(views.step_panel(detail, found.state.created_at))
        return
    parent, children = asyncio.run(read_tree(url, run_id))
    if json_output:
        print_json(_with_tree(found.report(), parent, children))
        return
    state = found.state
    _hide_secrets(state)
    console = views.console()
    console.print(views.run_header(state, found.horizon, found.status))
    times = Text(f"started {views.format_instant(state.created_at)}", style="dim")
    if state.finished_at is not None:
        times.append(f" · finished {views.format_instant(state.finished_at)}")
    console.print(times)
    if state.error:
        console.print(Text("error: ", style="bold red") + Text(state.error))
    if state.root_cause and state.root_cause not in (state.error or ""):
        console.print(Text(f"root cause: step '{state.root_cause}'", style="red"))
    if found.status == "interrupted":
        console.print(f"interrupted: resume with planweave resume {run_id}"
                      + (f" --journal {redact_url(url)}" if url != default_journal_url() else ""), markup=False)
    if state.answer:  # a run that did not succeed has no answer: its joiner's text is only partial
        label, style = ("answer: ", "bold green") if state.status == "succeeded" else ("partial answer: ", "yellow")
        console.print(Text(label, style=style) + Text(state.answer))
    _print_parent(console, parent)
    if state.model_calls:
        cost, unpriced = shown_cost(state, state.cost_usd)  # unknown, not $0, with calls of unpriced models
        shown_usd = f"${cost:.4f}" if cost is not None else \
            "cost unknown (no price for " + ", ".join(f"'{m}'" for m in unpriced) + ")"
        console.print(Text(f"model: {len(state.model_calls)} calls · {state.tokens:,} tokens · {shown_usd}",
                           style="dim"))
    _print_speculation(console, state)
    console.print()
    shown = None if all_rows else views.summary_steps(state, found.horizon, views.SUMMARY_TOP)[0]
    console.print(views.steps_table(state, found.horizon, detailed=True, top=None if all_rows else views.SUMMARY_TOP,
                                    more_hint=views.ALL_HINT, cached=found.cached,
                                    interrupted=found.status == "interrupted"))
    _print_unfinished(console, found, url)
    console.print()
    console.print(Text("timeline", style="bold"))
    console.print(views.timeline(state, views.timeline_width(console), found.horizon, shown,
                                 interrupted=found.status == "interrupted"), soft_wrap=True)
    if len(state.versions) > 1 or state.model_calls:
        console.print()
        console.print(views.versions_table(state))
    _print_subplans(console, children)
    if state.escalations:
        console.print()
        console.print(Text("escalations", style="bold"))
        for esc in state.escalations:
            console.print(Text(_escalation_line(esc)[:400]))
    if found.allocations:
        console.print()
        console.print(views.allocations_table(found.allocations))


def _print_unfinished(console: Console, found: JournaledRun, url: str) -> None:
    """Below the steps of a run not ended: the steps that may wait forever, and what each person is asked with the
    command that answers it."""
    assert found.state is not None
    hint = views.unbounded_hint(found.state) if found.status in ("running", "interrupted") else None
    if hint is not None:
        console.print(hint)
    for sid in found.state.waiting_steps():
        console.print(views.waiting_line(found.state, sid, journal_flag(url)), soft_wrap=True)


def _escalation_line(esc: Mapping[str, Any]) -> str:
    """One escalation as ``show`` lists it; a model cascade's move names its monitor and the tiers."""
    where = f" step '{esc['step']}'" if esc.get("step") else ""
    if esc.get("from_tier") is not None:  # a model cascade moved (escalate, deescalate)
        why = f" ({esc['monitor']})" if esc.get("monitor") else ""
        where += f"{why}: {esc['from_tier']} -> {esc.get('to_tier')}"
    return f"  {esc.get('rung')}{where}: {esc.get('reason', '')}"


def register(app: typer.Typer) -> None:
    """Add ``runs``, ``show`` and ``output`` to ``app``."""
    for command in (runs, show, output):
        app.command()(command)
