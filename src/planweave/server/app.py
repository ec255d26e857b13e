"""The HTTP API and the dashboard: submit, list, inspect, cancel and resume runs, and follow them as SSE streams.

:func:`create_app` builds the FastAPI app around an open :class:`~planweave.engine.runtime.Engine`; :func:`serving`
runs it under uvicorn in the current event loop (also next to a CLI run); :func:`serve` is ``planweave serve``.
Every endpoint but ``/healthz``, ``/openapi.json`` and the dashboard's files wants ``Authorization: Bearer TOKEN``.

Endpoints: ``GET /healthz``; ``POST /runs``; ``GET /runs``; ``GET /runs/{id}`` (the ``planweave run --json``
object); ``GET /runs/{id}/steps/{step}``; ``GET /runs/{id}/plan``; ``POST /runs/{id}/cancel``;
``POST /runs/{id}/resume``; ``GET /runs/{id}/events`` and ``GET /events`` (``text/event-stream``, resumable with
``Last-Event-ID``); ``GET /runs/{id}/agui`` (the run as AG-UI 1.0 events, server/agui.py); ``GET /metrics``
(model-call admission, Prometheus text format); ``GET /memory`` and ``GET /memory/{id}`` (lessons and skills across
runs, server/memory.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TextIO, TypeVar, cast
from urllib.parse import quote, urlsplit, urlunsplit

import uvicorn
from fastapi import APIRouter, Body, Depends, FastAPI, Header, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from planweave import __version__, open_engine
from planweave.core.errors import (
    EventNotRecorded,
    InputRejected,
    JournalError,
    PlanInvalid,
    PlanProblem,
    ReplyRefused,
    RunError,
    RunNotFound,
)
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.defaults import with_default_timeout
from planweave.core.plan.document import document_problems
from planweave.core.plan.graph import parse_plan_document
from planweave.core.plan.model import PlanSpec
from planweave.core.state import RunState
from planweave.engine.report import DEFAULT_OUTPUT_LIMIT, Redact, StepNotFound, find_step, step_detail
from planweave.engine.runtime import DEFAULT_CONCURRENCY, Engine, Run, request_cancel, send_approval, send_input
from planweave.extras import MissingExtra, installed
from planweave.journal import default_journal_url
from planweave.journal.summary import RunSummary
from planweave.memory.model import MemoryStoreError, UnknownEntry
from planweave.planfile import plan_document
from planweave.runview import list_overviews, parse_since
from planweave.server.agui import AguiCursor, agui_events
from planweave.server.connections import ConnectionLimits
from planweave.server.limits import (
    LimitCaps,
    RunLimits,
    ServerModel,
    checked_tiers,
    open_server_model,
    resume_within_limits,
    start_deadline,
    watch_plan,
)
from planweave.server.live import LiveServer, ServerError
from planweave.server.memory import MemoryAccess
from planweave.server.runs import (
    HTTP_SOURCE,
    RunIndex,
    active_run,
    owner_gone,
    plan_view,
    recover_orphans,
    run_report,
    stored_outputs,
)
from planweave.server.streams import ChangeFeed, StreamLimits, StreamTiming, all_events, run_events

if TYPE_CHECKING:
    from planweave.journal.leases import LeaseStore
    from planweave.models.endpoint import Endpoint
    from planweave.server.endpoints import EndpointPolicy
from planweave.server.tokens import AccessToken, resolve_token
from planweave.tools.safety import SecretRedactor, redact, secret_values

__all__ = ["AppState", "create_app", "serve", "serving", "telemetry_from_env"]

log = logging.getLogger("planweave.server")
STATIC_DIR = Path(__file__).resolve().parent / "static"
RUN_ID_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,63}$"
_LOOPBACK = ("127.0.0.1", "::1", "localhost")


# -- the wire models --------------------------------------------------------------------------------------------
class RunSubmission(BaseModel):
    """``POST /runs``: a plan as a JSON object (``plan``) or as YAML text (``plan_yaml``), and an optional id."""

    model_config = ConfigDict(extra="forbid")

    plan: dict[str, Any] | None = Field(None, description="The plan document: {'steps': [...], ...}.")
    plan_yaml: str | None = Field(None, description="The plan document as YAML (or JSON) text.")
    goal: str | None = Field(None, min_length=1, max_length=20000,
                             description="A goal to plan with the server's model (`planweave serve --model`).")
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, description="Id for the new run (default: random).")
    budget_usd: float | None = Field(None, ge=0, description="Most USD the run's model calls may spend "
                                                             "(default: the server's --max-budget-usd).")
    budget_tokens: int | None = Field(None, ge=0, description="Most tokens the run's model calls may spend "
                                                              "(default: the server's --max-budget-tokens).")
    deadline: float | None = Field(None, gt=0, description="Cancel the run after this many seconds "
                                                           "(default: the server's --max-deadline).")
    priority: float = Field(0.0, allow_inf_nan=False,
                            description="The run's priority for shared model endpoints: its model calls queue ahead "
                                        "of lower ones' (journaled; a resume keeps it).")
    max_replans: int | None = Field(None, ge=0, description="Most re-plans of a goal run "
                                                            "(default: the server's --max-replans, else 5).")
    tiers: dict[str, Any] | None = Field(
        None, max_length=32, description="Model tiers for the plan's llm steps saying model: auto: {name: {model, "
        "p_success, duration_s, cost_usd, duration_sigma?, tokens?}} (docs/allocation.md); journaled, a resume "
        "keeps them.")
    endpoint: dict[str, Any] | None = Field(
        None, description="The model endpoint of this run: {base_url?, api_key_env?, headers?: {name: value}}, the "
        "parts left out the server's; only base URLs and key variables the server allows (planweave serve "
        "--allow-endpoint URL, --allow-key-env NAME), else 422 naming the field. Its base URL and key variable are "
        "journaled, never a key nor a header's value (docs/models.md).")
    context: Literal["references", "summary"] | None = Field(
        None, description="What a goal run's planner sees of the run: references (the default: a report, the plan's "
        "frontier and outputs by reference, bounded) or summary (every step, cut at a fixed size); journaled.")
    subplans: bool = Field(True, description="False: a goal run's steps cannot say tool: plan (no child runs); "
                                             "journaled.")
    deadline_pressure: float | None = Field(
        None, gt=0, le=1, description="With a deadline (the request's, else the server's --max-deadline): when the "
        "run's forecast gives it less than this chance of "
        "ending in time, a goal run's planner re-plans with the time left, and a plan run takes its pressure: "
        "actions (this in place of its p_deadline; without pressure:, the default actions); journaled, a resume "
        "keeps it (docs/allocation.md).")

    def limits(self) -> RunLimits:
        """The limits the request asks for (before the server's caps)."""
        return RunLimits(self.budget_usd, self.budget_tokens, self.deadline, self.max_replans)


class ResumeRequest(BaseModel):
    """``POST /runs/{id}/resume``: whether to re-run steps whose outcome is unknown (not idempotent)."""

    model_config = ConfigDict(extra="forbid")

    retry_unknown: bool = False


class CancelRequest(BaseModel):
    """``POST /runs/{id}/cancel``: why (recorded in the journal)."""

    model_config = ConfigDict(extra="forbid")

    reason: str = Field("cancelled over HTTP", max_length=1000)


class ApprovalReply(BaseModel):
    """``POST /runs/{id}/steps/{step}/approval``: approve (the step runs) or reject (it fails, kind ``rejected``)."""

    model_config = ConfigDict(extra="forbid")

    approve: bool
    reason: str | None = Field(None, max_length=2000, description="Why (shown in the step's error when rejected).")


class InputReply(BaseModel):
    """``POST /runs/{id}/steps/{step}/input``: the value a ``human.input`` step waits for (any JSON value)."""

    model_config = ConfigDict(extra="forbid")

    value: Any = Field(..., description="Checked against the step's JSON schema; it becomes the step's output.")


class ReplyAccepted(BaseModel):
    """A person's reply was taken: ``applied`` to the running run, or ``recorded`` for when it resumes."""

    run_id: str
    step: str
    outcome: str


class RunAccepted(BaseModel):
    """A run was started, resumed, cancelled or asked to cancel."""

    run_id: str
    status: str


class ProblemItem(BaseModel):
    """One thing wrong with a request, located by plan step and field (either may be empty)."""

    step: str
    field: str
    message: str


class ProblemReport(BaseModel):
    """422: every problem found, not just the first."""

    detail: str
    problems: list[ProblemItem]


class ErrorMessage(BaseModel):
    """4xx/5xx: what went wrong, naming the run."""

    detail: str


# -- the app's state ----------------------------------------------------------------------------------------------
@dataclass
class AppState:
    """What the routes share: the engine, the folded journal, the change feed, the token, the model and caps."""

    engine: Engine
    token: AccessToken
    index: RunIndex
    feed: ChangeFeed
    timing: StreamTiming
    recover: bool
    model: ServerModel | None = None
    caps: LimitCaps = field(default_factory=LimitCaps)
    redact: Redact | None = None  # what hides secrets in everything the API shows
    ready: asyncio.Event = field(default_factory=asyncio.Event)
    recovered: list[str] = field(default_factory=list)
    queue: LeaseStore | None = None  # serve --queue: POST /runs queues plans for the workers (server/queue.py)
    memory: MemoryAccess | None = None  # GET /memory: the journal's memory store (server/memory.py)
    stream_limits: StreamLimits = field(default_factory=StreamLimits)  # what one event stream holds (streams.py)


def _state(request: Request) -> AppState:
    state: AppState = request.app.state.planweave
    return state


State = Annotated[AppState, Depends(_state)]
_bearer = HTTPBearer(auto_error=False, description="The server's access token (printed by `planweave serve`).")


async def require_token(
    state: State, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]
) -> None:
    """Reject the request with 401 unless it carries ``Authorization: Bearer <the token>``."""
    if credentials is None or not state.token.matches(credentials.credentials):
        raise HTTPException(
            401,
            "missing or wrong access token: send 'Authorization: Bearer TOKEN' (printed by `planweave serve`)",
            headers={"WWW-Authenticate": "Bearer"},
        )


def _problems(exc: PlanInvalid) -> JSONResponse:
    body = ProblemReport(
        detail=str(exc), problems=[ProblemItem(step=p.step, field=p.field, message=p.message) for p in exc.problems]
    )
    return JSONResponse(body.model_dump(), status_code=422)


_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorMessage, "description": "Missing or wrong access token."},
    404: {"model": ErrorMessage, "description": "No such run."},
    409: {"model": ErrorMessage, "description": "The run is not in a state that allows this."},
    422: {"model": ProblemReport, "description": "The request or the plan is not valid: every problem is listed."},
}
_SSE: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "Server-sent events: `id:` journal position, `event:` kind, `data:` event JSON.",
        "content": {"text/event-stream": {"schema": {"type": "string"}}},
    }
}

api = APIRouter(dependencies=[Depends(require_token)], responses={401: _ERRORS[401]})
#: The largest journal position (a signed 64-bit integer in SQLite and PostgreSQL): a cursor or ``Last-Event-ID``
#: beyond it can name nothing stored, and would overflow the journal's query, so it is refused as invalid input.
POSITION_MAX = 2**63 - 1
LastEventId = Annotated[
    int | None,
    Header(alias="Last-Event-ID", ge=0, le=POSITION_MAX,
           description="Resume after this journal position (the last `id:` seen)."),
]


#: Posted plans are read and checked on these threads, two at a time at most (a plan read holds its whole document
#: meanwhile), never on the event loop that serves every run and stream: a 15 MB ``plan_yaml`` held it for 51 s.
_PLAN_READERS = ThreadPoolExecutor(max_workers=2, thread_name_prefix="planweave-plan-reader")
#: How long reading a posted ``plan_yaml`` may take, checked while it is read (bytes and values are bounded too:
#: :func:`~planweave.planfile.plan_document`); reading stops there and the POST gets its 422.
PLAN_READ_SECONDS = 10.0


async def _checked_plan(submission: RunSubmission, request: Request) -> PlanSpec:
    """The submitted plan with the plan file loader's document checks and the safe default step timeout, read off
    the event loop (:data:`_PLAN_READERS`).

    Like a plan file run from the CLI, a step with no timeout of its own and no plan ``defaults.timeout`` gets
    :data:`~planweave.core.plan.defaults.DEFAULT_STEP_TIMEOUT`; ``timeout: null`` keeps "no limit".
    """
    body = await request.body() if submission.plan is not None else None  # read once already: kept by Starlette
    return await asyncio.get_running_loop().run_in_executor(_PLAN_READERS, _read_plan, submission, body)


def _read_plan(submission: RunSubmission, body: bytes | None = None) -> PlanSpec:
    if body is not None:
        # A plan object as sent: the JSON parser that read the request kept the last of a key given twice.
        plan_document(body.decode("utf-8", "replace"), HTTP_SOURCE, as_json=True, time_limit=PLAN_READ_SECONDS,
                      field="plan")
    document = _plan_document(submission)
    if isinstance(document, dict):
        problems = document_problems(document)
        if problems:
            raise PlanInvalid(problems, HTTP_SOURCE)
    return with_default_timeout(parse_plan_document(document, HTTP_SOURCE))


def _plan_document(submission: RunSubmission) -> Any:
    if (submission.plan is None) == (submission.plan_yaml is None):
        raise PlanInvalid([PlanProblem("", "plan", "give exactly one of 'plan' (an object), 'plan_yaml' (text) or "
                                                   "'goal' (text)")], HTTP_SOURCE)
    if submission.plan is not None:
        return submission.plan
    # The plan file loader's reading: YAML 1.2 scalars, keys given twice refused, limits checked while reading.
    return plan_document(submission.plan_yaml or "", HTTP_SOURCE, time_limit=PLAN_READ_SECONDS, field="plan_yaml")


def _check_plan_limits(submission: RunSubmission, model: ServerModel | None) -> None:
    """Refuse limits a plan run cannot honour: re-plans (only goals re-plan), a budget without a model to bound."""
    problems = []
    if submission.max_replans is not None:
        problems.append(PlanProblem("", "max_replans", "only goals are re-planned: a plan run takes budget_usd, "
                                                       "budget_tokens and deadline"))
    for name in ("budget_usd", "budget_tokens"):
        if getattr(submission, name) is not None and model is None:
            problems.append(PlanProblem("", name, "a plan's budget limits its llm steps, and this server has no "
                                                  "model: start it with `planweave serve --model NAME`"))
    for name, given in (("context", submission.context is not None), ("subplans", not submission.subplans)):
        if given:
            problems.append(PlanProblem("", name, "only a goal run has a planner: a plan run takes budget_usd, "
                                                  "budget_tokens and deadline"))
    if submission.endpoint is not None and model is None:
        problems.append(PlanProblem("", "endpoint", "an endpoint is where a plan's llm steps call their model, and "
                                                    "this server has no model: start it with `planweave serve "
                                                    "--model NAME`"))
    if submission.tiers is not None and model is None:
        problems.append(PlanProblem("", "tiers", "tiers allocate a plan's llm steps saying model: auto, and this "
                                                 "server has no model: start it with `planweave serve --model NAME`"))
    if problems:
        raise PlanInvalid(problems, HTTP_SOURCE)


@api.post("/runs", status_code=201, response_model=RunAccepted,
          responses={409: _ERRORS[409], 422: _ERRORS[422]})
async def submit_run(state: State, submission: RunSubmission, request: Request, response: Response) -> RunAccepted:
    """Validate a plan and start running it (or plan a goal); 422 lists every problem, naming the step and field.

    Budgets, deadline and re-plans are bounded by the server's caps (a missing one gets the cap).
    """
    if state.queue is not None:  # serve --queue: recorded for the workers, which run it
        return await _queue_run(state, submission, request, response)
    limits = state.caps.bound(submission.limits(), HTTP_SOURCE)
    if submission.deadline_pressure is not None and limits.deadline is None:
        raise PlanInvalid([PlanProblem("", "deadline_pressure", "acts when the forecast of the time left falls below "
                                                                "it: give a deadline too")], HTTP_SOURCE)
    if submission.goal is not None:
        if submission.plan is not None or submission.plan_yaml is not None:
            raise PlanInvalid([PlanProblem("", "goal", "give a goal or a plan, not both")], HTTP_SOURCE)
        if state.model is None:
            raise PlanInvalid([PlanProblem("", "goal", "this server has no model to plan goals with: start it with "
                                                       "`planweave serve --model NAME`")], HTTP_SOURCE)
        if submission.tiers is not None:
            raise PlanInvalid([PlanProblem("", "tiers", "tiers allocate a plan's llm steps saying model: auto: "
                                                        "POST a plan, not a goal")], HTTP_SOURCE)
        run = await state.model.start_goal(submission.goal, submission.run_id, limits, submission.priority,
                                           context=submission.context, subplans=submission.subplans,
                                           pressure=submission.deadline_pressure,
                                           endpoint=state.model.policy.read(submission.endpoint))
    else:
        _check_plan_limits(submission, state.model)
        document = await _checked_plan(submission, request)
        if state.model is None:
            run = await state.engine.start(document, run_id=submission.run_id, source=HTTP_SOURCE,
                                           limits=limits.journaled(state.engine.clock.now(),
                                                                   pressure=submission.deadline_pressure),
                                           priority=submission.priority)
            watch_plan(state.engine, run, limits, threshold=submission.deadline_pressure)
        else:
            run = await state.model.start_plan(document, submission.run_id, HTTP_SOURCE, limits,
                                               submission.priority, tiers=checked_tiers(submission.tiers),
                                               pressure=submission.deadline_pressure,
                                               endpoint=state.model.policy.read(submission.endpoint))
        start_deadline(state.engine, run, limits)
    # 201 promises the run survives a crash of this server from now on: its run_created must be stored.
    await state.engine.journal.flush()
    response.headers["Location"] = f"/runs/{quote(run.id)}"
    return RunAccepted(run_id=run.id, status="running")


async def _queue_run(state: AppState, submission: RunSubmission, request: Request,
                     response: Response) -> RunAccepted:
    from planweave.server.queue import queue_plan
    from planweave.tools import builtin_tools

    assert state.queue is not None
    if submission.goal is not None:
        raise PlanInvalid([PlanProblem("", "goal", "this server queues plans for workers (--queue), which have no "
                                                   "planner: POST a plan")], HTTP_SOURCE)
    if submission.endpoint is not None:
        raise PlanInvalid([PlanProblem("", "endpoint", "the workers of a queue call their own endpoint (planweave "
                                                       "worker --base-url, --api-key-env, --header)")], HTTP_SOURCE)
    _check_plan_limits(submission, None)
    if submission.deadline_pressure is not None:
        raise PlanInvalid([PlanProblem("", "deadline_pressure", "the workers of a queue do not watch deadline "
                                                                "pressure (start the server without --queue to use "
                                                                "it)")], HTTP_SOURCE)
    rid = await queue_plan(state.queue, await _checked_plan(submission, request), submission.run_id,
                           state.engine.tools or builtin_tools(), dict(state.engine.capacities),
                           deadline=submission.deadline, priority=submission.priority)
    response.headers["Location"] = f"/queue/{quote(rid)}"
    return RunAccepted(run_id=rid, status="queued")


@api.get("/capabilities", response_model=dict[str, bool])
async def get_capabilities(state: State) -> dict[str, bool]:
    """What this server can do, for the dashboard: ``goals`` (it has a model to plan goals with: ``serve --model``)
    and ``queue`` (it queues plans for workers: ``serve --queue``; then ``GET /workers`` lists them)."""
    return {"goals": state.model is not None and state.queue is None, "queue": state.queue is not None}


@api.get("/workers", responses={404: _ERRORS[404]})
async def list_workers(state: State) -> dict[str, Any]:
    """The workers of the run queue (``serve --queue``), the runs each holds and their leases' ages."""
    if state.queue is None:
        raise HTTPException(404, "this server has no run queue: start it with `planweave serve --queue`")
    from planweave.server.queue import worker_listing

    return await worker_listing(state.queue)


@api.get("/queue/{run_id}", responses={404: _ERRORS[404]})
async def get_queued(state: State, run_id: str) -> dict[str, Any]:
    """A queued run's row: state (queued, running, done), holder, epoch, lease ages and outcome."""
    if state.queue is None:
        raise HTTPException(404, "this server has no run queue: start it with `planweave serve --queue`")
    from planweave.server.queue import queued_run

    return await queued_run(state.queue, run_id)


@api.get("/runs", response_model=list[dict[str, Any]], responses={422: _ERRORS[422]})
async def list_runs(
    state: State, response: Response,
    status: Annotated[list[str] | None, Query(description="Only runs in these statuses (repeat, or comma-separated):"
                                                          " running, interrupted, succeeded, failed, cancelled.")]
    = None,
    since: Annotated[str | None, Query(description="Only runs started since: an age (30m, 2h, 7d) or an ISO "
                                                   "date or time (UTC unless it says).")] = None,
    limit: Annotated[int | None, Query(ge=1, le=10_000, description="At most this many runs.")] = None,
    cursor: Annotated[int | None, Query(ge=0, le=POSITION_MAX,
                                       description="The `X-Next-Cursor` of the previous page.")] = None,
) -> list[dict[str, Any]]:
    """Runs of the journal, newest first, read from their summaries: id, plan, status, times, error and step
    counts by state; filtered by ``status`` and ``since``, paged by ``limit`` and ``cursor``.

    ``X-Next-Cursor`` (when there are more) is the ``cursor`` of the next page. ``X-Journal-Position`` is the
    position the list is current to: follow ``GET /events`` from there.
    """
    statuses = None if status is None else [s.strip() for item in status for s in item.split(",") if s.strip()]
    try:
        started = None if since is None else parse_since(since, time.time())
        rows, following, position = await list_overviews(
            state.engine.journal, functools.partial(_summary_status, state), statuses=statuses, since=started,
            limit=limit, cursor=cursor)
    except ValueError as exc:
        field = "query.since" if since is not None and "since" in str(exc) else "query.status"
        raise PlanInvalid([PlanProblem("", field, str(exc))], "GET /runs") from None
    response.headers["X-Journal-Position"] = str(position)  # read before the summaries: nothing missed
    if following is not None:
        response.headers["X-Next-Cursor"] = str(following)
    return _shown(state, rows)


def _summary_status(state: AppState, summary: RunSummary) -> str:
    """The status shown for a run summary: ``interrupted`` for a running run no live process runs."""
    if summary.status == "running" and owner_gone(summary.owner, state.engine, summary.run_id):
        return "interrupted"
    return summary.status


_Body = TypeVar("_Body")


def _shown(state: AppState, body: _Body) -> _Body:
    """``body`` with secrets as ``***``: a run going on here holds the plan as written, secrets included."""
    return cast(_Body, state.redact(body)) if state.redact is not None else body  # redact keeps the shape


_MEMORY_ERRORS: dict[int | str, dict[str, Any]] = {
    501: {"model": ErrorMessage, "description": "The server has no `memory` extra installed."},
}


def _memory(state: AppState) -> MemoryAccess:
    if state.memory is None:
        state.memory = MemoryAccess(state.engine.journal.url)
    return state.memory


@api.get("/memory", response_model=list[dict[str, Any]], responses={422: _ERRORS[422], **_MEMORY_ERRORS})
async def list_memory(
    state: State,
    status: Annotated[str | None, Query(description="Only entries in this status: candidate, admitted, rejected, "
                                                    "retired.")] = None,
) -> list[dict[str, Any]]:
    """The memory entries (lessons and skills), oldest first, as ``planweave memory list --json`` prints them: id,
    kind, name, version, status, uses, provenance (run and steps), created_at, text and body."""
    return _shown(state, await _memory(state).entries(status))


@api.get("/memory/{entry_id}", response_model=dict[str, Any],
         responses={404: {"model": ErrorMessage, "description": "No such entry."}, **_MEMORY_ERRORS})
async def get_memory(
    state: State, entry_id: Annotated[int, PathParam(ge=1, le=POSITION_MAX, description="The entry's id.")],
) -> dict[str, Any]:
    """One memory entry as ``planweave memory show --json`` prints it."""
    return _shown(state, await _memory(state).entry(entry_id))


async def _known(state: AppState, run_id: str) -> None:
    """Raise RunNotFound unless ``run_id`` has an event in the journal (one event read, not the journal folded)."""
    if active_run(state.engine, run_id) is not None:
        return
    if not await state.engine.journal.read(run_id, limit=1):
        raise RunNotFound(f"no run '{run_id}' in the journal")


@dataclass(frozen=True)
class _Found:
    """A run as the API sees it: running in this server (``run``), or folded from the journal."""

    state: RunState
    status: str
    run: Run | None


async def _find(state: AppState, run_id: str) -> _Found:
    """The run ``run_id``, live if it runs here; raises RunNotFound, or JournalError if it cannot be read."""
    run = active_run(state.engine, run_id)
    if run is not None:
        return _Found(run.state, run.state.status, run)
    await state.index.refresh()
    found = state.index.get(run_id)
    if found is None:
        raise RunNotFound(f"no run '{run_id}' in the journal")
    if found.state is None:
        raise JournalError(f"run '{run_id}': {found.problem}")
    return _Found(found.state, state.index.status(found), None)


async def _outputs(state: AppState, found: _Found) -> dict[str, Any]:
    if found.run is not None:
        return dict(found.run.outputs)
    return await stored_outputs(state.engine.journal, found.state)


@api.get("/runs/{run_id}", response_model=dict[str, Any], responses={404: _ERRORS[404]})
async def get_run(
    state: State, run_id: str,
    outputs: Annotated[bool, Query(description="Include `outputs` (each above 256 KiB replaced by a marker).")] = True,
) -> dict[str, Any]:
    """The run as ``planweave run --json`` prints it (folded from the journal unless it is running here), with
    ``outputs``: ``{step: output}`` of its succeeded steps (secrets shown as ``***``)."""
    found = await _find(state, run_id)
    values = await _outputs(state, found) if outputs else None
    report = run_report(found.state, found.status if found.run is None else None, values, state.redact)
    if found.run is not None:
        # A live run's report is its in-memory state: make what it says durable before saying it, so a crash right
        # after cannot take back a step this answer reported succeeded (the journal groups commits by a few ms).
        await state.engine.journal.flush()
    return _shown(state, report)


@api.get("/runs/{run_id}/subplans", response_model=dict[str, Any], responses={404: _ERRORS[404]})
async def get_subplans(state: State, run_id: str) -> dict[str, Any]:
    """The run's sub-plans (docs/subplans.md): ``parent`` (its parent link, null for a root run) and ``children``
    (each ``{run, step, depth, status, answer, error, children}``, nested), as ``planweave show`` lists them."""
    from planweave.runtree import parent_link, run_tree

    await _find(state, run_id)
    journal = state.engine.journal
    parent = parent_link(await journal.read(run_id, kind="run_created"))
    return _shown(state, {"parent": None if parent is None else dict(parent),
                          "children": await run_tree(journal, run_id)})


@api.get("/runs/{run_id}/steps/{step_id}", response_model=dict[str, Any], responses={404: _ERRORS[404]})
async def get_step(
    state: State, run_id: str, step_id: str,
    full: Annotated[bool, Query(description="The whole output, however big (default: a marker above 256 KiB).")]
    = False,
) -> dict[str, Any]:
    """One step: ``status``, ``attempts`` (each with its error), the rendered ``args``, ``output`` and ``error``.

    An output above 256 KiB is ``{"truncated": true, "bytes": N, "sha256": ...}`` unless ``full``; secrets are
    shown as ``***``. 404 names an unknown run or step.
    """
    found = await _find(state, run_id)
    rec = find_step(found.state, step_id)  # 404 before any read of the journal
    failures = await state.engine.journal.read(run_id, kind="step_failed")
    detail = step_detail(found.state, await _outputs(state, found), step_id, events=failures,
                         limit=None if full else DEFAULT_OUTPUT_LIMIT, redact=state.redact)
    if rec.status in ("waiting_approval", "waiting_input"):
        detail["prompt"] = rec.prompt
        detail["input_schema"] = rec.input_schema
    return detail


_REPLY_ERRORS: dict[int | str, dict[str, Any]] = {404: _ERRORS[404], 409: _ERRORS[409], 422: _ERRORS[422]}


def _replier(request: Request) -> str:
    """Who replies over HTTP, as the journal records it: the holder of the server's token, and from where."""
    return f"the API token's holder at {request.client.host if request.client is not None else 'an unknown address'}"


def _refused(state: AppState, exc: ReplyRefused) -> JSONResponse:
    """409 naming the reply that stands (``decision``: by, at, approve and reason or value, applied)."""
    return JSONResponse(_shown(state, {"detail": str(exc), "decision": exc.decision}), status_code=409)


@api.post("/runs/{run_id}/steps/{step_id}/approval", response_model=ReplyAccepted, responses=_REPLY_ERRORS)
async def approve_step(state: State, request: Request, run_id: str, step_id: str,
                       body: ApprovalReply) -> ReplyAccepted | JSONResponse:
    """Approve or reject a step waiting for approval, through the journal: applied at once if the run runs here,
    else by the process running it (within a second) or when the run resumes. The first reply is final: 409 names
    the one that stands (``decision``), as it does when the step is not waiting."""
    found = await _find(state, run_id)
    find_step(found.state, step_id)
    try:
        outcome = await send_approval(state.engine.journal, run_id, step_id, approve=body.approve,
                                      reason=body.reason, by=_replier(request), run=found.run)
    except ReplyRefused as exc:
        return _refused(state, exc)
    return ReplyAccepted(run_id=run_id, step=step_id, outcome=outcome)


@api.post("/runs/{run_id}/steps/{step_id}/input", response_model=ReplyAccepted, responses=_REPLY_ERRORS)
async def give_input(state: State, request: Request, run_id: str, step_id: str,
                     body: InputReply) -> ReplyAccepted | JSONResponse:
    """Give the value a ``human.input`` step waits for; 422 with the reason if it fails the step's schema (the step
    keeps waiting), 409 if the step is not waiting for a value or already has one (the first value is final:
    ``decision`` names it)."""
    found = await _find(state, run_id)
    find_step(found.state, step_id)
    try:
        outcome = await send_input(state.engine.journal, run_id, step_id, body.value, by=_replier(request),
                                   run=found.run)
    except ReplyRefused as exc:
        return _refused(state, exc)
    except InputRejected as exc:
        report = ProblemReport(detail=str(exc), problems=[ProblemItem(step=step_id, field="value", message=str(exc))])
        return JSONResponse(report.model_dump(), status_code=422)
    return ReplyAccepted(run_id=run_id, step=step_id, outcome=outcome)


@api.get("/runs/{run_id}/plan", response_model=dict[str, Any], responses={404: _ERRORS[404]})
async def get_plan(
    state: State, run_id: str,
    version: Annotated[int | None, Query(ge=1, description="Plan version (default: the current one).")] = None,
) -> dict[str, Any]:
    """The run's plan as a graph: steps with dependencies and status, the critical path, and the plan versions."""
    run = active_run(state.engine, run_id)
    if run is not None and version in (None, run.state.plan.version):  # the index is not needed: its state is here
        return _shown(state, plan_view(run.state, run.state.plan))
    await state.index.refresh()
    found = state.index.get(run_id)
    if run is not None:
        run_state = run.state
    elif found is None:
        raise RunNotFound(f"no run '{run_id}' in the journal")
    elif found.state is None:
        raise JournalError(f"run '{run_id}': {found.problem}")
    else:
        run_state = found.state
    plan = run_state.plan
    if version is not None and version != plan.version:
        earlier = found.plans.get(version) if found is not None else None
        if earlier is None:
            raise RunNotFound(f"run '{run_id}' has no plan version {version} (versions 1 to {plan.version})")
        plan = earlier
    return _shown(state, plan_view(run_state, plan))


@api.post("/runs/{run_id}/cancel", status_code=202, response_model=RunAccepted,
          responses={404: _ERRORS[404], 409: _ERRORS[409]})
async def cancel_run(
    state: State, run_id: str, body: Annotated[CancelRequest | None, Body()] = None
) -> RunAccepted:
    """Cancel the run: at once if it runs here, else through the journal (its process stops it within a second)."""
    reason = body.reason if body is not None else CancelRequest().reason
    run = active_run(state.engine, run_id)
    if run is not None:
        run.cancel(reason)
        await state.engine.journal.flush()
        return RunAccepted(run_id=run_id, status="cancelled")
    outcome = await request_cancel(state.engine.journal, run_id, reason)
    return RunAccepted(run_id=run_id, status="cancel_requested" if outcome == "requested" else "cancelled")


@api.post("/runs/{run_id}/resume", status_code=202, response_model=RunAccepted,
          responses={404: _ERRORS[404], 409: _ERRORS[409], 422: _ERRORS[422]})
async def resume_run(
    state: State, run_id: str, body: Annotated[ResumeRequest | None, Body()] = None
) -> RunAccepted:
    """Continue an interrupted or failed run here; finished steps keep their results."""
    if active_run(state.engine, run_id) is not None:
        raise RunError(f"run '{run_id}' is already running in this server")
    queued = await state.queue.leases(run_id) if state.queue is not None else []
    if queued and queued[0].state != "done":  # the workers resume it: here it would run beside them, unfenced
        raise RunError(f"run '{run_id}' belongs to the workers' queue ({queued[0].state}): a worker resumes it")
    await state.index.refresh()
    found = state.index.get(run_id)
    if found is None:
        raise RunNotFound(f"no run '{run_id}' in the journal")
    if found.state is not None and found.state.status == "running" and not owner_gone(found.owner, state.engine,
                                                                                        run_id):
        owner = found.owner
        raise RunError(f"run '{run_id}' is running in process {owner.get('pid')} on {owner.get('host')}: "
                       "cancel it there first, or wait for it to end")
    run = await resume_within_limits(state.engine, state.model, run_id,
                                     retry_unknown=body.retry_unknown if body is not None else False)
    await state.engine.journal.flush()
    return RunAccepted(run_id=run.id, status="running")


@api.get("/runs/{run_id}/events", response_class=StreamingResponse, responses={**_SSE, 404: _ERRORS[404]})
async def stream_run(state: State, run_id: str, last_event_id: LastEventId = None) -> StreamingResponse:
    """The run's events as server-sent events after ``Last-Event-ID``, then live; it ends after ``run_finished``."""
    await _known(state, run_id)
    stream = run_events(state.engine, state.engine.journal, state.feed, run_id, last_event_id or 0, state.timing,
                        state.stream_limits)
    return _sse(stream)


@api.get("/runs/{run_id}/agui", response_class=StreamingResponse, responses={**_SSE, 404: _ERRORS[404]})
async def stream_run_agui(state: State, run_id: str, last_event_id: Annotated[str | None, Header(
        alias="Last-Event-ID", pattern=AguiCursor.PATTERN, description="Resume after this `id:`.")] = None,
) -> StreamingResponse:
    """The run as an AG-UI 1.0 event stream after ``Last-Event-ID``, then live (docs/protocols.md, "AG-UI")."""
    await _known(state, run_id)
    return _sse(agui_events(state.engine, state.feed, run_id, AguiCursor.parse(last_event_id), state.timing,
                            state.stream_limits, state.redact))


@api.get("/events", response_class=StreamingResponse, responses=_SSE)
async def stream_all(state: State, last_event_id: LastEventId = None) -> StreamingResponse:
    """Every run's events as server-sent events after ``Last-Event-ID``, then live (for the runs list)."""
    return _sse(all_events(state.engine.journal, state.feed, last_event_id or 0, state.timing, state.stream_limits))


@api.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def metrics() -> Response:
    """Model-call admission per endpoint (queue length, waits, window, signals) in the Prometheus text format."""
    from planweave.server.metrics import CONTENT_TYPE, metrics_text

    return Response(metrics_text(), media_type=CONTENT_TYPE)


def _sse(stream: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        stream, media_type="text/event-stream", headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
    )


# -- the app ----------------------------------------------------------------------------------------------------
class _SecurityHeaders:
    """Adds headers that keep the dashboard's page from loading anything but its own files, or being framed."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers += [
                    (b"x-content-type-options", b"nosniff"),
                    (b"referrer-policy", b"no-referrer"),
                    (b"x-frame-options", b"DENY"),
                    (b"content-security-policy",
                     b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'"),
                ]
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    state: AppState = app.state.planweave
    if state.recover:
        try:
            state.recovered = await recover_orphans(
                state.engine, state.index, lambda run_id: resume_within_limits(state.engine, state.model, run_id))
        except Exception as exc:  # a damaged journal must not keep the API (and its diagnosis) from coming up
            log.error("could not look for interrupted runs to resume: %s", exc)
    state.ready.set()
    try:
        yield
    finally:
        state.feed.close()
        if state.memory is not None:
            await state.memory.close()


#: The status of an error a route raises, by its class (a subclass takes its nearest listed base's status; the
#: errors that carry plan problems answer 422 with them instead: see the handlers in :func:`create_app`).
_STATUS_OF: dict[type[Exception], int] = {
    RunNotFound: 404, StepNotFound: 404, UnknownEntry: 404,  # no such run, step, or memory entry
    RunError: 409,  # the run is not in a state that allows it (ended, already running, not waiting)
    MissingExtra: 501,  # the feature's optional dependency is not installed here
    JournalError: 503, MemoryStoreError: 503,  # the store behind it failed
}


async def _detail(request: Request, exc: Exception) -> JSONResponse:
    status = next(_STATUS_OF[cls] for cls in type(exc).__mro__ if cls in _STATUS_OF)
    return JSONResponse({"detail": str(exc)}, status_code=status)


def create_app(
    engine: Engine, token: str | AccessToken, *, recover: bool = True, timing: StreamTiming | None = None,
    model: ServerModel | None = None, caps: LimitCaps | None = None, queue: LeaseStore | None = None,
    memory_url: str | None = None, stream_limits: StreamLimits | None = None,
) -> FastAPI:
    """The planweave HTTP API and dashboard around an open ``engine``, accepting only ``token``.

    With ``recover``, startup resumes the runs submitted over HTTP that the journal shows running but whose process
    is gone (a server restart). Create the app before starting runs on ``engine``: its listener only sees runs
    started after it subscribed (streams of older runs still work: they subscribe to the run itself). ``model``
    plans goals and serves the ``llm`` steps of plans; ``caps`` bound every run's limits. ``memory_url`` is
    the journal URL ``GET /memory`` opens the memory store from (default: the journal's, which for PostgreSQL has
    no password: pass the URL the journal was opened with). ``stream_limits`` bound what each event stream holds.
    """
    access = token if isinstance(token, AccessToken) else AccessToken(token)
    if not access.value:
        raise ServerError("the access token is empty")
    state = AppState(engine, access, RunIndex(engine.journal, engine), ChangeFeed(), timing or StreamTiming(),
                     recover, model, caps or LimitCaps(), _redaction(engine), queue=queue,
                     memory=MemoryAccess(memory_url) if memory_url else None,
                     stream_limits=stream_limits or StreamLimits())
    engine.subscribe(state.feed.notify)
    app = FastAPI(
        title="planweave",
        version=__version__,
        description="Submit, follow, cancel and resume planweave runs.",
        docs_url=None,  # Swagger UI and ReDoc load from a CDN: the dashboard serves nothing from elsewhere
        redoc_url=None,
        openapi_url="/openapi.json",
        lifespan=_lifespan,
    )
    app.state.planweave = state
    app.add_middleware(_SecurityHeaders)

    @app.exception_handler(PlanInvalid)
    async def _plan_invalid(request: Request, exc: PlanInvalid) -> JSONResponse:
        return _problems(exc)

    @app.exception_handler(RequestValidationError)
    async def _request_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = [
            PlanProblem("", ".".join(str(p) for p in err.get("loc", ())), str(err.get("msg", "invalid")))
            for err in exc.errors()
        ]
        return _problems(PlanInvalid(problems, f"{request.method} {request.url.path}"))

    for kind in _STATUS_OF:
        app.add_exception_handler(kind, _detail)

    @app.exception_handler(EventNotRecorded)
    async def _not_recordable(request: Request, exc: EventNotRecorded) -> JSONResponse:
        # The request's own data cannot be stored (the journal is fine): 422, like any other invalid input.
        return _problems(PlanInvalid([PlanProblem("", "body", str(exc))], f"{request.method} {request.url.path}"))

    @app.get("/healthz", response_model=dict[str, str])
    async def healthz() -> dict[str, str]:
        """Liveness: no token needed, nothing about the runs."""
        return {"status": "ok", "version": __version__}

    @app.get("/", include_in_schema=False)
    async def dashboard() -> FileResponse:
        return FileResponse(STATIC_DIR / "index.html", headers={"Cache-Control": "no-cache"})

    @app.get("/favicon.ico", include_in_schema=False)
    async def favicon() -> FileResponse:
        return FileResponse(STATIC_DIR / "favicon.svg", media_type="image/svg+xml")

    if installed("a2a"):  # /a2a and the agent card: these runs over A2A (docs/protocols.md, "A2A")
        from planweave.server.a2a import mount_a2a
        mount_a2a(app, submit_run, RunSubmission)
    app.include_router(api)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    from planweave.server.mcp import mount_mcp  # /mcp: these runs over MCP (docs/protocols.md, "MCP")
    mount_mcp(app)
    return app


def _redaction(engine: Engine) -> Redact | None:
    """The engine's :class:`SecretRedactor` (it also hides the keys and headers' values of the runs' model
    endpoints, as they are opened), else :func:`shown_redaction`."""
    return engine.redact if isinstance(engine.redact, SecretRedactor) else shown_redaction()


def shown_redaction() -> Redact | None:
    """What hides this process's secrets (:func:`~planweave.tools.safety.secret_values`) in what the API shows."""
    secrets = secret_values()
    return functools.partial(redact, secrets=secrets) if secrets else None


def telemetry_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the standard OpenTelemetry variables ask for traces (``OTEL_TRACES_EXPORTER`` other than ``none``)."""
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = {e.strip().lower() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()}
    return bool(exporters - {"none"})


def redact_url(url: str) -> str:
    """``url`` without its password (journal URLs may carry one)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _announce(server: LiveServer, token: AccessToken, journal_url: str, out: TextIO) -> None:
    lines = [f"planweave {__version__} serving {server.url} (journal {redact_url(journal_url)})"]
    if token.origin == "generated":
        lines.append(f"access token (shown only now; kept in {token.path}, mode 0600): {token.value}")
        lines.append(f"dashboard: {server.url}#token={token.value}")
    elif token.origin == "file":
        lines.append(f"access token: in {token.path}")
    elif token.origin == "env":
        lines.append("access token: from $PLANWEAVE_TOKEN")
    else:
        lines.append("access token: as given")
    if server.host not in _LOOPBACK:
        lines.append(f"warning: listening on {server.host}, not only this machine: whoever has the token can run "
                     "any tool (shell, python) here")
    if server.recovered:
        lines.append("resumed interrupted runs: " + ", ".join(server.recovered))
    out.write("\n".join(lines) + "\n")
    out.flush()


@asynccontextmanager
async def serving(
    engine: Engine,
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | AccessToken | None = None,
    journal_url: str | None = None,
    recover: bool = False,
    handle_signals: bool = False,
    announce: bool = True,
    out: TextIO | None = None,
    quiet: bool = False,
    model: ServerModel | None = None,
    caps: LimitCaps | None = None,
    queue: LeaseStore | None = None,
    connections: ConnectionLimits | None = None,
) -> AsyncIterator[LiveServer]:
    """Serve the API and dashboard for an open ``engine`` while the block runs (``planweave run --watch``).

    ``token`` None resolves it as :func:`~planweave.server.tokens.resolve_token` does. With ``announce`` the URL
    (and a newly generated token, once) is printed on ``out`` (default stdout; pass stderr next to ``--json``).
    ``quiet`` keeps uvicorn's logging out of the terminal (no access log, logging configuration untouched), for a
    CLI that draws its own live view. ``connections`` bounds the clients' connections (:class:`ConnectionLimits`).
    Start runs inside the block, after the app exists.
    """
    url = journal_url or engine.journal.url
    access = token if isinstance(token, AccessToken) else resolve_token(token, url)
    app = create_app(engine, access, recover=recover, model=model, caps=caps, queue=queue, memory_url=url)
    log_config = None if quiet else uvicorn.config.LOGGING_CONFIG
    async with LiveServer(app, host, port, handle_signals=handle_signals, log_config=log_config,
                          access_log=not quiet, connections=connections) as server:
        if announce:
            _announce(server, access, url, out if out is not None else sys.stdout)
        yield server


async def serve(
    host: str = "127.0.0.1",
    port: int = 8765,
    journal: str | None = None,
    token: str | None = None,
    *,
    tools: ToolCatalog | None = None,
    concurrency: int | None = None,
    capacities: Mapping[str, int] | None = None,
    telemetry: bool | None = None,
    model: str | None = None,
    base_url: str | None = None,
    endpoint: Endpoint | None = None,
    endpoint_policy: EndpointPolicy | None = None,
    caps: LimitCaps | None = None,
    queue: bool = False,
    cache: bool = True,
    connections: ConnectionLimits | None = None,
) -> None:
    """``planweave serve``: open the journal and an engine, serve until SIGINT/SIGTERM, then close both cleanly.

    ``cache=False`` (``--no-cache``): no step of this server's runs reuses a cached output (docs/caching.md).

    ``queue`` (a PostgreSQL journal): POST /runs queues plans for ``planweave worker`` processes instead of running
    them here, and this server resumes nothing at startup (the workers take interrupted runs over).

    ``endpoint`` (with ``base_url``) is where ``model`` is called; ``endpoint_policy`` the other endpoints a
    request may ask for (default: only that one; :mod:`planweave.server.endpoints`). ``caps`` bound the budget,
    deadline and re-plans of every run submitted (:class:`LimitCaps`); ``connections``
    the clients' connections (request and stall timeouts, how many at once: :class:`ConnectionLimits`).
    Runs submitted over HTTP and interrupted by a previous stop are resumed at startup. Runs still going at the stop
    are interrupted, not cancelled: the next start resumes them. ``telemetry`` None follows the OpenTelemetry
    environment variables (:func:`telemetry_from_env`). Raises :class:`ServerError` or
    :class:`~planweave.server.tokens.TokenError` before serving if it cannot.
    """
    url = journal or default_journal_url()
    access = resolve_token(token, url)
    provider: Any = None
    meters: Any = None  # the GenAI metrics, when OTEL_METRICS_EXPORTER asks too (docs/protocols.md)
    if telemetry_from_env() if telemetry is None else telemetry:
        from planweave.server.telemetry import meter_provider_from_env, tracer_provider_from_env

        provider, meters = tracer_provider_from_env(), meter_provider_from_env()
    try:
        async with contextlib.AsyncExitStack() as stack:
            engine = await stack.enter_async_context(
                open_engine(url, tools=tools, concurrency=concurrency or DEFAULT_CONCURRENCY, capacities=capacities,
                            redact=SecretRedactor(), cache=cache))  # secrets stay out of outputs, errors and plans
            if provider is not None:
                from planweave.server.telemetry import instrument

                instrument(engine, provider, meters)
            server_model = await open_server_model(stack, engine, model, base_url, endpoint=endpoint,
                                                   policy=endpoint_policy) if model else None
            store = await _open_queue(stack, url) if queue else None
            async with serving(engine, host=host, port=port, token=access, journal_url=url, recover=not queue,
                               handle_signals=True, model=server_model, caps=caps, queue=store,
                               connections=connections) as server:
                await server.wait()
    finally:
        if provider is not None:
            provider.shutdown()  # after the engine: the spans of interrupted runs are ended by then
        if meters is not None:
            meters.shutdown()


async def _open_queue(stack: contextlib.AsyncExitStack, url: str) -> LeaseStore:
    """The run queue of the PostgreSQL journal at ``url`` (closed with ``stack``); ServerError for another journal."""
    if not url.startswith(("postgresql://", "postgres://")):
        raise ServerError(f"--queue needs a postgresql:// journal that the workers share, got {redact_url(url)}")
    from planweave.journal.leases import LeaseStore

    store = await LeaseStore.open(url)
    stack.push_async_callback(store.close)
    return store
