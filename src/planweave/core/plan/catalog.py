"""What the core needs of a tool: a name, a schema, an argument check and a way to call it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol


class ToolSpec(Protocol):
    """The static description of a tool that validation and planners use."""

    @property
    def name(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def idempotent(self) -> bool: ...

    @property
    def input_schema(self) -> Mapping[str, Any]: ...

    def check_args(self, args: Mapping[str, Any], deferred: frozenset[str]) -> list[tuple[str, str]]:
        """Return ``(field, message)`` for every argument problem; fields in ``deferred`` hold references."""
        ...

    async def invoke(self, args: Mapping[str, Any]) -> Any:
        """Call the tool with resolved arguments and return its (JSON-serialisable) output."""
        ...


ToolCatalog = Mapping[str, ToolSpec]


# The names of the built-in tools (planweave.builtin_tools(); the CLI adds the file.* tools): for the hint when a
# plan names one and the catalog has none of them, as a toolbox started with ``Toolbox()`` does.
BUILTIN_TOOL_NAMES = ("noop", "sleep", "shell", "http.get", "http.post", "python", "human.input")


def missing_builtin_hint(name: str, tools: ToolCatalog) -> str:
    """A hint naming where a built-in comes from, when ``name`` is one and ``tools`` has it not (else "")."""
    if name not in BUILTIN_TOOL_NAMES or name in tools:
        return ""
    return (f" ('{name}' is a built-in tool, and this toolbox has no built-ins: start it from "
            "planweave.builtin_tools() rather than Toolbox(), or merge them in with toolbox.merged(builtin_tools()))")
