"""What the planner, re-planner and joiner are told: goal, tool catalog, bounded state (pure text building)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from planweave.core.plan.catalog import ToolSpec
from planweave.core.state import RunState

FORMAT = """Answer with the plan as JSON Lines: one step per line, each a JSON object
{"id": "...", "tool": "...", "args": {...}, "after": ["..."]} and nothing else (no prose, no code fences).
- ids: letters, digits, _ and -; unique.
- args may use "${step_id}" for another step's whole output or "${step_id.key[0]}" for part of it; a step may
  only refer to steps that exist already or that you wrote on an earlier line.
- Independent steps run in parallel: do not add `after` unless a step really needs another to finish first.
- Optional keys: "retries": N, "timeout": seconds, "estimate": {"duration": seconds},
  "observe": true (re-plan when its result arrives), "fallback": {"tool": ..., "args": {...}}.
- Put "approval": "<why, shown to the approver>" on steps with irreversible effects (payments, deploys, deletes,
  sending email): such a step waits until a person approves it.
- When a value can only come from a person (a preference, a secret, a decision), ask for it with a step
  {"tool": "human.input", "args": {"prompt": "...", "schema": <JSON schema of the value>}}; its output is the value."""


def tool_catalog(tools: Iterable[ToolSpec]) -> str:
    lines = []
    for tool in sorted(tools, key=lambda t: t.name):
        schema = json.dumps(tool.input_schema.get("properties", {}), separators=(",", ":"))
        required = tool.input_schema.get("required", [])
        desc = (tool.description or "").strip().splitlines()[0] if tool.description else ""
        lines.append(f"- {tool.name}: {desc} args={schema} required={json.dumps(required)}")
    return "\n".join(lines)


def _short(value: Any, limit: int) -> str:
    text = json.dumps(value, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[: limit - 15] + f"...[{len(text)} chars]"


def state_summary(state: RunState, outputs: Mapping[str, Any], *, budget_chars: int = 4000) -> str:
    """The run's steps with status, errors and summarised outputs, bounded to about ``budget_chars``."""
    done, running, failed, waiting = [], [], [], []
    per_output = max(80, budget_chars // max(1, len(state.records)))
    for sid, rec in state.records.items():
        step = state.plan.steps[sid]
        if rec.status == "succeeded":
            done.append(f"- {sid} ({step.tool}) -> {_short(outputs.get(sid), per_output)}")
        elif rec.status == "running":
            running.append(f"- {sid} ({step.tool}) running")
        elif rec.status in ("failed", "skipped", "cancelled", "unknown"):
            failed.append(f"- {sid} ({step.tool}) {rec.status}: {rec.error}")
        else:
            waiting.append(f"- {json.dumps(step.model_dump(exclude_defaults=True), separators=(',', ':'))}")
    parts = []
    for title, items in (("Done (reuse these by id, do not repeat them)", done), ("Running", running),
                         ("Failed or not run", failed), ("Remaining plan", waiting)):
        if items:
            parts.append(f"{title}:\n" + "\n".join(items))
    text = "\n\n".join(parts) or "Nothing has run yet."
    return text if len(text) <= budget_chars * 2 else text[: budget_chars * 2] + "\n[...state cut]"


REPORT = """- Finished steps are shown by reference (id, size, summary); to see more of an output, add a step
  {"id": "...", "tool": "context.read", "args": {"step": "<id>", "path": "key[0]", "max_chars": 2000}, "observe": true}.
- Keep a report: a line {"report": "<notes>"} replaces the run's notes (what was learned, what is left, ids that
  matter); it is all you will remember of the run besides the frontier and the recent references."""


# Tool-call planning (planning/tool_calls.py): the same rules, each step the arguments of one add_step call.
FORMAT_TOOLS = ("Give the plan by calling the function add_step once per step, in order; its arguments are one step\n"
                + FORMAT.split("\n", 1)[1].replace("on an earlier line", "in an earlier call")
                .replace(" and nothing else (no prose, no code fences).", ".")
                + "\n- If no step is needed, call nothing and answer [] as text.")
REPORT_TOOLS = REPORT.replace('a line {"report": "<notes>"}', "a write_report call")


def planner_system(tools: Iterable[ToolSpec], *, report: bool = False, via_tools: bool = False) -> str:
    """The planner's system message: the catalog and the format (with ``report``: outputs by reference, the report
    line; with ``via_tools``: the plan is given as ``add_step`` calls instead of JSON Lines)."""
    extra = f"\n{REPORT_TOOLS if via_tools else REPORT}" if report else ""
    return ("You plan tasks for an asynchronous executor that runs tool calls in parallel as soon as their inputs "
            f"exist.\nTools:\n{tool_catalog(tools)}\n\n{FORMAT_TOOLS if via_tools else FORMAT}{extra}")


def initial_prompt(goal: str, memory: str = "") -> str:
    """The first planning request; ``memory`` is the bounded section of verified entries recalled for the goal."""
    recalled = f"{memory}\n\n" if memory else ""
    return f"Goal: {goal}\n\n{recalled}Write the plan."


def continue_prompt(goal: str, summary: str) -> str:
    """Ask the planner to finish an initial plan its answer so far (the assistant message before this one) left
    unfinished: the run was interrupted while it wrote it, and the steps it had written exist and may have run."""
    return (f"Goal: {goal}\n\nYour plan above was cut off: the run was interrupted while you wrote it. Its steps "
            f"exist and may have run already. State of the run:\n{summary}\n\nContinue the plan: write only the "
            "steps still missing, as lines; refer to the steps above by id instead of repeating them. If nothing is "
            "missing, write [].")


def replan_prompt(goal: str, summary: str, reason: str) -> str:
    return (f"Goal: {goal}\n\nState of the run:\n{summary}\n\nWhy a new plan is needed: {reason}\n\n"
            "Write the REMAINING plan only: steps still to run (new ones, or waiting/running ones you keep). Refer to "
            "finished steps by id instead of repeating them; steps you leave out are cancelled. If nothing remains "
            "to be done, write [].")


def repair_region_prompt(goal: str, summary: str, failed: Sequence[str], error: str, region: Iterable[str]) -> str:
    """Ask for replacements of the ``failed`` steps and their downstream ``region`` (the failed steps may be in it)."""
    downstream = [s for s in region if s not in failed]
    names = ", ".join(f"'{f}'" for f in failed)
    what = (f"Replace it and the steps that depended on it ({', '.join(downstream)}): keep their ids, give them new "
            "ones or merge them; the ones you leave out are dropped." if downstream else "Replace it.")
    return (f"Goal: {goal}\n\nState of the run:\n{summary}\n\nStep {names} failed for good: {error}\n"
            f"{what} Finished steps are frozen: refer to them by id. Write only the replacement steps.")


def repair_lines_prompt(errors: Iterable[str], accepted: Iterable[str], *, via_tools: bool = False) -> str:
    again = "Call add_step again" if via_tools else "Write corrected lines"
    return ("Some lines of your plan were rejected:\n" + "\n".join(f"- {e}" for e in errors)
            + f"\nAccepted so far: {', '.join(accepted) or 'none'}. {again} for the rejected steps only.")


HUMAN_ACTIONS = ("retry", "skip", "abort")
HUMAN_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"action": {"enum": list(HUMAN_ACTIONS)}, "value": {}},
    "required": ["action"],
    "additionalProperties": False,
    "if": {"properties": {"action": {"const": "skip"}}},
    "then": {"required": ["action", "value"]},
}


def human_question(step: str, error: str, why: str) -> str:
    """What a person is asked when step ``step`` failed for good and the planner could not repair it (``why``)."""
    return (f"Step '{step}' failed for good: {error}\nThe planner could not repair it ({why}). What now? Send "
            '{"action": "retry"} to run it again, {"action": "skip", "value": <its output>} to go on with that '
            'value as its output, or {"action": "abort"} to end the run failed.')


JOIN_SCHEMA = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 4000},
        "replan": {"type": "string", "maxLength": 500},
    },
}


def join_prompt(goal: str, summary: str) -> str:
    return (f"Goal: {goal}\n\nResults:\n{summary}\n\nIf the results answer the goal, reply "
            '{"answer": "<the final answer>"}; otherwise reply {"replan": "<what is missing>"}. JSON only.')
