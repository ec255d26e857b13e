"""The ``context.read`` tool: a model fetches the detail of a finished step's output that it saw by reference.

The planner and re-planner see outputs as references (id, size, short summary: :mod:`planweave.planning.context`);
a step ``{"tool": "context.read", "args": {"step": "fetch", "path": "items[0]", "max_chars": 2000}}`` returns that
part of the output, cut to ``max_chars`` characters of JSON. It is a step like any other: journaled, resumable,
its output in the next prompt.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from planweave.engine.context import current_step
from planweave.errors import ToolError
from planweave.plan.refs import RefResolutionError, RefSyntaxError, parse_ref
from planweave.tools.registry import Tool

__all__ = ["MAX_READ_CHARS", "context_read_tool"]

MAX_READ_CHARS = 20_000


def context_read_tool(outputs_of: Callable[[str], Mapping[str, Any]]) -> Tool:
    """The ``context.read`` tool reading the outputs of the calling step's run through ``outputs_of(run_id)``."""

    async def read(step: str, path: str = "", max_chars: int = 2000) -> dict[str, Any]:
        """Read (part of) a finished step's output: step id, path like 'items[0].title', at most max_chars."""
        if not 1 <= max_chars <= MAX_READ_CHARS:
            raise ToolError(f"context.read: max_chars must be between 1 and {MAX_READ_CHARS}, got {max_chars}",
                            kind="invalid_args", retryable=False)
        outputs = outputs_of(current_step().run_id)
        if step not in outputs:
            raise ToolError(f"context.read: step '{step}' has no output in this run (not finished, or no such "
                            "step)", kind="invalid_args", retryable=False)
        spec = path.strip()
        expr = step if not spec else step + (spec if spec.startswith("[") else "." + spec)
        try:
            value = parse_ref(expr).resolve(outputs)
        except (RefSyntaxError, RefResolutionError) as exc:
            raise ToolError(f"context.read: path '{path}' of step '{step}': {exc}", kind="invalid_args",
                            retryable=False) from None
        text = json.dumps(value, default=str, separators=(",", ":"), ensure_ascii=False)
        out: dict[str, Any] = {"step": step, "path": spec, "chars": len(text), "text": text[:max_chars]}
        if len(text) > max_chars:
            out["cut"] = True
        return out

    return Tool.from_function(read, name="context.read", idempotent=True)
