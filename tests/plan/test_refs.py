"""References: ${step} and ${step.path[0]} resolve against outputs; errors say what is missing."""

from __future__ import annotations

import pytest

from planweave.core.plan.refs import Interpolation, Ref, RefResolutionError, RefSyntaxError, compile_args, render


def test_whole_reference_keeps_the_type() -> None:
    template, refs = compile_args({"a": "${x}", "b": "${x.items[1].n}", "c": ["${y}", 3]})
    assert [r.step for r in refs] == ["x", "x", "y"]
    out = render(template, {"x": {"items": [{"n": 1}, {"n": 2}]}, "y": [1, 2]})
    assert out == {"a": {"items": [{"n": 1}, {"n": 2}]}, "b": 2, "c": [[1, 2], 3]}


def test_interpolation_renders_strings_and_json() -> None:
    template, _ = compile_args("n=${x.n} s=${x.s} l=${x.l} $${literal}")
    assert render(template, {"x": {"n": 1, "s": "hi", "l": [1]}}) == 'n=1 s=hi l=[1] ${literal}'


def test_quoted_keys() -> None:
    template, _ = compile_args('${x["a b"]}')
    assert render(template, {"x": {"a b": 5}}) == 5


def test_missing_path_names_what_exists() -> None:
    template, _ = compile_args("${x.items[5]}")
    with pytest.raises(RefResolutionError, match=r"x.items has no index 5 \(a list of 2\)"):
        render(template, {"x": {"items": [1, 2]}})
    template, _ = compile_args("${x.nope}")
    with pytest.raises(RefResolutionError, match=r"x has no key 'nope' .an object with keys items"):
        render(template, {"x": {"items": [1, 2]}})


def test_bad_syntax() -> None:
    with pytest.raises(RefSyntaxError):
        compile_args("${1abc}")
    with pytest.raises(RefSyntaxError):
        compile_args("${a..b}")


def test_resolution_errors_describe_what_is_there_exactly() -> None:
    def error(expr: str, outputs: dict[str, object]) -> str:
        template, _ = compile_args(expr)
        with pytest.raises(RefResolutionError) as info:
            render(template, outputs)
        return str(info.value)

    many = {str(i): i for i in range(10)}
    assert error("${a.k}", {"a": many}) == "${a.k}: a has no key 'k' (an object with keys 0, 1, 2, 3, 4, 5, 6, 7)"
    assert error("${a.k}", {"a": {}}) == "${a.k}: a has no key 'k' (an empty object)"
    assert error("${a[0]}", {"a": 3}) == "${a[0]}: a has no index 0 (a int)"
    assert error("${a.k}", {"a": [1]}) == "${a.k}: a has no key 'k' (a list of 1)"
    assert error("${a[-3]}", {"a": [1, 2]}) == "${a[-3]}: a has no index -3 (a list of 2)"
    assert error("${a.b[1].c}", {"a": {"b": [0, {"d": 1}]}}) == (
        "${a.b[1].c}: a.b[1] has no key 'c' (an object with keys d)")


def test_negative_indexes_count_from_the_end() -> None:
    template, _ = compile_args("x${a[-1]}y${a[-2]}")
    assert render(template, {"a": [1, "z"]}) == "xzy1"


def test_interpolated_values_are_compact_json() -> None:
    template, _ = compile_args("v=${a}")
    assert render(template, {"a": {"k": [1, 2]}}) == 'v={"k":[1,2]}'


def test_compiled_strings_merge_literals_and_keep_whole_references() -> None:
    assert compile_args("plain $5 text") == ("plain $5 text", ())
    assert compile_args("$${a}$${b}") == ("${a}${b}", ())  # escapes only: one plain string
    whole, refs = compile_args("${ a.b }")  # spaces around the expression are not part of it
    assert isinstance(whole, Ref) and (whole.step, whole.path, whole.text) == ("a", ("b",), "a.b")
    assert refs == (whole,)
    mixed, refs = compile_args('$${x}-${a[0]}${b["k y"]}.')
    assert isinstance(mixed, Interpolation)
    assert [p if isinstance(p, str) else (p.step, p.path) for p in mixed.parts] == [
        "${x}-", ("a", (0,)), ("b", ("k y",)), "."]
    assert [r.step for r in refs] == ["a", "b"]
