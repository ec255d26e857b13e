"""``planweave bench caps``: runs that would spend past a dollar cap, and what each system spends against its cap.

Each scenario is a job that costs about three times its cap at the provider (:mod:`planweave.bench.storm_provider`,
which bills every token it generated at its own price, whatever the client knows):

* **priced**: ``--turns`` model calls one after another on a model the price databases know (gpt-4o-mini);
* **unpriced**: the same on a model no price table knows (the provider bills it at gpt-4o-mini's price);
* **cut**: priced, every call cut halfway on its first try (billed for what it generated) and then retried;
* **parallel**: priced, ``--turns`` calls at once under the one cap.

Each system uses the cap its own docs offer, set to the same dollars:

* **planweave**: a plan of ``llm`` steps (a chain, or a fan-out for parallel) with ``Budget(usd=cap)``: each call
  reserves its worst case before it starts, a cut stream is charged what it cost, a model without a price is refused;
* **pydantic-ai**: ``UsageLimits(cost_limit=cap)``: one agent run whose model calls a tool each turn (parallel: one-call
  runs at once sharing one ``usage``);
* **langgraph**: no dollar cap; ``recursion_limit`` set to the turns whose cost fits the cap (the user's arithmetic: the
  cap over one turn's cost at its ``max_tokens``) on a loop of model calls (parallel: a ``Send`` fan-out);
* **openai-agents**: no dollar cap; ``max_turns`` set the same way on an agent calling a tool each turn (parallel:
  one-turn runs at once, each with its own ``max_turns``).

Reported: what the provider billed against the cap, the calls it completed, and how the run ended. A peer that is not
installed is skipped with the reason. On the virtual clock: the same figures on every run.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import importlib.util
import json
import math
import operator
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Annotated, Any, TypedDict

import typer

from planweave.bench.cli import parse_command_line
from planweave.bench.storm_provider import Answer, ChatCall, Cut, MeteredProvider, Say, ToolCall, call_tag

__all__ = ["SCENARIOS", "SYSTEMS", "CapResult", "CapSettings", "main", "run_caps"]

PRICED = "gpt-4o-mini"
UNPRICED = "acme-large-2"  # no price table knows it
PRICE = (0.15, 0.60)  # gpt-4o-mini's USD per million input and output tokens: what the provider bills both models
SCENARIOS = ("priced", "unpriced", "cut", "parallel")
SYSTEMS = ("planweave", "pydantic-ai", "langgraph", "openai-agents")


@dataclass(frozen=True, slots=True)
class CapSettings:
    """``turns`` calls of ``reply_tokens`` each (their ``max_tokens``); the cap is a third of what they would cost."""

    turns: int = 30
    reply_tokens: int = 400
    seed: int = 7

    def reply(self) -> str:
        return "".join(f" w{i % 100:02d}" for i in range(self.reply_tokens))

    def turn_usd(self) -> float:
        """One call's cost at its ``max_tokens``, with a prompt of ~60 tokens (the user's estimate for a turn cap)."""
        return (60 * PRICE[0] + self.reply_tokens * PRICE[1]) / 1_000_000

    def cap_usd(self) -> float:
        return round(self.turns * self.turn_usd() / 3, 6)

    def turn_cap(self) -> int:
        """The turns whose cost fits the cap, by the arithmetic a user of a turn or step limit would do."""
        return max(1, math.floor(self.cap_usd() / self.turn_usd()))


@dataclass(frozen=True, slots=True)
class CapResult:
    """One system in one scenario: ``spent_usd`` is what the provider billed; ``ended`` how the run ended."""

    system: str
    scenario: str
    version: str
    cap: str
    cap_usd: float
    spent_usd: float
    calls: int
    ended: str
    skipped: str = ""

    @property
    def within(self) -> bool:
        return self.spent_usd <= self.cap_usd + 1e-12


def _script(settings: CapSettings, scenario: str) -> Callable[[ChatCall], Answer]:
    """Agent loops (keys ``loop...``) call the tool until their last turn; other calls answer text. In ``cut``, each
    call's first try (per key and turn) is cut halfway."""
    reply, seen = settings.reply(), set[tuple[str | None, int]]()

    def answer(call: ChatCall) -> Answer:
        first = (call.key, call.turn) not in seen
        seen.add((call.key, call.turn))
        if scenario == "cut" and first:
            return Cut(reply, 0.5)
        if call.key is not None and call.key.startswith("loop") and call.turn < settings.turns - 1:
            return ToolCall("step", {"n": call.turn}, text=reply)
        return Say(reply)

    return answer


def _model(scenario: str) -> str:
    return UNPRICED if scenario == "unpriced" else PRICED


def _ended(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text[:70]}"


Runner = Callable[[CapSettings, str, str], Awaitable[str]]


async def _planweave(settings: CapSettings, scenario: str, base_url: str) -> str:
    from planweave import RealClock, Toolbox, VirtualClock, open_engine
    from planweave.core.clock import VirtualEventLoop
    from planweave.journal.memory import MemoryJournal
    from planweave.models import Budget, PriceTable
    from planweave.models.openai import OpenAIChatClient, reset_server_compat
    from planweave.tools.llm import llm_tool

    reset_server_compat()
    model = _model(scenario)
    steps: list[dict[str, Any]] = []
    for i in range(settings.turns):
        step: dict[str, Any] = {"id": f"c{i}", "tool": "llm", "args": {
            "prompt": f"{call_tag(f'pw{i}')} Part {i} of the report.", "max_tokens": settings.reply_tokens}}
        if scenario != "parallel" and i:
            step["after"] = [f"c{i - 1}"]
        steps.append(step)
    virtual = isinstance(asyncio.get_running_loop(), VirtualEventLoop)
    async with (
        OpenAIChatClient(model, base_url=base_url, api_key="caps", rng=random.Random(settings.seed)) as client,
        open_engine(MemoryJournal(), tools=Toolbox({"llm": llm_tool(client, Budget(usd=settings.cap_usd()),
                                                                     prices=PriceTable())}),
                    concurrency=None, clock=VirtualClock() if virtual else RealClock()) as engine,
    ):
        run = await engine.start({"defaults": {"retries": 2}, "steps": steps}, run_id=f"caps-{scenario}")
        result = await run.wait()
    return "finished" if result.ok else f"{result.status}: {(result.error or '').splitlines()[0][:70]}"


async def _pydantic_ai(settings: CapSettings, scenario: str, base_url: str) -> str:
    from openai import AsyncOpenAI
    from pydantic_ai import Agent
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider
    from pydantic_ai.usage import RunUsage, UsageLimits

    client = AsyncOpenAI(base_url=base_url, api_key="caps")
    agent = Agent(OpenAIChatModel(_model(scenario), provider=OpenAIProvider(openai_client=client)))

    def step(n: int) -> str:
        """Do step ``n`` of the job."""
        return f"step {n} done"

    agent.tool_plain(step)  # called, not as a decorator: without the peer installed its type is unknown
    limits = UsageLimits(cost_limit=Decimal(str(settings.cap_usd())), request_limit=None)
    options: Any = {"max_tokens": settings.reply_tokens}
    try:
        if scenario == "parallel":
            usage = RunUsage()  # one usage for every run: the cap covers them all
            await asyncio.gather(*(agent.run(f"{call_tag(f'one{i}')} Part {i} of the report.", usage=usage,
                                             usage_limits=limits, model_settings=options)
                                   for i in range(settings.turns)))
        else:
            await agent.run(f"{call_tag('loop')} Write the report, one step at a time.", usage_limits=limits,
                            model_settings=options)
        return "finished"
    except Exception as exc:
        return _ended(exc)
    finally:
        await client.close()


class _LoopState(TypedDict):
    """The LangGraph peer's state: the loop's turn, and the parts done (a reducer appends the fan-out's)."""

    turn: int
    done: Annotated[list[int], operator.add]


async def _langgraph(settings: CapSettings, scenario: str, base_url: str) -> str:
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, StateGraph
    from langgraph.types import Send

    model = ChatOpenAI(model=_model(scenario), base_url=base_url, api_key="caps",
                       max_completion_tokens=settings.reply_tokens)

    async def call(state: _LoopState) -> dict[str, Any]:
        turn = state["turn"]
        await model.ainvoke(f"{call_tag(f'lg{turn}')} Part {turn} of the report.")
        return {"done": [turn]} if scenario == "parallel" else {"turn": turn + 1, "done": [turn]}

    def again(state: _LoopState) -> str:
        return "call" if state["turn"] < settings.turns else END

    def fan_out(_state: _LoopState) -> list[Any]:
        return [Send("call", {"turn": i}) for i in range(settings.turns)]

    builder = StateGraph(_LoopState)
    builder.add_node("call", call)
    if scenario == "parallel":
        builder.add_conditional_edges(START, fan_out, ["call"])
        builder.add_edge("call", END)
    else:
        builder.add_edge(START, "call")
        builder.add_conditional_edges("call", again, ["call", END])
    graph = builder.compile()
    try:
        await graph.ainvoke({"turn": 0, "done": []}, {"recursion_limit": settings.turn_cap()})
        return "finished"
    except Exception as exc:
        return _ended(exc)


async def _openai_agents(settings: CapSettings, scenario: str, base_url: str) -> str:
    from agents import Agent, ModelSettings, OpenAIChatCompletionsModel, Runner, function_tool, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)
    client = AsyncOpenAI(base_url=base_url, api_key="caps")

    def step(n: int) -> str:
        """Do step ``n`` of the job."""
        return f"step {n} done"

    agent = Agent(name="writer", instructions="Write the report.", tools=[function_tool(step)],
                  model=OpenAIChatCompletionsModel(model=_model(scenario), openai_client=client),
                  model_settings=ModelSettings(max_tokens=settings.reply_tokens))
    try:
        if scenario == "parallel":
            await asyncio.gather(*(Runner.run(agent, f"{call_tag(f'one{i}')} Part {i} of the report.",
                                              max_turns=settings.turn_cap()) for i in range(settings.turns)))
        else:
            await Runner.run(agent, f"{call_tag('loop')} Write the report, one step at a time.",
                             max_turns=settings.turn_cap())
        return "finished"
    except Exception as exc:
        return _ended(exc)
    finally:
        await client.close()


RUNNERS: dict[str, tuple[Runner, tuple[str, ...], tuple[str, ...], str]] = {
    # system: (runner, modules it needs, packages whose versions it prints, the cap it is given)
    "planweave": (_planweave, (), ("planweave",), "Budget(usd=cap)"),
    "pydantic-ai": (_pydantic_ai, ("pydantic_ai", "openai"), ("pydantic-ai-slim", "openai"),
                    "UsageLimits(cost_limit=cap)"),
    "langgraph": (_langgraph, ("langgraph", "langchain_openai"), ("langgraph", "langchain-openai"),
                  "recursion_limit={turns}"),
    "openai-agents": (_openai_agents, ("agents", "openai"), ("openai-agents", "openai"), "max_turns={turns}"),
}


def _version(packages: Sequence[str]) -> str:
    out = []
    for package in packages:
        try:
            out.append(f"{package} {importlib.metadata.version(package)}")
        except importlib.metadata.PackageNotFoundError:
            out.append(f"{package} (not installed)")
    return ", ".join(out)


async def _measure(system: str, scenario: str, settings: CapSettings) -> CapResult:
    runner, _, packages, cap = RUNNERS[system]
    random.seed(settings.seed)
    provider = MeteredProvider(_script(settings, scenario), ttft=0.2, tokens_per_second=100.0,
                               prices={PRICED: PRICE, UNPRICED: PRICE})
    async with provider as base_url:
        ended = await runner(settings, scenario, base_url)
    return CapResult(system=system, scenario=scenario, version=_version(packages),
                     cap=cap.format(turns=settings.turn_cap()), cap_usd=settings.cap_usd(),
                     spent_usd=provider.invoice_usd(), calls=sum(1 for a in provider.attempts if a.completed),
                     ended=ended)


def run_caps(settings: CapSettings, systems: Sequence[str] = SYSTEMS,
             scenarios: Sequence[str] = SCENARIOS) -> list[CapResult]:
    """Every system in every scenario, each on a fresh provider and its own virtual clock; a peer not installed is
    skipped with the reason."""
    import logging
    import warnings

    from planweave.core.clock import run_virtual

    results = []
    for system in systems:
        absent = [m for m in RUNNERS[system][1] if importlib.util.find_spec(m) is None]
        for scenario in scenarios:
            if absent:
                results.append(CapResult(system, scenario, "", "", settings.cap_usd(), 0.0, 0, "",
                                         skipped=f"not installed: {', '.join(absent)} (pip install -e '.[bench]')"))
                continue
            with warnings.catch_warnings(), contextlib.ExitStack() as stack:
                warnings.simplefilter("ignore")  # Pydantic AI warns that an unpriced model's cost cannot be capped
                previous = logging.root.manager.disable
                logging.disable(logging.WARNING)
                stack.callback(logging.disable, previous)
                results.append(run_virtual(_measure(system, scenario, settings)))
    return results


def table(results: Sequence[CapResult]) -> str:
    head = (f"{'scenario':<9} {'system':<14} {'cap given':<28} {'cap $':>8} {'spent $':>9} {'x cap':>6} {'calls':>5}"
            "  ended")
    lines = [head, "-" * len(head)]
    for r in sorted(results, key=lambda r: (SCENARIOS.index(r.scenario), SYSTEMS.index(r.system))):
        if r.skipped:
            lines.append(f"{r.scenario:<9} {r.system:<14} skipped: {r.skipped}")
            continue
        lines.append(f"{r.scenario:<9} {r.system:<14} {r.cap:<28} {r.cap_usd:>8.5f} {r.spent_usd:>9.5f} "
                     f"{r.spent_usd / r.cap_usd:>6.2f} {r.calls:>5}  {r.ended}")
    return "\n".join(lines)


@dataclass(frozen=True)
class _Options:
    settings: CapSettings
    systems: tuple[str, ...]
    scenarios: tuple[str, ...]
    json: bool


def _choose(value: str, allowed: Sequence[str], flag: str) -> tuple[str, ...]:
    chosen = tuple(s.strip() for s in value.split(",") if s.strip())
    bad = [s for s in chosen if s not in allowed]
    if bad or not chosen:
        raise typer.BadParameter(f"unknown {flag[2:-1]} {bad[0] if bad else '(none)'!r}: choose from "
                                 f"{', '.join(allowed)}", param_hint=flag)
    return chosen


def _options(
    turns: Annotated[int, typer.Option(min=3, help="model calls of the job (it costs ~3x the cap)")] = 30,
    reply_tokens: Annotated[int, typer.Option(min=8, help="tokens of each reply (its max_tokens)")] = 400,
    seed: Annotated[int, typer.Option(help="seeds the retry jitter")] = 7,
    systems: Annotated[str, typer.Option(help=f"comma-separated, of {','.join(SYSTEMS)}")] = ",".join(SYSTEMS),
    scenarios: Annotated[str, typer.Option(help=f"comma-separated, of {','.join(SCENARIOS)}")] = ",".join(SCENARIOS),
    quick: Annotated[bool, typer.Option("--quick", help="12 calls of 100 tokens (what CI runs)")] = False,
    json_output: Annotated[bool, typer.Option("--json", help="print one JSON object")] = False,
) -> _Options:
    """Runs that would spend about three times their dollar cap (priced model, unpriced model, cut calls, parallel
    calls): what planweave, Pydantic AI, LangGraph and the OpenAI Agents SDK spend against the cap."""
    if quick:
        turns, reply_tokens = 12, 100
    return _Options(CapSettings(turns=turns, reply_tokens=reply_tokens, seed=seed),
                    _choose(systems, SYSTEMS, "--systems"), _choose(scenarios, SCENARIOS, "--scenarios"),
                    json_output)


def main(argv: Sequence[str] | None = None) -> int:
    """Run every system in every scenario and print the table (or JSON); a bad option exits 2 naming it."""
    args = parse_command_line(_options, argv, "planweave bench caps")
    started = time.perf_counter()
    results = run_caps(args.settings, args.systems, args.scenarios)
    if args.json:
        print(json.dumps({"settings": asdict(args.settings), "cap_usd": args.settings.cap_usd(),
                          "results": [{**asdict(r), "within": r.within} for r in results],
                          "wall_seconds": time.perf_counter() - started}, indent=2))
        return 0
    s = args.settings
    print(f"caps: a job of {s.turns} model calls of {s.reply_tokens} tokens (~${3 * s.cap_usd():.5f}) under a cap of "
          f"${s.cap_usd():.5f}; turn and step limits set to {s.turn_cap()} (the cap over one call's cost)")
    print(table(results))
    versions = sorted({f"{r.system}: {r.version}" for r in results if r.version})
    print("versions: " + "; ".join(versions))
    print(f"({time.perf_counter() - started:.1f}s wall)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
