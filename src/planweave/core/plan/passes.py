"""The passes of :func:`planweave.core.plan.graph.validate_plan`, each small and checked on its own (pure: no I/O).

A pass appends the problems it finds to a list and returns what later passes build on. ``validate_plan`` runs
:func:`step_ids` once, then, step by step, :func:`step_references` (arguments, ``after``, the fallback's arguments
and tool, ``verifies``; a step with none of these whose ``after`` names other steps only is handled inline),
:func:`step_tool` and :func:`step_claims`, then :func:`topological_order` (cycles) and, only on an otherwise valid
plan, :func:`unordered_writers`. Running the per-step passes step by step keeps the problems in the order of the
steps, as a person reads the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from planweave.core.errors import PlanProblem, did_you_mean
from planweave.core.plan.cache import step_cache_problems
from planweave.core.plan.catalog import ToolCatalog, missing_builtin_hint
from planweave.core.plan.defaults import step_with_defaults
from planweave.core.plan.model import PlanSpec, Step
from planweave.core.plan.refs import Compiled, Ref, RefSyntaxError, compile_args

NO_ARGS: dict[str, Compiled] = {}  # the template of every step without arguments: read-only by contract
NO_DEFERRED: frozenset[str] = frozenset()


def step_ids(spec: PlanSpec, problems: list[PlanProblem]) -> dict[str, Step]:
    """The steps by id, the plan's ``defaults`` applied; a repeated id is a problem (the first step keeps it)."""
    steps: dict[str, Step] = {}
    defaults = spec.defaults if spec.defaults.model_fields_set else None
    for step in spec.steps:
        if defaults is not None:
            step = step_with_defaults(step, defaults)
        sid = step.__dict__["id"]  # one read through pydantic's __getattr__ hook, not two (graph.validate_plan)
        if sid in steps:
            problems.append(PlanProblem(sid, "id", "duplicate step id"))
        else:
            steps[sid] = step
    return steps


class StepLinks(NamedTuple):
    """What :func:`step_references` found for one step: its compiled arguments and what it depends on."""

    template: dict[str, Compiled]  # the compiled arguments
    refs: tuple[Ref, ...]  # every reference, the fallback's included
    deps: tuple[str, ...]  # the steps it waits for, in the order they are named, each once
    deferred: frozenset[str]  # the arguments that hold references: checked against the tool's schema at call time
    fallback: Compiled | None = None  # the fallback's compiled arguments, if it has a fallback whose args compile


class _Deps:
    """The dependencies of one step, each once, in the order they are first named."""

    __slots__ = ("order", "seen")

    def __init__(self) -> None:
        self.order: list[str] = []
        self.seen: set[str] = set()

    def add(self, sid: str) -> None:
        if sid not in self.seen:
            self.order.append(sid)
            self.seen.add(sid)


def step_references(
    sid: str, step: Step, steps: Mapping[str, Step], tools: ToolCatalog | None, problems: list[PlanProblem]
) -> StepLinks:
    """Compile the step's arguments and check everything it names: references, ``after``, fallback, ``verifies``."""
    template, refs, deferred = _compile_step_args(sid, step, problems)
    deps = _Deps()
    _check_refs(sid, "args", refs, steps, deps, problems)
    _check_after(sid, step, steps, deps, problems)
    fallback: Compiled | None = None
    if step.fallback is not None:
        fallback, fb_refs = _check_fallback(sid, step, steps, tools, deps, problems)
        refs.extend(fb_refs)
    _check_verifies(sid, step, steps, deps, problems)
    return StepLinks(template, tuple(refs), tuple(deps.order), frozenset(deferred), fallback)


def _compile_step_args(
    sid: str, step: Step, problems: list[PlanProblem]
) -> tuple[dict[str, Compiled], list[Ref], set[str]]:
    """Each argument compiled (an argument with a bad reference is kept as written), its references and which hold
    references."""
    template: dict[str, Compiled] = {}
    refs: list[Ref] = []
    deferred: set[str] = set()
    for name, value in step.args.items():
        try:
            template[name], found = compile_args(value)
        except RefSyntaxError as exc:
            problems.append(PlanProblem(sid, f"args.{name}", str(exc)))
            template[name] = value
            continue
        if found:
            deferred.add(name)
        refs.extend(found)
    return template, refs, deferred


def _check_refs(sid: str, field: str, refs: list[Ref] | tuple[Ref, ...], steps: Mapping[str, Step], deps: _Deps,
                problems: list[PlanProblem]) -> None:
    """A reference must name another step of the plan; the steps it names become dependencies."""
    for ref in refs:
        if ref.step == sid:
            problems.append(PlanProblem(sid, field, f"${{{ref.text}}} refers to the step itself"))
        elif ref.step not in steps:
            hint = did_you_mean(ref.step, steps)
            problems.append(PlanProblem(sid, field, f"${{{ref.text}}} refers to unknown step '{ref.step}'{hint}"))
        else:
            deps.add(ref.step)


def _check_after(sid: str, step: Step, steps: Mapping[str, Step], deps: _Deps, problems: list[PlanProblem]) -> None:
    for index, other in enumerate(step.after):
        if other == sid:
            problems.append(PlanProblem(sid, f"after[{index}]", "a step cannot come after itself"))
        elif other not in steps:
            problems.append(PlanProblem(sid, f"after[{index}]", f"unknown step '{other}'{did_you_mean(other, steps)}"))
        else:
            deps.add(other)


def _check_fallback(sid: str, step: Step, steps: Mapping[str, Step], tools: ToolCatalog | None, deps: _Deps,
                    problems: list[PlanProblem]) -> tuple[Compiled | None, tuple[Ref, ...]]:
    """The fallback's arguments (compiled, their references checked) and its tool; returns (compiled, refs)."""
    fallback = step.fallback
    assert fallback is not None  # the caller checks
    compiled: Compiled | None = None
    try:
        compiled, refs = compile_args(fallback.args)
    except RefSyntaxError as exc:
        problems.append(PlanProblem(sid, "fallback.args", str(exc)))
        refs = ()
    _check_refs(sid, "fallback.args", refs, steps, deps, problems)
    if tools is not None:
        tool = tools.get(fallback.tool)
        if tool is None:
            hint = missing_builtin_hint(fallback.tool, tools) or did_you_mean(fallback.tool, tools)
            problems.append(PlanProblem(sid, "fallback.tool", f"unknown tool '{fallback.tool}'{hint}"))
        else:
            deferred = frozenset(k for k, v in fallback.args.items() if "${" in str(v))
            for fld, msg in tool.check_args(fallback.args, deferred):
                problems.append(PlanProblem(sid, f"fallback.args.{fld}" if fld else "fallback.args", msg))
    return compiled, refs


def _check_verifies(sid: str, step: Step, steps: Mapping[str, Step], deps: _Deps,
                    problems: list[PlanProblem]) -> None:
    """A verifier names the step it checks, and runs after it (a step verifying itself is left alone)."""
    target = step.verifies
    if target is None:
        return
    if target not in steps:
        problems.append(PlanProblem(sid, "verifies", f"unknown step '{target}'{did_you_mean(target, steps)}"))
    elif target != sid:
        deps.add(target)


def step_tool(sid: str, step: Step, tools: ToolCatalog, deferred: frozenset[str], problems: list[PlanProblem]) -> None:
    """The step's tool exists, its arguments fit the tool's schema (those holding references: at call time), and a
    ``cache:`` it asks for is safe (:func:`planweave.core.plan.cache.step_cache_problems`)."""
    tool = tools.get(step.tool)
    if tool is None:
        hint = missing_builtin_hint(step.tool, tools) or did_you_mean(step.tool, tools)
        problems.append(PlanProblem(sid, "tool", f"unknown tool '{step.tool}'{hint}"))
        return
    for fld, msg in tool.check_args(step.args, deferred):
        problems.append(PlanProblem(sid, f"args.{fld}" if fld else "args", msg))
    if step.cache:  # true or {ttl}: only where reuse is safe
        problems.extend(PlanProblem(sid, fld, msg) for fld, msg in step_cache_problems(step, tool))


def step_claims(sid: str, step: Step, capacities: Mapping[str, int], problems: list[PlanProblem]) -> None:
    """Every resource the step claims has a declared capacity, and the claim fits in it."""
    for name, amount in step.resources.items():
        if name not in capacities:
            hint = did_you_mean(name, capacities)
            problems.append(PlanProblem(
                sid, f"resources.{name}",
                f"no capacity is declared for '{name}'{hint} (use --capacity {name}=N or the plan's 'capacities:')",
            ))
        elif amount > capacities[name]:
            problems.append(
                PlanProblem(sid, f"resources.{name}", f"claims {amount} but the capacity is {capacities[name]}"))


def topological_order(
    steps: Mapping[str, Step], deps: Mapping[str, tuple[str, ...]], problems: list[PlanProblem]
) -> tuple[list[str], dict[str, list[str]]]:
    """The steps in topological order (Kahn's, ties in plan order) and each step's dependents; every dependency
    cycle among the steps left over is a problem, each reported once.

    ``deps`` holds every step of ``steps``, and names only steps of ``steps``, each once (as :func:`step_references`
    gives them).
    """
    dependents: dict[str, list[str]] = {sid: [] for sid in steps}
    for sid, ds in deps.items():
        for d in ds:
            dependents[d].append(sid)
    indegree = {sid: len(ds) for sid, ds in deps.items()}
    order = [sid for sid in steps if indegree[sid] == 0]
    for sid in order:  # the list grows while it is read: a step joins once its last dependency is placed
        for child in dependents[sid]:
            indegree[child] -= 1
            if indegree[child] == 0:
                order.append(child)
    if len(order) < len(steps):
        problems.extend(_cycles(set(steps) - set(order), deps))
    return order, dependents


def _cycles(remaining: set[str], deps: Mapping[str, tuple[str, ...]]) -> list[PlanProblem]:
    """One problem per cycle among ``remaining`` (the steps Kahn's order could not place)."""
    problems: list[PlanProblem] = []
    reported: set[str] = set()
    while remaining - reported:
        left = remaining - reported
        on_cycle = find_cycle(left, {k: tuple(d for d in v if d in left) for k, v in deps.items()})
        problems.append(PlanProblem(on_cycle[0], "after", "dependency cycle: " + " -> ".join(on_cycle)))
        reported.update(on_cycle)
        # Drop everything that only led into reported cycles to avoid repeating them.
        changed = True
        while changed:
            changed = False
            for s in list(remaining - reported):
                if not any(d in remaining - reported for d in deps[s]):
                    reported.add(s)
                    changed = True
    return problems


def find_cycle(nodes: set[str], deps: Mapping[str, tuple[str, ...]]) -> list[str]:
    """Return one cycle among ``nodes`` (each of which is on or leads to a cycle) as a closed path."""
    start = min(nodes)
    path: list[str] = []
    seen: dict[str, int] = {}
    node = start
    while node not in seen:
        seen[node] = len(path)
        path.append(node)
        node = next(d for d in sorted(deps[node]) if d in nodes)
    cycle = [*path[seen[node] :], node]
    cycle.reverse()  # edges point from dependency to dependent
    return cycle


def unordered_writers(
    steps: Mapping[str, Step], order: list[str], deps: Mapping[str, tuple[str, ...]]
) -> list[PlanProblem]:
    """Report pairs of steps that write the same resource with no order between them (a race)."""
    writers: dict[str, list[str]] = {}
    for sid in order:
        for resource in steps[sid].writes:
            writers.setdefault(resource, []).append(sid)
    contested = {r: ws for r, ws in writers.items() if len(ws) > 1}
    if not contested:
        return []
    bit = {sid: 1 << i for i, sid in enumerate(order)}
    ancestors: dict[str, int] = {}
    for sid in order:
        mask = 0
        for d in deps[sid]:
            mask |= ancestors[d] | bit[d]
        ancestors[sid] = mask
    problems = []
    for resource, ws in contested.items():
        for i, a in enumerate(ws):
            for b in ws[i + 1 :]:  # b comes later in topological order, so only b can depend on a
                if not ancestors[b] & bit[a]:
                    problems.append(PlanProblem(
                        b, "writes",
                        f"writes '{resource}' like step '{a}' with no order between them; add `after: [{a}]`",
                    ))
    return problems
