"""The rollout gateway: planweave serves a session-scoped OpenAI-compatible endpoint in front of the policy server and
records one :class:`~planweave.rollouts.samples.Sample` per model call, with the server's own token ids.

    async with Gateway("http://127.0.0.1:8000/v1", dialect="vllm") as gateway:
        session = gateway.open_session("ep-7", episode=7)
        endpoint = session.endpoint()   # base_url .../sessions/ep-7/v1 with the session's own key
        ...                              # any OpenAI client on that endpoint: each call becomes a sample
        samples = gateway.close_session("ep-7")

``POST /sessions/{session}/v1/chat/completions`` is forwarded to ``{upstream}/chat/completions`` (never streamed
upstream: a streaming caller gets the whole reply as one SSE delta, then the finish and usage chunks), asking the
server for token ids and the sampled tokens' logprobs in its dialect (:data:`Dialect`). Who called (run, step, plan
version, purpose) comes from the ``X-Planweave-*`` headers planweave's own client adds per call
(:func:`tagging_http`); an unmodified agent's calls are role ``other``. The policy version is the upstream's
``X-Policy-Version`` response header, else the request's ``X-Policy-Version``, else the gateway's at call start.

A policy update (:meth:`Gateway.set_version`) issues again, on the new policy, every call in flight whose version
falls below ``floor`` (a partial rollout's re-sampled call: the caller only sees a slower answer).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Self

import httpx

from planweave.core.errors import PlanweaveError
from planweave.extras import require
from planweave.models.endpoint import Endpoint
from planweave.rollouts.asgi import serve_app
from planweave.rollouts.samples import Sample, role_of

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

    from planweave.engine.runtime import Engine

Dialect = Literal["vllm", "llama-cpp-python", "openai"]
"""How the upstream gives token ids:

- ``vllm``: ``return_token_ids: true`` (vLLM ≥ 0.10.2) answers ``prompt_token_ids`` and ``choices[0].token_ids``, the
  ids it sampled; ``logprobs: true`` the sampled token's logprob per token.
- ``llama-cpp-python``: its chat endpoint returns logprobs with each sampled token's *text* but no ids, and renders
  the chat template server-side. Completion ids are the server's own tokenisation of the reply
  (``/extras/tokenize``), kept only when it has exactly the sampled tokens (as many, the same text each:
  ``ids_from = "tokenize-checked"``), else None with the reason. Prompt ids need the server's chat format
  (``chat_format=``, :data:`CHAT_FORMATS`: ``gemma``, the local model's): the gateway renders the messages as that
  format does, the server tokenises the text (``/extras/tokenize``, with BOS, as its chat handler does), and the ids
  are kept only when they are as many as the server says it read (``usage.prompt_tokens``): ``prompt_ids_from =
  "rendered-checked"``; without a chat format, or when the count differs, None (``token_ids_missing`` says why).
- ``openai``: no ids at all (None, with the reason); logprobs if the server returns them.
"""

DIALECTS: tuple[Dialect, ...] = ("vllm", "llama-cpp-python", "openai")


def _render_gemma(messages: list[Mapping[str, Any]]) -> str:
    """llama-cpp-python's ``gemma`` chat format (``llama_chat_format.format_gemma``): user and assistant turns only
    (it drops system messages), then the model's turn opened."""
    roles = {"user": "<start_of_turn>user\n", "assistant": "<start_of_turn>model\n"}
    text = ""
    for message in messages:
        role, content = message.get("role"), message.get("content")
        if role in roles:
            text += roles[str(role)] + (content + "<end_of_turn>\n" if isinstance(content, str) and content else "")
    return text + roles["assistant"]


CHAT_FORMATS: dict[str, Callable[[list[Mapping[str, Any]]], str]] = {"gemma": _render_gemma}
"""llama-cpp-python chat formats the gateway can render to get prompt ids (``Gateway(chat_format=...)``)."""
POLICY_HEADER = "X-Policy-Version"
RUN_HEADER = "X-Planweave-Run"
STEP_HEADER = "X-Planweave-Step"
PURPOSE_HEADER = "X-Planweave-Purpose"
PLAN_VERSION_HEADER = "X-Planweave-Plan-Version"


class GatewayError(PlanweaveError):
    """The gateway cannot be used as asked (an unknown session or dialect); the message names it."""


@dataclass(slots=True)
class _Call:
    version: int
    task: asyncio.Task[httpx.Response]


@dataclass(slots=True)
class Session:
    """One episode's endpoint on the gateway: its URL and key, and the samples of its calls so far."""

    name: str
    episode: int
    base_url: str
    key: str = field(repr=False)
    on_sample: Callable[[Sample], None] | None = None
    samples: list[Sample] = field(default_factory=list)
    in_flight: dict[int, _Call] = field(default_factory=dict)
    closed: bool = False

    def endpoint(self, headers: Mapping[str, str] | None = None) -> Endpoint:
        """The :class:`~planweave.models.endpoint.Endpoint` of this session (its URL, its own key, ``headers``)."""
        return Endpoint(self.base_url, api_key=self.key, headers=tuple((headers or {}).items()))

    def oldest_in_flight(self) -> int | None:
        """The oldest policy version among the calls in flight (None: none)."""
        return min((c.version for c in self.in_flight.values()), default=None)


class Gateway:
    """The session-scoped OpenAI-compatible endpoint in front of the policy server ``upstream`` (its ``/v1`` base
    URL); see the module docstring. ``api_key`` is the upstream's key (sessions have their own); ``model`` replaces
    the model name callers send (None: theirs). ``version`` is the policy version calls start with."""

    def __init__(self, upstream: str, *, dialect: Dialect = "vllm", api_key: str | None = None,
                 model: str | None = None, version: int = 0, timeout: float = 600.0,
                 host: str = "127.0.0.1", port: int = 0, chat_format: str | None = None) -> None:
        if dialect not in DIALECTS:
            raise GatewayError(f"gateway dialect {dialect!r} is not one of {', '.join(DIALECTS)}")
        if chat_format is not None and chat_format not in CHAT_FORMATS:
            raise GatewayError(f"gateway chat_format {chat_format!r} is not one the gateway can render "
                               f"({', '.join(CHAT_FORMATS)})")
        self.chat_format = chat_format
        require("server", "the rollout gateway")
        self.upstream = upstream.rstrip("/")
        self.dialect: Dialect = dialect
        self.model = model
        self.version = version
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._timeout = timeout
        self._host, self._port = host, port
        self._sessions: dict[str, Session] = {}
        self._http: httpx.AsyncClient | None = None
        self._stack = contextlib.AsyncExitStack()
        self._calls = 0
        self._bos_known = False
        self._bos_id: int | None = None
        self.base_url = ""

    # -- lifecycle ---------------------------------------------------------------------------------------------------
    async def __aenter__(self) -> Self:
        from starlette.applications import Starlette
        from starlette.routing import Route

        app = Starlette(routes=[
            Route("/sessions/{session}/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/sessions/{session}/v1/models", self._models, methods=["GET"]),
        ])
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(self._timeout, connect=10.0),
                                       limits=httpx.Limits(max_connections=None, max_keepalive_connections=256))
        self._stack = contextlib.AsyncExitStack()
        self._stack.push_async_callback(self._http.aclose)
        self.base_url = await self._stack.enter_async_context(
            serve_app(app, host=self._host, port=self._port, what="the rollout gateway"))
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        for name in list(self._sessions):
            self.close_session(name)
        await self._stack.aclose()

    # -- sessions ----------------------------------------------------------------------------------------------------
    def open_session(self, name: str, *, episode: int, on_sample: Callable[[Sample], None] | None = None) -> Session:
        """A new session ``name`` for ``episode`` with a key of its own; ``on_sample`` sees each sample recorded."""
        if not self.base_url:
            raise GatewayError("the gateway is not started: use it as 'async with Gateway(...)'")
        if name in self._sessions:
            raise GatewayError(f"gateway session {name!r} is already open")
        if not name or "/" in name:
            raise GatewayError(f"gateway session name {name!r} must be non-empty and contain no '/'")
        session = Session(name, episode, f"{self.base_url}/sessions/{name}/v1", secrets.token_urlsafe(24),
                          on_sample)
        self._sessions[name] = session
        return session

    def close_session(self, name: str) -> list[Sample]:
        """Close session ``name`` (its later calls get 404; calls in flight are cancelled) and return its samples."""
        session = self._sessions.pop(name, None)
        if session is None:
            raise GatewayError(f"gateway session {name!r} is not open")
        session.closed = True
        for call in session.in_flight.values():
            call.task.cancel()
        return list(session.samples)

    def set_version(self, version: int, *, floor: int | None = None) -> int:
        """Serve new calls as policy ``version``; calls in flight older than ``floor`` are issued again on it.
        Returns how many were."""
        self.version = version
        again = 0
        if floor is not None:
            for session in self._sessions.values():
                for call in list(session.in_flight.values()):
                    if call.version < floor:
                        call.task.cancel()
                        again += 1
        return again

    @property
    def calls(self) -> int:
        """Model calls answered so far."""
        return self._calls

    # -- the routes --------------------------------------------------------------------------------------------------
    def _session_of(self, request: Request) -> Session | Response:
        from starlette.responses import JSONResponse

        name = str(request.path_params["session"])
        session = self._sessions.get(name)
        if session is None:
            return JSONResponse({"error": {"message": f"no open rollout session {name!r}", "type": "not_found"}},
                                status_code=404)
        if request.headers.get("authorization", "") != f"Bearer {session.key}":
            return JSONResponse({"error": {"message": f"rollout session {name!r}: wrong or missing key",
                                           "type": "authentication_error"}}, status_code=401)
        return session

    async def _models(self, request: Request) -> Response:
        from starlette.responses import JSONResponse, Response

        session = self._session_of(request)
        if not isinstance(session, Session):
            return session
        assert self._http is not None
        upstream = await self._http.get(f"{self.upstream}/models", headers=self._headers)
        if upstream.status_code != 200:
            return Response(upstream.content, upstream.status_code, media_type="application/json")
        return JSONResponse(upstream.json())

    async def _chat(self, request: Request) -> Response:
        from starlette.responses import JSONResponse, Response

        session = self._session_of(request)
        if not isinstance(session, Session):
            return session
        from starlette.requests import ClientDisconnect

        try:
            body = json.loads(await request.body())
            if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
                raise ValueError("a chat completion request has 'messages'")
        except ClientDisconnect:  # the caller gave up (cancelled) while sending: nobody to answer
            return Response(status_code=499)
        except ValueError as exc:
            return JSONResponse({"error": {"message": f"bad request: {exc}", "type": "invalid_request_error"}},
                                status_code=400)
        streaming = bool(body.get("stream"))
        forwarded = self._upstream_body(body)
        asked_version = _int_header(request.headers.get(POLICY_HEADER))
        resampled = 0
        while True:  # a call a policy update left too old is issued again on the new policy
            version = asked_version if asked_version is not None else self.version
            assert self._http is not None
            task = asyncio.ensure_future(self._http.post(f"{self.upstream}/chat/completions", json=forwarded,
                                                         headers=self._headers))
            key = id(task)
            session.in_flight[key] = _Call(version, task)
            try:
                upstream = await task
            except asyncio.CancelledError:
                current = asyncio.current_task()
                if current is not None and current.cancelling():
                    raise
                if session.closed:  # the episode ended (dropped, cancelled): nobody waits for this answer
                    return JSONResponse({"error": {"message": f"rollout session {session.name!r} closed",
                                                   "type": "not_found"}}, status_code=404)
                resampled += 1
                asked_version = None  # the update moved the version: the new call is the gateway's
                continue
            except httpx.HTTPError as exc:
                return JSONResponse({"error": {"message": f"policy server {self.upstream}: {type(exc).__name__}: "
                                               f"{exc}", "type": "upstream_error"}}, status_code=502)
            finally:
                session.in_flight.pop(key, None)
            break
        if upstream.status_code != 200:  # passed through: the caller's own fallbacks (json_schema, retries) apply
            return Response(upstream.content, upstream.status_code,
                            media_type=upstream.headers.get("content-type", "application/json"))
        reply = upstream.json()
        served = _int_header(upstream.headers.get(POLICY_HEADER))
        sample = await self._sample(session, request, body, reply, served if served is not None else version,
                                    resampled)
        if session.closed:
            return JSONResponse({"error": {"message": f"rollout session {session.name!r} closed",
                                           "type": "not_found"}}, status_code=404)
        session.samples.append(sample)
        self._calls += 1
        if session.on_sample is not None:
            session.on_sample(sample)
        headers = {POLICY_HEADER: str(sample.policy_version)}
        if not streaming:
            return JSONResponse(reply, headers=headers)
        return _sse_reply(reply, body, headers)

    # -- dialects ----------------------------------------------------------------------------------------------------
    def _upstream_body(self, body: Mapping[str, Any]) -> dict[str, Any]:
        out = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
        if self.model is not None:
            out["model"] = self.model
        out["logprobs"] = True
        if self.dialect == "vllm":
            out["return_token_ids"] = True
        elif self.dialect == "llama-cpp-python":
            # its chat endpoint returns logprobs only with top_logprobs >= 1 (it passes top_logprobs as the count)
            out["top_logprobs"] = max(1, int(body.get("top_logprobs") or 0))
        return out

    async def _sample(self, session: Session, request: Request, body: Mapping[str, Any], reply: Mapping[str, Any],
                      version: int, resampled: int) -> Sample:
        choice = (reply.get("choices") or [{}])[0]
        message = choice.get("message") or {}
        text = message.get("content") or ""
        items = [i for i in ((choice.get("logprobs") or {}).get("content") or []) if isinstance(i, dict)]
        logprobs = tuple(float(i["logprob"]) for i in items) if items and all(
            isinstance(i.get("logprob"), int | float) for i in items) else None
        prompt_ids: tuple[int, ...] | None = None
        completion_ids: tuple[int, ...] | None = None
        missing: str | None = None
        if self.dialect == "vllm":
            prompt_ids = _int_list(reply.get("prompt_token_ids"))
            completion_ids = _int_list(choice.get("token_ids"))
            if prompt_ids is None or completion_ids is None:
                missing = ("the policy server ignored return_token_ids (vLLM >= 0.10.2 returns prompt_token_ids and "
                           "choices[0].token_ids)")
                prompt_ids = completion_ids = None
        elif self.dialect == "llama-cpp-python":
            completion_ids, why = await self._llama_completion_ids(text, [str(i.get("token", "")) for i in items])
            prompt_ids, why_prompt = await self._llama_prompt_ids(list(body.get("messages") or ()), reply)
            missing = "; ".join(w for w in (why_prompt, why) if w) or None
        else:
            missing = "the 'openai' dialect returns no token ids"
        if logprobs is not None and completion_ids is not None and len(logprobs) != len(completion_ids):
            missing = (missing + "; " if missing else "") + (
                f"{len(logprobs)} logprobs for {len(completion_ids)} completion tokens: logprobs dropped")
            logprobs = None
        plan_version = _int_header(request.headers.get(PLAN_VERSION_HEADER))
        purpose = request.headers.get(PURPOSE_HEADER)
        return Sample(
            episode=session.episode, index=len(session.samples), session=session.name,
            run=request.headers.get(RUN_HEADER), plan_version=plan_version, step=request.headers.get(STEP_HEADER),
            role=role_of(purpose), messages=tuple(m for m in body.get("messages", ()) if isinstance(m, dict)),
            text=text, finish_reason=choice.get("finish_reason"), policy_version=version,
            prompt_token_ids=prompt_ids, completion_token_ids=completion_ids, logprobs=logprobs,
            token_ids_missing=missing, dialect=self.dialect, resampled=resampled,
            ids_from=None if completion_ids is None else (
                "server" if self.dialect == "vllm" else "tokenize-checked"),
            prompt_ids_from=None if prompt_ids is None else (
                "server" if self.dialect == "vllm" else "rendered-checked"))

    async def _llama_prompt_ids(self, messages: list[Mapping[str, Any]], reply: Mapping[str, Any]
                                ) -> tuple[tuple[int, ...] | None, str | None]:
        """The server's tokenisation of the prompt as its chat format renders it, if it has as many tokens as the
        server read, else why not."""
        if self.chat_format is None:
            return None, ("llama-cpp-python renders the chat template server-side and returns no prompt ids (give "
                          "the gateway its chat_format to render it)")
        assert self._http is not None
        root = self.upstream.removesuffix("/v1")
        answer = await self._http.post(f"{root}/extras/tokenize",
                                       json={"input": CHAT_FORMATS[self.chat_format](messages)}, headers=self._headers)
        ids = _int_list(answer.json().get("tokens")) if answer.status_code == 200 else None
        if ids is None:
            return None, f"/extras/tokenize answered HTTP {answer.status_code} for the prompt: prompt ids not given"
        read = (reply.get("usage") or {}).get("prompt_tokens")
        if read != len(ids):
            return None, (f"the prompt rendered as {self.chat_format} tokenises to {len(ids)} tokens where the server "
                          f"read {read}: prompt ids not given")
        return ids, None

    async def _llama_completion_ids(self, text: str, pieces: list[str]) -> tuple[tuple[int, ...] | None, str | None]:
        """The server's tokenisation of ``text`` if it is exactly the sampled tokens ``pieces``, else why not."""
        if not pieces:
            return None, "no logprobs returned, so the sampled tokens are unknown: completion ids not given"
        assert self._http is not None
        root = self.upstream.removesuffix("/v1")
        answer = await self._http.post(f"{root}/extras/tokenize", json={"input": text}, headers=self._headers)
        if answer.status_code != 200:
            return None, f"/extras/tokenize answered HTTP {answer.status_code}: completion ids not given"
        ids = _int_list(answer.json().get("tokens"))
        if ids is None:
            return None, "/extras/tokenize gave no token list: completion ids not given"
        if ids and ids[0] == await self._bos(root):  # tokenize adds BOS; the completion has none
            ids = ids[1:]
        if len(ids) != len(pieces) or "".join(pieces) != text:
            return None, (f"the reply's text tokenises to {len(ids)} tokens where {len(pieces)} were sampled: "
                          f"completion ids not given")
        return ids, None

    async def _bos(self, root: str) -> int | None:
        if not self._bos_known:
            assert self._http is not None
            answer = await self._http.post(f"{root}/extras/tokenize", json={"input": ""}, headers=self._headers)
            found = _int_list(answer.json().get("tokens")) if answer.status_code == 200 else None
            self._bos_id, self._bos_known = (found[0] if found else None), True
        return self._bos_id


def _sse_reply(reply: Mapping[str, Any], body: Mapping[str, Any], headers: Mapping[str, str]) -> Response:
    """A whole reply as an OpenAI chat completion stream: the text in one delta, the finish, usage if asked."""
    from starlette.responses import StreamingResponse

    choice = (reply.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    base = {"id": reply.get("id", "chatcmpl-gateway"), "object": "chat.completion.chunk",
            "created": reply.get("created", 0), "model": reply.get("model", body.get("model", ""))}
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    chunks = [{**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": choice.get("finish_reason")}]}]
    if (body.get("stream_options") or {}).get("include_usage") and reply.get("usage"):
        chunks.append({**base, "choices": [], "usage": reply["usage"]})

    async def events() -> AsyncIterator[bytes]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    return StreamingResponse(events(), media_type="text/event-stream", headers=dict(headers))


def _int_header(value: str | None) -> int | None:
    try:
        return None if value is None else int(value)
    except ValueError:
        return None


def _int_list(value: Any) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        return None
    return tuple(value)


def caller(roots: Callable[[str], bool] | None = None) -> tuple[str | None, str | None, str]:
    """Who makes the model call about to go out in this task: (run, step, purpose).

    The planning loop marks its calls with a call context (``models.admission.call_context``) and a step's tool call
    runs in the step's context. But a step's task is created wherever the engine dispatched it, so it may inherit a
    planner's call context, of its own run or of another one sharing the engine: a step wins over a call context of
    its own run, and over one of another episode's root run (``roots`` tells them: a sub-goal's child run is never
    one). A call context of another run that is not a root is a child run's planner inside the step: it wins."""
    from planweave.core.context import current_step
    from planweave.models.admission import call_class

    call = call_class()  # the call context if one is set, else the running step's, else an untagged call
    try:
        step = current_step()
    except LookupError:
        return call.run_id, call.step_id, call.purpose
    inherited = call.run_id is None or call.run_id == step.run_id or (roots is not None and roots(call.run_id))
    if inherited:
        return step.run_id, step.step_id, "llm_step"
    return call.run_id, call.step_id, call.purpose


def tagging_http(engine: Engine | None = None, *, roots: Callable[[str], bool] | None = None,
                 timeout: float = 600.0) -> httpx.AsyncClient:
    """An HTTP client for planweave's model client that tags every call with who makes it: the run, the step, the
    purpose (``plan``, ``join``, ``llm_step``, ...) and, given the ``engine`` running it, the plan version current
    when the call is made (``X-Planweave-*`` headers, read by the gateway). The tags come from the calling task's
    context (:func:`caller`, ``roots`` telling the runs that are episodes' roots), so calls of parallel steps and of
    concurrent runs are told apart."""
    async def tag(request: httpx.Request) -> None:
        run_id, step_id, purpose = caller(roots)
        if run_id:
            request.headers[RUN_HEADER] = run_id
            if engine is not None:
                with contextlib.suppress(Exception):  # a run that just ended: no plan version to give
                    request.headers[PLAN_VERSION_HEADER] = str(engine.get(run_id).plan.version)
        if step_id:
            request.headers[STEP_HEADER] = step_id
        request.headers[PURPOSE_HEADER] = purpose

    hooks: dict[str, list[Callable[[httpx.Request], Awaitable[None]]]] = {"request": [tag]}
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=10.0), event_hooks=hooks,
                             limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
