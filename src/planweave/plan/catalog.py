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
