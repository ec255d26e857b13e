"""The Python API's entry points: an engine on a journal, a model, and a goal run (docs/api.md).

``open_engine`` opens a journal by URL and an engine on it. ``run_goal`` is the whole of ``planweave goal`` in
one call: an engine, a model, a planning loop built by :func:`planweave.planning.build_planning_loop` and started by
:func:`planweave.planning.goal.launch_goal`, as the CLI and the server start theirs (with the live forecast).
``start_goal`` starts one on an engine of your own and returns the :class:`~planweave.Run` handle (``await
run.wait()``, ``async for event in run.events()``); ``open_model`` opens a model by the names ``--model`` takes.
Nothing heavy (models, the planning loop, httpx) is imported until one of them is called.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import AsyncExitStack, asynccontextmanager
from typing import TYPE_CHECKING, Any

from planweave.core.clock import Clock
from planweave.core.plan.catalog import ToolCatalog
from planweave.engine.runtime import DEFAULT_CONCURRENCY, Engine, Run, RunResult
from planweave.journal import open_journal
from planweave.journal.base import Journal
from planweave.limits import RunLimits
from planweave.tools import Toolbox, builtin_tools

if TYPE_CHECKING:
    from planweave.models import ModelClient


@asynccontextmanager
async def open_engine(
    journal: str | Journal | None = None,
    *,
    clock: Clock | None = None,
    concurrency: int | None = DEFAULT_CONCURRENCY,
    capacities: Mapping[str, int] | None = None,
    tools: ToolCatalog | None = None,
    redact: Callable[[Any], Any] | None = None,
    cache: bool = True,
) -> AsyncIterator[Engine]:
    """Open a journal by URL (or use the one given) and an :class:`Engine` on it; close both on exit.

    ``journal`` None means the default (``$PLANWEAVE_JOURNAL`` or ``sqlite:///.planweave/runs.db``);
    ``concurrency`` defaults to 64 steps at once, ``None`` means unlimited; ``cache=False``: no step reuses a cached
    output (docs/caching.md).
    """
    if journal is None or isinstance(journal, str):
        async with open_journal(journal) as opened, Engine(
            opened, clock=clock, concurrency=concurrency, capacities=capacities, tools=tools, redact=redact,
            cache=cache,
        ) as engine:
            yield engine
    else:
        async with Engine(journal, clock=clock, concurrency=concurrency, capacities=capacities, tools=tools,
                          redact=redact, cache=cache) as engine:
            yield engine


@asynccontextmanager
async def open_model(name: str) -> AsyncIterator[ModelClient]:
    """Open the model ``name`` names, as ``--model`` does, for the ``async with`` block; close it on exit.

    ``scripted:FILE`` serves a script's answers on 127.0.0.1 (offline planning, no model: docs/offline.md),
    ``local`` starts the bundled local model server, any other name is an OpenAI-compatible model at
    ``$OPENAI_BASE_URL`` with ``$OPENAI_API_KEY`` (:func:`planweave.models.resolve_model`).
    """
    from planweave.models import resolve_model

    async with resolve_model(name) as client:
        yield client


async def start_goal(
    engine: Engine,
    goal: str,
    *,
    model: ModelClient,
    tools: Toolbox | None = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    deadline: float | None = None,
    max_replans: int | None = None,
    run_id: str | None = None,
) -> Run:
    """Start planning and running ``goal`` on ``engine`` with ``model`` and return its run at once.

    The planner may use ``tools`` (default: the engine's toolbox, else :func:`planweave.builtin_tools`), plus an
    ``llm`` tool on ``model`` and ``plan`` (a sub-goal as a child run). ``budget_usd``/``budget_tokens`` bound what
    the planner, the joiner and the ``llm`` steps spend together (a zero budget is a budget), ``deadline`` is seconds
    from now, ``max_replans`` caps the re-plans (None: the loop's default); all are journaled, so ``planweave resume``
    applies them again. The run ends when the joiner has answered (``RunResult.answer``) or the goal failed.
    """
    from planweave.planning import build_planning_loop
    from planweave.planning.goal import launch_goal

    catalog = tools if tools is not None else engine.tools if isinstance(engine.tools, Toolbox) else builtin_tools()
    loop = build_planning_loop(engine, model, catalog, RunLimits(budget_usd, budget_tokens, deadline, max_replans))
    return await launch_goal(loop, goal, run_id=run_id)


async def run_goal(
    goal: str,
    *,
    model: str | ModelClient,
    tools: Toolbox | None = None,
    journal: str | Journal | None = None,
    budget_usd: float | None = None,
    budget_tokens: int | None = None,
    deadline: float | None = None,
    max_replans: int | None = None,
    run_id: str | None = None,
) -> RunResult:
    """Plan and run ``goal`` to its end and return how it ended, as ``planweave goal`` does.

    ``model`` is a name ``--model`` takes (opened with :func:`open_model` and closed at the end) or an open
    :class:`~planweave.models.ModelClient`; ``journal`` a journal URL or an open :class:`~planweave.Journal` (None:
    ``$PLANWEAVE_JOURNAL`` or ``sqlite:///.planweave/runs.db``); the rest is :func:`start_goal`'s. A run that fails
    is returned, not raised (``result.ok``, ``result.error``); the joiner's answer is ``result.answer``.
    """
    async with AsyncExitStack() as stack:
        client = await stack.enter_async_context(open_model(model)) if isinstance(model, str) else model
        engine = await stack.enter_async_context(open_engine(journal, tools=tools))  # closed first: runs end first
        run = await start_goal(engine, goal, model=client, tools=tools, budget_usd=budget_usd,
                               budget_tokens=budget_tokens, deadline=deadline, max_replans=max_replans,
                               run_id=run_id)
        return await run.wait()
