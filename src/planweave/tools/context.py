"""The ``context.read`` tool: a model fetches the detail of a finished step's output that it saw by reference.

The planner and re-planner see outputs as references (id, size, short summary: :mod:`planweave.planning.context`);
a step ``{"tool": "context.read", "args": {"step": "fetch", "path": "items[0]", "max_chars": 2000}}`` returns that
part of the output, cut to ``max_chars`` characters of JSON. It is a step like any other: journaled, resumable,
its output in the next prompt.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from planweave.core.context import current_step
from planweave.core.errors import RunError, ToolError
from planweave.core.plan.refs import Interpolation, RefResolutionError, RefSyntaxError, compile_args, parse_ref
from planweave.tools.registry import Tool

__all__ = ["MAX_READ_CHARS", "context_read_tool", "prompt_by_reference", "read_output", "referencing_llm_tool"]

MAX_READ_CHARS = 20_000


def context_read_tool(outputs_of: Callable[[str], Mapping[str, Any]]) -> Tool:
    """The ``context.read`` tool reading the outputs of the calling step's run through ``outputs_of(run_id)``."""

    async def read(step: str, path: str = "", max_chars: int = 2000) -> dict[str, Any]:
        """Read (part of) a finished step's output: step id, path like 'items[0].title', at most max_chars."""
        return read_output(outputs_of(current_step().run_id), step, path, max_chars)

    return Tool.from_function(read, name="context.read", idempotent=True)


#: What an ``llm`` step is told when its prompt shows outputs by reference (and it may ask for their detail).
READ_NOTE = ("\n\n(Outputs marked [ref ...] are shown by reference: id, size, summary. To read the detail of one, "
             "reply with only {\"context.read\": {\"step\": \"<id>\", \"path\": \"key[0]\", \"max_chars\": 2000}}; "
             "the detail is added to this prompt and you are asked again.)")


def read_output(outputs: Mapping[str, Any], step: str, path: str = "", max_chars: int = 2000) -> dict[str, Any]:
    """Part of step ``step``'s output: what ``context.read`` returns (raises ToolError naming what is wrong)."""
    if not 1 <= max_chars <= MAX_READ_CHARS:
        raise ToolError(f"context.read: max_chars must be between 1 and {MAX_READ_CHARS}, got {max_chars}",
                        kind="invalid_args", retryable=False)
    if step not in outputs:
        raise ToolError(f"context.read: step '{step}' has no output in this run (not finished, or no such step)",
                        kind="invalid_args", retryable=False)
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


def prompt_by_reference(raw: str, outputs: Mapping[str, Any], describe: Callable[[str], str], *,
                        inline_chars: int = 400) -> tuple[str, list[str]]:
    """``raw`` (a prompt template with ``${step...}`` references) rendered with each referenced value of at most
    ``inline_chars`` characters inline, as the engine renders it, and each larger one as ``[ref <describe(step)>]``
    (the step's reference: id, tool, size, summary); the steps shown by reference, in order."""
    template, _refs = compile_args(raw)
    parts = template.parts if isinstance(template, Interpolation) else (template,)
    out: list[str] = []
    shown: list[str] = []
    for part in parts:
        if isinstance(part, str):
            out.append(part)
            continue
        value = part.resolve(outputs)
        text = value if isinstance(value, str) else json.dumps(value, default=str, separators=(",", ":"))
        if len(text) <= inline_chars:
            out.append(text)
        else:
            out.append(f"[ref {describe(part.step)}" + (f" (you were given its {part.text[len(part.step):]})"
                                                         if part.path else "") + "]")
            if part.step not in shown:
                shown.append(part.step)
    return "".join(out), shown


def _read_request(reply: Any) -> dict[str, Any] | None:
    """The ``{"context.read": {...}}`` a model replied with, or None (any other reply is its answer)."""
    if not isinstance(reply, str) or "context.read" not in reply:
        return None
    try:
        parsed = json.loads(reply.strip().removeprefix("```json").removesuffix("```").strip())
    except json.JSONDecodeError:
        return None
    if isinstance(parsed, dict) and set(parsed) == {"context.read"} and isinstance(parsed["context.read"], dict):
        return parsed["context.read"]
    return None


def referencing_llm_tool(inner: Tool, run_of: Callable[[str], Any], describe: Callable[[str, str], str], *,
                         inline_chars: int = 400, max_reads: int = 3) -> Tool:
    """The ``llm`` tool ``inner`` for a run whose context is by reference: a step's prompt shows the outputs it
    refers to by reference when they are larger than ``inline_chars`` (``describe(run_id, step)``: the run's
    cached reference line), and the model may ask for their detail with a ``{"context.read": {...}}`` reply, at
    most ``max_reads`` times (each read is added to the prompt, and listed in the output's ``reads``). A step with a
    ``schema`` gets the references without reads (its reply must match the schema). ``run_of(run_id)`` is the live
    run (its plan's raw arguments and its outputs)."""

    async def llm(**kwargs: Any) -> Any:
        ctx = current_step()
        try:  # the step as planned (its raw prompt), in a run this engine drives
            run = run_of(ctx.run_id)
            spec = run.plan.steps.get(ctx.step_id)
            raw = spec.args.get("prompt") if spec is not None else None
        except (LookupError, RunError):  # not a run of this engine (a tool called outside the loop's runs): as it is
            raw = None
        if not isinstance(raw, str) or "${" not in raw:
            return await inner.fn(**kwargs)
        outputs = run.outputs
        try:
            prompt, shown = prompt_by_reference(raw, outputs, lambda sid: describe(ctx.run_id, sid),
                                                inline_chars=inline_chars)
        except (RefSyntaxError, RefResolutionError, KeyError):  # the engine resolved it: cannot happen, but then
            shown = []  # the prompt the engine rendered is used
        if not shown:
            return await inner.fn(**kwargs)
        can_read = kwargs.get("schema") is None and max_reads > 0
        base = prompt + (READ_NOTE if can_read else "")
        details: list[str] = []
        reads: list[dict[str, Any]] = []
        totals = {"prompt": 0, "completion": 0, "total": 0}
        while True:
            result = await inner.fn(**{**kwargs, "prompt": base + "".join(details)})
            tokens = result.get("tokens") if isinstance(result, dict) else None
            if isinstance(tokens, dict):
                for key in totals:
                    totals[key] += int(tokens.get(key) or 0)
            ask = _read_request(result.get("text")) if can_read and isinstance(result, dict) else None
            if ask is None or len(reads) >= max_reads:
                break
            try:
                got = read_output(outputs, str(ask.get("step", "")), str(ask.get("path", "")),
                                  int(ask.get("max_chars", 2000)))
                details.append(f"\n\nDetail of {got['step']}{'.' + got['path'] if got['path'] else ''} "
                               f"({got['chars']} chars{', cut' if got.get('cut') else ''}): {got['text']}")
                reads.append({k: got[k] for k in ("step", "path", "chars")})
            except (ToolError, ValueError, TypeError) as exc:
                details.append(f"\n\nThat read failed: {exc}")
                reads.append({"step": str(ask.get("step", "")), "error": str(exc)})
        if isinstance(result, dict):
            result = {**result, "references": shown, "reads": reads}
            if isinstance(result.get("tokens"), dict) and len(reads):
                result["tokens"] = {**result["tokens"], **totals}
        return result

    return dataclasses.replace(inner, fn=llm)
