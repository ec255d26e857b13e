"""A run as an AG-UI 1.0 event stream: an adapter on the journal's paged event stream (``GET /runs/{id}/agui``).

:class:`AguiTranslator` turns a run's journaled events, in journal order, into AG-UI events (plain JSON objects in
the protocol's wire form, camelCase; the tests decode every one with ``ag-ui-protocol``'s types, which the server
does not need at run time). It folds the events with the engine's own :class:`~planweave.core.state.RunState`, so
the plan DAG it shows is the one every other view shows:

- ``run_created`` → ``RUN_STARTED`` (thread and run id: the planweave run id; ``protocolVersion`` 1.0) and
  ``STATE_SNAPSHOT``; ``run_finished`` → ``RUN_FINISHED`` (outcome ``success`` or ``cancelled``, the answer as
  ``result``, token usage per model) or ``RUN_ERROR`` (a failed run). A run resumed after it ended opens a new AG-UI
  run ``<run id>@<journal position>`` in the same thread.
- a step → ``STEP_STARTED`` (its first attempt, or its request for approval) … ``STEP_FINISHED`` (it ended:
  succeeded, failed for good, cancelled, skipped, or left the plan); ``stepName`` is the step id.
- each attempt → ``TOOL_CALL_START``/``ARGS``/``END`` (the rendered arguments, known when it starts) and
  ``TOOL_CALL_RESULT`` (the output, or ``{"error", "kind", "final", "retry_in"}``); the call id is
  ``<step>#<attempt>``, the one OpenTelemetry's ``gen_ai.tool.call.id`` carries. Each model call the run journals
  is a tool call ``model_call`` (id ``model@<position>``) whose arguments are the model and purpose and whose result
  is the usage.
- the plan → ``STATE_SNAPSHOT``/``STATE_DELTA`` (RFC 6902 JSON Patch) of ``{"run", "plan", "versions"}``: the
  current version's steps (tool, dependencies, status, attempts) and every version with its splice diff.
- people → ``CUSTOM`` events: AG-UI 1.0 models an interrupt only as the outcome of a *finished* run
  (``RunFinishedInterruptOutcome``), but a planweave run keeps its other steps going while one waits. So a wait is
  ``CUSTOM planweave.interrupt`` whose value is an AG-UI ``Interrupt`` (id ``<step>:approval`` or ``<step>:input``,
  ``reason``, ``message``, ``responseSchema``), and its answer ``CUSTOM planweave.interrupt_resolved`` whose value
  is a ``ResumeEntry``. Escalations, warnings, progress and new plan versions are ``CUSTOM planweave.<kind>``; the
  run's answer is an assistant text message.

Every AG-UI event goes out as ``id: <journal position>:<index>`` and ``data: <event JSON>``; ``Last-Event-ID`` takes
that id (or a plain journal position, as ``/runs/{id}/events`` gives them), and the stream goes on with the event
after it: the translator is deterministic, so the journal events up to that position are translated again, silently,
to rebuild what the client had. Everything sent passes through the server's redaction.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from planweave.core.events import Event
from planweave.core.plan.model import TERMINAL_STATUSES
from planweave.core.state import RunState
from planweave.engine.report import DEFAULT_OUTPUT_LIMIT, rendered_args, shown_output
from planweave.engine.runtime import Engine
from planweave.journal.base import Journal, encode_data
from planweave.server.streams import PING, ChangeFeed, StreamLimits, StreamTiming, run_events

__all__ = ["PROTOCOL_VERSION", "AguiCursor", "AguiTranslator", "agui_events", "json_patch"]

#: The AG-UI version these events follow (``ag_ui.core.PROTOCOL_VERSION`` of ag-ui-protocol 1.0.0).
PROTOCOL_VERSION = "1.0"
AguiEvent = dict[str, Any]
Redact = Callable[[Any], Any]


@dataclass(frozen=True)
class AguiCursor:
    """Where an AG-UI stream resumes: after AG-UI event ``index`` of journal position ``pos`` (None: after all of
    that position's events)."""

    pos: int = 0
    index: int | None = None

    PATTERN = r"^[0-9]{1,18}(:[0-9]{1,6})?$"  # 18 digits: below the journals' largest position (2**63 - 1)

    @classmethod
    def parse(cls, last_event_id: str | None) -> AguiCursor:
        """The cursor a ``Last-Event-ID`` names (``<pos>`` or ``<pos>:<index>``); raises ValueError otherwise."""
        if not last_event_id:
            return cls()
        if re.match(cls.PATTERN, last_event_id) is None:
            raise ValueError(f"Last-Event-ID {last_event_id!r} is neither a journal position nor <position>:<index>")
        pos, _, index = last_event_id.partition(":")
        return cls(int(pos), int(index) if index else None)


def _pointer(part: str) -> str:
    return part.replace("~", "~0").replace("/", "~1")


def json_patch(old: Any, new: Any, path: str = "") -> list[dict[str, Any]]:
    """The RFC 6902 operations that turn ``old`` into ``new``: objects compared key by key, anything else (lists
    included) replaced whole when it differs."""
    if isinstance(old, dict) and isinstance(new, dict):
        ops: list[dict[str, Any]] = []
        for key in old:
            if key not in new:
                ops.append({"op": "remove", "path": f"{path}/{_pointer(key)}"})
        for key, value in new.items():
            where = f"{path}/{_pointer(key)}"
            if key not in old:
                ops.append({"op": "add", "path": where, "value": value})
            elif old[key] != value:
                ops.extend(json_patch(old[key], value, where))
        return ops
    if old == new and type(old) is type(new):
        return []
    return [{"op": "replace", "path": path, "value": new}]


def _ms(at: float) -> int | None:
    """An event time as the milliseconds since the epoch AG-UI uses; None for virtual-clock times."""
    return int(at * 1000) if at >= 1e9 else None


def _json_text(value: Any) -> str:
    return orjson.dumps(value, default=str).decode()


_PEOPLE_SCHEMA: Mapping[str, Any] = {
    "type": "object", "properties": {"approve": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approve"],
}


class AguiTranslator:
    """Translates one run's journaled events, in journal order, into AG-UI events (deterministic: the same events
    give the same AG-UI events, which is what makes ``Last-Event-ID`` resumption exact)."""

    def __init__(self, run_id: str, *, output_limit: int | None = DEFAULT_OUTPUT_LIMIT) -> None:
        self.run_id = run_id
        self.state: RunState | None = None
        self._output_limit = output_limit
        self._doc: dict[str, Any] = {}
        self._versions: list[dict[str, Any]] = []
        self._open_steps: set[str] = set()
        self._calls: dict[str, str] = {}  # step -> the call id of its attempt that has no result yet
        self._agui_run = run_id
        self._ended = False  # RUN_FINISHED or RUN_ERROR sent: a resume opens a new AG-UI run

    # -- what an event needs from the journal's blobs ------------------------------------------------------------
    def needs(self, event: Event) -> list[str]:
        """The blob references translating ``event`` reads: its output, or the outputs its arguments refer to."""
        state = self.state
        if event.kind == "step_succeeded":
            ref = event.data.get("output")
            return [ref] if isinstance(ref, str) else []
        step = event.step
        if event.kind == "step_started" and state is not None and step is not None and step in state.plan.steps:
            return sorted({r for ref in state.plan.refs[step] if (r := state.records[ref.step].output_ref) is not None})
        return []

    # -- translation --------------------------------------------------------------------------------------------
    def translate(self, event: Event, blobs: Mapping[str, Any]) -> list[AguiEvent]:
        """The AG-UI events ``event`` stands for (``blobs``: what :meth:`needs` named, by reference)."""
        if event.kind == "run_created":
            return self._stamped(event, self._created(event))
        state = self.state
        if state is None:
            return []  # a journal that does not start with run_created: nothing to show
        step = event.step
        head: list[AguiEvent] = []
        args: Any = None
        if event.kind == "step_started" and step is not None:
            head += self._open_step(step)
            args = self._args(state, step, blobs)  # rendered before the fold: the attempt's inputs
        ready = state.apply(event)
        tail: list[AguiEvent] = []
        if event.kind == "run_finished":
            tail += self._close_calls({"cancelled": "the run ended"})
            tail += self._close_steps(every=True)
            tail.append(self._run_ended(state, event))
            self._ended = True
        else:
            translate = _TRANSLATIONS.get(event.kind)
            if translate is not None:
                head += translate(self, state, event, blobs, args)
            tail += self._close_steps(every=False)
        delta = self._delta(state, structural=event.kind in _STRUCTURAL, touched=self._touched(state, event, ready))
        if delta:
            head.append({"type": "STATE_DELTA", "delta": delta})
        return self._stamped(event, head + tail)

    @staticmethod
    def _touched(state: RunState, event: Event, ready: Sequence[str]) -> Iterable[str]:
        """The steps whose status or attempts ``event`` may have changed: its step, the steps it made ready, and when
        its step ended without success, everything after it (skipped); every step for run-wide events."""
        if event.step is None:
            return () if event.kind in _RUN_NOTES else state.plan.order
        touched = {event.step, *ready}
        rec = state.records.get(event.step)
        if rec is not None and rec.status in ("failed", "cancelled", "skipped"):
            below = list(state.plan.dependents.get(event.step, ()))
            while below:
                sid = below.pop()
                if sid not in touched:
                    touched.add(sid)
                    below.extend(state.plan.dependents.get(sid, ()))
        return touched

    def _delta(self, state: RunState, *, structural: bool, touched: Iterable[str]) -> list[dict[str, Any]]:
        """The JSON Patch from the state last sent to the state now. An event that changes the plan is compared
        whole; any other only the statuses and attempts of the steps it touched (a document per event cost 3 ms an
        event at 1,000 steps)."""
        if structural:
            document = self._document()
            delta = json_patch(self._doc, document)
            self._doc = document
            return delta
        ops: list[dict[str, Any]] = []
        run = self._doc["run"]
        if run["status"] != state.status:
            run["status"] = state.status
            ops.append({"op": "replace", "path": "/run/status", "value": state.status})
        shown = self._doc["plan"]["steps"]
        records = state.records
        for sid in touched:
            step, rec = shown.get(sid), records.get(sid)
            if step is None or rec is None or (step["status"] == rec.status and step["attempts"] == rec.attempts):
                continue
            where = f"/plan/steps/{_pointer(sid)}"
            if step["status"] != rec.status:
                step["status"] = rec.status
                ops.append({"op": "replace", "path": f"{where}/status", "value": rec.status})
            if step["attempts"] != rec.attempts:
                step["attempts"] = rec.attempts
                ops.append({"op": "replace", "path": f"{where}/attempts", "value": rec.attempts})
        return ops

    # -- one method per kind of journal event that shows (after the fold) ---------------------------------------
    def _created(self, event: Event) -> list[AguiEvent]:
        self.state = RunState.from_events(self.run_id, [event])
        self._versions = [{"version": self.state.plan.version, "parent": None,
                           "trigger": str(event.data.get("trigger", "plan"))}]
        self._open_steps.clear()
        self._calls.clear()
        self._agui_run, self._ended = self.run_id, False
        self._doc = self._document()
        return [self._run_started(), {"type": "STATE_SNAPSHOT", "snapshot": self._doc}]

    def _resumed(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        shown: list[AguiEvent] = []
        if self._ended:  # it had ended: a new AG-UI run in the same thread
            self._agui_run, self._ended = f"{self.run_id}@{event.pos or 0}", False
            shown.append(self._run_started())
        else:
            shown.append(self._custom("planweave.resumed", {"retry_unknown": bool(event.data.get("retry_unknown"))}))
        return shown + self._close_calls({"interrupted": "the process running the attempt stopped"})

    def _started(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        step = event.step or ""
        return self._start_call(step, f"{step}#{int(event.data.get('attempt', 1))}", self._tool_of(state, step), args)

    def _succeeded(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        step = event.step or ""
        shown: list[AguiEvent] = []
        if step not in self._calls:  # no attempt of it was shown starting (e.g. an adopted speculative one)
            shown += self._start_call(step, f"{step}#{int(event.data.get('attempt', 1))}",
                                      self._tool_of(state, step), {})
        ref = event.data.get("output")
        output = blobs.get(ref) if isinstance(ref, str) else None
        return shown + self._result(step, shown_output(output, limit=self._output_limit))

    def _failed(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        failure = {k: event.data[k] for k in ("error", "kind", "final", "retry_in", "fallback") if k in event.data}
        return self._result(event.step or "", failure)

    def _cancelled(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        return self._result(event.step or "", {"cancelled": event.data.get("reason", "cancelled")})

    def _asked(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        step = event.step or ""
        return [*self._open_step(step), self._interrupt(event, step)]

    def _answered(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        step = event.step or ""
        reason = "approval" if event.kind == "approval_given" else "input"
        payload = {k: event.data[k] for k in ("approve", "reason", "value", "by") if k in event.data}
        return [self._custom("planweave.interrupt_resolved",
                             {"interruptId": f"{step}:{reason}", "status": "resolved", "payload": payload})]

    def _model_call(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        data = event.data
        call_id = f"model@{event.pos or 0}"
        called = {k: data[k] for k in ("model", "purpose") if data.get(k) is not None}
        if event.step is not None:
            called["step"] = event.step
        usage = {k: data[k] for k in ("prompt_tokens", "completion_tokens", "cost_usd", "usage_source") if k in data}
        return [{"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": "model_call"},
                {"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": _json_text(called)},
                {"type": "TOOL_CALL_END", "toolCallId": call_id},
                {"type": "TOOL_CALL_RESULT", "messageId": f"result:{call_id}", "toolCallId": call_id,
                 "content": _json_text(usage), "role": "tool"}]

    def _plan_version(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        entry = {"version": int(event.data.get("version", 0)), "parent": event.data.get("parent"),
                 "trigger": str(event.data.get("trigger", "replan"))}
        for part in ("added", "kept", "adopted", "unchanged", "cancelled", "dropped"):
            entry[part] = list(event.data.get(part, ()))
        self._versions.append(entry)
        return [self._custom("planweave.plan_version", entry)]

    def _noted(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        value = {**dict(event.data), **({"step": event.step} if event.step is not None else {})}
        return [self._custom(f"planweave.{event.kind}", value)]

    def _answer(self, state: RunState, event: Event, blobs: Mapping[str, Any], args: Any) -> list[AguiEvent]:
        if not event.data.get("text"):
            return []
        message = f"answer@{event.pos or 0}"
        return [{"type": "TEXT_MESSAGE_START", "messageId": message, "role": "assistant"},
                {"type": "TEXT_MESSAGE_CONTENT", "messageId": message, "delta": str(event.data["text"])},
                {"type": "TEXT_MESSAGE_END", "messageId": message}]

    # -- pieces ---------------------------------------------------------------------------------------------------
    def _stamped(self, event: Event, events: list[AguiEvent]) -> list[AguiEvent]:
        at = _ms(event.at)
        if at is not None:
            for item in events:
                item["timestamp"] = at
        return events

    def _run_started(self) -> AguiEvent:
        return {"type": "RUN_STARTED", "threadId": self.run_id, "runId": self._agui_run,
                "protocolVersion": PROTOCOL_VERSION}

    def _run_ended(self, state: RunState, event: Event) -> AguiEvent:
        status = str(event.data.get("status", state.status))
        if status == "failed":
            return {"type": "RUN_ERROR", "message": str(event.data.get("error") or "the run failed"),
                    "code": "failed", **self._usage(state)}
        finished: AguiEvent = {"type": "RUN_FINISHED", "threadId": self.run_id, "runId": self._agui_run,
                               "outcome": {"type": "cancelled" if status == "cancelled" else "success"},
                               **self._usage(state)}
        if state.answer is not None:
            finished["result"] = state.answer
        return finished

    def _usage(self, state: RunState) -> dict[str, Any]:
        """``usage``: token counts per model, as RUN_FINISHED and RUN_ERROR carry them (nothing if no model ran)."""
        per_model: dict[str, list[int]] = {}
        for call in state.model_calls:
            counts = per_model.setdefault(str(call.get("model") or "unknown"), [0, 0])
            counts[0] += int(call.get("prompt_tokens", 0) or 0)
            counts[1] += int(call.get("completion_tokens", 0) or 0)
        if not per_model:
            return {}
        return {"usage": [{"model": model, "inputTokens": i, "outputTokens": o, "totalTokens": i + o}
                          for model, (i, o) in per_model.items()]}

    def _open_step(self, step: str) -> list[AguiEvent]:
        if step in self._open_steps:
            return []
        self._open_steps.add(step)
        return [{"type": "STEP_STARTED", "stepName": step}]

    def _close_steps(self, *, every: bool) -> list[AguiEvent]:
        """STEP_FINISHED for the open steps that ended or left the plan (``every``: all of them)."""
        state = self.state
        assert state is not None
        done = sorted(s for s in self._open_steps if every or s not in state.plan.steps
                      or state.records[s].status in TERMINAL_STATUSES)
        closing: list[AguiEvent] = []
        for step in done:
            if step in self._calls:
                closing += self._result(step, {"cancelled": "the step left the plan"})
            self._open_steps.discard(step)
            closing.append({"type": "STEP_FINISHED", "stepName": step})
        return closing

    def _start_call(self, step: str, call_id: str, tool: str, args: Any) -> list[AguiEvent]:
        self._calls[step] = call_id
        return [{"type": "TOOL_CALL_START", "toolCallId": call_id, "toolCallName": tool},
                {"type": "TOOL_CALL_ARGS", "toolCallId": call_id, "delta": _json_text(args)},
                {"type": "TOOL_CALL_END", "toolCallId": call_id}]

    def _result(self, step: str, content: Any) -> list[AguiEvent]:
        call_id = self._calls.pop(step, None)
        if call_id is None:
            return []  # no attempt of it is open (a step cancelled or failed before it started)
        return [{"type": "TOOL_CALL_RESULT", "messageId": f"result:{call_id}", "toolCallId": call_id,
                 "content": _json_text(content), "role": "tool"}]

    def _close_calls(self, content: Any) -> list[AguiEvent]:
        closing: list[AguiEvent] = []
        for step in sorted(self._calls):
            closing += self._result(step, content)
        return closing

    def _interrupt(self, event: Event, step: str) -> AguiEvent:
        approval = event.kind == "approval_requested"
        reason = "approval" if approval else "input"
        interrupt: dict[str, Any] = {"id": f"{step}:{reason}", "reason": reason,
                                     "metadata": {"planweave": {"step": step, "reply": f"POST /runs/{self.run_id}"
                                                                f"/steps/{step}/{reason}"}}}
        if event.data.get("prompt"):
            interrupt["message"] = str(event.data["prompt"])
        if approval:
            interrupt["responseSchema"] = dict(_PEOPLE_SCHEMA)
        else:
            schema = event.data.get("schema")
            if isinstance(schema, Mapping):
                interrupt["responseSchema"] = dict(schema)
            if step in self._calls:
                interrupt["toolCallId"] = self._calls[step]
        return self._custom("planweave.interrupt", interrupt)

    @staticmethod
    def _custom(name: str, value: Any) -> AguiEvent:
        return {"type": "CUSTOM", "name": name, "value": value}

    @staticmethod
    def _tool_of(state: RunState, step: str) -> str:
        found = state.plan.steps.get(step)
        if found is None:
            return "unknown"
        if state.records[step].fallback_active and found.fallback is not None:
            return found.fallback.tool
        return found.tool

    @staticmethod
    def _args(state: RunState, step: str, blobs: Mapping[str, Any]) -> Any:
        if step not in state.plan.steps:
            return {}
        records = state.records
        outputs = {ref.step: blobs[out] for ref in state.plan.refs[step]
                   if (out := records[ref.step].output_ref) is not None and out in blobs}
        return rendered_args(state, outputs, step)[0]

    def _document(self) -> dict[str, Any]:
        """The shared state: the run's status, the current plan version's DAG, and every version with its diff."""
        state = self.state
        assert state is not None
        plan = state.plan
        steps = {sid: {"tool": plan.steps[sid].tool, "after": list(plan.deps[sid]),
                       "status": state.records[sid].status, "attempts": state.records[sid].attempts}
                 for sid in plan.order}
        return {"run": {"id": self.run_id, "status": state.status},
                "plan": {"version": plan.version, "steps": steps},
                "versions": [dict(v) for v in self._versions]}


#: The journal events that change the plan (its steps, their dependencies, its versions) or may change every step.
_STRUCTURAL = frozenset({"plan_version", "steps_added", "run_resumed"})
#: The journal events of no step that change no step either (any other event of no step may change any step).
_RUN_NOTES = frozenset({"model_call", "model_reserved", "model_released", "escalation", "answer", "warning",
                        "allocation", "forecast"})
_Translation = Callable[[AguiTranslator, RunState, Event, Mapping[str, Any], Any], list[AguiEvent]]
#: The journal events that show as AG-UI events of their own (any event may also change the shared state).
_TRANSLATIONS: dict[str, _Translation] = {
    "run_resumed": AguiTranslator._resumed,
    "step_started": AguiTranslator._started,
    "step_succeeded": AguiTranslator._succeeded,
    "step_failed": AguiTranslator._failed,
    "step_cancelled": AguiTranslator._cancelled,
    "approval_requested": AguiTranslator._asked,
    "input_requested": AguiTranslator._asked,
    "approval_given": AguiTranslator._answered,
    "input_given": AguiTranslator._answered,
    "model_call": AguiTranslator._model_call,
    "plan_version": AguiTranslator._plan_version,
    "escalation": AguiTranslator._noted,
    "warning": AguiTranslator._noted,
    "step_progress": AguiTranslator._noted,
    "answer": AguiTranslator._answer,
}


def _decode(chunk: bytes) -> Event | bytes:
    """A frame of :func:`~planweave.server.streams.run_events` as its journal event, or the frame itself when it
    carries none (a ping, or the ``lagging`` message)."""
    if chunk == PING:
        return chunk
    head, _, rest = chunk.partition(b"\nevent: ")
    kind, _, data = rest.partition(b"\ndata: ")
    if not head.startswith(b"id: ") or not kind:
        return chunk
    raw = orjson.loads(data)
    return Event(raw["run_id"], raw["kind"], raw["at"], raw["step"], raw["data"], raw["pos"])


def _lagging(chunk: bytes) -> bytes:
    """The ``lagging`` message as an AG-UI CUSTOM event (no id: resume from the last one seen)."""
    _, _, data = chunk.partition(b"\ndata: ")
    value = orjson.loads(data)
    return b"data: %s\n\n" % encode_data({"type": "CUSTOM", "name": "planweave.lagging", "value": value})


_LIMITS = StreamLimits()


async def _translated(translator: AguiTranslator, journal: Journal, event: Event) -> list[AguiEvent]:
    refs = translator.needs(event)
    blobs = await journal.get_blobs(refs) if refs else {}
    return translator.translate(event, blobs)


def _frames(events: Sequence[AguiEvent], pos: int, start: int, redact: Redact | None) -> list[bytes]:
    return [b"id: %d:%d\ndata: %s\n\n" % (pos, index, encode_data(redact(item) if redact else item))
            for index, item in enumerate(events) if index >= start]


async def agui_events(
    engine: Engine, feed: ChangeFeed, run_id: str, cursor: AguiCursor, timing: StreamTiming,
    limits: StreamLimits = _LIMITS, redact: Redact | None = None,
) -> AsyncIterator[bytes]:
    """The AG-UI stream of one run after ``cursor``, then live; it ends after RUN_FINISHED or RUN_ERROR (see
    :func:`~planweave.server.streams.run_events`, which it adapts: same pages, pings and lag bound)."""
    journal = engine.journal
    translator = AguiTranslator(run_id)
    after = cursor.pos
    seen = 0
    while seen < after:  # what the client had: translated again to rebuild the translator, not sent
        page = await journal.read(run_id, after=seen, limit=limits.page_size)
        for event in page:
            pos = event.pos or 0
            if pos > after:
                break
            if pos == after and cursor.index is not None:  # the client has part of this one's events
                for frame in _frames(await _translated(translator, journal, event), pos, cursor.index + 1, redact):
                    yield frame
            else:
                translator.translate(event, {})  # outputs only fill events nobody sends: no blob is read
            seen = pos
        if len(page) < limits.page_size or (page and (page[-1].pos or 0) > after):
            break
    async for chunk in run_events(engine, journal, feed, run_id, after, timing, limits):
        decoded = _decode(chunk)
        if isinstance(decoded, bytes):
            yield decoded if decoded == PING else _lagging(decoded)
            continue
        for frame in _frames(await _translated(translator, journal, decoded), decoded.pos or 0, 0, redact):
            yield frame
