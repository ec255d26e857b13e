"""Validated plans: a plan spec checked against tools and capacities, with its graph precomputed."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, cast

from pydantic import ValidationError
from pydantic_core import PydanticSerializationError

from planweave.core.errors import PlanInvalid, PlanProblem, did_you_mean
from planweave.core.plan import passes
from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.critical import critical_path, slacks, upward_ranks
from planweave.core.plan.document import Positions, in_plan_order, path_parts, placed, problem_path
from planweave.core.plan.model import Claim, PlanSpec, Step, StepDefaults
from planweave.core.plan.refs import Compiled, Interpolation, Ref

_STEP_KEYS = tuple(Step.model_fields)
_DEFAULTABLE = frozenset({"timeout", "heartbeat", "retries"})  # the keys a plan's `defaults` can fill


@dataclass(frozen=True)
class Plan:
    """An immutable, validated plan version: steps in topological order plus the derived graph.

    Build one with :func:`validate_plan`; never construct it directly.
    """

    spec: PlanSpec
    version: int
    parent: int | None
    steps: Mapping[str, Step]
    order: tuple[str, ...]
    deps: Mapping[str, tuple[str, ...]]
    dependents: Mapping[str, tuple[str, ...]]
    templates: Mapping[str, Compiled]
    refs: Mapping[str, tuple[Ref, ...]]
    fallbacks: Mapping[str, Compiled]  # compiled fallback args, for steps that declare a fallback
    rank: Mapping[str, float]
    claims: Mapping[str, Claim | None]
    makespan_lower_bound: float
    critical_path: tuple[str, ...]
    # Per step, its field values as pydantic keeps them (the step's ``__dict__``): the run reads a step's fields
    # here on every attempt, not through pydantic's ``__getattr__`` hook (~480 instructions a read against ~60 for
    # an item; 15 reads per no-op step: docs/benchmarks.md, "the fields of a step").
    values: Mapping[str, Mapping[str, Any]]
    _meta: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def __len__(self) -> int:
        return len(self.order)

    @cached_property
    def fingerprints(self) -> Mapping[str, str]:
        """Per step, a hash of its tool, its argument template and its dependencies' fingerprints.

        Equal fingerprints mean the same work on the same inputs, so a later plan version can reuse a result.
        Computed on first use: runs that never splice never pay for it.
        """
        prints: dict[str, str] = {}
        for sid in self.order:
            prints[sid] = _fingerprint(self.steps[sid], self.templates[sid], self.deps[sid], prints)
        return prints

    # What every run of this plan starts from, derived once per plan (a plan validated once may start many runs).
    @cached_property
    def in_degrees(self) -> Mapping[str, int]:
        """Per step, how many steps it depends on."""
        return {sid: len(self.deps[sid]) for sid in self.order}

    @cached_property
    def roots(self) -> tuple[str, ...]:
        """The steps that depend on none, in plan order."""
        return tuple(sid for sid in self.order if not self.deps[sid])

    @cached_property
    def approval_steps(self) -> frozenset[str]:
        """The steps that wait for a person's approval (``approval:``)."""
        return frozenset(sid for sid, values in self.values.items() if values["approval"])

    @cached_property
    def slack(self) -> Mapping[str, float]:
        """Per step, the seconds it may start late without delaying the plan (0 on the critical path), from the
        steps' estimated durations. Computed on first use (model calls queue by it; every attempt's context carries
        its step's slack)."""
        if self.makespan_lower_bound == 0.0:
            # No step has an estimate (durations are never negative): every slack is 0. Plan files rarely give
            # estimates, and this skips a second pass over the plan per run.
            return dict.fromkeys(self.order, 0.0)
        durations = {sid: self.steps[sid].duration_estimate for sid in self.order}
        return slacks(self.order, self.deps, self.rank, durations, self.makespan_lower_bound)

    def checked_against(self, tools: ToolCatalog, capacities: Mapping[str, int]) -> bool:
        """Whether :func:`validate_plan` checked this plan against these capacities and, for every tool the plan
        names, the very tool ``tools`` holds under that name now (tools are immutable: the checks would agree)."""
        checked = self._meta.get("checked")
        if checked is None:
            return False
        return checked[0] == dict(capacities) and _same_tools(tools, checked[1])

    def idempotent_steps(self, tools: ToolCatalog) -> list[str]:
        """The steps that may run twice (a step's ``idempotent``, else its tool's), in plan order.

        Kept on the plan for the next run of it when these are the tools it was checked against. The list is
        journaled in ``run_created``, whose data is never mutated: runs may share it.
        """
        checked = self._meta.get("checked")
        same = checked is not None and _same_tools(tools, checked[1])
        if same and "idempotent" in self._meta:
            return cast(list[str], self._meta["idempotent"])
        fields = self.values
        idempotent = [
            sid for sid in self.order
            if (fields[sid]["idempotent"] if fields[sid]["idempotent"] is not None
                else tools[fields[sid]["tool"]].idempotent)
        ]
        if same:
            self._meta["idempotent"] = idempotent
        return idempotent

    def to_document(self) -> dict[str, Any]:
        """The plan as a JSON-ready plan-file document (as written: defaults are not folded into the steps).

        An explicit ``timeout: null`` or ``heartbeat: null`` (no limit, against the plan's defaults) is kept, so the
        document read back gives the same effective values. The same document as pydantic's
        ``model_dump(mode="json", by_alias=True, exclude_defaults=True)`` gives, built by hand for the steps that
        set only ``id``, ``tool``, ``args``, ``after`` and ``description`` with plain JSON arguments: pydantic's
        dump cost ~33,000 instructions per step of the journaled ``run_created``, 15 % of a no-op step
        (docs/benchmarks.md, "The engine at the floor").
        """
        spec = self.spec
        document = _dump(spec, exclude={"steps"})
        steps = [_step_document(step) for step in spec.steps]
        if spec.defaults.model_fields_set:
            document["defaults"] = {**_explicit_defaults(spec.defaults), **document.get("defaults", {})}
        return {"steps": steps, **document}


def _same_tools(tools: ToolCatalog, checked: Mapping[str, Any]) -> bool:
    """Whether ``tools`` holds, under every name in ``checked``, the very tool object kept there."""
    return all(tools.get(name) is tool for name, tool in checked.items())


_PLAIN_STEP_KEYS = frozenset({"id", "tool", "args", "after", "description"})
_NOT_PLAIN = object()  # a value pydantic's JSON mode would convert (or refuse): the step takes pydantic's dump


def _plain_json(value: Any) -> Any:
    """A copy of ``value`` if it is plain JSON data (text, finite numbers, booleans, null, lists and tuples, objects
    with text keys), as pydantic's JSON mode would give it; else :data:`_NOT_PLAIN`."""
    kind = type(value)
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float:
        return value if value - value == 0 else _NOT_PLAIN  # NaN and infinities: pydantic's rules
    if kind is dict:
        copy: dict[str, Any] = {}
        for key, item in value.items():
            if type(key) is not str:
                return _NOT_PLAIN
            copy[key] = converted = _plain_json(item)
            if converted is _NOT_PLAIN:
                return _NOT_PLAIN
        return copy
    if kind is list or kind is tuple:
        items = [_plain_json(item) for item in value]
        return _NOT_PLAIN if any(item is _NOT_PLAIN for item in items) else items
    return _NOT_PLAIN


def _step_document(step: Step) -> dict[str, Any]:
    """One step as :meth:`Plan.to_document` writes it: by hand for a plain step, else pydantic's dump."""
    if step.__pydantic_fields_set__ <= _PLAIN_STEP_KEYS:
        values = step.__dict__  # one read through pydantic's __getattr__ hook, not one per field (validate_plan)
        args = values["args"]
        args = _plain_json(args) if args else None
        if args is not _NOT_PLAIN:
            written: dict[str, Any] = {"id": values["id"], "tool": values["tool"]}
            if args:
                written["args"] = args
            if values["after"]:
                written["after"] = list(values["after"])
            if values["description"]:
                written["description"] = values["description"]
            return written
    written = _dump(step)
    for name, value in _explicit_defaults(step).items():
        written.setdefault(name, value)
    return written


def _dump(model: PlanSpec | Step, exclude: set[str] | None = None) -> dict[str, Any]:
    try:
        return model.model_dump(mode="json", by_alias=True, exclude_defaults=True, exclude=exclude)
    except PydanticSerializationError:
        # A value no JSON holds (a PlanSpec built in Python skips the document checks of plan files): dumped as
        # it is, so that the journal's encoder refuses it naming the path instead of this raising.
        return model.model_dump(by_alias=True, exclude_defaults=True, exclude=exclude)


def _explicit_defaults(model: Step | StepDefaults) -> dict[str, Any]:
    """The defaultable keys a model sets on purpose, with their values (``exclude_defaults`` drops default values).

    A step's ``timeout: null`` or ``retries: 0`` must survive the journaled document: read back without it, the
    step would take the plan's defaults instead.
    """
    chosen = _DEFAULTABLE & model.model_fields_set
    return model.model_dump(mode="json", include=set(chosen)) if chosen else {}


def _problem_from_pydantic(step: str, err: Any) -> PlanProblem:
    loc = [str(p) for p in err["loc"]]
    field_name = ".".join(loc)
    if err["type"] == "extra_forbidden":
        return PlanProblem(step, field_name, f"unknown key{did_you_mean(loc[-1], _STEP_KEYS)}")
    return PlanProblem(step, field_name, err["msg"])


def _kind_of(value: Any) -> str:
    """``a list``, ``an int``: the type of a document value for messages."""
    name = {"list": "list", "str": "text", "NoneType": "null"}.get(type(value).__name__, type(value).__name__)
    return f"{'an' if name[0] in 'aeiou' else 'a'} {name}"


def parse_step(data: Any, source: str = "step") -> Step:
    """Read one step object (as a planner emits it), reporting every problem at once."""
    label = source
    if isinstance(data, Mapping) and isinstance(data.get("id"), str):
        label = data["id"]
    try:
        return Step.model_validate(data)
    except ValidationError as exc:
        raise PlanInvalid([_problem_from_pydantic(label, e) for e in exc.errors()], source) from None


def _top_level_problem(data: Any) -> PlanProblem | None:
    """What makes ``data`` no plan document at all (empty, not an object), or None."""
    if data is None:
        return PlanProblem("", "", "the document is empty (expected an object with a 'steps' list)")
    if not isinstance(data, Mapping):
        got = _kind_of(data)
        return PlanProblem("", "", f"expected an object with a 'steps' list at the top level, got {got}")
    return None


def _step_label(index: int, raw: Any) -> str:
    """How problems name the step at ``index``: its id, or ``#3`` (1-based) when it gives none."""
    if isinstance(raw, Mapping) and isinstance(raw.get("id"), str):
        return str(raw["id"])
    return f"#{index + 1}"


def _plan_keys(data: Mapping[str, Any], problems: list[PlanProblem]) -> tuple[PlanSpec | None, frozenset[str]]:
    """The plan's own keys (all but ``steps``) as a spec with no steps, or None if they have problems (appended);
    and the keys those problems are on."""
    rest = {k: v for k, v in data.items() if k != "steps"}
    try:
        return PlanSpec.model_validate({**rest, "steps": []}), frozenset()
    except ValidationError as exc:
        for e in exc.errors():
            loc = ".".join(str(p) for p in e["loc"])
            extra = e["type"] == "extra_forbidden"
            msg = f"unknown key{did_you_mean(loc, PlanSpec.model_fields)}" if extra else e["msg"]
            problems.append(PlanProblem("", loc, msg))
        return None, frozenset(str(e["loc"][0]) for e in exc.errors() if e["loc"])


def parse_plan_document(data: Any, source: str = "plan") -> PlanSpec:
    """Read a plan document (the parsed YAML/JSON) into a :class:`PlanSpec`, reporting every problem at once."""
    top = _top_level_problem(data)
    if top is not None:
        raise PlanInvalid([top], source)
    problems: list[PlanProblem] = []
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        problems.append(PlanProblem("", "steps", "missing or not a list"))
        raw_steps = []
    steps: list[Step] = []
    for index, raw in enumerate(raw_steps):
        try:
            steps.append(Step.model_validate(raw))
        except ValidationError as exc:
            label = _step_label(index, raw)
            problems.extend(_problem_from_pydantic(label, e) for e in exc.errors())
    spec, _ = _plan_keys(data, problems)
    if problems or spec is None:
        raise PlanInvalid(problems, source)
    return spec.model_copy(update={"steps": tuple(steps)})


_STAND_IN_TOOL = "?"  # the tool of a stand-in whose own tool has a problem: no catalog has it (and it is not said)


@dataclass(frozen=True)
class DocumentCheck:
    """What :func:`check_plan_document` found: every problem of the document, in plan order, and its step count."""

    problems: tuple[PlanProblem, ...]
    steps: int  # the items of the document's `steps` list (0 if it has none)

    @property
    def valid(self) -> bool:
        return not self.problems


def check_plan_document(
    data: Any,
    tools: ToolCatalog | None = None,
    capacities: Mapping[str, int] | None = None,
    *,
    positions: Positions | None = None,
) -> DocumentCheck:
    """Every problem of a plan document at once, schema and semantic, in plan order (``planweave validate``).

    Each step is read on its own (a step with problems does not hide the next one's), then :func:`validate_plan`'s
    passes run on the steps that parsed, with ``tools`` (None: no tool checks) and the plan's capacities plus
    ``capacities`` (none checked if the plan's ``capacities:`` has a problem). A step with schema problems that
    gives an id takes part through a stand-in (its keys without problems), so that the steps naming it are not told
    it is unknown and its other keys are still checked; what the stand-in lacks is not reported again. With
    ``positions``, each problem is placed at the line and column of its step or field.
    """
    top = _top_level_problem(data)
    if top is not None:
        return DocumentCheck((top,), 0)
    found: list[tuple[int | None, PlanProblem]] = []
    raw_steps = data.get("steps")
    if not isinstance(raw_steps, list):
        found.append((None, PlanProblem("", "steps", "missing or not a list")))
        raw_steps = []
    parsed: list[tuple[int, Step]] = []
    left_out: dict[int, frozenset[str] | None] = {}  # per stand-in: the keys it lacks (None: all but its id)
    for index, raw in enumerate(raw_steps):
        try:
            parsed.append((index, Step.model_validate(raw)))
        except ValidationError as exc:
            label = _step_label(index, raw)
            found.extend((index, _problem_from_pydantic(label, e)) for e in exc.errors())
            stand_in = _stand_in(raw, exc)
            if stand_in is not None:
                parsed.append((index, stand_in[0]))
                left_out[index] = stand_in[1]
    plan_problems: list[PlanProblem] = []
    spec, bad_keys = _plan_keys(data, plan_problems)
    found.extend((None, problem) for problem in plan_problems)
    if spec is None:  # the plan's keys that are fine still count (defaults, capacities)
        kept = {k: v for k, v in data.items() if k != "steps" and k not in bad_keys}
        try:
            spec = PlanSpec.model_validate({**kept, "steps": []})
        except ValidationError:
            spec = PlanSpec(steps=())
    checked_capacities = None if "capacities" in bad_keys else {**spec.capacities, **(capacities or {})}
    try:
        validate_plan(spec.model_copy(update={"steps": tuple(step for _, step in parsed)}), tools,
                      checked_capacities)
    except PlanInvalid as exc:
        found.extend(_semantic(exc.problems, parsed, left_out))
    if positions is None:
        ordered = sorted(found, key=lambda item: -1 if item[0] is None else item[0])
        return DocumentCheck(tuple(problem for _, problem in ordered), len(raw_steps))
    problems = [placed(problem, positions.of(index, problem.field if index is None
                                             else problem_path(problem, raw_steps[index])))
                for index, problem in found]
    return DocumentCheck(tuple(in_plan_order(problems)), len(raw_steps))


def _stand_in(raw: Any, exc: ValidationError) -> tuple[Step, frozenset[str] | None] | None:
    """A step standing in for ``raw``, which has the schema problems of ``exc``, and the keys it leaves out (None:
    every key but its id); None when ``raw`` gives no valid id (nothing can name it)."""
    if not isinstance(raw, Mapping):
        return None
    dropped = {str(e["loc"][0]) for e in exc.errors() if e["loc"]}
    sid = raw.get("id")
    if "id" in dropped or not isinstance(sid, str):
        return None
    kept = {k: v for k, v in raw.items() if k not in dropped}
    if not isinstance(kept.get("tool"), str):
        kept["tool"] = _STAND_IN_TOOL
        dropped.add("tool")
    try:
        return Step.model_validate(kept), frozenset(dropped)
    except ValidationError:  # a problem of the whole step (no key to leave out): only its id takes part
        return Step(id=sid, tool=_STAND_IN_TOOL), None


def _semantic(problems: tuple[PlanProblem, ...], parsed: list[tuple[int, Step]],
              left_out: Mapping[int, frozenset[str] | None]) -> list[tuple[int | None, PlanProblem]]:
    """``validate_plan``'s problems with the index of the step each concerns (a repeated id's own problem: the
    repetition), less those about what a stand-in left out."""
    indices: dict[str, list[int]] = {}
    for index, step in parsed:
        indices.setdefault(step.id, []).append(index)
    repeated: dict[str, int] = {}
    found: list[tuple[int | None, PlanProblem]] = []
    for problem in problems:
        given = indices.get(problem.step)
        if not given:
            found.append((None, problem))
            continue
        index = given[0]
        if problem.field == "id" and len(given) > 1:
            seen = repeated[problem.step] = repeated.get(problem.step, 0) + 1
            index = given[min(seen, len(given) - 1)]
        if index in left_out:
            lacks = left_out[index]
            parts = path_parts(problem.field)
            if lacks is None or (parts and parts[0] in lacks):
                continue
        found.append((index, problem))
    return found


def _canonical(template: Compiled, prints: Mapping[str, str]) -> Any:
    """The argument template with every reference named by its target's fingerprint instead of its id."""
    if isinstance(template, Ref):
        return {"$ref": prints[template.step], "path": list(template.path)}
    if isinstance(template, Interpolation):
        return {"$fmt": [p if isinstance(p, str) else _canonical(p, prints) for p in template.parts]}
    if isinstance(template, dict):
        return {k: _canonical(v, prints) for k, v in template.items()}
    if isinstance(template, list):
        return [_canonical(v, prints) for v in template]
    return template


def _fingerprint(step: Step, template: Compiled, deps: tuple[str, ...], prints: Mapping[str, str]) -> str:
    """Hash tool, arguments and dependencies, independent of step ids: renaming a step keeps its fingerprint."""
    body = json.dumps(
        {"tool": step.tool, "args": _canonical(template, prints), "deps": sorted(prints[d] for d in deps)},
        sort_keys=True,
        separators=(",", ":"),
        default=str,
    )
    return hashlib.sha256(body.encode()).hexdigest()[:32]


def validate_plan(
    spec: PlanSpec,
    tools: ToolCatalog | None = None,
    capacities: Mapping[str, int] | None = None,
    *,
    version: int = 1,
    parent: int | None = None,
    source: str = "plan",
) -> Plan:
    """Check a plan spec and build the :class:`Plan`; raise :class:`PlanInvalid` listing every problem.

    ``tools`` None skips tool checks; ``capacities`` None skips claim checks (else every claimed resource must be
    declared and no claim may exceed its capacity). The plan's ``defaults`` are applied to the steps of the
    :class:`Plan` (see :mod:`planweave.core.plan.defaults`); ``spec`` stays as written. The checks are the passes of
    :mod:`planweave.core.plan.passes`, run step by step so that the problems come in the order of the steps.
    """
    problems: list[PlanProblem] = []
    steps = passes.step_ids(spec, problems)
    # Filled for the common step (no arguments, no claims, no estimate); the loop overwrites the others.
    templates: dict[str, Compiled] = dict.fromkeys(steps, passes.NO_ARGS)
    refs: dict[str, tuple[Ref, ...]] = dict.fromkeys(steps, ())
    claims: dict[str, Claim | None] = dict.fromkeys(steps)
    durations: dict[str, float] = dict.fromkeys(steps, 0.0)
    deps: dict[str, tuple[str, ...]] = {}
    fallbacks: dict[str, Compiled] = {}
    values_of: dict[str, Mapping[str, Any]] = {}
    clean_tools: set[str] = set()  # tools found whose check of no arguments reported nothing (checks are pure)
    writes = False
    # One loop over the steps for every per-step pass and what the plan derives per step, the common step handled
    # inline: validate_plan was 22 % of a no-op step's instructions (docs/benchmarks.md, "The engine at the floor").
    for sid, step in steps.items():
        # A step's values read from its __dict__: each attribute read goes through pydantic's __getattr__ hook
        # (~500 instructions, against ~100 for a dictionary's item).
        values = values_of[sid] = step.__dict__
        args, after = values["args"], values["after"]
        plain = not args and values["fallback"] is None and values["verifies"] is None
        if plain:  # nothing to compile: its dependencies are its `after`, if every one names another step
            for other in after:
                if other == sid or other not in steps:
                    plain = False
                    break
        if plain:
            unique = len(after) < 2 or len(set(after)) == len(after)
            deps[sid] = after if unique else tuple(dict.fromkeys(after))
            deferred = passes.NO_DEFERRED
        else:
            links = passes.step_references(sid, step, steps, tools, problems)
            templates[sid], refs[sid], deps[sid], deferred = links.template, links.refs, links.deps, links.deferred
            if links.fallback is not None:
                fallbacks[sid] = links.fallback
        if tools is not None:
            tool, cache = values["tool"], values["cache"]
            if args or cache or tool not in clean_tools:
                reported = len(problems)
                passes.step_tool(sid, step, tools, deferred, problems)
                if not args and not cache and len(problems) == reported:
                    clean_tools.add(tool)
        estimate = values["estimate"]
        if estimate is not None:
            durations[sid] = estimate.duration
        if values["resources"] or values["reads"] or values["writes"]:
            claims[sid] = Claim(values["resources"], values["reads"], values["writes"])
            writes = writes or bool(values["writes"])
            if capacities is not None and values["resources"]:
                passes.step_claims(sid, step, capacities, problems)
    order, dependents = passes.topological_order(steps, deps, problems)
    if not problems and writes:
        problems.extend(passes.unordered_writers(steps, order, deps))
    if problems:
        raise PlanInvalid(problems, source)

    frozen_dependents = {sid: tuple(v) for sid, v in dependents.items()}
    rank = upward_ranks(order, frozen_dependents, durations)
    bound, path = critical_path(order, deps, frozen_dependents, rank)
    plan = Plan(
        spec=spec,
        version=version,
        parent=parent,
        steps={sid: steps[sid] for sid in order},
        order=tuple(order),
        deps=deps,
        dependents=frozen_dependents,
        templates=templates,
        refs=refs,
        fallbacks=fallbacks,
        rank=rank,
        claims=claims,
        makespan_lower_bound=bound,
        critical_path=tuple(path),
        values=values_of,
    )
    _record_checks(plan, tools, capacities)
    return plan


def _record_checks(plan: Plan, tools: ToolCatalog | None, capacities: Mapping[str, int] | None) -> None:
    """Keep on ``plan`` what every check ran against (Plan.checked_against): the capacities and each tool it names.

    Nothing when the tool or capacity checks did not run."""
    if tools is None or capacities is None:
        return
    values = plan.values.values()
    used = {fields["tool"] for fields in values}
    used.update(fields["fallback"].tool for fields in values if fields["fallback"] is not None)
    plan._meta["checked"] = (dict(capacities), {name: tools.get(name) for name in used})
