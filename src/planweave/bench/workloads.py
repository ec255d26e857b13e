"""Benchmark workloads: seeded DAG generators shared by every system, so all of them run the same graph (pure).

A :class:`Workload` is a dependency dict in topological order (step id -> its parents) plus, for latency-bound
workloads, how long each step sleeps. :func:`plan_document` turns one into a planweave plan document; the peers in
:mod:`planweave.bench.peers` read the dependency dict directly.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Deps = Mapping[str, tuple[str, ...]]


@dataclass(frozen=True)
class Workload:
    """A named DAG: ``deps`` maps each step to its parents, in topological order; ``durations`` are seconds slept.

    An empty ``durations`` means a no-op workload (every step returns at once).
    """

    name: str
    deps: Deps
    durations: Mapping[str, float] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.deps)

    @property
    def sinks(self) -> tuple[str, ...]:
        """The steps nothing depends on, in topological order."""
        parents = {p for ps in self.deps.values() for p in ps}
        return tuple(sid for sid in self.deps if sid not in parents)

    @property
    def critical_path(self) -> float:
        """The longest duration-weighted path: the makespan with unlimited parallelism and zero overhead."""
        return critical_path(self.deps, self.durations)

    @property
    def depth(self) -> int:
        """The number of steps on the longest path counted in steps (LangGraph's superstep count)."""
        level: dict[str, int] = {}
        for sid, parents in self.deps.items():
            level[sid] = 1 + max((level[p] for p in parents), default=0)
        return max(level.values(), default=0)


def _step_id(index: int) -> str:
    return f"s{index}"


def critical_path(deps: Deps, durations: Mapping[str, float]) -> float:
    """Return the longest path through ``deps`` weighted by ``durations`` (missing steps weigh 0).

    ``deps`` must be in topological order (parents before children), as every generator here returns it.
    """
    finish: dict[str, float] = {}
    for sid, parents in deps.items():
        finish[sid] = max((finish[p] for p in parents), default=0.0) + durations.get(sid, 0.0)
    return max(finish.values(), default=0.0)


def fan_out(steps: int) -> Workload:
    """A wide fan-out/fan-in of ``steps`` no-op steps in total: one source, ``steps - 2`` in parallel, one sink."""
    if steps < 3:
        raise ValueError(f"a fan-out needs at least 3 steps, got {steps}")
    deps: dict[str, tuple[str, ...]] = {"src": ()}
    middle = [_step_id(i) for i in range(steps - 2)]
    for sid in middle:
        deps[sid] = ("src",)
    deps["sink"] = tuple(middle)
    return Workload(f"fan-out {steps:,}", deps)


def _layer_sizes(steps: int, layers: int) -> list[int]:
    base, extra = divmod(steps, layers)
    return [base + (1 if i < extra else 0) for i in range(layers)]


def layered(steps: int, layers: int = 20, seed: int = 1) -> Workload:
    """A random layered DAG of ``steps`` no-op steps: each step past the first layer has 1-3 parents in the previous.

    Seeded: the same arguments always give the same graph.
    """
    if steps < layers:
        raise ValueError(f"{steps} steps cannot fill {layers} layers")
    rng = random.Random(seed)
    deps: dict[str, tuple[str, ...]] = {}
    previous: list[str] = []
    index = 0
    for size in _layer_sizes(steps, layers):
        current = []
        for _ in range(size):
            sid = _step_id(index)
            index += 1
            deps[sid] = tuple(rng.sample(previous, min(len(previous), rng.randint(1, 3)))) if previous else ()
            current.append(sid)
        previous = current
    return Workload(f"layered {steps:,}", deps)


def latency_random(steps: int = 200, seed: int = 2, median: float = 0.05, window: int = 24) -> Workload:
    """A random DAG of ``steps`` sleeping steps, durations lognormal around ``median`` seconds (sigma 0.5).

    Step ``i`` has 1-3 parents drawn from the ``window`` steps before it (the first four steps are roots), so the
    graph is neither a chain nor one wide layer. Seeded.
    """
    rng = random.Random(seed)
    deps: dict[str, tuple[str, ...]] = {}
    durations: dict[str, float] = {}
    ids = [_step_id(i) for i in range(steps)]
    for i, sid in enumerate(ids):
        if i < 4:
            deps[sid] = ()
        else:
            pool = ids[max(0, i - window) : i]
            deps[sid] = tuple(sorted(rng.sample(pool, rng.randint(1, 3)), key=lambda s: int(s[1:])))
        durations[sid] = round(min(0.5, rng.lognormvariate(math.log(median), 0.5)), 4)
    return Workload(f"random {steps} x ~{median * 1000:.0f} ms", deps, durations)


def uneven(layers: int = 20, fast_per_layer: int = 9, seed: int = 3, slow: float = 0.5, fast: float = 0.01) -> Workload:
    """Layers of ``fast_per_layer`` ``fast`` steps plus one ``slow`` step that nothing waits for.

    Each fast step has 1-3 fast parents in the previous layer; the slow step of a layer hangs off one fast step of
    the previous layer and is a leaf. An event-driven engine finishes in about ``(layers - 1) * fast + slow``; an
    engine with superstep barriers waits for every slow step in turn, about ``layers * slow``. Seeded.
    """
    rng = random.Random(seed)
    deps: dict[str, tuple[str, ...]] = {}
    durations: dict[str, float] = {}
    previous: list[str] = []
    index = 0
    for _ in range(layers):
        current = []
        for _ in range(fast_per_layer):
            sid = _step_id(index)
            index += 1
            deps[sid] = tuple(rng.sample(previous, rng.randint(1, min(3, len(previous))))) if previous else ()
            durations[sid] = fast
            current.append(sid)
        sid = _step_id(index)
        index += 1
        deps[sid] = (rng.choice(previous),) if previous else ()
        durations[sid] = slow
        previous = current
    return Workload(f"uneven {layers} layers", deps, durations)


def plan_document(workload: Workload) -> dict[str, Any]:
    """Return the planweave plan document for ``workload``: ``noop`` steps, or ``sleep`` steps with its durations.

    Each step's ``estimate.duration`` is its sleep, so the engine's critical-path priorities see the real weights.
    """
    steps: list[dict[str, Any]] = []
    for sid, parents in workload.deps.items():
        step: dict[str, Any] = {"id": sid}
        if workload.durations:
            seconds = workload.durations.get(sid, 0.0)
            step.update(tool="sleep", args={"seconds": seconds}, estimate={"duration": seconds})
        else:
            step["tool"] = "noop"
        if parents:
            step["after"] = list(parents)
        steps.append(step)
    return {"name": workload.name, "steps": steps}
