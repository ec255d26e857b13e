"""Transport: planweave's httpx clients or the official ``openai``/``anthropic`` SDKs, under planweave's accounting?

Against the scripted server (Chat Completions, the Responses API, Anthropic Messages) in a child process, so the
client's CPU is measured alone, each dialect is called through two transports:

* ``httpx``: planweave's own client (:mod:`planweave.models.openai`, ``openai_responses``, ``anthropic``):
  admission slot, SSE parsing, a :class:`~planweave.models.Delta` with the usage so far per network read, retries;
* ``sdk``: the official SDK streaming the same call inside the same admission slot, each text event turned into a
  ``Delta`` with the usage so far (the server's when it has sent it, else the events counted), the final usage
  taken from the SDK's last event: what an SDK-backed ``ModelClient`` would do.

Figures: time to first token and whole-call time (median and p95 of ``--calls`` sequential calls of a
``--tokens``-token reply, no server delay), client CPU per call (the process's CPU time over the calls: the server
runs in another process), and the behaviour on the SSE edge cases: a stream cut mid-way (what is raised, what the
caller can charge), a 429 with ``Retry-After`` (retried after the wait?), an error event mid-stream (raised? after
the text?), usage in the last chunk. ``python benchmarks/transport_bench.py [--calls 200] [--tokens 256] [--json]``;
docs/models.md quotes its output.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Any

import anthropic
import openai

from planweave.models import Completion, CompletionRequest, Delta, Usage, client_class
from planweave.models.admission import Admission, EndpointLimits, call_class
from planweave.models.openai import Backoff, OpenAIChatClient
from planweave.models.pricing import approx_prompt_tokens
from planweave.testing import Drop, HttpError, ScriptedLLM, StreamError, Text

MODELS = {"chat": "openai:gpt-4o-mini", "responses": "openai-responses:gpt-4o-mini",
          "anthropic": "anthropic:claude-3-5-haiku-latest"}
PROMPT = CompletionRequest.of("Describe the weather in Oslo.", system="Be brief.", max_tokens=1024)
Stream = Callable[[CompletionRequest], AsyncIterator[Delta | Completion]]


# -- the SDK transport, under planweave's admission and per-delta usage ----------------------------------------------
class SdkClient:
    """A minimal SDK-backed streaming client: the official SDK inside planweave's admission slot, yielding Deltas
    with the usage so far, then a Completion with the SDK's final usage."""

    def __init__(self, dialect: str, base_url: str, admission: Admission, max_retries: int = 3) -> None:
        self.dialect, self.base_url, self.admission = dialect, base_url, admission
        self.name = MODELS[dialect].split(":", 1)[1]
        self.oa = openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=max_retries)
        self.an = anthropic.AsyncAnthropic(base_url=base_url.removesuffix("/v1"), api_key="k",
                                           max_retries=max_retries)

    async def aclose(self) -> None:
        await self.oa.close()
        await self.an.close()

    async def stream(self, request: CompletionRequest) -> AsyncIterator[Delta | Completion]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        prompt = approx_prompt_tokens(m.content for m in request.messages)
        scheduler = self.admission.endpoint(self.base_url, self.name)
        async with scheduler.slot(call_class(), prompt + (request.max_tokens or 1024), since=started) as grant:
            events, pieces = 0, []
            usage: tuple[int, int] | None = None
            first: float | None = None
            async for piece, final in self._events(request):
                if final is not None:
                    usage = final
                if piece:
                    events += 1
                    pieces.append(piece)
                    first = first if first is not None else loop.time()
                    yield Delta(piece, Usage(prompt, events, "estimated"))
            grant.done(200, first_token_s=None if first is None else first - started,
                       tokens=None if usage is None else sum(usage))
        text = "".join(pieces)
        p, c = usage if usage is not None else (prompt, events)
        yield Completion(text, self.name, p, c, "server" if usage else "estimated", None,
                         first_token_s=None if first is None else first - started, duration_s=loop.time() - started)

    async def _events(self, request: CompletionRequest) -> AsyncIterator[tuple[str, tuple[int, int] | None]]:
        messages = [{"role": m.role, "content": m.content} for m in request.messages if m.role != "system"]
        system = "\n".join(m.content for m in request.messages if m.role == "system")
        if self.dialect == "chat":
            chat = await self.oa.chat.completions.create(  # type: ignore[call-overload]
                model=self.name, messages=[{"role": "system", "content": system}, *messages],
                max_tokens=request.max_tokens, stream=True, stream_options={"include_usage": True})
            async for chunk in chat:
                text = "".join(c.delta.content or "" for c in chunk.choices)
                yield text, (chunk.usage.prompt_tokens, chunk.usage.completion_tokens) if chunk.usage else None
        elif self.dialect == "responses":
            async with self.oa.responses.stream(model=self.name, instructions=system, input=messages,  # type: ignore[arg-type]
                                                max_output_tokens=request.max_tokens) as rstream:
                async for event in rstream:
                    if event.type == "response.output_text.delta":
                        yield event.delta, None
                    elif event.type == "response.completed" and event.response.usage is not None:
                        yield "", (event.response.usage.input_tokens, event.response.usage.output_tokens)
                    elif event.type in ("error", "response.failed"):
                        raise RuntimeError(f"{event.type} in stream")
        else:
            async with self.an.messages.stream(model=self.name, system=system, messages=messages,  # type: ignore[arg-type]
                                               max_tokens=request.max_tokens or 1024) as astream:
                async for aevent in astream:
                    if aevent.type == "text":
                        yield aevent.text, None
                    elif aevent.type == "message_stop":
                        u = aevent.message.usage
                        yield "", (u.input_tokens + (u.cache_read_input_tokens or 0)
                                   + (u.cache_creation_input_tokens or 0), u.output_tokens)


# -- timing ---------------------------------------------------------------------------------------------------------
def start_server(text: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen([sys.executable, "-m", "planweave.testing.scripted_llm", "--port", "0", "--text", text],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    return proc, line.split(" at ", 1)[1].split()[0]


async def one_call(stream: Stream) -> tuple[float, float]:
    loop = asyncio.get_running_loop()
    started = loop.time()
    first: float | None = None
    async with aclosing(stream(PROMPT)) as items:  # type: ignore[type-var]
        async for item in items:
            if isinstance(item, Delta) and item.text and first is None:
                first = loop.time()
    end = loop.time()
    return (first or end) - started, end - started


def quantiles(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


async def timings(dialect: str, transport: str, base_url: str, calls: int) -> dict[str, float]:
    admission = Admission(default=EndpointLimits(max_concurrency=16, order="fcfs"))
    name = MODELS[dialect]
    ours: OpenAIChatClient | None = None
    sdk: SdkClient | None = None
    if transport == "httpx":
        ours = client_class(name)(name, base_url=base_url, api_key="k", admission=admission)
        stream: Stream = ours.stream
    else:
        sdk = SdkClient(dialect, base_url, admission)
        stream = sdk.stream
    try:
        for _ in range(5):  # warm up: connections, imports, caches
            await one_call(stream)
        cpu = time.process_time()
        results = [await one_call(stream) for _ in range(calls)]
        cpu = (time.process_time() - cpu) / calls
    finally:
        if ours is not None:
            await ours.aclose()
        if sdk is not None:
            await sdk.aclose()
    ttft, whole = quantiles([r[0] for r in results]), quantiles([r[1] for r in results])
    return {"ttft_ms_p50": ttft[0] * 1e3, "ttft_ms_p95": ttft[1] * 1e3, "call_ms_p50": whole[0] * 1e3,
            "call_ms_p95": whole[1] * 1e3, "cpu_ms_per_call": cpu * 1e3}


# -- the edge cases -------------------------------------------------------------------------------------------------
async def edge_case(dialect: str, transport: str, script: list[Any]) -> dict[str, Any]:
    """One call on ``script``: what the caller saw (text, the last usage it could charge, the error, the wait)."""
    server = ScriptedLLM(script)
    async with server as base_url:
        admission = Admission(default=EndpointLimits(max_concurrency=4, order="fcfs"))
        name = MODELS[dialect]
        ours = client_class(name)(name, base_url=base_url, api_key="k", admission=admission,
                                  backoff=Backoff(attempts=3, base=0.05, cap=0.1))
        sdk = SdkClient(dialect, base_url, admission, max_retries=2)
        await ours.__aenter__()  # its connection pool made now, as the SDKs' are: "waited" is the call's own
        stream: Stream = ours.stream if transport == "httpx" else sdk.stream
        text, last, error, usage_source = "", None, None, None
        started = time.monotonic()
        try:
            async with aclosing(stream(PROMPT)) as items:  # type: ignore[type-var]
                async for item in items:
                    if isinstance(item, Delta):
                        text += item.text
                        last = item.usage
                    else:
                        usage_source = item.usage_source
        except Exception as exc:  # the point: which error each transport raises
            error = type(exc).__name__
        finally:
            await ours.aclose()
            await sdk.aclose()
        waited = time.monotonic() - started
    billed = server.served[-1].completion_tokens if server.served else 0
    return {"text_chars": len(text), "error": error, "calls": len(server.served), "waited_s": round(waited, 2),
            "charged_tokens": None if last is None else last.completion_tokens, "billed_tokens": billed,
            "usage": usage_source}


EDGES: dict[str, Callable[[], list[Any]]] = {
    "cut stream": lambda: [Drop("one two three four five six seven eight nine ten " * 3)],
    "429 Retry-After 0.5s": lambda: [HttpError(429, "slow down", retry_after=0.5), Text("ok")],
    "5xx before any text": lambda: [HttpError(503), Text("ok")],
    "error event mid-stream": lambda: [StreamError("some text then " * 3, 500, "overloaded")],
    "usage in last chunk": lambda: [Text("a reply whose usage comes in the last event")],
}


async def main(calls: int, tokens: int, as_json: bool) -> None:
    text = " ".join(f"w{i % 100}" for i in range(tokens))  # ~one token per word
    proc, base_url = start_server(text)
    report: dict[str, Any] = {"calls": calls, "tokens": tokens, "timings": {}, "edges": {}}
    try:
        for dialect in MODELS:
            for transport in ("httpx", "sdk"):
                report["timings"][f"{dialect}/{transport}"] = await timings(dialect, transport, base_url, calls)
    finally:
        proc.terminate()
        proc.wait(10)
    for edge, script in EDGES.items():
        for dialect in MODELS:
            for transport in ("httpx", "sdk"):
                report["edges"][f"{edge}: {dialect}/{transport}"] = await edge_case(dialect, transport, script())
    if as_json:
        print(json.dumps(report, indent=2))
        return
    print(f"{calls} sequential streamed calls of a {tokens}-token reply against the scripted server (child process)")
    print(f"{'dialect/transport':<22}{'ttft p50':>10}{'ttft p95':>10}{'call p50':>10}{'call p95':>10}{'CPU/call':>10}")
    for key, t in report["timings"].items():
        print(f"{key:<22}{t['ttft_ms_p50']:>8.2f}ms{t['ttft_ms_p95']:>8.2f}ms{t['call_ms_p50']:>8.2f}ms"
              f"{t['call_ms_p95']:>8.2f}ms{t['cpu_ms_per_call']:>8.2f}ms")
    print()
    print(f"{'edge case: dialect/transport':<46}{'error':>20}{'calls':>6}{'waited':>8}{'charged':>9}{'billed':>8}"
          f"{'usage':>11}")
    for key, e in report["edges"].items():
        charged = "-" if e["charged_tokens"] is None else str(e["charged_tokens"])
        print(f"{key:<46}{e['error'] or '-':>20}{e['calls']:>6}{e['waited_s']:>7}s{charged:>9}"
              f"{e['billed_tokens']:>8}{e['usage'] or '-':>11}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    asyncio.run(main(args.calls, args.tokens, args.json))
