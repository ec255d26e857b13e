"""A toy policy server speaking vLLM's token-id dialect, for the tests, the benchmark and the example: honestly not a
model. Its tokenizer is byte-level (a token id is a UTF-8 byte, :func:`encode`/:func:`decode`), its replies come
from a function of the messages (:func:`goal_replies` answers the planning loop: a plan of parallel ``llm`` steps,
their texts, the joiner's answer), and each sampled token's logprob is drawn from a seeded generator.

    async with ToyPolicyServer(goal_replies(steps=3)) as base_url:   # http://127.0.0.1:PORT/v1
        ...

``return_token_ids: true`` gets ``prompt_token_ids`` (the rendered prompt ``<|role|>\\ncontent\\n``... then
``<|assistant|>\\n``) and ``choices[0].token_ids``; ``logprobs: true`` the logprobs block. ``version`` is sent back
as ``X-Policy-Version`` when ``version_header`` is set; ``delay`` and ``seconds_per_token`` make calls take time.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from planweave.rollouts.asgi import serve_app

if TYPE_CHECKING:
    from starlette.requests import Request
    from starlette.responses import Response

Replies = Callable[[Sequence[Mapping[str, Any]], random.Random], str]
"""The reply to a request's messages (with the server's seeded generator)."""


def encode(text: str) -> list[int]:
    """The toy tokenizer: one id per UTF-8 byte."""
    return list(text.encode("utf-8"))


def decode(ids: Sequence[int]) -> str:
    """The text of toy token ids (bytes that do not form UTF-8 are replaced)."""
    return bytes(ids).decode("utf-8", "replace")


def render(messages: Sequence[Mapping[str, Any]]) -> str:
    """The toy chat template."""
    return "".join(f"<|{m.get('role', 'user')}|>\n{m.get('content') or ''}\n" for m in messages) + "<|assistant|>\n"


def purpose_of(messages: Sequence[Mapping[str, Any]]) -> str:
    """What the planning loop asks (``plan``, ``join``, ``replan``, ...; ``llm`` for a step's call), from its own
    prompts (:func:`planweave.testing.scripted_planner.purpose`)."""
    from planweave.testing.scripted_llm import RecordedRequest
    from planweave.testing.scripted_planner import purpose

    return purpose(RecordedRequest("POST", "/chat/completions", {}, {"messages": list(messages)}, 0.0))


WORDS = ("blue", "red", "green", "amber")


def goal_replies(steps: int = 3, *, words: Sequence[str] = WORDS) -> Replies:
    """Answers for a goal run: the plan is ``steps`` independent ``llm`` steps (``s0``, ``s1``, ...), each step's
    call answers one of ``words`` drawn by the server's generator, the joiner answers with the steps' words."""

    def reply(messages: Sequence[Mapping[str, Any]], rng: random.Random) -> str:
        asked = purpose_of(messages)
        if asked == "plan":
            return "".join(json.dumps({"id": f"s{i}", "tool": "llm",
                                       "args": {"prompt": f"Name colour number {i}.", "max_tokens": 8}}) + "\n"
                           for i in range(steps))
        if asked in ("replan", "repair", "continue", "fix_lines"):
            return "[]\n"
        if asked == "join":
            return json.dumps({"answer": "the colours were named"})
        return rng.choice(list(words))

    return reply


def colour_episode(seed: int) -> Any:
    """An ``episodes_from`` for :func:`goal_replies`: the goal run "Name three colours (episode SEED)."."""
    from planweave.rollouts.goals import EpisodeSpec

    return EpisodeSpec(goal=f"Name three colours (episode {seed}).", budget_tokens=100_000, deadline=120)


def blue_reward(outcome: Any) -> list[float]:
    """A per-call reward for :func:`goal_replies`' episodes: 1 for a step's call that answered "blue"."""
    return [1.0 if s.role == "step" and s.text == "blue" else 0.0 for s in outcome.samples]


class ToyPolicyServer:
    """See the module docstring. ``calls`` and ``completion_tokens`` count what it served."""

    def __init__(self, replies: Replies, *, seed: int = 0, delay: float = 0.0, seconds_per_token: float = 0.0,
                 version_header: bool = False) -> None:
        self.replies = replies
        self.rng = random.Random(seed)
        self.delay = delay
        self.seconds_per_token = seconds_per_token
        self.version_header = version_header
        self.version = 0
        self.calls = 0
        self.completion_tokens = 0
        self.bodies: list[dict[str, Any]] = []  # every request body received
        self.in_flight = 0
        self.max_in_flight = 0  # the most calls it was answering at once

    @asynccontextmanager
    async def serve(self) -> AsyncIterator[str]:
        """Serve for the ``async with`` block; yield the ``/v1`` base URL."""
        from starlette.applications import Starlette
        from starlette.routing import Route

        app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"]),
                                Route("/v1/models", self._models, methods=["GET"])])
        async with serve_app(app, what="the toy policy server") as url:
            yield f"{url}/v1"

    async def __aenter__(self) -> str:
        self._cm = self.serve()
        return await self._cm.__aenter__()

    async def __aexit__(self, *exc_info: Any) -> None:
        await self._cm.__aexit__(*exc_info)

    async def _models(self, request: Request) -> Response:
        from starlette.responses import JSONResponse

        return JSONResponse({"object": "list", "data": [{"id": "toy", "object": "model"}]})

    async def _chat(self, request: Request) -> Response:
        from starlette.requests import ClientDisconnect
        from starlette.responses import JSONResponse, Response

        try:
            body = json.loads(await request.body())
        except ClientDisconnect:  # a re-sampled call cancelled by the gateway while it was sent: nobody to answer
            return Response(status_code=499)
        self.bodies.append(body)
        messages = body.get("messages") or []
        text = self.replies(messages, self.rng)
        ids = encode(text)
        finish = "stop"
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(limit, int) and len(ids) > limit:
            ids, finish = ids[:limit], "length"
            text = decode(ids)
        version = self.version
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay + self.seconds_per_token * len(ids))
        finally:
            self.in_flight -= 1
        self.calls += 1
        self.completion_tokens += len(ids)
        prompt_ids = encode(render(messages))
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "finish_reason": finish}
        if body.get("logprobs"):
            choice["logprobs"] = {"content": [
                {"token": decode([i]), "logprob": math.log(self.rng.uniform(0.05, 1.0)), "top_logprobs": []}
                for i in ids]}
        reply: dict[str, Any] = {"id": f"toy-{self.calls}", "object": "chat.completion", "created": 0,
                                 "model": body.get("model", "toy"), "choices": [choice],
                                 "usage": {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids),
                                           "total_tokens": len(prompt_ids) + len(ids)}}
        if body.get("return_token_ids"):
            reply["prompt_token_ids"] = prompt_ids
            choice["token_ids"] = ids
        headers = {"X-Policy-Version": str(version)} if self.version_header else {}
        return JSONResponse(reply, headers=headers)
