"""AG-UI 1.0 streams of runs (``GET /runs/{id}/agui``): every event decodes with ag-ui-protocol's own types, a plan
run with a retry, an approval and a re-plan reads as the protocol's lifecycle, the shared state follows the DAG
through JSON Patch, ``Last-Event-ID`` resumes exactly, and no secret leaves the server."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from ag_ui.core import Event as AguiEvent
from ag_ui.core import Interrupt, ResumeEntry
from pydantic import TypeAdapter

from planweave import Toolbox, ToolError, builtin_tools, current_step, open_engine
from planweave.core.events import Event
from planweave.server.agui import AguiCursor, AguiTranslator, _decode, json_patch
from planweave.server.streams import PING, encode_sse

from .conftest import TOKEN, Live, gated_tools, sse, start_live

SECRET = "sk-agui-0123456789abcdefSECRET"
EVENTS: TypeAdapter[Any] = TypeAdapter(AguiEvent)


def flaky_tools() -> Toolbox:
    """The built-ins, ``flaky`` (fails its first call, then echoes the secret it was given) and ``leak`` (its output
    carries the secret of the environment)."""
    box = builtin_tools()
    calls: list[str] = []

    async def flaky(word: str) -> dict[str, str]:
        """Fails once, then succeeds."""
        calls.append(word)
        if len(calls) == 1:
            raise RuntimeError(f"transient failure (key {SECRET})")
        return {"word": word}

    async def leak() -> dict[str, str]:
        """Returns the secret."""
        return {"token": SECRET}

    async def think(y: Any) -> Any:
        """Reports a model call."""
        current_step().report_usage({"model": "tiny-1", "prompt_tokens": 12, "completion_tokens": 3,
                                     "cost_usd": 0.0001, "purpose": "test"})
        return y

    async def explode(message: str) -> None:
        """Always fails."""
        raise ToolError(message, kind="boom")

    box.add(explode)
    box.add(think, idempotent=True)
    box.add(flaky, idempotent=True)
    box.add(leak, idempotent=True)
    return box


PLAN: dict[str, Any] = {"steps": [
    {"id": "a", "tool": "flaky", "args": {"word": "hello"}, "retries": {"max": 2, "backoff": 0}},
    {"id": "leaky", "tool": "leak", "after": ["a"]},
    {"id": "b", "tool": "noop", "args": {"x": "${a.word}"}, "after": ["leaky"], "approval": "Ship it?"},
    {"id": "c", "tool": "noop", "after": ["b"]},
]}
REPLAN: dict[str, Any] = {"steps": [
    {"id": "a", "tool": "flaky", "args": {"word": "hello"}, "retries": {"max": 2, "backoff": 0}},
    {"id": "leaky", "tool": "leak", "after": ["a"]},
    {"id": "b", "tool": "noop", "args": {"x": "${a.word}"}, "after": ["leaky"], "approval": "Ship it?"},
    {"id": "d", "tool": "think", "args": {"y": "${b}"}},
]}


@pytest.fixture
async def live(journal_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Live]:
    monkeypatch.setenv("UPSTREAM_API_KEY", SECRET)  # before the app: its redaction hides this process's secrets
    async with start_live(journal_url, tools=flaky_tools()) as running:
        yield running


async def read_agui(client: httpx.AsyncClient, run_id: str, last_id: str | None = None,
                    limit: int | None = None) -> list[dict[str, Any]]:
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    frames: list[dict[str, Any]] = []
    async with client.stream("GET", f"/runs/{run_id}/agui", headers=headers) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for frame in sse(resp):
            frames.append(frame)
            if limit is not None and len(frames) >= limit:
                break
    return frames


def model_pos(frames: list[dict[str, Any]]) -> int:
    """The journal position of the model call's tool call (its id names it)."""
    ids = [f["id"] for f in frames if f["data"].get("toolCallName") == "model_call"]
    assert len(ids) == 1
    return int(ids[0].split(":")[0])


def apply_patch(document: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 add / remove / replace on objects (what the server sends), for the test to follow the state."""
    document = copy.deepcopy(document)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        if not parts:
            document = op["value"]
            continue
        parent = document
        for part in parts[:-1]:
            parent = parent[part]
        if op["op"] == "remove":
            del parent[parts[-1]]
        else:
            assert op["op"] in ("add", "replace"), op
            assert (parts[-1] in parent) == (op["op"] == "replace"), op
            parent[parts[-1]] = op["value"]
    return document


async def run_with_retry_approval_and_replan(live: Live, client: httpx.AsyncClient) -> str:
    resp = await client.post("/runs", json={"plan": PLAN})
    assert resp.status_code == 201, resp.text
    run_id: str = resp.json()["run_id"]
    await live.until_step(run_id, "b", "waiting_approval")
    live.run(run_id).propose(REPLAN)  # c is dropped, d added after b
    approved = await client.post(f"/runs/{run_id}/steps/b/approval", json={"approve": True, "reason": "ok"})
    assert approved.status_code in (200, 202), approved.text
    result = await live.wait(run_id)
    assert result.status == "succeeded"
    return run_id


async def test_a_plan_run_reads_as_the_ag_ui_lifecycle_and_every_event_decodes(live: Live) -> None:
    async with live.client() as client:
        run_id = await run_with_retry_approval_and_replan(live, client)
        frames = await read_agui(client, run_id)
    events = [EVENTS.validate_python(f["data"]) for f in frames]  # every one is an AG-UI 1.0 event
    kinds = [e.type.value for e in events]
    assert kinds[:2] == ["RUN_STARTED", "STATE_SNAPSHOT"] and kinds[-1] == "RUN_FINISHED"
    assert events[0].thread_id == run_id and events[0].run_id == run_id and events[0].protocol_version == "1.0"
    assert events[-1].outcome is not None and events[-1].outcome.type == "success"

    # Steps open and close once each, around their tool calls; the retried step has two calls, the first failed.
    def of(kind: str) -> list[Any]:
        return [e for e in events if e.type.value == kind]

    assert [e.step_name for e in of("STEP_STARTED")] == ["a", "leaky", "b", "d"]
    assert sorted(e.step_name for e in of("STEP_FINISHED")) == ["a", "b", "d", "leaky"]
    starts = [e.tool_call_id for e in of("TOOL_CALL_START")]
    assert starts == ["a#1", "a#2", "leaky#1", "b#1", "d#1", "model@" + str(model_pos(frames))]
    assert sorted(e.tool_call_id for e in of("TOOL_CALL_RESULT")) == sorted(starts)
    assert [e.tool_call_id for e in of("TOOL_CALL_END")] == starts
    model = next(e for e in of("TOOL_CALL_RESULT") if e.tool_call_id.startswith("model@"))
    assert '"prompt_tokens":12' in model.content and '"completion_tokens":3' in model.content
    assert [(u.model, u.input_tokens, u.output_tokens) for u in events[-1].usage or []] == [("tiny-1", 12, 3)]
    first, second = of("TOOL_CALL_RESULT")[:2]
    assert '"final":false' in first.content and "transient failure" in first.content
    assert second.content == '{"word":"hello"}'
    args = {e.tool_call_id: e.delta for e in of("TOOL_CALL_ARGS")}
    assert args["b#1"] == '{"x":"hello"}'  # rendered on a's output

    # Each tool call: START, ARGS, END, later RESULT, all inside its step.
    open_steps: set[str] = set()
    calls: dict[str, str] = {}
    for e in events:
        kind = e.type.value
        if kind == "STEP_STARTED":
            assert e.step_name not in open_steps
            open_steps.add(e.step_name)
        elif kind == "STEP_FINISHED":
            open_steps.remove(e.step_name)
        elif kind == "TOOL_CALL_START":
            assert e.tool_call_id.split("#")[0] in open_steps or e.tool_call_id.startswith("model@")
            calls[e.tool_call_id] = "start"
        elif kind == "TOOL_CALL_ARGS":
            assert calls[e.tool_call_id] == "start"
            calls[e.tool_call_id] = "args"
        elif kind == "TOOL_CALL_END":
            assert calls[e.tool_call_id] == "args"
            calls[e.tool_call_id] = "end"
        elif kind == "TOOL_CALL_RESULT":
            assert calls.pop(e.tool_call_id) == "end"
    assert not open_steps and not calls

    # The approval is an interrupt, answered by a resume entry, both in AG-UI's own shapes.
    custom = {e.name: e.value for e in of("CUSTOM") if e.name.startswith("planweave.interrupt")}
    interrupt = Interrupt.model_validate(custom["planweave.interrupt"])
    assert (interrupt.id, interrupt.reason, interrupt.message) == ("b:approval", "approval", "Ship it?")
    resumed = ResumeEntry.model_validate(custom["planweave.interrupt_resolved"])
    assert (resumed.interrupt_id, resumed.status) == ("b:approval", "resolved")
    assert isinstance(resumed.payload, dict) and resumed.payload["approve"] is True
    b_opened = next(i for i, e in enumerate(events) if e.type.value == "STEP_STARTED" and e.step_name == "b")
    b_called = next(i for i, e in enumerate(events) if e.type.value == "TOOL_CALL_START" and e.tool_call_id == "b#1")
    asked = next(i for i, e in enumerate(events) if e.type.value == "CUSTOM" and e.name == "planweave.interrupt")
    assert b_opened < asked < b_called  # the step opens when it asks, and calls its tool once approved
    replans = [e.value for e in of("CUSTOM") if e.name == "planweave.plan_version"]
    assert len(replans) == 1 and replans[0]["added"] == ["d"] and replans[0]["dropped"] == ["c"]

    # The shared state, snapshot then patches, ends as the plan's last version with every step's outcome.
    state: Any = None
    for e in events:
        if e.type.value == "STATE_SNAPSHOT":
            state = e.snapshot
            assert set(state["plan"]["steps"]) == {"a", "leaky", "b", "c"}
        elif e.type.value == "STATE_DELTA":
            state = apply_patch(state, [op.model_dump(by_alias=True) for op in e.delta])
    assert state["run"]["status"] == "succeeded"
    assert state["plan"]["version"] == 2
    assert {sid: s["status"] for sid, s in state["plan"]["steps"].items()} == {
        "a": "succeeded", "leaky": "succeeded", "b": "succeeded", "d": "succeeded"}
    assert state["plan"]["steps"]["a"]["attempts"] == 2 and state["plan"]["steps"]["d"]["after"] == ["b"]
    assert [v["version"] for v in state["versions"]] == [1, 2]


async def test_last_event_id_resumes_after_any_event_without_loss_or_repeat(live: Live) -> None:
    async with live.client() as client:
        run_id = await run_with_retry_approval_and_replan(live, client)
        whole = await read_agui(client, run_id)
        ids = [f["id"] for f in whole]
        assert len(set(ids)) == len(ids)
        for cut in range(0, len(whole) - 1, 3):  # reconnect after every third event
            rest = await read_agui(client, run_id, last_id=ids[cut])
            assert [f["data"] for f in rest] == [f["data"] for f in whole[cut + 1:]], f"resumed after {ids[cut]}"
        # A plain journal position (as /runs/{id}/events gives them) resumes after that journal event's group.
        last_of_group = max(i for i, f in enumerate(whole) if f["id"].split(":")[0] == ids[5].split(":")[0])
        rest = await read_agui(client, run_id, last_id=ids[5].split(":")[0])
        assert [f["data"] for f in rest] == [f["data"] for f in whole[last_of_group + 1:]]
        bad = await client.get(f"/runs/{run_id}/agui", headers={"Last-Event-ID": "1:x"})
        assert bad.status_code == 422


async def test_a_planted_secret_never_appears_in_the_stream(live: Live) -> None:
    async with live.client() as client:
        run_id = await run_with_retry_approval_and_replan(live, client)
        async with client.stream("GET", f"/runs/{run_id}/agui") as resp:
            raw = (await resp.aread()).decode()
    assert "RUN_FINISHED" in raw and SECRET not in raw
    assert "transient failure" in raw and '\\"token\\"' in raw  # the texts that carried it are there, redacted


async def test_the_stream_needs_the_token_and_a_known_run(live: Live) -> None:
    async with live.client(token=None) as anonymous, live.client() as client:
        assert (await anonymous.get("/runs/nope/agui")).status_code == 401
        assert (await client.get("/runs/nope/agui")).status_code == 404
    assert TOKEN


def test_json_patch_turns_one_document_into_the_other() -> None:
    old = {"a": {"x": 1, "y/z": [1]}, "gone": True, "same": "s"}
    new = {"a": {"x": 2, "y/z": [1, 2], "w": None}, "same": "s", "new": {"k": 1}}
    ops = json_patch(old, new)
    assert apply_patch(old, ops) == new
    assert {"op": "remove", "path": "/gone"} in ops and {"op": "replace", "path": "/a/y~1z", "value": [1, 2]} in ops
    assert json_patch(new, new) == []


def test_a_cursor_is_a_journal_position_and_an_optional_index() -> None:
    assert AguiCursor.parse(None) == AguiCursor(0, None)
    assert AguiCursor.parse("42") == AguiCursor(42, None)
    assert AguiCursor.parse("42:3") == AguiCursor(42, 3)
    with pytest.raises(ValueError, match="neither"):
        AguiCursor.parse("-1")


async def test_a_live_stream_shows_the_input_interrupt_then_the_failure_as_run_error(live: Live) -> None:
    plan = {"steps": [
        {"id": "ask", "tool": "human.input", "args": {"prompt": "How many replicas?", "schema": {"type": "integer"}}},
        {"id": "boom", "tool": "explode", "args": {"message": "replicas: ${ask}"}},
    ]}
    async with live.client() as client:
        resp = await client.post("/runs", json={"plan": plan})
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        events: list[Any] = []
        async with client.stream("GET", f"/runs/{run_id}/agui") as stream:
            async for frame in sse(stream):
                event = EVENTS.validate_python(frame["data"])
                events.append(event)
                if event.type.value == "CUSTOM" and event.name == "planweave.interrupt":
                    given = await client.post(f"/runs/{run_id}/steps/ask/input", json={"value": 3})
                    assert given.status_code in (200, 202), given.text
    interrupt = Interrupt.model_validate(next(e.value for e in events if e.type.value == "CUSTOM"
                                              and e.name == "planweave.interrupt"))
    assert (interrupt.id, interrupt.reason, interrupt.tool_call_id) == ("ask:input", "input", "ask#1")
    assert interrupt.response_schema == {"type": "integer"}
    resolved = next(e.value for e in events if e.type.value == "CUSTOM" and e.name == "planweave.interrupt_resolved")
    assert resolved["payload"]["value"] == 3
    last = events[-1]
    assert last.type.value == "RUN_ERROR" and last.code == "failed" and "replicas: 3" in last.message
    assert [e.type.value for e in events].count("RUN_STARTED") == 1


async def test_a_run_resumed_by_the_next_server_goes_on_in_the_same_ag_ui_run(journal_url: str) -> None:
    closed = asyncio.Event()
    plan = {"steps": [{"id": "first", "tool": "noop"}, {"id": "wait", "tool": "gate", "after": ["first"]},
                      {"id": "last", "tool": "noop", "after": ["wait"]}]}
    async with start_live(journal_url, tools=gated_tools(closed)) as first, first.client() as client:
        resp = await client.post("/runs", json={"plan": plan})
        assert resp.status_code == 201, resp.text
        run_id = resp.json()["run_id"]
        await first.until_step(run_id, "wait", "running")
        before = await read_agui(client, run_id, limit=1)
    async with start_live(journal_url, tools=gated_tools(None)) as second, second.client() as client:
        assert second.server.recovered == [run_id]
        await second.wait(run_id)
        frames = await read_agui(client, run_id, last_id=before[0]["id"])
    events = [EVENTS.validate_python(f["data"]) for f in frames]
    kinds = [e.type.value for e in events]
    assert "RUN_STARTED" not in kinds and kinds[-1] == "RUN_FINISHED"
    resumed = kinds.index("CUSTOM", next(i for i, e in enumerate(events) if e.type.value == "CUSTOM"
                                         and e.name == "planweave.resumed"))
    interrupted = events[resumed + 1]  # the attempt the stop cut short gets its result: the next one is new
    assert interrupted.type.value == "TOOL_CALL_RESULT" and interrupted.tool_call_id == "wait#1"
    assert [e.tool_call_id for e in events if e.type.value == "TOOL_CALL_START"][-2:] == ["wait#2", "last#1"]
    assert [e.step_name for e in events if e.type.value == "STEP_STARTED"] == ["first", "wait", "last"]


def test_the_adapter_reads_the_frames_of_the_event_stream_back_as_its_events() -> None:
    event = Event("r1", "step_failed", 1.8e9, "a", {"error": "x\ny", "final": False}, 42)
    assert _decode(encode_sse(event)) == event
    assert _decode(PING) == PING


async def test_the_state_sent_step_by_step_is_always_the_whole_state_of_the_run() -> None:
    plan = {"steps": [
        {"id": "a", "tool": "noop"},
        {"id": "b", "tool": "explode", "args": {"message": "no"}, "after": ["a"], "retries": {"max": 1, "backoff": 0}},
        {"id": "c", "tool": "noop", "after": ["b"]}, {"id": "d", "tool": "noop", "after": ["c"]},
        {"id": "e", "tool": "noop", "after": ["a"]},
    ], "on_failure": "continue"}
    async with open_engine("memory://", tools=flaky_tools()) as engine:
        await (await engine.start(plan, run_id="whole")).wait()
        journaled = await engine.journal.read("whole")
    translator = AguiTranslator("whole")
    state: Any = None
    for event in journaled:
        for item in translator.translate(event, {}):
            EVENTS.validate_python(item)
            if item["type"] == "STATE_SNAPSHOT":
                state = item["snapshot"]
            elif item["type"] == "STATE_DELTA":
                state = apply_patch(state, item["delta"])
        assert state == translator._document(), f"after {event.kind} {event.step}"
    assert {sid: s["status"] for sid, s in state["plan"]["steps"].items()} == {
        "a": "succeeded", "b": "failed", "c": "skipped", "d": "skipped", "e": "succeeded"}
