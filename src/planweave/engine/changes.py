"""Changes to a running plan: steps added (streaming admission) and proposals spliced in as a new version."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from planweave.core.plan.catalog import ToolCatalog
from planweave.core.plan.graph import parse_plan_document, parse_step, validate_plan
from planweave.core.plan.model import PlanSpec, Step
from planweave.core.splice import SpliceDiff, StaleProposal, merge_proposal, splice_diff
from planweave.engine.attempts import Attempts
from planweave.engine.emission import Emission
from planweave.engine.host import RunHost
from planweave.engine.lifecycle import Lifecycle


class PlanChanges:
    """Extend or re-plan one running run (see :meth:`planweave.engine.runtime.Run.extend` and ``propose``)."""

    def __init__(self, run_id: str, host: RunHost, tools: ToolCatalog, emission: Emission, life: Lifecycle,
                 attempts: Attempts) -> None:
        self.run_id = run_id
        self.state = emission.state
        self._tools = tools
        self._dispatch = host.dispatch
        self._emit = emission.emit
        self._life = life
        self._attempts = attempts

    def _idempotent_ids(self, steps: Iterable[Step]) -> list[str]:
        return [s.id for s in steps
                if (s.idempotent if s.idempotent is not None else self._tools[s.tool].idempotent)]

    def extend(self, steps: Sequence[Step | Mapping[str, Any]], version: int | None, meta: Mapping[str, Any]
               ) -> list[str]:
        self._life.check_alive()
        plan = self.state.plan
        parsed = [s if isinstance(s, Step) else parse_step(s) for s in steps]
        version = plan.version if version is None else version
        if parsed:
            spec = plan.spec.model_copy(update={"steps": (*plan.spec.steps, *parsed)})
            self._dispatch.adopt(spec)
            validate_plan(spec, self._tools, self._dispatch.capacities, source=f"run '{self.run_id}'")
        self._emit("steps_added", None, {"steps": parsed, "version": version,
                                         "idempotent": self._idempotent_ids(parsed), **meta})
        self._dispatch.pump()
        self._attempts.speculate()  # a new step may start on predictions of the steps it waits for
        return [s.id for s in parsed]

    def propose(self, proposal: PlanSpec | Mapping[str, Any], trigger: str, seen: int | None,
                max_staleness: int | None, meta: Mapping[str, Any]) -> SpliceDiff:
        self._life.check_alive()
        state = self.state
        position = state.events_applied
        if seen is not None and max_staleness is not None and position - seen > max_staleness:
            raise StaleProposal(
                f"the proposal is stale: {position - seen} events happened since the re-planner looked "
                f"(limit {max_staleness})", [])
        plan = state.plan
        spec = proposal if isinstance(proposal, PlanSpec) else parse_plan_document(proposal, "proposal")
        merged, renames = merge_proposal(spec, plan, state.records, source="proposal")
        self._dispatch.adopt(merged)
        version = plan.version + 1
        new_plan = validate_plan(merged, self._tools, self._dispatch.capacities, version=version,
                                 parent=plan.version, source="proposal")
        diff = splice_diff(state.records, plan, new_plan)
        # Take the tasks to cancel before the new version is applied: applying it may start a replacement step
        # under the same id at once, and that one must keep running.
        tasks = self._attempts.tasks
        doomed = [task for sid in diff.cancelled if (task := tasks.pop(sid, None)) is not None]
        self._emit("plan_version", None, {
            "plan": merged, "version": version, "parent": plan.version, "trigger": trigger,
            "seen": seen, "renamed": renames, "idempotent": self._idempotent_ids(new_plan.steps.values()),
            **diff.as_dict(), **meta,
        })
        for task in doomed:
            self._attempts.cancel_attempt(task)
        self._dispatch.pump()
        self._attempts.speculate()  # a new version: other producers, other steps to speculate on
        self._life.check_done()
        return diff
