"""``planweave runs`` lists root runs (``--all``: their sub-plans' child runs too); ``show`` shows the child tree."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planweave import run_virtual
from tests.planning.subplan_world import world
from tests.planning.test_subplans import run_tree

from .test_cli import invoke, sqlite_url


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A journal holding a finished three-level tree: root -> root.mid -> root.mid.leaf."""
    monkeypatch.setenv("SUBPLAN_LOG", str(tmp_path / "calls.log"))
    monkeypatch.delenv("SUBPLAN_GATE", raising=False)
    url = sqlite_url(tmp_path)
    result, _ = run_virtual(run_tree(url, world()))
    assert result.ok, result.error
    return url


def test_runs_lists_roots_and_all_lists_children_too(tree: str) -> None:
    roots = json.loads(invoke("runs", "--journal", tree, "--json").stdout)
    every = json.loads(invoke("runs", "--journal", tree, "--json", "--all").stdout)
    assert [r["run_id"] for r in roots] == ["root"]
    assert sorted(r["run_id"] for r in every) == ["root", "root.mid", "root.mid.leaf"]
    assert "root.mid" not in invoke("runs", "--journal", tree).stdout


def test_show_prints_the_child_tree_indented_with_status_and_answer(tree: str) -> None:
    out = invoke("show", "root", "--journal", tree).stdout
    lines = out.splitlines()
    start = lines.index("sub-plans")
    assert lines[start + 1].startswith("  root.mid  succeeded  mid answer"), out
    assert lines[start + 2].startswith("    root.mid.leaf  succeeded  leaf answer"), out


def test_show_of_a_child_names_its_parent(tree: str) -> None:
    report = json.loads(invoke("show", "root.mid", "--journal", tree, "--json").stdout)
    assert report["parent"] == {"run": "root", "step": "mid", "depth": 1}
    assert [c["run"] for c in report["subplans"]] == ["root.mid.leaf"]
    assert "sub-plan of run 'root', step 'mid'" in invoke("show", "root.mid", "--journal", tree).stdout
    assert "parent" not in json.loads(invoke("show", "root", "--journal", tree, "--json").stdout)
