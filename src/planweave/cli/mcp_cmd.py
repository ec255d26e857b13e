"""``planweave mcp``: the runs of a journal as an MCP server over stdio (docs/protocols.md, "MCP").

The same tools as ``/mcp`` on ``planweave serve`` (:mod:`planweave.server.mcp`): each is a request to the HTTP API's
routes made in this process, so limits, caps and redaction are the server's. The client that spawned the process
is the one it serves; nothing listens on a socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

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
    WorkdirOption,
    clean_errors,
    load_tools,
    parse_capacities,
)
from planweave.cli.run_config import ConfigOption, load_config, use_config_files
from planweave.extras import require

if TYPE_CHECKING:
    from planweave.server.limits import LimitCaps
    from planweave.tools.registry import Toolbox


def mcp(
    journal: JournalOption = None,
    tools: ToolsOption = None,
    model: Annotated[str | None, typer.Option(
        "--model", help="Plan goals (the start_goal tool) with this model; scripted:FILE plans offline.")] = None,
    base_url: Annotated[str | None, typer.Option("--base-url", metavar="URL",
                                                 help="OpenAI-compatible endpoint (default $OPENAI_BASE_URL).")] = None,
    concurrency: Annotated[int | None, typer.Option("--concurrency", min=1, help="Most steps running at once.")] =
    None,
    capacity: Annotated[
        list[str] | None, typer.Option("--capacity", metavar="NAME=N", help="Capacity of a resource (repeatable)."),
    ] = None,
    config: ConfigOption = None,
    workdir: WorkdirOption = Path("."),
    allow_exec: AllowExecOption = None,
    max_budget_usd: MaxBudgetUsdOption = None,
    max_budget_tokens: MaxBudgetTokensOption = None,
    max_deadline: MaxDeadlineOption = None,
    max_replans: MaxReplansCapOption = None,
    no_cache: NoCacheOption = False,
) -> None:
    """Serve the journal's runs to an MCP client over stdio: start plans and goals, follow them, read steps and
    outputs, approve, send input, cancel. Runs still going when the client leaves are interrupted (resumable).

    The jail's env keys and roots, model limits and prices are keys of a --config file (docs/cli.md)."""
    with clean_errors():
        loaded = load_config(config, "mcp")
        require("server", "the MCP server")
        require("mcp", "the MCP server")
        use_config_files(loaded)
        from planweave.server.limits import LimitCaps

        toolbox = load_tools(tools or (), Confinement(workdir, tuple(allow_exec) if allow_exec else None,
                                                      tuple(Path(r) for r in loaded.values.roots or ()),
                                                      tuple(loaded.values.allow_env or ())))
        caps = LimitCaps(max_budget_usd, max_budget_tokens, max_deadline, max_replans)
        asyncio.run(serve_stdio(journal, toolbox, model=model, base_url=base_url, caps=caps,
                                concurrency=concurrency, capacities=parse_capacities(capacity or ()),
                                cache=not no_cache))


async def serve_stdio(
    journal: str | None, toolbox: Toolbox, *, model: str | None, base_url: str | None, caps: LimitCaps,
    concurrency: int | None, capacities: Mapping[str, int], cache: bool,
) -> None:
    """Open the journal, an engine and the API's app around it (nothing listening), and serve MCP on stdio until
    the client closes it; then interrupt what still runs and close the journal."""
    from planweave import open_engine
    from planweave.engine.runtime import DEFAULT_CONCURRENCY
    from planweave.journal import default_journal_url
    from planweave.server.app import create_app
    from planweave.server.limits import open_server_model
    from planweave.server.mcp import RunsAPI, build_mcp_server
    from planweave.tools.safety import SecretRedactor

    url = journal or default_journal_url()
    token = secrets.token_urlsafe(32)  # the in-process client's own: nobody else can reach this app
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(
            open_engine(url, tools=toolbox, concurrency=concurrency or DEFAULT_CONCURRENCY, capacities=capacities,
                        redact=SecretRedactor(), cache=cache))
        server_model = await open_server_model(stack, engine, model, base_url) if model else None
        app = create_app(engine, token, recover=False, model=server_model, caps=caps, memory_url=url)
        await stack.enter_async_context(app.router.lifespan_context(app))
        api = RunsAPI(app, token)
        stack.push_async_callback(api.aclose)
        await build_mcp_server(api).run_stdio_async()


def register(app: typer.Typer) -> None:
    """Add ``mcp`` to ``app``."""
    app.command()(mcp)
