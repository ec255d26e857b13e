"""A scripted world for sub-plan tests: a planner model (for the scripted server) that plans by goal.

Each goal's plan is looked up by the ``Goal:`` line of the request, so a parent, its child and its grandchild are
each planned and joined on their own goal. A repair of a failed step (``failed for good``) gets :data:`REPAIRS`'s
steps for that goal (none: the failed step is restated as it was, so it fails again).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from planweave.testing.scripted_llm import RecordedRequest, Reply, Text, plan_lines

MARK = "mark_idempotent"  # tests/cli/subplan_tools.py: appends its step id to a side-effect file

TREE: dict[str, list[dict[str, Any]]] = {
    "root": [
        {"id": "mid", "tool": "plan", "args": {"goal": "mid"}},
        {"id": "top", "tool": MARK, "args": {"step": "top", "v": "${mid.answer}"}},
    ],
    "mid": [
        {"id": "m1", "tool": MARK, "args": {"step": "m1"}},
        {"id": "leaf", "tool": "plan", "args": {"goal": "leaf"}, "after": ["m1"]},
    ],
    "leaf": [
        {"id": "l1", "tool": MARK, "args": {"step": "l1"}},
        {"id": "l2", "tool": MARK, "args": {"step": "l2", "gated": True}, "after": ["l1"]},
    ],
}

ANSWERS = {"root": "root answer", "mid": "mid answer", "leaf": "leaf answer"}


def goal_of(req: RecordedRequest) -> str:
    """The goal of the run that sent ``req`` (the first line of its last user message)."""
    text = str(req.messages[-1]["content"])
    first = text.split("\n", 1)[0]
    return first.removeprefix("Goal: ").strip()


def world(plans: Mapping[str, Sequence[Mapping[str, Any]]] = TREE, answers: Mapping[str, str] | None = None,
          repairs: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
          ) -> Callable[[RecordedRequest], Reply]:
    """The script: plan each goal with ``plans``, answer with ``answers``, repair with ``repairs``."""
    answers = answers or ANSWERS

    def script(req: RecordedRequest) -> Reply:
        goal, text = goal_of(req), str(req.messages[-1]["content"])
        if "If the results answer the goal" in text:
            return Text(json.dumps({"answer": answers.get(goal, f"{goal} answer")}))
        if "failed for good" in text or "REMAINING plan" in text:
            fix = (repairs or {}).get(goal)
            if fix is not None:
                return Text(plan_lines(fix) if fix else "[]")
            failed = text.split("Step '", 1)[1].split("'", 1)[0] if "Step '" in text else ""
            again = [s for s in plans.get(goal, ()) if s["id"] == failed]
            return Text(plan_lines(again) if again else "[]")
        return Text(plan_lines(plans[goal]))

    return script
