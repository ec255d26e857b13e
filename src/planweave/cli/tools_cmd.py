"""``planweave tools list``: the tools a plan can call."""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from planweave.cli.common import (
    JsonOption,
    ToolsOption,
    clean_errors,
    load_tools,
    open_mcp,
    print_json,
)

tools_app = typer.Typer(help="Tools: built-ins, Python tools (--tools) and MCP servers (--mcp).", no_args_is_help=True)


def register(app: typer.Typer) -> None:
    """Add the ``tools`` group to ``app``."""
    app.add_typer(tools_app, name="tools")


@tools_app.command("list")
def tools_list(
    tools: ToolsOption = None,
    mcp: Annotated[list[str] | None, typer.Option("--mcp", metavar="NAME=COMMAND_OR_URL",
                                                  help="Also list this MCP server's tools (repeatable).")] = None,
    json_output: JsonOption = False,
) -> None:
    """List the tools a plan can call: name, description and argument schema."""
    with clean_errors():
        toolbox = load_tools(tools or ())

        async def collect() -> list[dict[str, Any]]:
            async with AsyncExitStack() as stack:
                box = await open_mcp(stack, tuple(mcp or ()), toolbox)
                return [{"name": t.name, "description": t.description, "input_schema": dict(t.input_schema),
                         "idempotent": t.idempotent} for t in sorted(box.values(), key=lambda t: t.name)]

        listed = asyncio.run(collect())
    if json_output:
        print_json(listed)
        return
    console = Console(highlight=False)
    table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
    for column in ("tool", "arguments", "description"):
        table.add_column(column)
    for item in listed:
        props = item["input_schema"].get("properties", {})
        required = set(item["input_schema"].get("required", []))
        args = ", ".join(f"{k}{'' if k in required else '?'}" for k in props) or "(any)"
        desc = (item["description"] or "").strip().splitlines()
        table.add_row(item["name"], args, desc[0] if desc else "")
    console.print(table)
