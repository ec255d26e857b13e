"""Plan validation: every problem is reported at once, each naming the step and the field."""

from __future__ import annotations

from typing import Any

import pytest

from planweave import PlanInvalid, builtin_tools, parse_plan_document, validate_plan
from planweave.core.plan.graph import Plan


def check(doc: dict[str, Any], capacities: dict[str, int] | None = None) -> Plan:
    return validate_plan(parse_plan_document(doc), builtin_tools(), capacities if capacities is not None else {})


def problems(doc: dict[str, Any], capacities: dict[str, int] | None = None) -> list[str]:
    with pytest.raises(PlanInvalid) as info:
        check(doc, capacities)
    return [str(p) for p in info.value.problems]


def test_valid_plan_has_topological_order_and_dependencies() -> None:
    plan = check({"steps": [
        {"id": "b", "tool": "noop", "args": {"x": "${a.items[0]}"}},
        {"id": "a", "tool": "noop"},
        {"id": "c", "tool": "noop", "after": ["a", "b"]},
    ]})
    assert plan.order == ("a", "b", "c")
    assert plan.deps["b"] == ("a",)
    assert set(plan.deps["c"]) == {"a", "b"}
    assert plan.dependents["a"] == ("b", "c")


def test_duplicate_ids_are_reported() -> None:
    assert problems({"steps": [{"id": "a", "tool": "noop"}, {"id": "a", "tool": "noop"}]}) == [
        "step 'a', id: duplicate step id"
    ]


def test_unknown_reference_suggests_the_closest_step() -> None:
    found = problems({"steps": [
        {"id": "search", "tool": "noop"},
        {"id": "fetch", "tool": "noop", "args": {"q": "${serch.results}"}},
    ]})
    assert found == ["step 'fetch', args: ${serch.results} refers to unknown step 'serch' (did you mean 'search'?)"]


def test_unknown_after_is_reported_with_its_index() -> None:
    found = problems({"steps": [{"id": "a", "tool": "noop", "after": ["zzz"]}]})
    assert found == ["step 'a', after[0]: unknown step 'zzz'"]


def test_cycles_are_printed() -> None:
    found = problems({"steps": [
        {"id": "a", "tool": "noop", "after": ["c"]},
        {"id": "b", "tool": "noop", "after": ["a"]},
        {"id": "c", "tool": "noop", "args": {"v": "${b}"}},
        {"id": "d", "tool": "noop", "after": ["c"]},
    ]})
    assert len(found) == 1
    assert "dependency cycle: " in found[0]
    cycle = found[0].split("dependency cycle: ")[1].split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "b", "c"}


def test_self_reference_is_rejected() -> None:
    assert problems({"steps": [{"id": "a", "tool": "noop", "args": {"x": "${a}"}}]}) == [
        "step 'a', args: ${a} refers to the step itself"
    ]


def test_unknown_tool_suggests_a_name() -> None:
    assert problems({"steps": [{"id": "a", "tool": "slep", "args": {"seconds": 1}}]}) == [
        "step 'a', tool: unknown tool 'slep' (did you mean 'sleep'?)"
    ]


def test_arguments_are_checked_against_the_tool_schema() -> None:
    found = problems({"steps": [
        {"id": "a", "tool": "sleep", "args": {"second": 1}},
        {"id": "b", "tool": "sleep", "args": {"seconds": "soon"}},
        {"id": "c", "tool": "shell", "args": {}},
    ]})
    assert "step 'a', args.second: tool 'sleep' has no argument 'second' (did you mean 'seconds'?)" in found
    assert "step 'a', args.seconds: required by tool 'sleep'" in found
    assert any(p.startswith("step 'b', args.seconds:") and "number" in p for p in found)
    assert "step 'c', args.argv: required by tool 'shell'" in found


def test_arguments_holding_references_are_checked_at_call_time() -> None:
    plan = check({"steps": [
        {"id": "a", "tool": "noop"},
        {"id": "b", "tool": "sleep", "args": {"seconds": "${a.n}"}},
    ]})
    assert plan.deps["b"] == ("a",)


def test_claims_larger_than_capacity_or_undeclared_are_rejected() -> None:
    found = problems(
        {"steps": [
            {"id": "a", "tool": "noop", "resources": {"browser": 3}},
            {"id": "b", "tool": "noop", "resources": {"gpu": 1}},
        ]},
        capacities={"browser": 2},
    )
    assert found == [
        "step 'a', resources.browser: claims 3 but the capacity is 2",
        "step 'b', resources.gpu: no capacity is declared for 'gpu' (use --capacity gpu=N or the plan's 'capacities:')",
    ]


def test_schema_errors_name_step_and_key_and_all_are_reported() -> None:
    with pytest.raises(PlanInvalid) as info:
        parse_plan_document({"steps": [
            {"id": "a", "tool": "noop", "retires": 2},
            {"id": "b"},
            {"id": "c", "tool": "noop", "timeout": -1},
            {"id": "bad id", "tool": "noop"},
        ]}, source="plan.yaml")
    text = str(info.value)
    assert text.startswith("plan.yaml is not valid (4 problems):")
    assert "step 'a', retires: unknown key (did you mean 'retries'?)" in text
    assert "step 'b', tool: Field required" in text
    assert "step 'c', timeout:" in text
    assert "step 'bad id', id:" in text


def test_all_problem_kinds_are_reported_together() -> None:
    found = problems({"steps": [
        {"id": "a", "tool": "nope"},
        {"id": "a", "tool": "noop"},
        {"id": "b", "tool": "noop", "after": ["x"]},
    ]})
    assert len(found) == 3


def test_retries_shorthand_and_policy() -> None:
    plan = check({"steps": [
        {"id": "a", "tool": "noop", "retries": 3},
        {"id": "b", "tool": "noop", "retries": {"max": 2, "backoff": 1, "on": ["timeout"]}},
    ]})
    assert plan.steps["a"].retries.max == 3
    assert plan.steps["b"].retries.on == ("timeout",)


def test_not_a_mapping_is_a_clear_error() -> None:
    with pytest.raises(PlanInvalid, match="expected an object with a 'steps' list"):
        parse_plan_document(["a"])


def test_fingerprints_follow_content_and_dependencies() -> None:
    one = check({"steps": [{"id": "a", "tool": "noop", "args": {"x": 1}},
                           {"id": "b", "tool": "noop", "args": {"y": "${a}"}}]})
    renamed = check({"steps": [{"id": "a", "tool": "noop", "args": {"x": 1}},
                               {"id": "z", "tool": "noop", "args": {"y": "${a}"}}]})
    changed = check({"steps": [{"id": "a", "tool": "noop", "args": {"x": 2}},
                               {"id": "b", "tool": "noop", "args": {"y": "${a}"}}]})
    assert one.fingerprints["b"] == renamed.fingerprints["z"]
    assert one.fingerprints["a"] != changed.fingerprints["a"]
    assert one.fingerprints["b"] != changed.fingerprints["b"]  # its input changed


def test_critical_path_and_makespan_lower_bound() -> None:
    plan = check({"steps": [
        {"id": "a", "tool": "noop", "estimate": {"duration": 2}},
        {"id": "b", "tool": "noop", "after": ["a"], "estimate": {"duration": 5}},
        {"id": "c", "tool": "noop", "after": ["a"], "estimate": {"duration": 1}},
        {"id": "d", "tool": "noop", "after": ["b", "c"], "estimate": {"duration": 1}},
    ]})
    assert plan.rank == {"a": 8.0, "b": 6.0, "c": 2.0, "d": 1.0}
    assert plan.makespan_lower_bound == 8.0
    assert plan.critical_path == ("a", "b", "d")


def test_every_pass_reports_in_plan_order_step_by_step() -> None:
    """The passes run step by step (ids first, cycles last), so the problems come in the same order as the steps."""
    doc: dict[str, Any] = {"defaults": {"timeout": 5}, "steps": [
        {"id": "a", "tool": "noop"},
        {"id": "a", "tool": "noop"},
        {"id": "b", "tool": "nop", "args": {"x": "${b.y}", "y": "${zz}", "z": "${9a}", "w": "${a.v}"},
         "after": ["b", "qq", "a"], "resources": {"gpu": 2, "cpu": 9}, "verifies": "aa",
         "fallback": {"tool": "noop", "args": {"m": "${b}", "n": "${nope}", "o": "${a}"}}},
        {"id": "c", "tool": "noop", "fallback": {"tool": "nope", "args": {"m": "${a.}"}}, "verifies": "c"},
        {"id": "d", "tool": "noop", "after": ["e"]},
        {"id": "e", "tool": "noop", "after": ["d"]},
        {"id": "f", "tool": "noop", "after": ["e"]},
        {"id": "g", "tool": "http.get", "args": {"bogus": 1}, "fallback": {"tool": "http.get", "args": {"url": 3}}},
    ]}
    assert problems(doc, {"cpu": 4}) == [
        "step 'a', id: duplicate step id",
        "step 'b', args.z: '${9a}' does not start with a step id",
        "step 'b', args: ${b.y} refers to the step itself",
        "step 'b', args: ${zz} refers to unknown step 'zz'",
        "step 'b', after[0]: a step cannot come after itself",
        "step 'b', after[1]: unknown step 'qq'",
        "step 'b', fallback.args: ${b} refers to the step itself",
        "step 'b', fallback.args: ${nope} refers to unknown step 'nope'",
        "step 'b', verifies: unknown step 'aa' (did you mean 'a'?)",
        "step 'b', tool: unknown tool 'nop' (did you mean 'noop'?)",
        "step 'b', resources.gpu: no capacity is declared for 'gpu' (did you mean 'cpu'?) (use --capacity gpu=N or the "
        "plan's 'capacities:')",
        "step 'b', resources.cpu: claims 9 but the capacity is 4",
        "step 'c', fallback.args: '${a.}': cannot read '.' (use .key, [index] or [\"key\"])",
        "step 'c', fallback.tool: unknown tool 'nope' (did you mean 'noop'?)",
        "step 'g', fallback.args.url: Input should be a valid string",
        "step 'g', args.url: required by tool 'http.get'",
        "step 'g', args.bogus: tool 'http.get' has no argument 'bogus'",
        "step 'd', after: dependency cycle: d -> e -> d",
    ]


def test_fingerprints_see_every_part_of_the_arguments_but_not_the_ids() -> None:
    def print_of_b(args: Any, a_id: str = "a") -> str:
        plan = check({"steps": [{"id": a_id, "tool": "noop", "args": {"x": 1}},
                                {"id": "c", "tool": "noop", "args": {"x": 2}},
                                {"id": "b", "tool": "noop", "args": args}]})
        return plan.fingerprints["b"]

    base = print_of_b({"m": {"k": ["${a.p[0]}", "t=${a.q} end", 3]}})
    assert print_of_b({"m": {"k": ["${z.p[0]}", "t=${z.q} end", 3]}}, a_id="z") == base  # ids do not count
    for changed in ({"m": {"k": ["${a.p[1]}", "t=${a.q} end", 3]}},  # a path in a list
                    {"m": {"k": ["${a.p[0]}", "u=${a.q} end", 3]}},  # the text around a reference
                    {"m": {"k": ["${a.p[0]}", "t=${a.r} end", 3]}},  # a path in an interpolation
                    {"m": {"k": ["${c.p[0]}", "t=${a.q} end", 3]}},  # the step referred to
                    {"m": {"j": ["${a.p[0]}", "t=${a.q} end", 3]}},  # a key
                    {"m": {"k": ["${a.p[0]}", "t=${a.q} end", 4]}}):  # a literal
        assert print_of_b(changed) != base, changed


@pytest.mark.parametrize(("document", "kind"), [([1], "a list"), ("x", "a text"), (3, "an int"), (2.5, "a float")])
def test_a_document_that_is_not_an_object_names_its_type(document: Any, kind: str) -> None:
    with pytest.raises(PlanInvalid) as info:
        parse_plan_document(document)
    assert [str(p) for p in info.value.problems] == [
        f"expected an object with a 'steps' list at the top level, got {kind}"]


def test_a_fallback_is_checked_against_its_tool_and_its_references_wait() -> None:
    deferred = check({"steps": [{"id": "a", "tool": "noop"}, {"id": "b", "tool": "noop", "fallback": {
        "tool": "sleep", "args": {"seconds": "${a.n}"}}}]})  # a reference: checked at call time, and b waits for a
    assert deferred.deps["b"] == ("a",)
    bad = {"tool": "sleep", "args": {"seconds": "x"}}
    assert problems({"steps": [{"id": "b", "tool": "noop", "fallback": bad}]}) == [
        "step 'b', fallback.args.seconds: Input should be a valid number, unable to parse string as a number"]
    assert problems({"steps": [{"id": "b", "tool": "noop", "fallback": {"tool": "sleep", "args": {}}}]}) == [
        "step 'b', fallback.args.seconds: required by tool 'sleep'"]


def test_each_cycle_is_reported_once_and_steps_leading_into_them_not_at_all() -> None:
    assert problems({"steps": [
        {"id": "a", "tool": "noop", "after": ["b"]}, {"id": "b", "tool": "noop", "after": ["a"]},
        {"id": "t", "tool": "noop", "after": ["a", "y"]}, {"id": "u", "tool": "noop", "after": ["t"]},
        {"id": "x", "tool": "noop", "after": ["y"]}, {"id": "y", "tool": "noop", "after": ["x"]},
    ]}) == ["step 'a', after: dependency cycle: a -> b -> a", "step 'y', after: dependency cycle: y -> x -> y"]


def test_a_claim_equal_to_the_capacity_fits_and_a_step_named_twice_is_one_dependency() -> None:
    assert check({"steps": [{"id": "a", "tool": "noop", "resources": {"gpu": 2}}]}, {"gpu": 2}).order == ("a",)
    plan = check({"steps": [{"id": "a", "tool": "noop"},
                            {"id": "b", "tool": "noop", "args": {"x": "${a}", "y": "${a.k}"}, "after": ["a"],
                             "fallback": {"tool": "noop", "args": {"z": "${a}"}}}]})
    assert plan.deps["b"] == ("a",) and plan.dependents["a"] == ("b",)
