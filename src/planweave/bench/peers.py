"""The systems planweave is measured against: a hand-written asyncio floor, LangGraph and Ray (local).

Every system implements :class:`System`: ``prepare`` turns a :class:`~planweave.bench.workloads.Workload` into
whatever the system runs (not timed), ``run`` executes it and returns when every step is done (timed), and
``step_durations`` says how long each sleeping step really took (its critical path is the fair bound). LangGraph
and Ray are optional (``pip install -e .[bench]``); they are imported when opened, and a missing one raises
:class:`SystemUnavailable`, which the benchmark reports as a skipped column.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol, TypeVar

from planweave.bench.workloads import Deps, Workload

P = TypeVar("P")


class SystemUnavailable(Exception):
    """Raised by :meth:`System.open` when a system cannot be measured here; the message says why."""


class System(Protocol[P]):
    """One system under test, opened once and then given workload after workload."""

    key: str
    label: str

    async def open(self) -> None:
        """Start the system (not timed); raise :class:`SystemUnavailable` if it cannot run here."""
        ...

    async def prepare(self, workload: Workload) -> P:
        """Build what :meth:`run` executes for ``workload`` (not timed)."""
        ...

    async def run(self, prepared: P) -> object:
        """Execute every step and return once all are done (timed); return a trace for :meth:`step_durations`."""
        ...

    async def step_durations(self, prepared: P, trace: object) -> Mapping[str, float]:
        """How long each step of a sleeping workload actually took in the run that returned ``trace`` (not timed).

        Empty for no-op workloads, where nothing is recorded so that recording costs nothing.
        """
        ...

    async def close(self) -> None:
        """Release what :meth:`open` started."""
        ...


# -- the asyncio floor --------------------------------------------------------------------------------------------


async def run_floor(deps: Deps, work: Callable[[str], Awaitable[None]] | None = None) -> None:
    """Run the DAG ``deps`` with as little as an asyncio program can do: one task per step, no journal, no polling.

    A step's task, as it completes, launches each child whose last parent it was, inside one TaskGroup. (Launching
    from inside the finishing task rather than from a done-callback keeps the group non-empty, so it cannot close
    between a task ending and its children starting.) Each step awaits ``work(step_id)`` if given, else nothing.
    """
    children: dict[str, list[str]] = {sid: [] for sid in deps}
    waiting: dict[str, int] = {}
    for sid, parents in deps.items():
        waiting[sid] = len(parents)
        for parent in parents:
            children[parent].append(sid)

    async with asyncio.TaskGroup() as tg:

        async def step(sid: str) -> None:
            if work is not None:
                await work(sid)
            for child in children[sid]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    tg.create_task(step(child))

        for sid, count in waiting.items():
            if count == 0:
                tg.create_task(step(sid))


class SleepRecorder:
    """Step work that sleeps each step's duration and records how long the sleep really took."""

    def __init__(self, durations: Mapping[str, float]) -> None:
        self.durations = durations
        self.actual: dict[str, float] = {}

    async def __call__(self, sid: str) -> None:
        started = time.perf_counter()
        await asyncio.sleep(self.durations[sid])
        self.actual[sid] = time.perf_counter() - started


class _FloorRecord:
    """A step's record in :func:`run_journaled_floor`: what a journaled engine must know of a step at the least."""

    __slots__ = ("attempt", "finished_at", "started_at", "status")

    def __init__(self) -> None:
        self.status = "pending"
        self.attempt = 0
        self.started_at: float | None = None
        self.finished_at: float | None = None


def _fold_started(rec: _FloorRecord, event: tuple[Any, ...]) -> None:
    rec.status, rec.attempt, rec.started_at = "running", event[4]["attempt"], event[2]


def _fold_succeeded(rec: _FloorRecord, event: tuple[Any, ...]) -> None:
    rec.status, rec.finished_at = "succeeded", event[2]


_FLOOR_FOLD = {"step_started": _fold_started, "step_succeeded": _fold_succeeded}


async def run_journaled_floor(deps: Deps, work: Callable[[str], Awaitable[None]] | None = None) -> list[Any]:
    """:func:`run_floor` plus the least an engine that journals and resumes must do per step: a record per step,
    and two events (started, succeeded) that are built, appended to a log and folded into the record through a
    table of handlers, the way a resume folds them again; the output is kept. No validation, no priorities, no
    capacities, no attempt context, no encoding: a lower bound for a journaled engine in pure Python, not a design.
    Returns the log."""
    children: dict[str, list[str]] = {sid: [] for sid in deps}
    waiting: dict[str, int] = {}
    for sid, parents in deps.items():
        waiting[sid] = len(parents)
        for parent in parents:
            children[parent].append(sid)
    records = {sid: _FloorRecord() for sid in deps}
    outputs: dict[str, Any] = {}
    log: list[Any] = []
    now = time.time
    started = {"attempt": 1}

    def emit(kind: str, sid: str, data: Mapping[str, Any]) -> None:
        event = ("run", kind, now(), sid, data)
        log.append(event)
        _FLOOR_FOLD[kind](records[sid], event)

    async with asyncio.TaskGroup() as tg:

        async def step(sid: str) -> None:
            if work is not None:
                await work(sid)
            outputs[sid] = None  # what the step returned: the floor's work returns nothing
            emit("step_succeeded", sid, {"attempt": 1, "output": None})
            for child in children[sid]:
                waiting[child] -= 1
                if waiting[child] == 0:
                    launch(child)

        def launch(sid: str) -> None:
            tg.create_task(step(sid))
            emit("step_started", sid, started)

        for sid, count in waiting.items():
            if count == 0:
                launch(sid)
    return log


class JournaledFloorSystem:
    """:func:`run_journaled_floor` as a :class:`System` (no-op workloads; sleeping ones sleep as the floor's do)."""

    key = "floor-fold"
    label = "journaled floor"

    async def open(self) -> None:
        pass

    async def prepare(self, workload: Workload) -> tuple[Deps, SleepRecorder | None]:
        return workload.deps, SleepRecorder(workload.durations) if workload.durations else None

    async def run(self, prepared: tuple[Deps, SleepRecorder | None]) -> object:
        deps, recorder = prepared
        await run_journaled_floor(deps, recorder)
        return None

    async def step_durations(self, prepared: tuple[Deps, SleepRecorder | None], trace: object) -> Mapping[str, float]:
        recorder = prepared[1]
        return dict(recorder.actual) if recorder is not None else {}

    async def close(self) -> None:
        pass


class FloorSystem:
    """The asyncio ready-frontier floor (:func:`run_floor`) as a :class:`System`."""

    key = "floor"
    label = "asyncio floor"

    async def open(self) -> None:
        pass

    async def prepare(self, workload: Workload) -> tuple[Deps, SleepRecorder | None]:
        return workload.deps, SleepRecorder(workload.durations) if workload.durations else None

    async def run(self, prepared: tuple[Deps, SleepRecorder | None]) -> object:
        deps, recorder = prepared
        await run_floor(deps, recorder)
        return None

    async def step_durations(self, prepared: tuple[Deps, SleepRecorder | None], trace: object) -> Mapping[str, float]:
        recorder = prepared[1]
        return dict(recorder.actual) if recorder is not None else {}

    async def close(self) -> None:
        pass


# -- LangGraph ----------------------------------------------------------------------------------------------------


def _langgraph_node(sid: str, recorder: SleepRecorder | None) -> Callable[[Mapping[str, Any]], Awaitable[None]]:
    async def node(state: Mapping[str, Any]) -> None:
        if recorder is not None:
            await recorder(sid)

    return node


class LangGraphSystem:
    """LangGraph: a ``StateGraph`` with one async node per step, invoked with ``ainvoke`` (compiling is not timed).

    A step with one parent gets an edge from it; a step with several gets one waiting edge from all of them
    (``add_edge([parents], step)``), so it runs once, after all of them. Roots hang off ``START``. Nodes still run
    in supersteps: a node made ready in one superstep starts only when every node of that superstep has finished.
    """

    key = "langgraph"
    label = "LangGraph"

    def __init__(self) -> None:
        self._graph_module: Any = None
        self.compile_seconds: dict[str, float] = {}

    async def open(self) -> None:
        try:
            import langgraph.graph
        except ImportError as exc:
            raise SystemUnavailable(f"not installed ({exc.name}); pip install -e .[bench]") from None
        self._graph_module = langgraph.graph

    async def prepare(self, workload: Workload) -> tuple[Any, SleepRecorder | None]:
        graph_module = self._graph_module
        started = time.perf_counter()
        recorder = SleepRecorder(workload.durations) if workload.durations else None
        graph = graph_module.StateGraph(dict)
        for sid in workload.deps:
            graph.add_node(sid, _langgraph_node(sid, recorder))
        for sid, parents in workload.deps.items():
            if not parents:
                graph.add_edge(graph_module.START, sid)
            elif len(parents) == 1:
                graph.add_edge(parents[0], sid)
            else:
                graph.add_edge(list(parents), sid)
        compiled = graph.compile()
        self.compile_seconds[workload.name] = time.perf_counter() - started
        return compiled, recorder

    async def run(self, prepared: tuple[Any, SleepRecorder | None]) -> object:
        # One superstep per DAG level: lift the default limit of 25 supersteps.
        await prepared[0].ainvoke({}, {"recursion_limit": 1_000_000})
        return None

    async def step_durations(self, prepared: tuple[Any, SleepRecorder | None], trace: object) -> Mapping[str, float]:
        recorder = prepared[1]
        return dict(recorder.actual) if recorder is not None else {}

    async def close(self) -> None:
        pass


# -- Ray ----------------------------------------------------------------------------------------------------------


def _ray_noop(*parents: None) -> None:
    """A Ray task body: nothing, once the parents' results (passed as ObjectRefs) are available."""


def _ray_sleep(seconds: float, *parents: float) -> float:
    """A Ray task body: sleep ``seconds`` (a worker process per concurrent step) and return how long it took."""
    started = time.perf_counter()
    time.sleep(seconds)
    return time.perf_counter() - started


class RaySystem:
    """Ray on this machine: ``ray.init(num_cpus=2)``, one remote task per step taking its parents' ObjectRefs.

    No-op steps use the default one CPU per task; sleeping steps claim no CPU so that all ready ones can run at
    once (each in its own worker process). ``ray.init`` is not timed; :meth:`run` times submit to ``ray.get``.
    """

    key = "ray"
    label = "Ray (local)"

    def __init__(self, num_cpus: int = 2) -> None:
        self.num_cpus = num_cpus
        self._ray: Any = None
        self._noop: Any = None
        self._sleep: Any = None

    async def open(self) -> None:
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        try:
            import ray
        except ImportError as exc:
            raise SystemUnavailable(f"not installed ({exc.name}); pip install -e .[bench]") from None
        try:
            ray.init(
                num_cpus=self.num_cpus,
                include_dashboard=False,
                log_to_driver=False,
                logging_level=logging.ERROR,
                object_store_memory=256 * 1024 * 1024,
            )
        except Exception as exc:  # Ray raises many kinds; any of them means "cannot measure here"
            raise SystemUnavailable(f"ray.init failed: {type(exc).__name__}: {exc}") from None
        self._ray = ray
        self._noop = ray.remote(_ray_noop)
        self._sleep = ray.remote(num_cpus=0)(_ray_sleep)

    async def prepare(self, workload: Workload) -> tuple[Workload, tuple[str, ...]]:
        return workload, workload.sinks

    async def run(self, prepared: tuple[Workload, tuple[str, ...]]) -> object:
        workload, sinks = prepared
        refs: dict[str, Any] = {}
        durations = workload.durations
        for sid, parents in workload.deps.items():
            parent_refs = [refs[p] for p in parents]
            if durations:
                refs[sid] = self._sleep.remote(durations.get(sid, 0.0), *parent_refs)
            else:
                refs[sid] = self._noop.remote(*parent_refs)
        # Blocking the loop is fine here: nothing else runs while a system is measured.
        self._ray.get([refs[sid] for sid in sinks])
        return refs

    async def step_durations(self, prepared: tuple[Workload, tuple[str, ...]], trace: object) -> Mapping[str, float]:
        if not prepared[0].durations or not isinstance(trace, dict):
            return {}
        return dict(zip(trace, self._ray.get(list(trace.values())), strict=True))

    async def close(self) -> None:
        if self._ray is not None:
            self._ray.shutdown()
            self._ray = None
