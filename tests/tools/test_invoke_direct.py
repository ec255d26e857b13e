"""``Tool.invoke`` hands back an async tool's own coroutine when its output needs no conversion (``plain_output``):
the same outputs, argument checks and isolation errors as the tool's wrapping coroutine gives."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from planweave import Event, RunResult, Toolbox, VirtualClock, builtin_tools, open_engine, run_virtual
from planweave.tools.registry import Tool


class Point(BaseModel):
    x: int
    y: int = 0


async def plain_dict(n: int) -> dict[str, Any]:
    return {"n": n}


async def plain_none() -> None:
    return None


async def model_out(x: int) -> Point:
    return Point(x=x)


async def untyped(x: int):  # type: ignore[no-untyped-def]  # no annotation: a model may come back
    return Point(x=x)


async def any_out(x: int) -> Any:
    return Point(x=x)


def sync_dict(n: int) -> dict[str, Any]:
    return {"n": n}


@pytest.mark.parametrize(("fn", "plain"), [
    (plain_dict, True), (plain_none, True), (model_out, False), (untyped, False), (any_out, False),
    (sync_dict, False),
])
def test_plain_output_is_declared_only_for_async_functions_returning_plain_data(fn: Any, plain: bool) -> None:
    assert Tool.from_function(fn).plain_output is plain


def run_plan(doc: dict[str, Any]) -> tuple[RunResult, list[Event]]:
    box: Toolbox = builtin_tools()
    for fn in (plain_dict, plain_none, model_out, untyped, any_out):
        box.add(fn)

    async def go() -> tuple[RunResult, list[Event]]:
        async with open_engine("memory://", clock=VirtualClock(), tools=box) as engine:
            run = await engine.start(doc)
            result = await run.wait()
            return result, list(await engine.journal.read(run.id))

    return run_virtual(go())


def test_outputs_are_the_same_on_both_paths() -> None:
    result, _ = run_plan({"steps": [
        {"id": "a", "tool": "plain_dict", "args": {"n": "3"}},  # bound by the argument model: "3" -> 3
        {"id": "b", "tool": "plain_none"},
        {"id": "c", "tool": "model_out", "args": {"x": 2}},
        {"id": "d", "tool": "untyped", "args": {"x": 4}},
        {"id": "e", "tool": "any_out", "args": {"x": 5}},
    ]})
    assert result.status == "succeeded"
    assert result.outputs == {"a": {"n": 3}, "b": None, "c": {"x": 2, "y": 0}, "d": {"x": 4, "y": 0},
                              "e": {"x": 5, "y": 0}}


def test_bad_arguments_fail_the_step_without_retries_on_the_direct_path() -> None:
    result, events = run_plan({"on_failure": "continue", "steps": [
        {"id": "src", "tool": "noop", "args": {"v": "many"}},  # checked at call time: a reference
        {"id": "a", "tool": "plain_dict", "args": {"n": "${src.v}"}, "retries": 3}]})
    assert result.status == "failed"
    failed = [e.data for e in events if e.kind == "step_failed"]
    assert [(d["kind"], d["final"]) for d in failed] == [("arguments", True)]
    assert "bad arguments for tool 'plain_dict'" in failed[0]["error"]


def test_an_async_tool_under_process_isolation_is_refused_on_the_direct_path() -> None:
    result, events = run_plan({"on_failure": "continue", "steps": [
        {"id": "a", "tool": "plain_dict", "args": {"n": 1}, "isolation": "process"}]})
    assert result.status == "failed"
    failed = [e.data for e in events if e.kind == "step_failed"]
    assert [d["kind"] for d in failed] == ["arguments"]
    assert "is async" in failed[0]["error"]


def test_a_tool_remade_with_another_function_derives_plain_output_again() -> None:
    import dataclasses

    plain = Tool.from_function(plain_dict)
    assert plain.plain_output
    remade = dataclasses.replace(plain, fn=sync_dict, is_async=False)
    assert not remade.plain_output  # a sync function's result is no coroutine: invoke must not return it
    assert not dataclasses.replace(plain, fn=model_out).plain_output
    made = Tool(name="direct", fn=plain_dict)  # built directly, as the MCP and safety wrappers build theirs
    assert made.plain_output


def test_a_subclass_with_its_own_bind_takes_the_path_that_calls_it() -> None:
    from planweave.core.errors import ToolError

    class Checked(Tool):
        def bind(self, args: Any) -> dict[str, Any]:
            raise ToolError("refused by the subclass", kind="arguments", retryable=False)

    checked = Checked(name="checked", fn=plain_dict)
    assert not checked.plain_output

    async def call() -> str:
        try:
            await checked.invoke({"n": 1})
        except ToolError as exc:
            return str(exc)
        return "called"

    assert run_virtual(call()) == "refused by the subclass"
