"""validate_plan's short ways for the common step (no arguments, known ``after``) and for plans without estimates give
what the general passes give: the same order, dependencies, ranks, critical path and problems."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planweave import PlanInvalid, builtin_tools, parse_plan_document, validate_plan


def reference_graph(
    ids: list[str], after: dict[str, list[str]], durations: dict[str, float]
) -> tuple[list[str], dict[str, tuple[str, ...]], dict[str, tuple[str, ...]], dict[str, float], float, list[str]]:
    """Order (Kahn's, ties in plan order), deps, dependents, upward ranks, makespan bound and critical path, written
    the plain way."""
    deps = {sid: tuple(dict.fromkeys(after[sid])) for sid in ids}
    dependents: dict[str, list[str]] = {sid: [] for sid in ids}
    indegree = dict.fromkeys(ids, 0)
    for sid in ids:
        for d in deps[sid]:
            dependents[d].append(sid)
            indegree[sid] += 1
    order = [sid for sid in ids if indegree[sid] == 0]
    i = 0
    while i < len(order):
        for child in dependents[order[i]]:
            indegree[child] -= 1
            if indegree[child] == 0:
                order.append(child)
        i += 1
    rank: dict[str, float] = {}
    for sid in reversed(order):
        rank[sid] = durations[sid] + max((rank[c] for c in dependents[sid]), default=0.0)
    roots = [sid for sid in order if not deps[sid]]
    path = [max(roots, key=lambda s: rank[s])] if roots else []
    while path and dependents[path[-1]]:
        path.append(max(dependents[path[-1]], key=lambda s: rank[s]))
    bound = rank[path[0]] if path else 0.0
    return order, deps, {k: tuple(v) for k, v in dependents.items()}, rank, bound, path


@st.composite
def dags(draw: st.DrawFn) -> dict[str, Any]:
    """A plan document of ``noop`` steps in a shuffled plan order; ``after`` may name a step twice; some steps carry
    arguments with references (the general pass), some estimates (or none at all)."""
    size = draw(st.integers(1, 14))
    ids = [f"s{i}" for i in range(size)]
    estimated = draw(st.booleans())
    steps: list[dict[str, Any]] = []
    for i, sid in enumerate(ids):
        parents = draw(st.lists(st.sampled_from(ids[:i]), max_size=4) if i else st.just([]))
        step: dict[str, Any] = {"id": sid, "tool": "noop"}
        referenced = draw(st.booleans())  # the first parent named by a reference in the arguments
        if parents and referenced:
            step["args"] = {"x": "${" + parents[0] + "}"}
            parents = parents[1:]
        if parents:
            step["after"] = parents
        if draw(st.booleans()) and estimated:
            step["estimate"] = {"duration": draw(st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.0]))}
        steps.append(step)
    return {"steps": draw(st.permutations(steps))}


@settings(max_examples=300, deadline=None)
@given(dags())
def test_the_graph_is_the_one_the_plain_algorithms_give(doc: dict[str, Any]) -> None:
    plan = validate_plan(parse_plan_document(doc), builtin_tools(), {})
    ids = [step["id"] for step in doc["steps"]]
    after = {step["id"]: ([step["args"]["x"][2:-1]] if "args" in step else []) + step.get("after", [])
             for step in doc["steps"]}
    durations = {step["id"]: float(step.get("estimate", {}).get("duration", 0.0)) for step in doc["steps"]}
    order, deps, dependents, rank, bound, path = reference_graph(ids, after, durations)
    assert plan.order == tuple(order)
    assert list(plan.steps) == order
    assert dict(plan.deps) == deps
    assert dict(plan.dependents) == dependents
    assert list(plan.rank.items()) == list(rank.items())  # the same values, in the same (reversed) order
    assert (plan.makespan_lower_bound, plan.critical_path) == (bound, tuple(path))


def problems(steps: list[dict[str, Any]]) -> list[str]:
    with pytest.raises(PlanInvalid) as info:
        validate_plan(parse_plan_document({"steps": steps}), builtin_tools(), {})
    return [str(p) for p in info.value.problems]


def test_a_step_without_arguments_has_its_after_checked_in_plan_order() -> None:
    assert problems([
        {"id": "a", "tool": "noop"},
        {"id": "b", "tool": "noop", "after": ["a", "b"]},
        {"id": "c", "tool": "noop", "after": ["x"]},
        {"id": "d", "tool": "nop", "after": ["a", "a", "aa"]},
        {"id": "e", "tool": "noop", "after": ["e"]},
    ]) == [
        "step 'b', after[1]: a step cannot come after itself",
        "step 'c', after[0]: unknown step 'x'",
        "step 'd', after[2]: unknown step 'aa' (did you mean 'a'?)",
        "step 'd', tool: unknown tool 'nop' (did you mean 'noop'?)",
        "step 'e', after[0]: a step cannot come after itself",
    ]


def test_a_step_named_twice_in_after_is_one_dependency() -> None:
    plan = validate_plan(parse_plan_document({"steps": [
        {"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop"},
        {"id": "c", "tool": "noop", "after": ["a", "b", "a"]}, {"id": "d", "tool": "noop", "after": ["c", "c"]},
    ]}), builtin_tools(), {})
    assert plan.deps == {"a": (), "b": (), "c": ("a", "b"), "d": ("c",)}
    assert plan.dependents == {"a": ("c",), "b": ("c",), "c": ("d",), "d": ()}


def test_a_tool_checked_once_still_checks_the_cache_and_the_arguments_of_each_step() -> None:
    assert problems([
        {"id": "a", "tool": "human.input", "args": {"prompt": "?"}},
        {"id": "b", "tool": "noop"},
        {"id": "c", "tool": "noop", "cache": True, "writes": ["f"]},
        {"id": "d", "tool": "noop", "cache": True, "idempotent": False},
        {"id": "e", "tool": "human.input"},
        {"id": "f", "tool": "human.input", "cache": True, "args": {"prompt": "?"}},
    ]) == [
        "step 'c', cache: cannot be cached: the step writes 'f'",
        "step 'd', cache: cannot be cached: the step says idempotent: false",
        "step 'e', args.prompt: required by tool 'human.input'",
        "step 'f', cache: cannot be cached: tool 'human.input' asks a person",
    ]
