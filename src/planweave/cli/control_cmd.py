"""``planweave control run CONFIG.yaml``: a control loop from a file, with a live view of tick lateness and chunk
age (docs/control.md)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from planweave.cli.common import JsonOption, clean_errors, print_json

control_app = typer.Typer(help="Real-time control loops: act while the next chunk is inferred.", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``control`` group to ``app``."""
    app.add_typer(control_app, name="control")


@control_app.command("run")
def control_run(
    config: Annotated[Path, typer.Argument(help="The control run file (YAML).", show_default=False)],
    resume: Annotated[str | None, typer.Option("--resume", metavar="RUN_ID",
                                               help="Resume this control run from its journal.")] = None,
    live_every: Annotated[int, typer.Option("--live-every", min=0, metavar="N",
                                            help="Print the live view every N ticks (0: never).")] = 50,
    json_output: JsonOption = False,
) -> None:
    """Run the control loop CONFIG describes; print a line every N ticks (tick, lateness, chunk age), then the
    report."""
    from planweave.control.config import build_loop, live_line, load_config
    from planweave.control.loop import TickRecord
    from planweave.core.clock import run_virtual

    def observe(record: TickRecord) -> None:
        if live_every and not json_output and record.tick % live_every == 0:
            typer.echo(live_line(record))

    with clean_errors(json_output):
        settings = load_config(config)
        loop, env = build_loop(settings, observer=observe)
        main = loop.run(until=lambda obs: obs.done, deadline=settings.deadline_s, resume=resume)
        report = run_virtual(main) if settings.clock == "virtual" else asyncio.run(main)
    summary = {**report.summary(), "success": env.success(), "tracking_error": env.tracking_error()}
    if json_output:
        print_json(summary)
        return
    typer.echo(f"control run {report.run_id}: {report.status} after {report.ticks} ticks, success {env.success()}, "
               f"tracking error {env.tracking_error():.3f}, idle {100 * report.idle_frac:.1f} %, "
               f"{report.spliced} chunks spliced, {report.refused} refused, {report.discarded} actions discarded, "
               f"{report.missed} ticks missed, max lateness {1000 * report.max_lateness:.2f} ms")
