"""planweave as an A2A agent: the agent card at ``/.well-known/agent-card.json`` and A2A's JSON-RPC binding at
``POST /a2a`` (protocol 1.0, and the 0.3 method names ``message/send``, ``message/stream``, ``tasks/get``,
``tasks/cancel``), on the runs, token, limits and redaction of the HTTP API.

An adapter, not a second server: a task is a run. A message starts one through the very code of ``POST /runs``
(:func:`mount_a2a` is given that route's function and its :class:`RunSubmission`), or, sent to a task waiting for a
person, is that person's reply (:func:`~planweave.engine.runtime.send_approval` / ``send_input``: the first reply is
final, docs/people.md). What a client sees of a task is :func:`planweave.runview.run_report` (status, the waiting
steps' prompts, the outputs cut at 256 KiB, the answer) as A2A's ``Task``; what it streams is the run's journaled
events (:func:`planweave.server.streams.run_events`, the stream ``GET /runs/{id}/events`` sends) as
``TaskStatusUpdateEvent`` and ``TaskArtifactUpdateEvent``. Everything sent is redacted as the API's responses are,
and every error is a JSON-RPC error naming what was wrong (never a 500, never a secret). docs/protocols.md, "A2A".
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import orjson

try:  # the a2a extra: name it when it is missing
    from a2a.helpers import get_data_parts, new_data_part, new_text_part
    from a2a.server.context import ServerCallContext
    from a2a.server.request_handlers.request_handler import RequestHandler
    from a2a.server.request_handlers.response_helpers import agent_card_to_dict
    from a2a.server.routes import DefaultServerCallContextBuilder
    from a2a.server.routes.jsonrpc_dispatcher import JsonRpcDispatcher
    from a2a.types import (
        AgentCapabilities,
        AgentCard,
        AgentInterface,
        AgentSkill,
        Artifact,
        CancelTaskRequest,
        DeleteTaskPushNotificationConfigRequest,
        ExtendedAgentCardNotConfiguredError,
        GetExtendedAgentCardRequest,
        GetTaskPushNotificationConfigRequest,
        GetTaskRequest,
        HTTPAuthSecurityScheme,
        InternalError,
        InvalidParamsError,
        ListTaskPushNotificationConfigsRequest,
        ListTaskPushNotificationConfigsResponse,
        ListTasksRequest,
        ListTasksResponse,
        Message,
        Part,
        PushNotificationNotSupportedError,
        Role,
        SecurityRequirement,
        SecurityScheme,
        SendMessageRequest,
        StringList,
        SubscribeToTaskRequest,
        Task,
        TaskArtifactUpdateEvent,
        TaskNotCancelableError,
        TaskNotFoundError,
        TaskPushNotificationConfig,
        TaskState,
        TaskStatus,
        TaskStatusUpdateEvent,
        UnsupportedOperationError,
    )
    from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
    from a2a.utils.errors import A2AError
    from google.protobuf.json_format import MessageToDict, ParseDict
except ModuleNotFoundError:
    from planweave.extras import require

    require("a2a", "the A2A endpoint (planweave.server.a2a)")
    raise
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ValidationError

from planweave import __version__
from planweave.core.errors import (
    EventNotRecorded,
    InputRejected,
    JournalError,
    PlanInvalid,
    PlanweaveError,
    ReplyRefused,
    RunError,
    RunNotFound,
)
from planweave.core.events import Event
from planweave.core.state import RunState
from planweave.engine.report import shown_output
from planweave.engine.runtime import request_cancel, send_approval, send_input
from planweave.extras import MissingExtra
from planweave.runview import list_overviews, run_report, stored_outputs
from planweave.server.runs import active_run, owner_gone
from planweave.server.streams import run_events

if TYPE_CHECKING:
    from planweave.journal.summary import RunSummary
    from planweave.server.app import AppState

__all__ = ["A2A_PATH", "CARD_PATH", "PlanweaveAgent", "mount_a2a"]

log = logging.getLogger("planweave.server")

#: Where the JSON-RPC binding listens, and where the agent card is (A2A's well-known path).
A2A_PATH = "/a2a"
CARD_PATH = AGENT_CARD_WELL_KNOWN_PATH

#: The options a message may give (in a data part, or in its or the request's metadata), as ``POST /runs`` takes
#: them; ``model`` names the model the server plans with (a run cannot choose another).
OPTIONS = ("run_id", "budget_usd", "budget_tokens", "deadline", "priority", "max_replans", "tiers", "context",
           "subplans", "deadline_pressure", "model")
_PLAN_TYPES = ("application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml", "application/json")
_PLAN_SUFFIXES = (".yaml", ".yml", ".json")
_TERMINAL = {TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED,
             TaskState.TASK_STATE_REJECTED}
_STATE_OF = {"succeeded": TaskState.TASK_STATE_COMPLETED, "failed": TaskState.TASK_STATE_FAILED,
             "cancelled": TaskState.TASK_STATE_CANCELED, "running": TaskState.TASK_STATE_WORKING,
             # a run whose process is gone (a restarted server resumes it) or whose events cannot be read: the task
             # ends here for A2A; its metadata says which (planweave.status)
             "interrupted": TaskState.TASK_STATE_FAILED, "unreadable": TaskState.TASK_STATE_FAILED}
_ASKED = ("approval_requested", "input_requested")
_APPROVE_WORDS = ("approve", "approved", "yes", "y", "ok")
_REJECT_WORDS = ("reject", "rejected", "no", "n")
#: How long ``tasks/cancel`` waits for a run of this server to end before it answers with the task as it is.
CANCEL_WAIT_S = 10.0

_Proto = TypeVar("_Proto", Task, TaskStatusUpdateEvent, TaskArtifactUpdateEvent)


class Submit(Protocol):
    """``POST /runs``'s route function: validates, bounds by the caps and starts (or queues) a run."""

    def __call__(self, state: AppState, submission: Any, request: Request, response: Response) -> Awaitable[Any]: ...


# -- messages in ---------------------------------------------------------------------------------------------------
def _plain(value: Any) -> Any:
    """A data part's value as JSON would have it: protobuf keeps every number as a double, so whole ones are ints."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def _metadata(struct: Any) -> dict[str, Any]:
    """The planweave options in a message's or a request's ``metadata`` (other keys are the client's business)."""
    found = _plain(MessageToDict(struct)) if struct is not None else {}
    return {k: v for k, v in found.items() if k in OPTIONS} if isinstance(found, dict) else {}


def _invalid(field: str, message: str) -> InvalidParamsError:
    return InvalidParamsError(message=message, data={"problems": [{"step": "", "field": field, "message": message}]})


def submission_fields(params: SendMessageRequest) -> dict[str, Any]:
    """The ``POST /runs`` body a message stands for: a plan (a data part holding ``steps``, or a YAML/JSON text or
    file part), or a goal (a plain text part), and options from data parts and metadata.

    Raises InvalidParamsError naming the part that cannot be read.
    """
    fields = {**_metadata(params.metadata), **_metadata(params.message.metadata)}
    goals: list[str] = []
    for i, part in enumerate(params.message.parts):
        kind = part.WhichOneof("content")
        where = f"message.parts[{i}]"
        if kind == "data":
            value = _plain(get_data_parts([part])[0])
            if not isinstance(value, dict):
                raise _invalid(where, f"{where}: a data part is a plan (an object with 'steps') or an object of "
                                      f"options ({', '.join(OPTIONS)}), not {type(value).__name__}")
            fields.update({"plan": value} if "steps" in value else value)
        elif kind == "text" and (part.media_type in _PLAN_TYPES or part.filename.endswith(_PLAN_SUFFIXES)):
            fields["plan_yaml"] = part.text
        elif kind == "text":
            goals.append(part.text)
        elif kind == "raw" and (part.media_type in _PLAN_TYPES or part.filename.endswith(_PLAN_SUFFIXES)):
            try:
                fields["plan_yaml"] = part.raw.decode("utf-8")
            except UnicodeDecodeError:
                raise _invalid(where, f"{where}: the plan file is not UTF-8 text") from None
        elif kind == "url":
            raise _invalid(where, f"{where}: planweave does not fetch URLs: send the plan's text in a text part "
                                  "(media type application/yaml) or as a data part")
        else:
            raise _invalid(where, f"{where}: a {kind or 'empty'} part must be a plan (YAML or JSON media type, or a "
                                  ".yaml/.json filename), a goal (text) or options (data)")
    if goals:
        fields["goal"] = "\n".join(goals)
    return fields


def _text_value(text: str, schema: Any) -> Any:
    """A value given as text: the text itself for a step wanting a string (or saying nothing), else its JSON if it
    is JSON (``3`` for an integer), else the text (which the step's schema then refuses, saying why)."""
    if not isinstance(schema, Mapping) or schema.get("type") in (None, "string"):
        return text
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return text


def _reply_of(params: SendMessageRequest, waiting: Mapping[str, str],
              schemas: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """The step a reply message answers and what it says (``approve``/``reason``, or ``value``).

    A data part ``{"step"?, "approve", "reason"?}`` or ``{"step"?, "value"}``; or text: for an approval, "approve"
    or "reject" (the rest of the text is the reason), for an input, the value (JSON when the step's schema wants
    other than a string: ``3``). ``step`` may be left out when one step waits.
    """
    said: dict[str, Any] = {}
    text: list[str] = []
    for part in params.message.parts:
        kind = part.WhichOneof("content")
        if kind == "data":
            value = _plain(get_data_parts([part])[0])
            if not isinstance(value, dict):
                raise _invalid("message.parts", "a reply's data part is an object: {step?, approve, reason?} or "
                                                "{step?, value}")
            said.update(value)
        elif kind == "text":
            text.append(part.text)
        else:
            raise _invalid("message.parts", f"a reply is text or data, not a {kind or 'empty'} part")
    step = said.pop("step", None)
    if step is None:
        if len(waiting) != 1:
            raise _invalid("step", f"steps {', '.join(sorted(waiting))} are waiting: say which one the reply is for "
                                   "(a data part {\"step\": ...})")
        step = next(iter(waiting))
    if not isinstance(step, str) or step not in waiting:
        raise _invalid("step", f"step {step!r} is not waiting for a reply (waiting: "
                               f"{', '.join(sorted(waiting)) or 'none'})")
    if not said and text:
        words = " ".join(text).strip()
        if waiting[step] == "waiting_input":
            said = {"value": _text_value(words, schemas.get(step))}
        else:
            first, _, rest = words.replace(":", " ", 1).partition(" ")
            if first.lower() not in _APPROVE_WORDS + _REJECT_WORDS:
                raise _invalid("approve", f"step '{step}' waits for an approval: reply 'approve' or 'reject "
                                          "[reason]', or a data part {\"approve\": true|false, \"reason\": ...}")
            said = {"approve": first.lower() in _APPROVE_WORDS, "reason": rest.strip() or None}
    allowed = {"approve", "reason"} if waiting[step] == "waiting_approval" else {"value"}
    if set(said) - allowed or not ({"approve", "value"} & set(said)):
        wanted = "an approval" if "approve" in allowed else "a value"
        raise _invalid("message.parts", f"step '{step}' waits for {wanted}: the reply gives "
                                        f"{', '.join(sorted(allowed))}")
    if "approve" in said and not isinstance(said["approve"], bool):
        raise _invalid("approve", "approve is true or false")
    return step, said


# -- tasks out -----------------------------------------------------------------------------------------------------
def _agent_message(task_id: str, parts: list[Part]) -> Message:
    return Message(message_id=uuid.uuid4().hex, task_id=task_id, context_id=task_id, role=Role.ROLE_AGENT,
                   parts=parts)


def _asked_parts(step: str, status: str, prompt: str | None, schema: Any) -> list[Part]:
    """What a waiting step asks: its prompt as text, and ``{step, kind, prompt, input_schema}`` as data."""
    kind = "approval" if status == "waiting_approval" else "input"
    how = ("reply 'approve' or 'reject [reason]'" if kind == "approval"
           else "reply with the value (a data part {\"value\": ...})")
    return [new_text_part(f"step '{step}' waits for {'an approval' if kind == 'approval' else 'a value'}: "
                          f"{prompt or ''} ({how})"),
            new_data_part({"step": step, "kind": kind, "prompt": prompt, "input_schema": schema})]


def _step_artifact(step: str, output: Any) -> Artifact:
    return Artifact(artifact_id=f"step:{step}", name=step, description=f"the output of step '{step}'",
                    parts=[new_data_part(output)])


def _answer_artifact(answer: str) -> Artifact:
    return Artifact(artifact_id="answer", name="answer", description="the run's answer",
                    parts=[new_text_part(answer)])


def task_of(run_id: str, report: Mapping[str, Any], state: RunState) -> Task:
    """The A2A task of a run from its :func:`~planweave.runview.run_report` (with outputs): status (input-required
    while a step waits, naming each), artifacts (each succeeded step's output, the answer) and planweave's view in
    the metadata."""
    status = str(report["status"])
    waiting = dict(report.get("waiting") or {})
    task_state = _STATE_OF.get(status, TaskState.TASK_STATE_FAILED)
    parts: list[Part] = []
    if status == "running" and waiting:
        task_state = TaskState.TASK_STATE_INPUT_REQUIRED
        for sid, how in waiting.items():
            rec = state.records[sid]
            parts += _asked_parts(sid, how, rec.prompt, rec.input_schema)
    elif status == "succeeded" and report.get("answer"):
        parts.append(new_text_part(str(report["answer"])))
    elif report.get("error") or status in ("interrupted", "unreadable"):
        parts.append(new_text_part(str(report.get("error") or f"the run is {status}")))
    artifacts = [_step_artifact(sid, out) for sid, out in (report.get("outputs") or {}).items()]
    if status == "succeeded" and report.get("answer"):
        artifacts.append(_answer_artifact(str(report["answer"])))
    meta = {k: report.get(k) for k in ("plan", "status", "waiting", "steps", "error", "root_cause", "tokens",
                                       "cost_usd", "makespan_s")}
    meta["steps"] = {sid: step.get("status") for sid, step in (report.get("steps") or {}).items()}
    task = Task(id=run_id, context_id=run_id, artifacts=artifacts,
                status=TaskStatus(state=task_state, message=_agent_message(run_id, parts) if parts else None))
    task.metadata.update({"planweave": orjson.loads(orjson.dumps(meta, default=str))})
    task.status.timestamp.GetCurrentTime()
    return task


def _status(run_id: str, state: TaskState, at: float, parts: list[Part] | None = None) -> TaskStatusUpdateEvent:
    """A status update of the event journaled ``at`` (epoch seconds)."""
    status = TaskStatus(state=state, message=_agent_message(run_id, parts) if parts else None)
    status.timestamp.FromNanoseconds(int(at * 1e9))
    return TaskStatusUpdateEvent(task_id=run_id, context_id=run_id, status=status)


def _artifact_update(run_id: str, artifact: Artifact) -> TaskArtifactUpdateEvent:
    return TaskArtifactUpdateEvent(task_id=run_id, context_id=run_id, artifact=artifact, last_chunk=True)


def _decoded(chunk: bytes) -> Event | None:
    """An event of :func:`run_events`' SSE stream (None for a ping or a ``lagging`` notice)."""
    kind = data = None
    for line in chunk.split(b"\n"):
        if line.startswith(b"event: "):
            kind = line[7:].decode()
        elif line.startswith(b"data: "):
            data = line[6:]
    if data is None or kind in (None, "lagging"):
        return None
    body = orjson.loads(data)
    return Event(body["run_id"], body["kind"], body["at"], body.get("step"), body.get("data") or {}, body.get("pos"))


# -- the request handler ---------------------------------------------------------------------------------------------
class _RequestContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context, plus the request itself: ``POST /runs``'s code reads it (the plan's bytes, the
    client's address for a reply's ``by``)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        # The token stays out of the context (nothing that logs a context can show it); the version header is kept.
        context.state["headers"] = {k: v for k, v in context.state.get("headers", {}).items()
                                    if k.lower() != "authorization"}
        context.state["request"] = request
        return context


class PlanweaveAgent(RequestHandler):
    """The A2A request handler of a planweave server: each method on the server's runs (its :class:`AppState`)."""

    def __init__(self, app: FastAPI, submit: Submit, submission: type[BaseModel]) -> None:
        self._app = app
        self._submit = submit
        self._submission = submission

    @property
    def _state(self) -> AppState:
        state: AppState = self._app.state.planweave
        return state

    def _shown(self, proto: _Proto) -> _Proto:
        """``proto`` with every secret as ``***``, as the API shows everything (a run here holds its secrets)."""
        redact = self._state.redact
        if redact is None:
            return proto
        shown: _Proto = ParseDict(redact(MessageToDict(proto)), type(proto)())
        return shown

    @contextlib.contextmanager
    def _errors(self) -> Iterator[None]:
        """planweave's errors as A2A's (the JSON-RPC error codes), their messages redacted; anything else is an
        internal error whose text stays in the server's log."""
        redact = self._state.redact or (lambda value: value)
        try:
            yield
        except A2AError as exc:
            exc.message = redact(exc.message)
            exc.data = redact(exc.data) if exc.data else exc.data
            raise
        except PlanInvalid as exc:
            problems = [{"step": p.step, "field": p.field, "message": p.message} for p in exc.problems]
            raise InvalidParamsError(message=redact(str(exc)), data={"problems": redact(problems)}) from None
        except ValidationError as exc:
            problems = [{"step": "", "field": ".".join(str(p) for p in err.get("loc", ())),
                         "message": str(err.get("msg", "invalid"))} for err in exc.errors()]
            message = "; ".join(f"{p['field']}: {p['message']}" for p in problems)
            raise InvalidParamsError(message=redact(f"the message's options are not valid: {message}"),
                                     data={"problems": redact(problems)}) from None
        except (InputRejected, EventNotRecorded) as exc:
            raise InvalidParamsError(message=redact(str(exc))) from None
        except RunNotFound as exc:
            raise TaskNotFoundError(message=redact(str(exc))) from None
        except ReplyRefused as exc:
            raise UnsupportedOperationError(message=redact(str(exc)),
                                            data={"decision": redact(dict(exc.decision))}) from None
        except (RunError, MissingExtra) as exc:
            raise UnsupportedOperationError(message=redact(str(exc))) from None
        except HTTPException as exc:
            raise UnsupportedOperationError(message=redact(str(exc.detail))) from None
        except (JournalError, PlanweaveError) as exc:
            raise InternalError(message=redact(str(exc))) from None
        except Exception:
            log.exception("A2A request failed")
            raise InternalError(message="internal error: the server's log has its details") from None

    # -- reading runs ------------------------------------------------------------------------------------------------
    async def _task(self, run_id: str) -> Task:
        """The task of ``run_id`` as the read model has it now (live if it runs here, else folded from the journal)."""
        return (await self._read(run_id))[0]

    async def _read(self, run_id: str) -> tuple[Task, set[str]]:
        """The task of ``run_id`` now, and the steps that wait for a person."""
        state = self._state
        run = active_run(state.engine, run_id)
        if run is not None:
            report = run_report(run.state, None, dict(run.outputs), state.redact)
            task = self._shown(task_of(run_id, report, run.state))
            await state.engine.journal.flush()  # what the task says of a live run is durable before it is sent
            return task, set(report["waiting"])
        await state.index.refresh()
        found = state.index.get(run_id)
        if found is None and state.queue is not None and await state.queue.leases(run_id):
            # serve --queue: queued for the workers, none has started it yet
            return self._shown(Task(id=run_id, context_id=run_id,
                                    status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED))), set()
        if found is None:
            raise RunNotFound(f"no run '{run_id}' in the journal")
        if found.state is None:
            raise JournalError(f"run '{run_id}': {found.problem}")
        outputs = await stored_outputs(state.engine.journal, found.state)
        report = run_report(found.state, state.index.status(found), outputs, state.redact)
        return self._shown(task_of(run_id, report, found.state)), set(report["waiting"])

    async def _updates(self, run_id: str, after: int, waiting: set[str], *,
                       until_asked: bool) -> AsyncIterator[TaskStatusUpdateEvent | TaskArtifactUpdateEvent]:
        """The run's journaled events after ``after`` as A2A updates, until it ends (``until_asked``: or until a step
        waits for a person: A2A's input-required interrupts a message's stream)."""
        state = self._state
        stream = run_events(state.engine, state.engine.journal, state.feed, run_id, after, state.timing,
                            state.stream_limits)
        try:
            async for chunk in stream:
                event = _decoded(chunk)
                if event is None:
                    continue
                for update in await self._translated(event, waiting):
                    yield self._shown(update)
                if event.kind == "run_finished" or (until_asked and event.kind in _ASKED):
                    return
        finally:
            await stream.aclose()  # type: ignore[attr-defined]

    async def _translated(self, event: Event, waiting: set[str]) -> list[TaskStatusUpdateEvent |
                                                                             TaskArtifactUpdateEvent]:
        run_id, step, data = event.run_id, event.step, event.data
        if event.kind in ("run_created", "run_resumed"):
            return [_status(run_id, TaskState.TASK_STATE_WORKING, event.at)]
        if event.kind in _ASKED and step is not None:
            waiting.add(step)
            how = "waiting_approval" if event.kind == "approval_requested" else "waiting_input"
            return [_status(run_id, TaskState.TASK_STATE_INPUT_REQUIRED, event.at,
                            _asked_parts(step, how, data.get("prompt"), data.get("schema")))]
        if event.kind == "run_finished":
            status = str(data.get("status"))
            error = data.get("error")
            return [_status(run_id, _STATE_OF.get(status, TaskState.TASK_STATE_FAILED), event.at,
                            [new_text_part(str(error))] if error else None)]
        if event.kind == "answer" and data.get("text"):
            return [_artifact_update(run_id, _answer_artifact(str(data["text"])))]
        updates: list[TaskStatusUpdateEvent | TaskArtifactUpdateEvent] = []
        if step is not None and step in waiting and event.kind != "step_reply":
            waiting.discard(step)  # answered, timed out or cancelled: it waits no more
            if not waiting:
                updates.append(_status(run_id, TaskState.TASK_STATE_WORKING, event.at))
        if event.kind == "step_succeeded" and step is not None:
            ref = data.get("output")
            blobs = await self._state.engine.journal.get_blobs({ref}) if isinstance(ref, str) else {}
            output = blobs.get(ref) if isinstance(ref, str) else None
            updates.append(_artifact_update(run_id, _step_artifact(step, shown_output(output,
                                                                                      redact=self._state.redact))))
        return updates

    async def _position(self) -> int:
        """The journal's position now: a stream after it misses nothing of what follows."""
        return await self._state.index.refresh()

    # -- a message: a new run, or a reply to a waiting one ------------------------------------------------------------
    async def _take(self, params: SendMessageRequest, context: ServerCallContext) -> tuple[str, int]:
        """Start the run a message asks for, or apply the reply it gives; its id and the position to stream after."""
        request: Request = context.state["request"]
        if params.message.task_id:
            return await self._reply(params, request)
        state = self._state
        fields = submission_fields(params)
        model = fields.pop("model", None)
        if model is not None:
            served = state.model.client.model if state.model is not None else None
            if model != served:
                raise _invalid("model", f"this server plans with {served!r}: a run cannot choose the model "
                                        f"{model!r} (start the server with `planweave serve --model NAME`)"
                               if served else "this server has no model: start it with `planweave serve --model NAME`")
        submission = self._submission(**fields)
        after = await self._position()
        accepted = await self._submit(state, submission, request, Response())
        return str(accepted.run_id), after

    async def _reply(self, params: SendMessageRequest, request: Request) -> tuple[str, int]:
        state = self._state
        run_id = params.message.task_id
        task = await self._task(run_id)
        if task.status.state in _TERMINAL:
            raise UnsupportedOperationError(message=f"task '{run_id}' has ended "
                                                    f"({TaskState.Name(task.status.state)}): nothing waits for a reply")
        run = active_run(state.engine, run_id)
        found = state.index.get(run_id)
        run_state = run.state if run is not None else found.state if found is not None else None
        waiting = dict(run_state.waiting_steps()) if run_state is not None else {}
        if run_state is None or not waiting:
            raise UnsupportedOperationError(message=f"task '{run_id}' is working: no step waits for a reply")
        step, said = _reply_of(params, waiting, {sid: run_state.records[sid].input_schema for sid in waiting})
        by = f"an A2A client holding the API token at {request.client.host if request.client else 'an unknown address'}"
        after = await self._position()
        if "approve" in said:
            await send_approval(state.engine.journal, run_id, step, approve=said["approve"],
                                reason=said.get("reason"), by=by, run=run)
        else:
            await send_input(state.engine.journal, run_id, step, said["value"], by=by, run=run)
        return run_id, after

    async def on_message_send(self, params: SendMessageRequest, context: ServerCallContext) -> Task | Message:
        with self._errors():
            run_id, after = await self._take(params, context)
            task, waiting = await self._read(run_id)
            if params.configuration.return_immediately or task.status.state in _TERMINAL:
                return task
            if task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
                async for _ in self._updates(run_id, after, waiting, until_asked=True):
                    pass
            return await self._task(run_id)

    async def on_message_send_stream(self, params: SendMessageRequest,
                                     context: ServerCallContext) -> AsyncGenerator[Any]:
        with self._errors():
            run_id, after = await self._take(params, context)
            task, waiting = await self._read(run_id)
        yield task
        if task.status.state in _TERMINAL or task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED:
            return
        with self._errors():
            async for update in self._updates(run_id, after, waiting, until_asked=True):
                yield update

    async def on_subscribe_to_task(self, params: SubscribeToTaskRequest,
                                   context: ServerCallContext) -> AsyncGenerator[Any]:
        with self._errors():
            after = await self._position()
            task, waiting = await self._read(params.id)
            if task.status.state in _TERMINAL:
                raise UnsupportedOperationError(message=f"task '{params.id}' has ended "
                                                        f"({TaskState.Name(task.status.state)}): tasks/get shows it")
        yield task
        with self._errors():
            async for update in self._updates(params.id, after, waiting, until_asked=False):
                yield update

    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task | None:
        with self._errors():
            return await self._task(params.id)

    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task | None:
        with self._errors():
            state = self._state
            reason = "cancelled over A2A"
            run = active_run(state.engine, params.id)
            if run is not None:
                run.cancel(reason)
                await state.engine.journal.flush()
                with contextlib.suppress(TimeoutError, RunError):
                    await asyncio.wait_for(run.wait(), CANCEL_WAIT_S)
                return await self._task(params.id)
            task = await self._task(params.id)
            if task.status.state in _TERMINAL:
                raise TaskNotCancelableError(message=f"task '{params.id}' has ended "
                                                     f"({TaskState.Name(task.status.state)})")
            await request_cancel(state.engine.journal, params.id, reason)  # its process stops it within a second
            return await self._task(params.id)

    async def on_list_tasks(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        with self._errors():
            state = self._state
            cursor = None
            if params.page_token:
                if not params.page_token.isdigit():
                    raise _invalid("page_token", "page_token is the next_page_token of the previous page")
                cursor = int(params.page_token)
            size = params.page_size or 50

            def status_of(summary: RunSummary) -> str:
                gone = summary.status == "running" and owner_gone(summary.owner, state.engine, summary.run_id)
                return "interrupted" if gone else summary.status

            rows, following, _ = await list_overviews(state.engine.journal, status_of, limit=min(size, 100),
                                                      cursor=cursor)
            tasks = []
            for row in rows:
                task_state = _STATE_OF.get(row["status"], TaskState.TASK_STATE_FAILED)
                if row["status"] == "running" and row["waiting"]:
                    task_state = TaskState.TASK_STATE_INPUT_REQUIRED
                task = Task(id=row["run_id"], context_id=row["run_id"], status=TaskStatus(state=task_state))
                task.metadata.update({"planweave": orjson.loads(orjson.dumps(row, default=str))})
                tasks.append(self._shown(task))
            return ListTasksResponse(tasks=tasks, next_page_token="" if following is None else str(following),
                                     page_size=len(tasks), total_size=len(tasks))

    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError(message="planweave streams a task's updates (message/stream, "
                                                        "tasks/resubscribe): it sends no push notifications")

    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext,
    ) -> TaskPushNotificationConfig:
        raise PushNotificationNotSupportedError

    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext,
    ) -> ListTaskPushNotificationConfigsResponse:
        raise PushNotificationNotSupportedError

    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext,
    ) -> None:
        raise PushNotificationNotSupportedError

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext,
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError


# -- the card and the routes -------------------------------------------------------------------------------------------
def agent_card(base_url: str, *, goals: bool) -> AgentCard:
    """The card of the planweave agent at ``base_url``: its JSON-RPC interface (A2A 1.0 and 0.3), streaming, the
    server's bearer token as its one auth scheme, and its skills (a goal only when the server has a model)."""
    url = base_url.rstrip("/") + A2A_PATH
    skills = [AgentSkill(
        id="run-plan", name="Run a plan",
        description="Run a planweave plan (a DAG of tool steps) to its end: send the plan document as a data part "
                    "({steps: [...]}) or as YAML text (media type application/yaml); each step's output is an "
                    "artifact. Steps with approval: or human.input ask for a reply (input-required). Options "
                    "(budget_usd, budget_tokens, deadline, priority, run_id, tiers, deadline_pressure) as a data part "
                    "or metadata.",
        tags=["plan", "dag", "workflow"], examples=['{"steps": [{"id": "hi", "tool": "noop", "args": {"x": 1}}]}'],
        input_modes=["application/json", "application/yaml"], output_modes=["application/json", "text/plain"])]
    if goals:
        skills.append(AgentSkill(
            id="run-goal", name="Run a goal",
            description="Plan a goal with the server's model and run the plan as it is written, re-planning on "
                        "failures; the answer is the 'answer' artifact. Send the goal as text; options (budget_usd, "
                        "budget_tokens, deadline, max_replans, context, subplans, model) as a data part or metadata.",
            tags=["goal", "planning", "agent"], examples=["Compare tomorrow's weather in Paris and Rome"],
            input_modes=["text/plain", "application/json"], output_modes=["application/json", "text/plain"]))
    return AgentCard(
        name="planweave",
        description="Plans and runs LLM-agent tasks as a journaled DAG: a task is a run (plans, goals, approvals "
                    "and human input, cancel).",
        version=__version__,
        supported_interfaces=[AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="1.0"),
                              AgentInterface(url=url, protocol_binding="JSONRPC", protocol_version="0.3")],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        security_schemes={"bearer": SecurityScheme(http_auth_security_scheme=HTTPAuthSecurityScheme(
            scheme="bearer", description="The server's access token (printed by `planweave serve`)."))},
        security_requirements=[SecurityRequirement(schemes={"bearer": StringList()})],
        default_input_modes=["text/plain", "application/json", "application/yaml"],
        default_output_modes=["application/json", "text/plain"],
        skills=skills,
    )


def mount_a2a(app: FastAPI, submit: Submit, submission: type[BaseModel]) -> None:
    """Serve the A2A agent on ``app`` (a :func:`~planweave.server.app.create_app` app): the card, open to anyone
    (it names the auth scheme, nothing about the runs), and ``POST /a2a``, which wants the API's token.

    ``submit`` and ``submission`` are ``POST /runs``'s route function and body model: a message starts a run
    through them, with the same checks, caps and queue.
    """
    dispatcher = JsonRpcDispatcher(PlanweaveAgent(app, submit, submission), context_builder=_RequestContextBuilder(),
                                   enable_v0_3_compat=True)

    @app.get(CARD_PATH, include_in_schema=False)
    async def a2a_agent_card(request: Request) -> JSONResponse:
        state: AppState = request.app.state.planweave
        card = agent_card(str(request.base_url), goals=state.model is not None)
        return JSONResponse(agent_card_to_dict(card), headers={"Cache-Control": "no-cache"})

    @app.post(A2A_PATH, include_in_schema=False)
    async def a2a_rpc(request: Request) -> Response:
        state: AppState = request.app.state.planweave
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not state.token.matches(given.strip()):
            return JSONResponse({"detail": "missing or wrong access token: send 'Authorization: Bearer TOKEN' "
                                           "(printed by `planweave serve`)"},
                                status_code=401, headers={"WWW-Authenticate": "Bearer"})
        response = await dispatcher.handle_requests(request)
        if state.redact is not None and isinstance(response, JSONResponse):
            # The dispatcher's own errors (a request it cannot parse) may quote the request: shown as the rest is.
            return JSONResponse(state.redact(orjson.loads(response.body)), status_code=response.status_code)
        return response
