"""The ``llm`` tool's conversation: native tool calls run as steps of the run, and structured output with a repair.

A step ``tool: llm`` with ``args: {prompt, tools: [...], schema: {...}, max_tool_rounds: N}`` offers the run's tools
to the model as functions. Each call the model makes becomes a child step of the run (:meth:`StepContext.call`), so
it has the tool's own limits (timeout, retries, approval, idempotence) and its own journal entries; its id is derived
from the llm step's id, the tool and a hash of the canonical arguments, so a resumed llm step that makes the same call
gets the journaled output instead of calling the tool again. Results go back as tool messages in the model's dialect;
the answer is the final reply (parsed JSON with ``schema``). A reply that does not match the schema gets one repair
round trip with the error; a second miss fails the step naming the schema path. docs/tools.md has the details.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from planweave.core.context import current_step
from planweave.core.errors import PlanError, PlanInvalid, PlanweaveError, RunError, ToolError
from planweave.core.plan.graph import parse_step
from planweave.models import Completion, CompletionRequest, Message, ToolCall, ToolSpec, Usage

DEFAULT_TOOL_ROUNDS = 8
"""Rounds of tool calls an llm step may make before it must answer (``max_tool_rounds``)."""
MAX_RESULT_CHARS = 20_000
"""A tool result longer than this goes back to the model cut, with a note saying so."""
STEP_KEYS = frozenset({"timeout", "retries", "approval", "heartbeat", "idempotent", "cache", "resources", "reads",
                       "writes", "isolation", "executor", "description"})
"""Keys a ``tools`` entry may give its calls' steps (``{tool: name, timeout: 30, approval: true}``)."""

Ask = Callable[..., Awaitable[Completion]]


class RejectedReply(Exception):
    """A reply the endpoint gave that does not match the schema asked of it: the error, the reply's text, and what
    the call cost (it is journaled and counted like any other)."""

    def __init__(self, message: str, text: str, usage: Usage, cost: float | None) -> None:
        super().__init__(message)
        self.text, self.usage, self.cost = text, usage, cost


@dataclass(frozen=True, slots=True)
class Conversation:
    """What an llm step asks: its prompt, model and limits, the tools it offers and the schema of its answer."""

    prompt: str
    system: str | None
    schema: Mapping[str, Any] | None
    model: str
    max_tokens: int
    temperature: float | None
    tools: Sequence[str | Mapping[str, Any]] = ()
    max_rounds: int = DEFAULT_TOOL_ROUNDS


@dataclass(slots=True)
class _Offered:
    """A run tool offered to the model: its function name, the tool and the step keys its calls get."""

    function: str
    tool: str
    keys: dict[str, Any]
    spec: ToolSpec


@dataclass(slots=True)
class _Tally:
    """Tokens and cost summed over a step's model calls (cost None once one call's cost is unknown)."""

    prompt: int = 0
    completion: int = 0
    estimated: bool = False
    cost: float | None = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)

    def add(self, usage: Usage, cost: float | None) -> None:
        self.prompt += usage.prompt_tokens
        self.completion += usage.completion_tokens
        self.estimated = self.estimated or usage.source == "estimated"
        self.cost = None if self.cost is None or cost is None else self.cost + cost


def _arguments_error(message: str) -> ToolError:
    return ToolError(message, kind="arguments", retryable=False)


def function_name(tool: str) -> str:
    """The function name a tool is offered under: its name with characters providers refuse (``.``) as ``_``."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", tool)[:64]


def child_step_id(caller: str, tool: str, arguments: Any) -> str:
    """The id of the step a call runs as: the caller, the tool and a hash of the canonical arguments (the same call
    of a resumed step finds the same step)."""
    canonical = orjson.dumps(arguments, option=orjson.OPT_SORT_KEYS)
    digest = hashlib.sha256(tool.encode() + b"\0" + canonical).hexdigest()[:12]
    return f"{caller[:150]}-{function_name(tool)[:30]}-{digest}"


def _literal(value: Any) -> Any:
    """``value`` with every ``${`` written ``$${``: a model's arguments are data, never references to outputs."""
    if isinstance(value, str):
        return value.replace("${", "$${")
    if isinstance(value, list):
        return [_literal(v) for v in value]
    if isinstance(value, dict):
        return {k: _literal(v) for k, v in value.items()}
    return value


def _offer(entries: Sequence[str | Mapping[str, Any]]) -> dict[str, _Offered]:
    """The functions offered for a step's ``tools`` entries, by function name; ToolError naming a bad entry."""
    ctx = current_step()
    offered: dict[str, _Offered] = {}
    for i, entry in enumerate(entries):
        if isinstance(entry, str):
            name, keys = entry, {}
        elif isinstance(entry, Mapping) and isinstance(entry.get("tool"), str):
            name, keys = str(entry["tool"]), {k: v for k, v in entry.items() if k != "tool"}
            unknown = sorted(set(keys) - STEP_KEYS)
            if unknown:
                raise _arguments_error(f"tools[{i}] ('{name}'): unknown key(s) {', '.join(unknown)} (a tool's calls "
                                       f"take {', '.join(sorted(STEP_KEYS))})")
        else:
            raise _arguments_error(f"tools[{i}]: give a tool name or {{tool: name, ...}}, got {entry!r}")
        if name == "llm":
            raise _arguments_error(f"tools[{i}]: an llm step cannot offer the llm tool itself")
        found = ctx.tool(name)
        if found is None:
            raise _arguments_error(f"tools[{i}]: the run has no tool '{name}'")
        try:
            parse_step({**keys, "id": "call", "tool": name})
        except PlanError as exc:
            raise _arguments_error(f"tools[{i}] ('{name}'): {exc}") from None
        description, schema = found
        function = function_name(name)
        if function in offered:
            raise _arguments_error(f"tools[{i}]: '{name}' is offered twice (or under the same function name as "
                                   f"'{offered[function].tool}')")
        parameters = dict(schema) if schema.get("type") == "object" else {"type": "object", "properties": {}}
        offered[function] = _Offered(function, name, keys, ToolSpec(function, description or name, parameters))
    return offered


def _result_text(output: Any) -> str:
    text = output if isinstance(output, str) else orjson.dumps(output, default=str).decode()
    if len(text) > MAX_RESULT_CHARS:
        return text[:MAX_RESULT_CHARS] + f"... [cut: {len(text)} characters in all]"
    return text


async def _run_call(call: ToolCall, offered: Mapping[str, _Offered], rounds: int) -> tuple[str, dict[str, Any]]:
    """Run one tool call the model made as a child step; return the text for the model and the call's record."""
    record: dict[str, Any] = {"id": call.id, "function": call.name, "round": rounds}
    target = offered.get(call.name)
    if target is None:
        record["error"] = "unknown function"
        return f"error: there is no function '{call.name}' (offered: {', '.join(sorted(offered))})", record
    try:
        arguments = call.parsed_arguments()
    except ValueError as exc:
        record["error"] = "arguments not JSON"
        return f"error: {exc}", record
    if not isinstance(arguments, dict):
        record["error"] = "arguments not an object"
        return f"error: the arguments of '{call.name}' must be a JSON object", record
    ctx = current_step()
    sid = child_step_id(ctx.step_id, target.tool, arguments)
    record.update(tool=target.tool, step=sid)
    child = {**target.keys, "id": sid, "tool": target.tool, "args": _literal(arguments)}
    child.setdefault("description", f"called by '{ctx.step_id}' (tool call {call.id})")
    try:
        output = await ctx.call(child)
    except PlanInvalid as exc:  # the model's arguments do not fit the tool: it is told, and may call again
        record["error"] = "invalid arguments"
        return f"error: {exc}", record
    except RunError as exc:  # no run to add steps to (outside a run, a speculative attempt)
        raise ToolError(f"tool call '{target.tool}': {exc}", kind="tool_call", retryable=False) from None
    except PlanweaveError as exc:  # the step is invalid (PlanInvalid: bad arguments) or failed for good
        raise ToolError(f"tool call '{target.tool}' (step '{sid}'): {exc}", kind="tool_call",
                        retryable=False) from None
    return _result_text(output), record


def _schema_error(schema: Mapping[str, Any], text: str) -> tuple[Any, str | None]:
    """``text`` parsed and checked against ``schema``: the value, and the error naming its path (None: valid)."""
    import jsonschema

    try:
        value = orjson.loads(text.strip().removeprefix("```json").removeprefix("```").removesuffix("```"))
    except orjson.JSONDecodeError as exc:
        return None, f"reply is not valid JSON ({exc})"
    plain = dict(schema)
    error = jsonschema.exceptions.best_match(jsonschema.validators.validator_for(plain)(plain).iter_errors(value))
    if error is None:
        return value, None
    path = "/".join(str(p) for p in error.absolute_path) or "(root)"
    return None, f"reply does not match the schema at {path}: {error.message}"


def _repair_note(error: str) -> str:
    return (f"Your reply was not accepted: {error}. Reply again with only the JSON value that matches the schema, "
            "nothing else.")


async def converse(ask: Ask, conv: Conversation) -> dict[str, Any]:  # noqa: C901 (the rounds, then the answer)
    """Run an llm step's conversation with ``ask`` (one budgeted, journaled model call per request) and return the
    step's output: ``text`` (or ``json``), ``tokens`` and ``cost_usd`` over every call, ``model``, ``rounds`` and
    ``tool_calls`` (each call's id, function, tool, step and round)."""
    if conv.max_rounds < 0:
        raise _arguments_error(f"max_tool_rounds must be 0 or more, got {conv.max_rounds}")
    offered = _offer(conv.tools) if conv.tools else {}
    specs = tuple(o.spec for o in offered.values())
    messages: list[Message] = [Message("system", conv.system)] if conv.system else []
    messages.append(Message("user", conv.prompt))
    tally = _Tally()
    rounds = 0
    model = conv.model

    def request(schema: Mapping[str, Any] | None, tool_choice: str = "auto") -> CompletionRequest:
        return CompletionRequest(messages=tuple(messages), model=conv.model, max_tokens=conv.max_tokens,
                                 temperature=conv.temperature, schema=schema, tools=specs,
                                 tool_choice=tool_choice if specs else "auto")

    async def answer(schema: Mapping[str, Any] | None, tool_choice: str) -> tuple[Completion | None, str | None]:
        """One call; with a schema asked of the endpoint, its miss as the error instead of a completion."""
        try:
            done = await ask(request(schema, tool_choice), malformed=schema is not None)
        except RejectedReply as exc:
            tally.add(exc.usage, exc.cost)
            messages.append(Message("assistant", exc.text))
            return None, str(exc)
        tally.add(Usage(done.prompt_tokens, done.completion_tokens, done.usage_source), done.cost_usd)
        return done, None

    completion: Completion | None = None
    error: str | None = None
    while True:
        last = rounds >= conv.max_rounds
        # While tools are offered the schema is not sent: a client checks a reply against it even when the model
        # calls tools, and Anthropic's forced tool would leave the model no choice of the offered ones. The answer
        # is checked here instead, and a miss repaired with the schema asked of the endpoint.
        completion, error = await answer(conv.schema if not specs or last else None, "none" if last else "auto")
        if completion is None:
            break  # a schema miss: repaired below
        model = completion.model
        if not completion.tool_calls or not specs:
            break
        if last:
            raise ToolError(f"model '{model}' still called tools after max_tool_rounds ({conv.max_rounds}) rounds",
                            kind="tool_rounds", retryable=False)
        rounds += 1
        messages.append(Message("assistant", completion.text, tool_calls=completion.tool_calls))
        try:  # in parallel; one failing cancels the others (their steps go on in the run)
            async with asyncio.TaskGroup() as group:
                running = [group.create_task(_run_call(c, offered, rounds)) for c in completion.tool_calls]
        except ExceptionGroup as failed:
            raise failed.exceptions[0] from None
        for call, (text, record) in zip(completion.tool_calls, (t.result() for t in running), strict=True):
            messages.append(Message("tool", text, tool_call_id=call.id))
            tally.calls.append(record)
    value: Any = None
    if conv.schema is not None:
        if completion is not None:
            value, error = ((completion.parsed, None) if completion.structured_mode is not None
                            and completion.parsed is not None else _schema_error(conv.schema, completion.text))
            if error is not None:
                messages.append(Message("assistant", completion.text))
        if error is not None:  # one repair round trip, the error fed back, the schema asked of the endpoint
            messages.append(Message("user", _repair_note(error)))
            first = error
            completion, error = await answer(conv.schema, "none")
            if completion is not None:
                value, error = completion.parsed, None
                model = completion.model
            if error is not None:
                raise ToolError(f"model '{model}': {error} (after one repair round trip; first: {first})",
                                kind="malformed_output", retryable=True)
    assert completion is not None
    out: dict[str, Any] = {"json": value} if conv.schema is not None else {"text": completion.text}
    out["tokens"] = {"prompt": tally.prompt, "completion": tally.completion,
                     "total": tally.prompt + tally.completion, "estimated": tally.estimated}
    out["cost_usd"] = tally.cost
    out["model"] = model
    if specs:
        out["rounds"] = rounds
        out["tool_calls"] = tally.calls
    return out
