"""Tools (adapters): Python functions with schemas, the built-ins, and (later) MCP servers."""

from planweave.tools.builtins import builtin_tools
from planweave.tools.registry import Tool, Toolbox, tool

__all__ = ["Tool", "Toolbox", "builtin_tools", "tool"]
