"""References: ${step} and ${step.path[0]} resolve against outputs; errors say what is missing."""

from __future__ import annotations

import pytest

from planweave.plan.refs import RefResolutionError, RefSyntaxError, compile_args, render


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
