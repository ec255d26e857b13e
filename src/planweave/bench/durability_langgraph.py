"""The durability workload on LangGraph: a child process that starts the graph, or resumes it as LangGraph documents.

``python -m planweave.bench.durability_langgraph SPEC_JSON``. The graph is LangGraph's map-reduce shape: a
conditional edge from ``START`` returns one ``Send("effect", ...)`` per fan-out step (run in parallel in one
superstep), every ``effect`` leads to ``join``, and a reducer collects what each step did. It is compiled with the
checkpointer of the store (``SqliteSaver`` for a file, ``PostgresSaver`` for a ``postgresql://`` URL, ``setup()``
called first) and invoked with ``durability="sync"`` (persisted before the next step starts) on the run's
``thread_id``. Resume (docs "Durable execution", "Resuming workflows"): invoke the same graph with ``None`` as the
input and the same ``thread_id``.
"""

from __future__ import annotations

import operator
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated, Any, TypedDict

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.errors import EmptyInputError
from langgraph.graph import END, START, StateGraph
from langgraph.types import Send

from planweave.bench.durability_effects import JOIN, ChildSpec, append_effect, begin, report, step_ids


class Progress(TypedDict):
    """The graph's state: the steps that ran (the reducer appends each node's list)."""

    done: Annotated[list[str], operator.add]


class EffectInput(TypedDict):
    """What one ``Send`` gives the ``effect`` node."""

    run_dir: str
    step: str
    ms: int


def build(spec: ChildSpec, saver: BaseCheckpointSaver[Any]) -> Any:
    """The fan-out graph of ``spec``, compiled with ``saver``."""

    def fan_out(state: Progress) -> list[Send]:
        return [Send("effect", EffectInput(run_dir=spec.run_dir, step=sid, ms=ms))
                for sid, ms in zip(step_ids(len(spec.durations_ms)), spec.durations_ms, strict=True)]

    def effect(state: EffectInput) -> dict[str, list[str]]:
        begin(state["run_dir"], state["step"])
        time.sleep(state["ms"] / 1000)
        append_effect(state["run_dir"], state["step"])
        return {"done": [state["step"]]}

    def join(state: Progress) -> dict[str, list[str]]:
        begin(spec.run_dir, JOIN)
        append_effect(spec.run_dir, JOIN)
        return {"done": [JOIN]}

    builder = StateGraph(Progress)
    builder.add_node("effect", effect, input_schema=EffectInput)  # a Send delivers an EffectInput
    builder.add_node("join", join)
    builder.add_conditional_edges(START, fan_out, ["effect"])
    builder.add_edge("effect", "join")
    builder.add_edge("join", END)
    return builder.compile(checkpointer=saver)


@contextmanager
def checkpointer(store: str) -> Iterator[BaseCheckpointSaver[Any]]:
    """LangGraph's checkpointer for ``store``: PostgreSQL for a URL, else SQLite on the file."""
    if store.startswith("postgresql://"):
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(store) as pg_saver:
            pg_saver.setup()
            yield pg_saver
    else:
        from langgraph.checkpoint.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(store) as sqlite_saver:
            yield sqlite_saver


def main(spec: ChildSpec) -> None:
    """Start or resume the thread of ``spec`` and report how it ended."""
    with checkpointer(spec.store) as saver:
        graph = build(spec, saver)
        config = {"configurable": {"thread_id": spec.run_id}}
        report("READY")
        began = time.perf_counter()
        try:
            final = graph.invoke({"done": []} if spec.mode == "start" else None, config, durability="sync")
        except EmptyInputError:
            report("DONE", call_s=time.perf_counter() - began, outcome="not_found",
                   detail="no checkpoint for the thread (killed before the first one was stored)")
            return
        done = list(final.get("done", [])) if isinstance(final, dict) else []
        if JOIN in done:
            outcome, detail = "completed", ""
        else:
            outcome, detail = "failed", f"the graph returned without its join: {sorted(done)}"
        report("DONE", call_s=time.perf_counter() - began, outcome=outcome, detail=detail)


if __name__ == "__main__":
    main(ChildSpec.from_json(sys.argv[1]))
