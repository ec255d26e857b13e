"""One conformance suite for executors (the execution seam): every implementation runs the same engine tests.

Each test runs a real engine on the real clock (a worker-thread executor's tools do not run on a virtual loop), with
a memory journal; what the tools observe is recorded outside them (in a file: a Ray worker is another process) and
asserted after the run. The tools are top-level functions of this module, so a remote executor's workers can import
them; ``tests/ray/test_ray_conformance.py`` runs these same tests over the Ray executor.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from planweave import Engine, RunResult, Toolbox, ToolError, builtin_tools, current_step
from planweave.engine.executor import Executor, InProcessExecutor, ThreadExecutor
from planweave.journal.memory import MemoryJournal

EXECUTORS: dict[str, Callable[[], Executor]] = {"in-process": InProcessExecutor, "thread": ThreadExecutor}


@pytest.fixture
def heartbeat_s() -> float:
    """The heartbeat period the suite's steps declare (an executor's own suite may widen it)."""
    return 0.1


@pytest.fixture(params=sorted(EXECUTORS))
def make_executor(request: pytest.FixtureRequest) -> Callable[[], Executor]:
    return EXECUTORS[request.param]


def run(doc: Mapping[str, Any], tools: Toolbox, executor: Executor, *,
        during: Callable[[Any], Any] | None = None) -> tuple[RunResult, list[Any]]:
    """Run ``doc`` to its end with ``executor``; ``during(run)`` is awaited beside it. Returns result and events."""

    async def go() -> tuple[RunResult, list[Any]]:
        journal = MemoryJournal()
        async with Engine(journal, tools=tools, executor=executor) as engine:
            started = await engine.start(doc)
            if during is not None:
                await during(started)
            result = await started.wait()
        return result, await journal.read(result.run_id)

    return asyncio.run(go())


def record(log: str, line: str) -> None:
    """Append ``line`` to the file ``log`` (a tool's observation, from whichever process runs it)."""
    with open(log, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def recorded(log: Path) -> list[str]:
    return log.read_text(encoding="utf-8").splitlines() if log.exists() else []


async def answer(n: int, log: str) -> dict[str, Any]:
    """Return n doubled."""
    record(log, str(threading.get_ident()))
    await asyncio.sleep(0)
    return {"doubled": n * 2, "step": current_step().step_id, "attempt": current_step().attempt}


def test_the_output_is_returned(make_executor: Callable[[], Executor], tmp_path: Path) -> None:
    box = builtin_tools()
    box.add(answer, idempotent=True)
    log = str(tmp_path / "calls")
    result, _ = run({"steps": [{"id": "a", "tool": "answer", "args": {"n": 21, "log": log}},
                               {"id": "b", "tool": "answer", "args": {"n": "${a.doubled}", "log": log}}]},
                    box, make_executor())
    assert result.ok, result.error
    assert result.outputs == {"a": {"doubled": 42, "step": "a", "attempt": 1},
                              "b": {"doubled": 84, "step": "b", "attempt": 1}}
    assert len(recorded(tmp_path / "calls")) == 2


class Unserialisable:
    pass


async def boom(how: str) -> Any:
    """Fail in the way named."""
    await asyncio.sleep(0)
    if how == "value":
        raise ValueError("bad value")
    if how == "tool":
        raise ToolError("refused by the service", kind="refused", retryable=False)
    if how == "exit":
        raise SystemExit(3)
    if how == "interrupt":
        raise KeyboardInterrupt
    if how == "cancelled":
        raise asyncio.CancelledError("by itself")
    return {"value": Unserialisable()}


def failing_tools() -> Toolbox:
    box = builtin_tools()
    box.add(boom, idempotent=True)
    return box


FAILURES = {
    "value": ("ValueError", "ValueError: bad value"),
    "tool": ("refused", "refused by the service"),
    "exit": ("exit", "the tool raised SystemExit(3)"),
    "interrupt": ("interrupted", "the tool raised KeyboardInterrupt"),
    "cancelled": ("RuntimeError", "RuntimeError: tool raised CancelledError: by itself"),
    "output": ("output", None),
}


def test_exceptions_are_classified_as_in_process(make_executor: Callable[[], Executor]) -> None:
    doc = {"on_failure": "continue", "steps": [{"id": how, "tool": "boom", "args": {"how": how}} for how in FAILURES]}
    result, events = run(doc, failing_tools(), make_executor())
    failed = {e.step: e.data for e in events if e.kind == "step_failed"}
    assert result.status == "failed"
    assert set(failed) == set(FAILURES)
    for how, (kind, message) in FAILURES.items():
        assert failed[how]["kind"] == kind, how
        assert failed[how]["final"] is True
        if message is not None:
            assert failed[how]["error"] == message


async def hang(log: str) -> None:
    """Wait forever, recording that it started (also as progress: the run sees it) and how it ended."""
    record(log, "entered")
    current_step().progress(None, "entered")
    try:
        await asyncio.sleep(3600)
    except asyncio.CancelledError:
        record(log, "cancelled")
        raise


def hanging_tools() -> Toolbox:
    box = builtin_tools()
    box.add(hang, idempotent=True)
    return box


def test_a_timeout_stops_the_call(make_executor: Callable[[], Executor], tmp_path: Path) -> None:
    log = tmp_path / "hang"
    result, events = run({"steps": [{"id": "h", "tool": "hang", "args": {"log": str(log)}, "timeout": 0.1}]},
                         hanging_tools(), make_executor())
    failed = [e.data for e in events if e.kind == "step_failed"]
    assert result.status == "failed"
    assert [(f["kind"], f["error"]) for f in failed] == [("timeout", "timed out after 0.1s")]
    assert recorded(log) == ["entered", "cancelled"]


def test_cancelling_the_run_cancels_the_call_promptly(make_executor: Callable[[], Executor], tmp_path: Path) -> None:
    log = tmp_path / "hang"
    took: list[float] = []

    async def cancel_once_running(started: Any) -> None:
        entered = asyncio.Event()
        started.subscribe(lambda event: entered.set() if event.kind == "step_progress" else None)
        if not recorded(log):  # it may have started before this subscription
            await entered.wait()  # the tool's progress report, from whichever process runs it
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        started.cancel("enough")
        await started.wait()
        took.append(loop.time() - t0)

    result, _ = run({"steps": [{"id": "h", "tool": "hang", "args": {"log": str(log)}}]}, hanging_tools(),
                    make_executor(), during=cancel_once_running)
    assert result.status == "cancelled"
    assert recorded(log) == ["entered", "cancelled"]
    assert took[0] < 1.0


async def steady(beats: int, every: float = 0.02) -> str:
    """Beat ``beats`` times, ``every`` seconds apart (longer in all than the step's heartbeat), reporting progress."""
    step = current_step()
    for _ in range(beats):
        await asyncio.sleep(every)
        step.heartbeat()
    step.progress(0.5, "half way")
    step.report_usage({"model": "m", "prompt_tokens": 1, "completion_tokens": 2})
    return "done"


async def silent(seconds: float = 0.5) -> str:
    """Say nothing for ``seconds``, longer than the step's heartbeat."""
    await asyncio.sleep(seconds)
    return "never"


def test_heartbeats_and_progress_reach_the_run(make_executor: Callable[[], Executor], heartbeat_s: float) -> None:
    # heartbeat_s: the step's heartbeat period, wider for executors whose reports cross processes (tests/ray)
    box = builtin_tools()
    box.add(steady, idempotent=True)
    box.add(silent, idempotent=True)
    doc = {"on_failure": "continue", "steps": [
        {"id": "alive", "tool": "steady", "args": {"beats": 15, "every": heartbeat_s / 5}, "heartbeat": heartbeat_s},
        {"id": "hung", "tool": "silent", "args": {"seconds": heartbeat_s * 5}, "heartbeat": heartbeat_s},
    ]}
    result, events = run(doc, box, make_executor())
    kinds = [(e.kind, e.step) for e in events]
    assert result.outputs == {"alive": "done"}
    assert ("step_progress", "alive") in kinds and ("model_call", "alive") in kinds
    progress = next(e.data for e in events if e.kind == "step_progress")
    assert progress == {"fraction": 0.5, "message": "half way"}
    hung = [e.data for e in events if e.kind == "step_failed" and e.step == "hung"]
    assert [h["kind"] for h in hung] == ["timeout"] and f"no heartbeat for {heartbeat_s:g}s" in hung[0]["error"]
