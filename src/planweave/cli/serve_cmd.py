"""``planweave serve``: the HTTP API, the live event streams and the dashboard."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import typer

from planweave.cli.common import (
    AllowExecOption,
    Confinement,
    JournalOption,
    MaxBudgetTokensOption,
    MaxBudgetUsdOption,
    MaxDeadlineOption,
    MaxReplansCapOption,
    NoCacheOption,
    ToolsOption,
    UsageError,
    WorkdirOption,
    clean_errors,
    load_tools,
    parse_capacities,
)
from planweave.cli.run_config import ConfigOption, config_access, load_config, use_config_files
from planweave.extras import require


def serve(
    host: Annotated[str, typer.Option("--host", help="Interface to bind (anything but 127.0.0.1 is exposed).")] =
    "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8765,
    journal: JournalOption = None,
    tools: ToolsOption = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Most steps running at once.")] =
    None,
    capacity: Annotated[
        list[str] | None, typer.Option("--capacity", metavar="NAME=N", help="Capacity of a resource (repeatable)."),
    ] = None,
    telemetry: Annotated[
        bool | None, typer.Option("--telemetry/--no-telemetry",
                                  help="OpenTelemetry spans (default: as the OTEL_* variables say)."),
    ] = None,
    config: ConfigOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    queue: Annotated[bool, typer.Option("--queue", help="POST /runs queues plans for `planweave worker` processes "
                                                        "(a postgresql:// journal) instead of running them here.")]
    = False,
    model: Annotated[str | None, typer.Option("--model", help="Plan goals POSTed to /runs with this model.")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", metavar="URL",
                                                 help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL).")] = None,
    allow_endpoint: Annotated[list[str] | None, typer.Option(
        "--allow-endpoint", metavar="URL", help="A base URL a POST /runs endpoint (or a tier's base_url) may name, "
        "besides --base-url (repeatable; default: only --base-url).")] = None,
    allow_key_env: Annotated[list[str] | None, typer.Option(
        "--allow-key-env", metavar="NAME", help="An environment variable a POST /runs endpoint's api_key_env may "
        "name, besides the config's api_key_env (repeatable; default: only that one).")] = None,
    max_budget_usd: MaxBudgetUsdOption = None,
    max_budget_tokens: MaxBudgetTokensOption = None,
    max_deadline: MaxDeadlineOption = None,
    max_replans: MaxReplansCapOption = None,
    no_cache: NoCacheOption = False,
) -> None:
    """Serve the HTTP API, the live event streams and the dashboard; print the URL and the access token.

    The ``--max-*`` caps bound what any ``POST /runs`` may ask for; a request without a limit gets the cap. The
    rarer knobs (the endpoint's key variable and headers, model limits, prices, the jail's env keys and roots,
    request_timeout, max_connections) are keys of a --config file (docs/cli.md).
    """
    with clean_errors():
        loaded = load_config(config, "serve")
        values = loaded.values
        require("server", "the server")
        use_config_files(loaded)  # POST /runs refuses a budget_usd over a model without a price (422)
        from planweave.server import serve as serve_forever
        from planweave.server.connections import ConnectionLimits
        from planweave.server.limits import LimitCaps

        toolbox = load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                                      tuple(Path(r) for r in values.roots or ()),
                                                      tuple(values.allow_env or ())))
        caps = LimitCaps(max_budget_usd, max_budget_tokens, max_deadline, max_replans)
        from planweave.models.endpoint import Endpoint, EndpointError
        from planweave.server.endpoints import EndpointPolicy

        endpoint = replace(config_access(loaded) or Endpoint(), base_url=base_url)
        try:
            allowed = [Endpoint(base_url=u).base_url or u for u in allow_endpoint or ()]
            policy = EndpointPolicy.of(endpoint, allowed, [Endpoint(api_key_env=n).api_key_env or n
                                                           for n in allow_key_env or ()])
        except EndpointError as exc:
            raise UsageError(f"--allow-endpoint/--allow-key-env: {exc}") from None
        asyncio.run(serve_forever(host, port, journal, None, tools=toolbox, concurrency=concurrency,
                                  capacities=parse_capacities(capacity or ()), telemetry=telemetry, model=model,
                                  base_url=base_url, endpoint=endpoint, endpoint_policy=policy, caps=caps,
                                  queue=queue, cache=not no_cache,
                                  connections=ConnectionLimits(
                                      request_timeout=10.0 if values.request_timeout is None
                                      else values.request_timeout, max_connections=values.max_connections)))


def register(app: typer.Typer) -> None:
    """Add ``serve`` to ``app``."""
    for command in (serve,):
        app.command()(command)
