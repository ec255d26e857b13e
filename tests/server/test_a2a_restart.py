"""A killed ``planweave serve`` resumed while an A2A client waits loses nothing the client already saw (issue 30).

The SDK's client (a2a-sdk) against a real server process (127.0.0.1, SQLite journal): a plan task followed with
``SendStreamingMessage``, the server SIGKILLed mid-run and restarted on the same port and journal (it resumes the
runs it started), the same client subscribes to the task again and follows it to ``completed``. Everything it saw
before the kill holds in the end: each step it was told succeeded is still succeeded with the same output (stamped
with ``time.time_ns()``: a step run again would show a new value), and ran once. An approval waiting when the
server was killed is answered over A2A after the restart and the run completes.
"""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from google.protobuf.json_format import MessageToDict

from planweave.testing.server import read_sse

REPO = Path(__file__).resolve().parents[2]
TOKEN = "a2a-restart-token-0123456789abcdef"
#: Generous: a loaded 2-core machine starts a server (and replays a journal) slowly. Each test starts two.
WAIT_S = 60.0
pytestmark = pytest.mark.timeout(300)
TERMINAL = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED,
            TaskState.TASK_STATE_REJECTED}
LINKS = 6


def stamped_chain(links: int, seconds: float) -> dict[str, Any]:
    """``s1`` .. ``sN`` sleep steps in a chain, and after each ``sI`` a step ``tI`` whose output is the time it ran
    (nanoseconds): the same value in the end means it did not run again. The stamps say ``idempotent`` (reading the
    clock has no effect): one the kill interrupts is run again, not left ``unknown`` as a tool with effects is."""
    steps: list[dict[str, Any]] = []
    for i in range(1, links + 1):
        step: dict[str, Any] = {"id": f"s{i}", "tool": "sleep", "args": {"seconds": seconds, "result": {"n": i}}}
        if i > 1:
            step["after"] = [f"s{i - 1}"]
        steps.append(step)
        steps.append({"id": f"t{i}", "tool": "python", "args": {"function": "time:time_ns"}, "after": [f"s{i}"],
                      "idempotent": True})
    return {"steps": steps}


class Server:
    """``planweave serve`` over one SQLite journal, on one port kept across restarts."""

    def __init__(self, tmp_path: Path) -> None:
        self.journal = tmp_path / "runs.db"
        self.log = tmp_path / "serve.log"
        self.port = 0
        self.url = ""
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PLANWEAVE_")}
        env.update(PLANWEAVE_TOKEN=TOKEN, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        with self.log.open("ab") as stderr:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "planweave.cli.main", "serve", "--port", str(self.port),
                "--journal", f"sqlite:///{self.journal}", cwd=REPO, env=env,
                stdout=asyncio.subprocess.PIPE, stderr=stderr)
        assert self.proc.stdout is not None
        first = (await asyncio.wait_for(self.proc.stdout.readline(), WAIT_S)).decode()
        found = re.search(r"serving (http://\S+)", first)
        assert found is not None, (first, self.log.read_text(errors="replace")[-4000:])
        url = found.group(1).rstrip("/")
        assert not self.url or url == self.url, (url, self.url)  # the same address: the client's card still holds
        self.url, self.port = url, int(url.rsplit(":", 1)[1])

    async def kill(self) -> None:
        assert self.proc is not None and self.proc.returncode is None
        self.proc.send_signal(signal.SIGKILL)
        await asyncio.wait_for(self.proc.wait(), WAIT_S)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(self.proc.wait(), WAIT_S)

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        """Every journaled event of a run that has ended (``GET /runs/{id}/events`` ends at ``run_finished``)."""
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(WAIT_S)) as http, \
                http.stream("GET", f"{self.url}/runs/{run_id}/events") as response:
            assert response.status_code == 200
            return [frame["data"] async for frame in read_sse(response)]


@asynccontextmanager
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    running = Server(tmp_path)
    await running.start()
    try:
        yield running
    finally:
        await running.stop()


@asynccontextmanager
async def a2a_client(url: str) -> AsyncIterator[Client]:
    """The SDK's streaming client for the agent card at ``url`` (one connection pool, kept across the restart)."""
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(WAIT_S)) as http:
        client = await ClientFactory(ClientConfig(httpx_client=http, streaming=True)).create_from_url(url)
        try:
            yield client
        finally:
            await client.close()


def message(*parts: Part, task_id: str = "") -> SendMessageRequest:
    return SendMessageRequest(message=Message(message_id=os.urandom(8).hex(), role=Role.ROLE_USER,
                                              parts=list(parts), task_id=task_id))


def state_of(event: StreamResponse) -> int | None:
    if event.HasField("task"):
        return event.task.status.state
    if event.HasField("status_update"):
        return event.status_update.status.state
    return None


def data_of(part: Part) -> Any:
    found = MessageToDict(part)
    return found.get("data", found.get("text"))


def artifacts_in(events: list[StreamResponse]) -> dict[str, list[Any]]:
    """Every value each artifact had in a stream (a task's artifacts, then the updates), by artifact name."""
    shown: dict[str, list[Any]] = {}
    for event in events:
        if event.HasField("task"):
            for artifact in event.task.artifacts:
                shown.setdefault(artifact.name, []).append(data_of(artifact.parts[0]))
        elif event.HasField("artifact_update"):
            artifact = event.artifact_update.artifact
            shown.setdefault(artifact.name, []).append(data_of(artifact.parts[0]))
    return shown


def outputs(task: Task) -> dict[str, Any]:
    return {a.name: data_of(a.parts[0]) for a in task.artifacts}


def succeeded_in(events: list[StreamResponse]) -> set[str]:
    """The steps a stream's task snapshots said had succeeded (their ``metadata.planweave.steps``)."""
    said: set[str] = set()
    for event in events:
        if event.HasField("task"):
            steps = MessageToDict(event.task.metadata).get("planweave", {}).get("steps", {})
            said |= {sid for sid, status in steps.items() if status == "succeeded"}
    return said


def asked(event: StreamResponse) -> set[str]:
    """The steps an input-required status says wait for a person."""
    status = event.task.status if event.HasField("task") else event.status_update.status
    if status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
        return set()
    return {data_of(p)["step"] for p in status.message.parts if p.HasField("data")}


async def read_until(stream: AsyncIterator[StreamResponse], seen: list[StreamResponse],
                     done: Callable[[list[StreamResponse]], bool]) -> None:
    """Read ``stream`` into ``seen`` until ``done(seen)``; fail if it ends first."""
    while not done(seen):
        seen.append(await asyncio.wait_for(anext(stream), WAIT_S))


async def drain(stream: AsyncIterator[StreamResponse], seen: list[StreamResponse]) -> BaseException | None:
    """Read ``stream`` into ``seen`` to its end; the error that ended it, if one did (the server was killed)."""
    try:
        async for event in stream:
            seen.append(event)
    except Exception as exc:  # the SDK's error for a lost connection is its own
        return exc
    return None


def step_counts(events: list[dict[str, Any]], kind: str) -> Counter[str]:
    return Counter(e["step"] for e in events if e["kind"] == kind)


async def test_a_streaming_client_resubscribes_after_a_kill_and_restart_and_loses_nothing_it_saw(
        tmp_path: Path) -> None:
    plan = stamped_chain(LINKS, 1.5)
    every = {step["id"] for step in plan["steps"]}
    before: list[StreamResponse] = []
    after: list[StreamResponse] = []
    async with server(tmp_path) as served, a2a_client(served.url) as client:
        stream = client.send_message(message(new_data_part(plan)))
        # A few updates, two links of the chain done; then the server dies while the client is still reading.
        await read_until(stream, before, lambda seen: {"s1", "s2"} <= set(artifacts_in(seen)))
        assert not any(state_of(e) in TERMINAL for e in before), before
        task_id = before[0].task.id
        reading = asyncio.ensure_future(drain(stream, before))
        await served.kill()
        lost = await asyncio.wait_for(reading, WAIT_S)
        await served.start()
        # The same client, on the same address, subscribes again and follows the resumed run to its end.
        lost_again = await asyncio.wait_for(drain(client.subscribe(SubscribeToTaskRequest(id=task_id)), after),
                                            WAIT_S)
        final = await client.get_task(GetTaskRequest(id=task_id))
        journaled = await served.events(task_id)

    assert lost is not None, "the stream ended although the server was killed"
    assert lost_again is None, lost_again
    assert not any(state_of(e) in TERMINAL for e in before), before  # the kill came mid-run
    # What the client saw before the kill: each artifact one value (a snapshot and an update may both carry it), the
    # final one; each step said succeeded
    # (an artifact or a task snapshot's metadata) still succeeded.
    saw = artifacts_in(before)
    assert {"s1", "s2", "t1"} <= set(saw) and set(saw) < every, saw
    assert all(value == values[0] for values in saw.values() for value in values), saw
    assert final.status.state == TaskState.TASK_STATE_COMPLETED, final.status
    done = outputs(final)
    assert set(done) == every
    assert {name: values[0] for name, values in saw.items()} == {name: done[name] for name in saw}
    assert all(done[f"s{i}"] == {"n": i} for i in range(1, LINKS + 1))
    assert len({done[f"t{i}"] for i in range(1, LINKS + 1)}) == LINKS
    final_steps = MessageToDict(final.metadata)["planweave"]["steps"]
    assert (succeeded_in(before) | set(saw)) <= {sid for sid, status in final_steps.items() if status == "succeeded"}
    # The subscription: first the task as the restarted server has it (still running, with everything seen
    # before), then the updates to the end; never a value other than the final one.
    assert after[0].HasField("task") and state_of(after[0]) == TaskState.TASK_STATE_WORKING, after[0]
    assert {name: done[name] for name in saw} == {name: outputs(after[0].task)[name] for name in saw}
    assert state_of(after[-1]) == TaskState.TASK_STATE_COMPLETED
    assert [state_of(e) for e in after if state_of(e) in TERMINAL] == [TaskState.TASK_STATE_COMPLETED]
    followed = artifacts_in(after)
    assert set(followed) == every
    assert all(values == [done[name]] * len(values) for name, values in followed.items()), followed
    # The journal agrees: the run was resumed, and no step the client saw succeed ran again.
    assert [e["kind"] for e in journaled].count("run_resumed") == 1
    started, succeeded = step_counts(journaled, "step_started"), step_counts(journaled, "step_succeeded")
    assert all(succeeded[sid] == 1 for sid in every), succeeded
    assert all(started[sid] == 1 for sid in saw), started


async def test_an_approval_waiting_when_the_server_was_killed_is_answered_over_a2a_after_the_restart(
        tmp_path: Path) -> None:
    plan = {"steps": [
        {"id": "build", "tool": "python", "args": {"function": "time:time_ns"}, "idempotent": True},
        {"id": "deploy", "tool": "noop", "args": {"built": "${build}"}, "after": ["build"],
         "approval": "Deploy the build?"},
        {"id": "verify", "tool": "sleep", "args": {"seconds": 0.5, "result": {"ok": True}}, "after": ["deploy"]},
    ]}
    asking: list[StreamResponse] = []
    waiting: list[StreamResponse] = []
    resumed: list[StreamResponse] = []
    async with server(tmp_path) as served, a2a_client(served.url) as client:
        async for event in client.send_message(message(new_data_part(plan))):
            asking.append(event)  # the stream ends at input-required: A2A's interruption
        task_id = asking[0].task.id
        subscription = client.subscribe(SubscribeToTaskRequest(id=task_id))
        await read_until(subscription, waiting, lambda seen: "deploy" in asked(seen[-1]) if seen else False)
        reading = asyncio.ensure_future(drain(subscription, waiting))  # a client waiting for the answer
        await served.kill()
        lost = await asyncio.wait_for(reading, WAIT_S)
        await served.start()
        again = client.subscribe(SubscribeToTaskRequest(id=task_id))
        await read_until(again, resumed, lambda seen: "deploy" in asked(seen[-1]) if seen else False)
        following = asyncio.ensure_future(drain(again, resumed))
        answered: list[StreamResponse] = []
        reply = message(new_text_part("approve: after the restart"), task_id=task_id)
        assert await asyncio.wait_for(drain(client.send_message(reply), answered), WAIT_S) is None
        lost_again = await asyncio.wait_for(following, WAIT_S)
        final = await client.get_task(GetTaskRequest(id=task_id))
        journaled = await served.events(task_id)

    assert lost is not None and lost_again is None, (lost, lost_again)
    assert state_of(asking[-1]) == TaskState.TASK_STATE_INPUT_REQUIRED and asked(asking[-1]) == {"deploy"}
    built = artifacts_in(asking)["build"]
    assert len(set(built)) == 1, built
    assert resumed[0].HasField("task") and outputs(resumed[0].task) == {"build": built[0]}
    assert state_of(answered[-1]) == TaskState.TASK_STATE_COMPLETED, answered[-1]
    assert state_of(resumed[-1]) == TaskState.TASK_STATE_COMPLETED, resumed[-1]
    assert final.status.state == TaskState.TASK_STATE_COMPLETED, final.status
    assert outputs(final) == {"build": built[0], "deploy": {"built": built[0]}, "verify": {"ok": True}}
    assert [e["kind"] for e in journaled].count("run_resumed") == 1
    assert step_counts(journaled, "step_started")["build"] == 1  # it was not run again
    given = [e for e in journaled if e["kind"] in ("approval_given", "step_reply")]
    assert given and all("A2A client" in str(e["data"].get("by")) for e in given), given
