"""The sub-plan tree read back from every journal (memory, SQLite, PostgreSQL): parent links and children.

A child run is an ordinary run whose ``run_created`` names its parent (``options.limits.parent``), so no journal
needs anything new; this checks that every backend gives the tree back (planweave/runtree.py): ``read`` by kind,
``run_ids``, and a root whose id merely contains a dot is not taken for a child.
"""

from __future__ import annotations

from typing import Any

from planweave import Engine, builtin_tools
from planweave.journal import open_journal
from planweave.limits import LimitsRecord
from planweave.runtree import child_ids, parent_link, run_tree

from .conftest import Backend

PLAN = {"steps": [{"id": "x", "tool": "noop", "args": {}}]}


async def _run(engine: Engine, run_id: str, parent: dict[str, Any] | None = None) -> None:
    run = await engine.start(PLAN, run_id=run_id, limits=LimitsRecord(parent=parent) if parent else None)
    await run.wait()


async def test_a_journal_gives_back_the_tree_of_sub_plans(backend: Backend) -> None:
    async with open_journal(backend.url) as journal:
        async with Engine(journal, tools=builtin_tools()) as engine:
            await _run(engine, "root")
            await _run(engine, "root.a", {"run": "root", "step": "a", "depth": 1})
            await _run(engine, "root.a.b", {"run": "root.a", "step": "b", "depth": 2})
            await _run(engine, "root.a-2", {"run": "root", "step": "a", "depth": 1})
            await _run(engine, "v1")
            await _run(engine, "v1.2")  # a root run whose id has a dot: no parent link
        ids = await journal.run_ids()
        assert await child_ids(journal, ids) == {"root.a", "root.a.b", "root.a-2"}
        assert parent_link(await journal.read("root.a.b", kind="run_created")) == {"run": "root.a", "step": "b",
                                                                                   "depth": 2}
        tree = await run_tree(journal, "root")
        assert [(c["run"], c["status"]) for c in tree] == [("root.a", "succeeded"), ("root.a-2", "succeeded")]
        assert [c["run"] for c in tree[0]["children"]] == ["root.a.b"] and tree[1]["children"] == []
        assert await run_tree(journal, "v1") == []
