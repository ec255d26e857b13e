"""``planweave bench storm``: a burst of parallel model calls against a rate-limited provider, planweave and its peers.

The provider (:mod:`planweave.bench.storm_provider`) has a tokens-per-minute bucket and a concurrency limit; past
either it answers HTTP 429 with ``Retry-After``, and a seeded few calls are cut mid-generation on their first try
(the same calls for every system). Each system sends the same ``--calls`` calls at once, each a prompt tagged with
its call and a reply of ``--reply-tokens`` tokens (``max_tokens`` set to it), the way its own docs show:

* **planweave**: one plan of ``llm`` steps in parallel on the engine, the endpoint's limits given as a model limits
  file would (``tokens_per_minute``, ``max_concurrency``: admission control), ``retries: 2`` per step;
* **openai-gather**: the official ``openai`` SDK's ``AsyncOpenAI`` under ``asyncio.gather`` with its default retries
  (2, honouring ``Retry-After``); ``openai-gather-exc``: the same with ``return_exceptions=True``;
* **langgraph**: a ``Send`` fan-out to a node calling ``langchain-openai``'s ``ChatOpenAI`` with LangGraph's
  documented ``RetryPolicy()`` (3 attempts), on an ``InMemorySaver`` checkpointer;
* **pydantic-ai**: ``Agent.run`` per call under ``asyncio.gather`` (its OpenAI model, the SDK's default retries).

The ``-limited`` variants of LangGraph and Pydantic AI also set their documented concurrency knob (LangGraph's
``max_concurrency`` config, ``Agent(max_concurrency=...)``) to the provider's limit: neither has a tokens-per-minute
limit.

Counted per system, from the provider's own records: calls completed (at the provider), results kept (in the
caller's hands when its run ended or was stopped at ``--stop`` times the floor), 429s received, tokens wasted (billed
but not in a kept result: cut calls, and completed calls whose results were lost), and the time to finish against
the floor (total tokens / tokens per minute). Everything runs on the virtual clock (the provider's minute is a
virtual minute), so a storm of minutes takes seconds and the figures are the same on every run; a peer that is not
installed is reported as skipped, with the reason.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import math
import operator
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Annotated, Any, TypedDict

import typer

from planweave.bench.cli import parse_command_line
from planweave.bench.storm_provider import Answer, ChatCall, Cut, MeteredProvider, ProviderLimits, Say, call_tag

__all__ = ["SYSTEMS", "StormSettings", "SystemResult", "main", "run_storm"]

MODEL = "storm-model"
TTFT, TOKENS_PER_SECOND = 0.2, 50.0  # the provider's speed: seconds to the first token, tokens a second after it
SYSTEMS = ("planweave", "openai-gather", "openai-gather-exc", "langgraph", "langgraph-limited", "pydantic-ai",
           "pydantic-ai-limited")
_WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu",
          "nu", "xi", "omicron", "pi", "rho", "sigma", "tau")


@dataclass(frozen=True, slots=True)
class StormSettings:
    """The storm: ``calls`` at once; the provider's ``tokens_per_minute`` and ``max_concurrency``; each reply
    ``reply_tokens`` long; ``cut_share`` of the calls cut halfway on their first try; stopped at ``stop`` floors."""

    calls: int = 200
    tokens_per_minute: int = 6_000
    max_concurrency: int = 16
    reply_tokens: int = 100
    cut_share: float = 0.04
    stop: float = 3.0
    seed: int = 7

    def prompt(self, i: int) -> str:
        return f"{call_tag(f's{i}')} Summarise item {i} of the batch in about {self.reply_tokens} tokens."

    def reply(self) -> str:
        return "".join(f" {_WORDS[i % len(_WORDS)][:3]}" for i in range(self.reply_tokens))

    def cut_keys(self) -> frozenset[str]:
        rng = random.Random(self.seed)
        return frozenset(f"s{i}" for i in rng.sample(range(self.calls), round(self.cut_share * self.calls)))

    def call_tokens(self) -> int:
        """The tokens one call takes from the bucket (its prompt, counted as the provider does, and its reply)."""
        return math.ceil(len(self.prompt(0)) / 4) + 4 + 2 + self.reply_tokens

    def floor_seconds(self) -> float:
        """Total tokens / tokens per minute, in seconds: the rate limit's floor."""
        return 60.0 * self.calls * self.call_tokens() / self.tokens_per_minute

    def least_seconds(self) -> float:
        """The least any client could take here: the provider's bucket starts full, so only the tokens past one
        minute's worth wait for it to refill; and no more than ``max_concurrency`` calls run at once."""
        refill = 60.0 * max(0, self.calls * self.call_tokens() - self.tokens_per_minute) / self.tokens_per_minute
        waves = math.ceil(self.calls / self.max_concurrency) * (TTFT + self.reply_tokens / TOKENS_PER_SECOND)
        return max(refill, waves)


@dataclass(frozen=True, slots=True)
class SystemResult:
    """One system's storm; ``status`` is finished, failed (it raised), stopped (at the stop time) or skipped."""

    system: str
    version: str
    status: str
    reason: str
    calls: int
    completed: int
    kept: int
    rate_limited: int
    requests: int
    billed_tokens: int
    wasted_tokens: int
    seconds: float
    floor_seconds: float


def _script(settings: StormSettings) -> Callable[[ChatCall], Answer]:
    cut, reply = settings.cut_keys(), settings.reply()

    def answer(call: ChatCall) -> Answer:
        return Cut(reply, 0.5) if call.key in cut and call.attempt == 1 else Say(reply)

    return answer


def _version(*packages: str) -> str:
    found = []
    for package in packages:
        try:
            found.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            found.append(f"{package} (not installed)")
    return ", ".join(found)


# -- the systems: each sends the calls and returns the keys of the results it holds at the end ----------------------
Outcome = tuple[str, set[str]]  # (finished | failed | stopped, keys of the results kept)
Runner = Callable[[StormSettings, str, float], Awaitable[Outcome]]


async def _planweave(settings: StormSettings, base_url: str, stop_at: float) -> Outcome:
    from planweave import RealClock, Toolbox, VirtualClock, open_engine
    from planweave.core.clock import VirtualEventLoop
    from planweave.journal.memory import MemoryJournal
    from planweave.models.admission import Admission, parse_model_limits
    from planweave.models.openai import OpenAIChatClient, reset_server_compat
    from planweave.tools.llm import llm_tool

    reset_server_compat()
    # What a model limits file (--model-limits) says: the provider's published limits.
    admission = Admission(parse_model_limits({MODEL: {"tokens_per_minute": settings.tokens_per_minute,
                                                      "max_concurrency": settings.max_concurrency}}))
    plan = {"defaults": {"retries": 2}, "steps": [
        {"id": f"s{i}", "tool": "llm", "args": {"prompt": settings.prompt(i), "max_tokens": settings.reply_tokens}}
        for i in range(settings.calls)]}
    virtual = isinstance(asyncio.get_running_loop(), VirtualEventLoop)
    async with (
        OpenAIChatClient(MODEL, base_url=base_url, api_key="storm", admission=admission,
                         rng=random.Random(settings.seed)) as client,
        open_engine(MemoryJournal(), tools=Toolbox({"llm": llm_tool(client)}), concurrency=None,
                    clock=VirtualClock() if virtual else RealClock()) as engine,
    ):
        run = await engine.start(plan, run_id="storm")
        status = "finished"
        try:
            async with asyncio.timeout(stop_at):
                result = await asyncio.shield(run.wait())
        except TimeoutError:
            run.cancel("stopped by the benchmark")
            result = await run.wait()
            status = "stopped"
        if status == "finished" and not result.ok:
            status = "failed"
        kept = {sid for sid, rec in result.state.records.items() if rec.status == "succeeded"}
    return status, kept


async def _gather(calls: Sequence[Callable[[], Awaitable[Any]]], keys: Sequence[str], stop_at: float, *,
                  return_exceptions: bool) -> Outcome:
    """``asyncio.gather`` as a script uses it; when it raises, the script ends and ``asyncio.run`` cancels the rest."""
    tasks = [asyncio.ensure_future(call()) for call in calls]
    try:
        async with asyncio.timeout(stop_at):
            results = await asyncio.gather(*tasks, return_exceptions=return_exceptions)
    except TimeoutError:
        return "stopped", set()
    except Exception:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return "failed", set()
    kept = {key for key, result in zip(keys, results, strict=True) if not isinstance(result, BaseException)}
    return ("finished" if len(kept) == len(keys) else "failed"), kept


def _openai(return_exceptions: bool) -> Runner:
    async def run(settings: StormSettings, base_url: str, stop_at: float) -> Outcome:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key="storm")  # default max_retries (2)

        def call(i: int) -> Callable[[], Awaitable[Any]]:
            return lambda: client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": settings.prompt(i)}],
                max_tokens=settings.reply_tokens)

        try:
            return await _gather([call(i) for i in range(settings.calls)], [f"s{i}" for i in range(settings.calls)],
                                 stop_at, return_exceptions=return_exceptions)
        finally:
            await client.close()

    return run


class _StormState(TypedDict):
    """The LangGraph peer's state: the keys of the calls done (a reducer appends each node's)."""

    results: Annotated[list[str], operator.add]


class _Item(TypedDict):
    i: int


def _langgraph(limited: bool) -> Runner:
    async def run(settings: StormSettings, base_url: str, stop_at: float) -> Outcome:
        return await _langgraph_storm(settings, base_url, stop_at, settings.max_concurrency if limited else None)

    return run


async def _langgraph_storm(settings: StormSettings, base_url: str, stop_at: float,
                           max_concurrency: int | None) -> Outcome:
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import RetryPolicy, Send

    model = ChatOpenAI(model=MODEL, base_url=base_url, api_key="storm",
                       max_completion_tokens=settings.reply_tokens)

    async def call(item: _Item) -> dict[str, list[str]]:
        await model.ainvoke(settings.prompt(item["i"]))
        return {"results": [f"s{item['i']}"]}

    def fan_out(_state: _StormState) -> list[Any]:
        return [Send("call", {"i": i}) for i in range(settings.calls)]

    builder = StateGraph(_StormState)
    node: Any = call  # a Send's payload (_Item), not the graph's state
    builder.add_node("call", node, retry_policy=RetryPolicy())
    builder.add_conditional_edges(START, fan_out, ["call"])
    builder.add_edge("call", END)
    saver = InMemorySaver()
    graph = builder.compile(checkpointer=saver)
    config: Any = {"configurable": {"thread_id": "storm"}}
    if max_concurrency is not None:
        config["max_concurrency"] = max_concurrency  # LangGraph's documented cap on tasks run at once
    try:
        async with asyncio.timeout(stop_at):
            final = await graph.ainvoke({"results": []}, config)
        return "finished", set(final["results"])
    except TimeoutError:
        status = "stopped"
    except Exception:
        status = "failed"
    # What survived in the checkpoint: the writes of the calls that finished before the failure (a resume keeps them).
    saved = await saver.aget_tuple(config)
    kept = {key for _task, channel, value in (saved.pending_writes or [] if saved else [])
            if channel == "results" for key in value}
    return status, kept


def _pydantic_ai(limited: bool) -> Runner:
    async def run(settings: StormSettings, base_url: str, stop_at: float) -> Outcome:
        return await _pydantic_ai_storm(settings, base_url, stop_at, settings.max_concurrency if limited else None)

    return run


async def _pydantic_ai_storm(settings: StormSettings, base_url: str, stop_at: float,
                             max_concurrency: int | None) -> Outcome:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    client = AsyncOpenAI(base_url=base_url, api_key="storm")
    # max_concurrency: Pydantic AI's documented limit on agent runs at once.
    agent = Agent(OpenAIChatModel(MODEL, provider=OpenAIProvider(openai_client=client)),
                  max_concurrency=max_concurrency)

    def call(i: int) -> Callable[[], Awaitable[Any]]:
        return lambda: agent.run(settings.prompt(i), model_settings={"max_tokens": settings.reply_tokens})

    try:
        return await _gather([call(i) for i in range(settings.calls)], [f"s{i}" for i in range(settings.calls)],
                             stop_at, return_exceptions=False)
    finally:
        await client.close()


RUNNERS: dict[str, tuple[Runner, tuple[str, ...], tuple[str, ...]]] = {
    # system: (runner, modules it needs, packages whose versions it prints)
    "planweave": (_planweave, (), ("planweave",)),
    "openai-gather": (_openai(False), ("openai",), ("openai",)),
    "openai-gather-exc": (_openai(True), ("openai",), ("openai",)),
    "langgraph": (_langgraph(False), ("langgraph", "langchain_openai"), ("langgraph", "langchain-openai", "openai")),
    "langgraph-limited": (_langgraph(True), ("langgraph", "langchain_openai"),
                          ("langgraph", "langchain-openai", "openai")),
    "pydantic-ai": (_pydantic_ai(False), ("pydantic_ai", "openai"), ("pydantic-ai-slim", "openai")),
    "pydantic-ai-limited": (_pydantic_ai(True), ("pydantic_ai", "openai"), ("pydantic-ai-slim", "openai")),
}


def _missing(modules: Sequence[str]) -> str | None:
    import importlib.util

    absent = [m for m in modules if importlib.util.find_spec(m) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (pip install -e '.[bench]')"
    return None


async def _measure(system: str, settings: StormSettings) -> SystemResult:
    runner, _, packages = RUNNERS[system]
    random.seed(settings.seed)  # the peers' retry jitter draws from the global generator
    provider = MeteredProvider(_script(settings), limits=ProviderLimits(
        settings.tokens_per_minute, settings.max_concurrency), ttft=TTFT, tokens_per_second=TOKENS_PER_SECOND)
    floor = settings.floor_seconds()
    loop = asyncio.get_running_loop()
    async with provider as base_url:
        began = loop.time()
        status, kept = await runner(settings, base_url, settings.stop * floor)
        seconds = loop.time() - began
        await asyncio.sleep(0)
    completed = {a.key for a in provider.attempts if a.completed}
    kept_tokens = 0
    for key in kept:
        first = next((a for a in provider.attempts if a.key == key and a.completed), None)
        kept_tokens += first.tokens if first is not None else 0
    return SystemResult(
        system=system, version=_version(*packages), status=status, reason="", calls=settings.calls,
        completed=len(completed), kept=len(kept), rate_limited=provider.rate_limited,
        requests=len(provider.attempts), billed_tokens=provider.billed_tokens,
        wasted_tokens=provider.billed_tokens - kept_tokens, seconds=seconds, floor_seconds=floor)


def run_storm(settings: StormSettings, systems: Sequence[str] = SYSTEMS) -> list[SystemResult]:
    """Run the storm once per system, each on a fresh provider on its own virtual clock; skip a peer not installed."""
    from planweave.core.clock import run_virtual

    results = []
    for system in systems:
        missing = _missing(RUNNERS[system][1])
        if missing is not None:
            results.append(SystemResult(system, "", "skipped", missing, settings.calls, 0, 0, 0, 0, 0, 0, 0.0,
                                        settings.floor_seconds()))
            continue
        with contextlib.suppress(Warning), _quiet():
            results.append(run_virtual(_measure(system, settings)))
    return results


@contextlib.contextmanager
def _quiet() -> Any:
    import logging
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


def table(results: Sequence[SystemResult]) -> str:
    head = (f"{'system':<20} {'status':<9} {'completed':>9} {'kept':>9} {'429s':>6} {'requests':>8} "
            f"{'wasted tok':>10} {'finish s':>8} {'/ floor':>7}")
    lines = [head, "-" * len(head)]
    for r in results:
        if r.status == "skipped":
            lines.append(f"{r.system:<20} skipped: {r.reason}")
            continue
        lines.append(f"{r.system:<20} {r.status:<9} {r.completed:>4}/{r.calls:<4} {r.kept:>4}/{r.calls:<4} "
                     f"{r.rate_limited:>6} {r.requests:>8} {r.wasted_tokens:>10} {r.seconds:>8.1f} "
                     f"{r.seconds / r.floor_seconds:>7.2f}")
    return "\n".join(lines)


@dataclass(frozen=True)
class _Options:
    settings: StormSettings
    systems: tuple[str, ...]
    json: bool


def _options(
    calls: Annotated[int, typer.Option(min=1, help="model calls sent at once")] = 200,
    tpm: Annotated[int, typer.Option("--tpm", min=1, help="the provider's tokens per minute")] = 6_000,
    concurrency: Annotated[int, typer.Option(min=1, help="the provider's requests in flight")] = 16,
    reply_tokens: Annotated[int, typer.Option(min=1, help="tokens of each reply (its max_tokens)")] = 100,
    cut_share: Annotated[float, typer.Option(min=0.0, max=1.0, help="share of calls cut halfway on their first try")
                         ] = 0.04,
    stop: Annotated[float, typer.Option(min=0.05, help="stop a system still running at this many floors")] = 3.0,
    seed: Annotated[int, typer.Option(help="seeds the cut calls and the retry jitter")] = 7,
    systems: Annotated[str, typer.Option(help=f"comma-separated, of {','.join(SYSTEMS)}")] = ",".join(SYSTEMS),
    quick: Annotated[bool, typer.Option("--quick", help="50 calls at 1,500 tokens/min (what CI runs)")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> _Options:
    """Parallel model calls against a provider with a tokens-per-minute and a concurrency limit (429 with
    Retry-After, a few calls cut mid-stream): planweave against the openai SDK, LangGraph and Pydantic AI."""
    chosen = tuple(s.strip() for s in systems.split(",") if s.strip())
    bad = [s for s in chosen if s not in SYSTEMS]
    if bad or not chosen:
        raise typer.BadParameter(f"unknown system {bad[0] if bad else '(none)'!r}: choose from {', '.join(SYSTEMS)}",
                                 param_hint="--systems")
    if quick:
        calls, tpm = 50, 1_500
    return _Options(StormSettings(calls=calls, tokens_per_minute=tpm, max_concurrency=concurrency,
                                  reply_tokens=reply_tokens, cut_share=cut_share, stop=stop, seed=seed),
                    chosen, json_output)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the storm on every system and print the table (or JSON); a bad option exits 2 naming it."""
    args = parse_command_line(_options, argv, "planweave bench storm")
    started = time.perf_counter()
    results = run_storm(args.settings, args.systems)
    if args.json:
        print(json.dumps({"settings": asdict(args.settings), "systems": [asdict(r) for r in results],
                          "wall_seconds": time.perf_counter() - started}, indent=2))
        return 0
    s = args.settings
    print(f"storm: {s.calls} calls at once, {s.call_tokens()} tokens each; provider {s.tokens_per_minute} tokens/min, "
          f"{s.max_concurrency} in flight, {len(s.cut_keys())} calls cut halfway on their first try; floor "
          f"(tokens / tokens per minute) {s.floor_seconds():.1f}s, least possible {s.least_seconds():.1f}s (the "
          f"bucket starts full); virtual clock, stopped at {s.stop:g}x the floor")
    print(table(results))
    print("versions: " + "; ".join(f"{r.system}: {r.version}" for r in results if r.version))
    print(f"({time.perf_counter() - started:.1f}s wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
