"""planweave as an A2A agent: the SDK's client (a2a-sdk) against a real ``planweave serve`` process on 127.0.0.1.

A task is a run: a plan (a data part) or a goal (text) runs to its end with each step's output as an artifact,
streamed as status and artifact updates; a step waiting for a person makes the task input-required and the reply
message answers it; cancel; the token is required; bad input is a JSON-RPC error, never a 500; and a secret planted
in the server's environment (and in the plans) appears in no response.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from a2a.client import A2AClientError, Client, ClientConfig, ClientFactory
from a2a.helpers import new_data_part, new_text_part
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    ListTasksRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskState,
)
from a2a.utils.errors import A2AError
from google.protobuf.json_format import MessageToDict, MessageToJson

REPO = Path(__file__).resolve().parents[2]
TOKEN = "a2a-test-token-0123456789abcdef"
SECRET = "sk-a2a-planted-0123456789SECRET"
SCRIPT = "examples/offline/weather.yaml"

APPROVAL_PLAN = {"steps": [
    {"id": "build", "tool": "noop", "args": {"artifact": "app-1.2", "auth": f"Bearer {SECRET}"}},
    {"id": "deploy", "tool": "noop", "args": {"what": "${build.artifact}"}, "after": ["build"],
     "approval": "Deploy app-1.2 to production?"},
]}
INPUT_PLAN = {"steps": [
    {"id": "ask", "tool": "human.input", "args": {"prompt": "How many replicas?", "schema": {"type": "integer"}}},
    {"id": "scale", "tool": "noop", "args": {"replicas": "${ask}"}},
]}


@dataclass
class Served:
    """A ``planweave serve`` process: its URL, and everything its clients were shown (to grep for the secret)."""

    url: str
    seen: list[str] = field(default_factory=list)

    def saw(self, item: Any) -> Any:
        self.seen.append(MessageToJson(item) if hasattr(item, "DESCRIPTOR") else str(item))
        return item

    def assert_no_secret(self) -> None:
        assert self.seen, "nothing was seen"
        leaked = [text for text in self.seen if SECRET in text]
        assert not leaked, leaked[0]


@asynccontextmanager
async def serving(tmp_path: Path, *flags: str) -> AsyncIterator[Served]:
    """``planweave serve`` on a free port of 127.0.0.1 over a SQLite journal, with a secret in its environment."""
    env = {**{k: v for k, v in os.environ.items() if k != "PLANWEAVE_JOURNAL"}, "PLANWEAVE_TOKEN": TOKEN,
           "SERVICE_API_KEY": SECRET,
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    log = tmp_path / "serve.log"
    with log.open("wb") as stderr:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "planweave.cli.main", "serve", "--port", "0", "--journal",
            f"sqlite:///{tmp_path / 'runs.db'}", *flags, cwd=REPO, env=env,
            stdout=asyncio.subprocess.PIPE, stderr=stderr)
    try:
        assert proc.stdout is not None
        first = (await asyncio.wait_for(proc.stdout.readline(), 60)).decode()
        url = re.search(r"serving (http://\S+)", first)
        assert url is not None, first
        served = Served(url.group(1).rstrip("/"))
        yield served
        served.assert_no_secret()
    finally:
        proc.send_signal(signal.SIGTERM)
        await asyncio.wait_for(proc.wait(), 30)
    assert TOKEN not in log.read_text(errors="replace")  # the server's log (access log, A2A errors) holds no token


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    async with serving(tmp_path) as running:
        yield running


@asynccontextmanager
async def a2a_client(served: Served, *, token: str | None = TOKEN, streaming: bool = True) -> AsyncIterator[Client]:
    """The SDK's client for the agent card at ``served``, sending ``token`` as the card's bearer scheme asks."""
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(60.0)) as http:
        client = await ClientFactory(ClientConfig(httpx_client=http, streaming=streaming)).create_from_url(served.url)
        try:
            yield client
        finally:
            await client.close()


def user_message(*parts: Part, task_id: str = "", metadata: dict[str, Any] | None = None) -> SendMessageRequest:
    message = Message(message_id=os.urandom(8).hex(), role=Role.ROLE_USER, parts=list(parts), task_id=task_id)
    if metadata:
        message.metadata.update(metadata)
    return SendMessageRequest(message=message)


async def collected(served: Served, client: Client, request: SendMessageRequest) -> list[StreamResponse]:
    return [served.saw(event) async for event in client.send_message(request)]


def final_task(events: list[StreamResponse]) -> Task:
    tasks = [e.task for e in events if e.HasField("task")]
    assert len(tasks) == 1, events
    return tasks[0]


def states(events: list[StreamResponse]) -> list[int]:
    return [e.task.status.state if e.HasField("task") else e.status_update.status.state
            for e in events if e.HasField("task") or e.HasField("status_update")]


def artifact_names(events: list[StreamResponse]) -> set[str]:
    """The artifacts a stream carried: in its task (a run that ended before the stream began) or its updates."""
    names = {a.name for e in events if e.HasField("task") for a in e.task.artifacts}
    return names | {e.artifact_update.artifact.name for e in events if e.HasField("artifact_update")}


def asked_steps(event: StreamResponse) -> set[str]:
    """The steps an input-required status (the task's or an update's) says wait for a person."""
    status = event.task.status if event.HasField("task") else event.status_update.status
    if status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
        return set()
    return {MessageToDict(p)["data"]["step"] for p in status.message.parts if p.HasField("data")}


def outputs(task: Task) -> dict[str, Any]:
    return {a.name: MessageToDict(a.parts[0]).get("data", a.parts[0].text) for a in task.artifacts}


async def test_the_agent_card_names_both_skills_streaming_and_the_bearer_scheme(served: Served) -> None:
    async with httpx.AsyncClient() as http:  # no token: the card is public, and says how to authenticate
        response = await http.get(served.url + "/.well-known/agent-card.json")
    served.saw(response.text)
    assert response.status_code == 200, response.text
    card = response.json()
    assert card["name"] == "planweave" and card["capabilities"]["streaming"] is True
    assert card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"] == "bearer"
    assert card["securityRequirements"] == [{"schemes": {"bearer": {}}}]
    assert [skill["id"] for skill in card["skills"]] == ["run-plan"]  # no --model: no goals
    assert {i["protocolVersion"] for i in card["supportedInterfaces"]} == {"1.0", "0.3"}
    assert all(i["url"] == served.url + "/a2a" for i in card["supportedInterfaces"])


async def test_a_plan_task_runs_to_completion_with_each_step_output_as_an_artifact(served: Served) -> None:
    plan = {"steps": [{"id": "fetch", "tool": "noop", "args": {"rows": [1, 2, 3], "city": "oslo"}},
                      {"id": "count", "tool": "noop", "args": {"n": "${fetch.rows[2]}", "label": "${fetch.city}"}}]}
    async with a2a_client(served, streaming=False) as client:
        task = final_task(await collected(served, client, user_message(new_data_part(plan))))
        again = served.saw(await client.get_task(GetTaskRequest(id=task.id)))
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    assert outputs(task) == {"fetch": {"rows": [1, 2, 3], "city": "oslo"}, "count": {"n": 3, "label": "oslo"}}
    assert [a.artifact_id for a in task.artifacts] == ["step:fetch", "step:count"]
    assert again.status.state == TaskState.TASK_STATE_COMPLETED and outputs(again) == outputs(task)
    assert MessageToDict(again.metadata)["planweave"]["steps"] == {"fetch": "succeeded", "count": "succeeded"}


async def test_a_plan_as_yaml_text_streams_status_updates_then_artifacts_then_completed(served: Served) -> None:
    plan = ("steps:\n  - {id: wait, tool: sleep, args: {seconds: 0.5, result: {slept: true}}}\n"
            "  - {id: after, tool: noop, args: {got: '${wait.slept}'}}\n")
    async with a2a_client(served) as client:
        events = await collected(served, client, user_message(new_text_part(plan, "application/yaml")))
    assert events[0].HasField("task")  # the task first, then its updates
    assert events[0].task.status.state == TaskState.TASK_STATE_WORKING
    updates = [e for e in events[1:] if e.HasField("status_update") or e.HasField("artifact_update")]
    assert updates and all(u.HasField("status_update") or u.HasField("artifact_update") for u in events[1:])
    artifacts = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert [(a.name, MessageToDict(a.parts[0])["data"]) for a in artifacts] == [
        ("wait", {"slept": True}), ("after", {"got": True})]
    assert states(events)[-1] == TaskState.TASK_STATE_COMPLETED
    assert TaskState.TASK_STATE_WORKING in states(events)[1:]


async def test_an_approval_answered_through_a2a_resumes_the_run(served: Served) -> None:
    async with a2a_client(served) as client:
        asked = await collected(served, client, user_message(new_data_part(APPROVAL_PLAN)))
        task_id = asked[0].task.id
        waiting = served.saw(await client.get_task(GetTaskRequest(id=task_id)))
        answered = await collected(served, client, user_message(new_text_part("approve: ship it"), task_id=task_id))
        with pytest.raises(A2AError) as late:  # the first reply is final, and the task has ended
            await collected(served, client, user_message(new_text_part("reject"), task_id=task_id))
        served.saw(late.value)
    assert states(asked)[-1] == TaskState.TASK_STATE_INPUT_REQUIRED  # the stream ends there: A2A's interruption
    last = asked[-1].status_update.status.message if asked[-1].HasField("status_update") else \
        asked[-1].task.status.message
    assert "Deploy app-1.2 to production?" in last.parts[0].text
    assert MessageToDict(last.parts[1])["data"]["step"] == "deploy"
    assert waiting.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert outputs(waiting) == {"build": {"artifact": "app-1.2", "auth": "Bearer ***"}}
    assert states(answered)[-1] == TaskState.TASK_STATE_COMPLETED
    assert "deploy" in artifact_names(answered)
    assert "has ended" in str(late.value)


async def test_a_value_through_a2a_is_checked_against_the_schema_and_becomes_the_output(served: Served) -> None:
    async with a2a_client(served, streaming=False) as client:
        asked = final_task(await collected(served, client, user_message(new_data_part(INPUT_PLAN))))
        with pytest.raises(A2AError) as wrong:
            await collected(served, client, user_message(new_data_part({"value": "three"}), task_id=asked.id))
        served.saw(wrong.value)
        still = served.saw(await client.get_task(GetTaskRequest(id=asked.id)))
        done = final_task(await collected(served, client, user_message(new_text_part("3"), task_id=asked.id)))
    assert asked.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert MessageToDict(asked.status.message.parts[1])["data"]["input_schema"] == {"type": "integer"}
    assert "'three' is not of type 'integer'" in str(wrong.value)
    assert still.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert done.status.state == TaskState.TASK_STATE_COMPLETED
    assert outputs(done) == {"ask": 3, "scale": {"replicas": 3}}


async def test_a_subscriber_follows_two_approvals_answered_by_step_to_the_end(served: Served) -> None:
    plan = {"steps": [{"id": "a", "tool": "noop", "args": {"n": 1}, "approval": "Run a?"},
                      {"id": "b", "tool": "noop", "args": {"n": 2}, "approval": "Run b?"}]}
    async with a2a_client(served) as client:
        asked = await collected(served, client, user_message(new_data_part(plan)))
        task_id = asked[0].task.id
        subscription = client.subscribe(SubscribeToTaskRequest(id=task_id))
        first = served.saw(await anext(subscription))
        waiting = asked_steps(first)
        while waiting != {"a", "b"}:  # the second approval may be asked a moment after the first
            waiting |= asked_steps(served.saw(await anext(subscription)))
        listed = served.saw(await client.list_tasks(ListTasksRequest()))
        with pytest.raises(A2AError) as which:
            await collected(served, client, user_message(new_text_part("approve"), task_id=task_id))
        served.saw(which.value)
        approved = await collected(served, client, user_message(new_data_part({"step": "a", "approve": True}),
                                                                 task_id=task_id))
        rejected = await collected(served, client, user_message(
            new_data_part({"step": "b", "approve": False, "reason": "freeze week"}), task_id=task_id))
        followed = [served.saw(event) async for event in subscription]
    assert [(t.id, t.status.state) for t in listed.tasks] == [(task_id, TaskState.TASK_STATE_INPUT_REQUIRED)]
    assert first.task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
    assert "steps a, b are waiting: say which one" in str(which.value)
    assert states(approved) == [TaskState.TASK_STATE_INPUT_REQUIRED]  # b still waits: the stream ends at once
    assert states(rejected)[-1] == TaskState.TASK_STATE_FAILED
    assert "freeze week" in MessageToJson(rejected[-1])
    assert "a" in artifact_names(followed) and states(followed)[-1] == TaskState.TASK_STATE_FAILED


async def test_cancel_ends_a_running_task_canceled(served: Served) -> None:
    plan = {"steps": [{"id": "long", "tool": "sleep", "args": {"seconds": 60}}]}
    request = user_message(new_data_part(plan))
    request.configuration.return_immediately = True
    async with a2a_client(served, streaming=False) as client:
        started = final_task(await collected(served, client, request))
        cancelled = served.saw(await client.cancel_task(CancelTaskRequest(id=started.id)))
        with pytest.raises(A2AError) as again:
            await client.cancel_task(CancelTaskRequest(id=started.id))
        served.saw(again.value)
    assert started.status.state == TaskState.TASK_STATE_WORKING
    assert cancelled.status.state == TaskState.TASK_STATE_CANCELED
    assert "has ended" in str(again.value)


async def test_every_call_without_the_token_is_refused(served: Served) -> None:
    async with a2a_client(served, token=None) as client:  # the card is public: the client is built
        with pytest.raises(A2AClientError) as refused:
            await collected(served, client, user_message(new_data_part(APPROVAL_PLAN)))
        served.saw(refused.value)
    async with httpx.AsyncClient(base_url=served.url) as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tasks/get", "params": {"id": "x"}}
        wrong = await http.post("/a2a", json=body, headers={"Authorization": "Bearer not-the-token"})
        missing = await http.post("/a2a", json=body)
        listed = await http.get("/runs", headers={"Authorization": f"Bearer {TOKEN}"})
    assert "401" in str(refused.value)
    assert wrong.status_code == missing.status_code == 401
    assert wrong.headers["www-authenticate"] == "Bearer"
    assert listed.json() == []  # nothing ran


async def test_bad_input_gets_a_json_rpc_error_naming_it_never_a_500_nor_a_secret(served: Served) -> None:
    def send(parts: list[dict[str, Any]], **metadata: Any) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": 7, "method": "SendMessage", "params": {"message": {
            "messageId": "m", "role": "ROLE_USER", "parts": parts, "metadata": metadata}}}

    bad_plan = {"steps": [{"id": "x", "tool": f"tool-{SECRET}", "args": {}}]}
    cases: list[tuple[Any, int, str]] = [
        ("not json", -32700, ""),
        ({"jsonrpc": "2.0", "id": 1, "method": "NoSuchMethod"}, -32601, ""),
        ({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": "x"}}, -32602, ""),
        ({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {"message": {"taskId": [SECRET]}}}, -32602,
         ""),
        (send([{"data": bad_plan}]), -32602, "unknown tool"),
        (send([{"data": {"steps": []}}], budget_usd=-1), -32602, "budget_usd"),
        (send([{"data": {"steps": []}, }], deadline="soon"), -32602, "deadline"),
        (send([{"url": "http://127.0.0.1:9/plan.yaml"}]), -32602, "does not fetch URLs"),
        (send([{"data": [1, 2]}]), -32602, "a data part is a plan"),
        (send([{"text": "plan a trip"}]), -32602, "no model to plan goals"),
        (send([{"data": {"steps": []}}], model="gpt-4o"), -32602, "no model"),
        ({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": "no-such-run"}}, -32001, "no-such-run"),
        ({"jsonrpc": "2.0", "id": 1, "method": "CancelTask", "params": {"id": "no-such-run"}}, -32001, ""),
        (send([{"text": "approve"}]) | {"params": {"message": {"messageId": "m", "role": "ROLE_USER",
                                                              "taskId": "no-such-run", "parts": [{"text": "ok"}]}}},
         -32001, "no-such-run"),
    ]
    headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "1.0"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as http:
        for body, code, says in cases:
            sent = {"content": body} if isinstance(body, str) else {"json": body}
            response = await http.post("/a2a", **sent)
            served.saw(response.text)
            assert response.status_code == 200, (body, response.text)
            error = response.json()["error"]
            assert error["code"] == code, (body, error)
            assert says in error["message"], (body, error)
        # The 0.3 method names answer too (a client of the previous protocol version), with 0.3's shapes.
        legacy = await http.post("/a2a", headers={"A2A-Version": "0.3"}, json={
            "jsonrpc": "2.0", "id": 2, "method": "message/send", "params": {"message": {
                "messageId": "m2", "role": "user", "kind": "message",
                "parts": [{"kind": "data", "data": {"steps": [{"id": "one", "tool": "noop", "args": {"k": SECRET}}]}}],
            }}})
        served.saw(legacy.text)
    assert legacy.status_code == 200, legacy.text
    result = legacy.json()["result"]
    assert result["kind"] == "task" and result["status"]["state"] == "completed"
    assert result["artifacts"][0]["parts"][0]["data"] == {"k": "***"}


async def test_a_goal_planned_with_the_scripted_model_answers(tmp_path: Path) -> None:
    model = f"scripted:{SCRIPT}"
    async with serving(tmp_path, "--model", model, "--tools", "examples.weather:toolbox") as served, \
            a2a_client(served) as client:
        events = await collected(served, client, user_message(
            new_text_part("Compare tomorrow's weather in Paris and Rome and recommend one"),
            metadata={"deadline": 120, "model": model}))
        with pytest.raises(A2AError) as other:
            await collected(served, client, user_message(new_text_part("anything"), metadata={"model": "gpt-4o"}))
        served.saw(other.value)
        task = served.saw(await client.get_task(GetTaskRequest(id=events[0].task.id)))
        async with httpx.AsyncClient() as http:
            card = (await http.get(served.url + "/.well-known/agent-card.json")).json()
    assert [skill["id"] for skill in card["skills"]] == ["run-plan", "run-goal"]
    assert states(events)[-1] == TaskState.TASK_STATE_COMPLETED
    artifacts = [e.artifact_update.artifact for e in events if e.HasField("artifact_update")]
    assert {a.name for a in artifacts} >= {"paris", "rome", "pick", "answer"}
    assert task.status.state == TaskState.TASK_STATE_COMPLETED
    answer = [a for a in task.artifacts if a.artifact_id == "answer"]
    assert answer and answer[0].parts[0].text == "Go with the recommendation of step pick: it is warmer and drier."
    assert task.status.message.parts[0].text == answer[0].parts[0].text
    assert f"plans with {model!r}" in str(other.value)


async def test_a_client_of_protocol_0_3_streams_a_task_with_message_stream(served: Served) -> None:
    plan = {"steps": [{"id": "w", "tool": "sleep", "args": {"seconds": 0.3, "result": {"ok": True}}},
                      {"id": "x", "tool": "noop", "args": {"v": "${w.ok}", "k": SECRET}}]}
    body = {"jsonrpc": "2.0", "id": 3, "method": "message/stream", "params": {"message": {
        "messageId": "m", "role": "user", "kind": "message", "parts": [{"kind": "data", "data": plan}]}}}
    headers = {"Authorization": f"Bearer {TOKEN}", "A2A-Version": "0.3"}
    async with httpx.AsyncClient(base_url=served.url, headers=headers, timeout=30) as http, \
            http.stream("POST", "/a2a", json=body) as response:
        frames = [served.saw(line) async for line in response.aiter_lines() if line.startswith("data:")]
    results = [json.loads(frame[5:])["result"] for frame in frames]
    assert results[0]["kind"] == "task"
    kinds = [r["kind"] for r in results]
    assert kinds[-1] == "status-update" and results[-1]["final"] is True
    assert results[-1]["status"]["state"] == "completed"
    streamed = {r["artifact"]["name"]: r["artifact"]["parts"][0]["data"] for r in results
                if r["kind"] == "artifact-update"}
    if results[0]["status"]["state"] == "working":  # else the run ended before its stream began: all in the task
        assert streamed == {"w": {"ok": True}, "x": {"v": True, "k": "***"}}


def test_without_the_a2a_extra_the_module_names_it_and_the_server_serves_without_it() -> None:
    code = ("import sys\nsys.modules['a2a'] = None\nfrom planweave.extras import MissingExtra\n"
            "try:\n    import planweave.server.a2a\nexcept MissingExtra as exc:\n    print(exc.extra)\n"
            "import asyncio\nfrom planweave import open_engine\nfrom planweave.server import create_app\n"
            "async def main():\n    async with open_engine('memory://') as engine:\n"
            "        app = create_app(engine, 'a-token-0123456789', recover=False)\n"
            "        paths = [getattr(r, 'path', '') for r in app.routes]\n"
            "        print(sorted(p for p in paths if p.startswith(('/a2a', '/.well'))))\n"
            "asyncio.run(main())\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:2] == ["a2a", "[]"]
