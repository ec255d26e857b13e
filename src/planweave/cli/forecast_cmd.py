"""``planweave estimates`` and ``planweave forecast``: what the journal's history says steps take, and the chances
that a plan (or a run, from where it is) finishes in time and within budget (docs/forecast.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from planweave.cli.common import JournalOption, JsonOption, UsageError, clean_errors, journal_file_missing, print_json
from planweave.journal import default_journal_url, open_journal

if TYPE_CHECKING:
    from planweave.forecast.estimates import Estimates, KeyKind
    from planweave.forecast.simulate import Forecast


async def _estimates(url: str) -> Estimates:
    from planweave.forecast.estimates import Estimates
    from planweave.forecast.history import read_estimates

    if journal_file_missing(url):
        return Estimates()
    async with open_journal(url) as journal:
        return await read_estimates(journal)


def estimates(
    tool: Annotated[str | None, typer.Option("--tool", metavar="T", help="Only this tool (and the models it called: "
                                             "use --kind model for every model).")] = None,
    kind: Annotated[str | None, typer.Option("--kind", metavar="KIND", help="Only tool, model or step estimates.")]
    = None,
    journal: JournalOption = None,
    json_output: JsonOption = False,
) -> None:
    """Show the estimates fitted from the journal's history: per tool, model and repeated step, the attempts seen,
    the duration distribution (lognormal, or the samples when few), the success rate (Beta posterior), tokens and
    cost per attempt. Derived from the journal's newest 200 runs each time: nothing is stored."""
    with clean_errors(json_output):
        if kind is not None and kind not in ("tool", "model", "step"):
            raise UsageError(f"--kind {kind}: use tool, model or step")
        url = journal or default_journal_url()
        table = asyncio.run(_estimates(url))
        rows = table.rows("tool", tool) if tool is not None else table.rows(cast("KeyKind | None", kind))
        if tool is not None and not rows:
            known = ", ".join(e.name for e in table.rows("tool")) or "none"
            raise UsageError(f"--tool {tool}: no attempts of tool '{tool}' in the journal {url} (tools seen: {known})")
    if json_output:
        print_json({"journal": url, "estimates": [e.to_json() for e in rows]})
        return
    if not rows:
        typer.echo(f"no finished attempts in the journal {url}: nothing to estimate yet")
        return
    typer.echo(f"{'kind':5} {'name':28} {'n':>5} {'duration':24} {'success':>8} {'tokens in/out':>14} {'cost $':>9}")
    for e in rows:
        d = e.duration.to_json()
        shape = (f"logN median {d['median']:.3g}s sd {d['sigma']:.2f}" if e.duration.kind == "lognormal"
                 else f"{d['kind']} mean {d['mean']:.3g}s")
        name = (e.label or e.name)[:28]
        typer.echo(f"{e.kind:5} {name:28} {e.n:>5} {shape:24} {e.success.mean:>8.3f} "
                   f"{e.tokens_in:>6.0f}/{e.tokens_out:<7.0f} {e.cost_usd:>9.4g}")


def _target(spec: str, url: str) -> tuple[Any, float | None, float | None, str]:
    """A plan file (validated: structure, not tools) or a journaled run's state, with the run's own limits."""
    from planweave.core.events import Event
    from planweave.core.plan.graph import validate_plan
    from planweave.core.state import RunState
    from planweave.limits import JournaledLimits
    from planweave.planfile import load_plan_file

    path = Path(spec)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.exists():
            raise UsageError(f"no plan file {spec}")
        plan_spec = load_plan_file(path)
        return validate_plan(plan_spec, source=str(path)), None, None, "plan"

    async def read() -> list[Event]:
        if journal_file_missing(url):
            return []
        async with open_journal(url) as journal:
            return await journal.read(spec)

    events = asyncio.run(read())
    if not events:
        raise UsageError(f"'{spec}' is neither a plan file nor a run in the journal {url}")
    state = RunState.from_events(spec, events)
    limits = JournaledLimits.from_events(events)
    deadline = None
    if limits.deadline_at is not None and state.created_at is not None:
        deadline = limits.deadline_at - state.created_at
    return state, deadline, limits.limits.budget_usd, "run"


def forecast(
    plan_or_run: Annotated[str, typer.Argument(metavar="PLAN_OR_RUN", help="A plan file, or the id of a run in "
                                               "the journal (forecast from its last journaled event).")],
    deadline: Annotated[float | None, typer.Option("--deadline", metavar="S", min=0, help=(
        "Seconds from the run's start it must end within (a run: default its own --deadline)."))] = None,
    budget_usd: Annotated[float | None, typer.Option("--budget-usd", metavar="X", min=0, help=(
        "USD the whole run may cost (a run: default its own budget; what it spent counts)."))] = None,
    runs: Annotated[int, typer.Option("--runs", metavar="N", min=1, max=1_000_000, help="Simulated runs.")] = 1000,
    seed: Annotated[int, typer.Option("--seed", metavar="K", help="Seed of the simulation.")] = 0,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help=(
        "Steps at once, as `run --concurrency` (default: the plan's, else the engine's 64)."))] = None,
    journal: JournalOption = None,
    json_output: JsonOption = False,
) -> None:
    """Simulate the rest of a plan or run N times on virtual time with the engine's scheduler, drawing durations,
    failures, retries and fallbacks from the journal's history (and the plan's estimate:), and print the chances
    of finishing in time, within budget and successfully, the makespan and cost percentiles and the critical steps.
    """
    from planweave.forecast.simulate import ENGINE_CONCURRENCY
    from planweave.forecast.simulate import forecast as simulate

    with clean_errors(json_output):
        url = journal or default_journal_url()
        target, own_deadline, own_budget, what = _target(plan_or_run, url)
        table = asyncio.run(_estimates(url))
        try:
            result = simulate(target, table, deadline=deadline if deadline is not None else own_deadline,
                              budget_usd=budget_usd if budget_usd is not None else own_budget, runs=runs,
                              seed=seed, concurrency=concurrency or ENGINE_CONCURRENCY)
        except ValueError as exc:
            raise UsageError(f"{plan_or_run}: {exc}") from None
    if json_output:
        print_json({"target": plan_or_run, "kind": what, **result.to_json()})
        return
    typer.echo(describe(result))


def _p(value: float | None) -> str:
    return "-" if value is None else f"{value:.0%}"


def describe(result: Forecast) -> str:
    """A forecast in three lines for people."""
    m, c = result.makespan, result.cost_usd
    limits = []
    if result.deadline is not None:
        limits.append(f"in time ({result.deadline:g}s) {_p(result.p_deadline)}")
    if result.budget_usd is not None:
        limits.append(f"within budget (${result.budget_usd:g}) {_p(result.p_budget)}")
    if result.success_known:
        head = f"forecast over {result.runs:,} simulated runs: succeeds {_p(result.p_success)}"
        verdict = [f"all {_p(result.p_all)}"]
    else:
        head = (f"forecast over {result.runs:,} simulated runs: succeeds: unknown (no history in the journal; "
                "run the plan to give it one)")
        verdict = []
    lines = [", ".join([head, *limits, *verdict]),
             f"makespan p50 {m.p50:.4g}s  p90 {m.p90:.4g}s  p99 {m.p99:.4g}s;  cost p50 ${c.p50:.4g}  p90 "
             f"${c.p90:.4g}  p99 ${c.p99:.4g}"]
    if result.untimed:
        lines.append(f"untimed (no history, estimate: or literal duration; counted as instant): "
                     f"{', '.join(result.untimed)}")
    if result.critical_steps:
        lines.append("critical: " + " -> ".join(result.critical_steps))
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    """Add ``estimates`` and ``forecast`` to ``app``."""
    app.command()(estimates)
    app.command()(forecast)
