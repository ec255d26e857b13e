#!/bin/bash
# Instructions per step of planweave (or the asyncio floor) on a no-op DAG, counted by valgrind's callgrind: a
# figure the machine's load does not move (wall-clock figures on a shared machine vary by +-15-30 %).
# It runs the plan 1 and 3 times in one process and divides the difference by 2 x the steps, so imports and
# set-up cancel out. Repeat runs of the same code agree within about 3 %.
#   benchmarks/count_instructions.sh [planweave|floor|floor-fold] [layered|fan] [STEPS] [JOURNAL URL]
# The plan is validated before the counted runs, as `planweave bench engine` validates it in prepare (LangGraph's
# graph is built and compiled there too); COUNT_VALIDATION=1 starts each run from the spec instead (validated then).
# Compare two versions of the code with PYTHONPATH=/path/to/a/copy/of/src.
set -euo pipefail
SYSTEM=${1:-planweave}; SHAPE=${2:-layered}; STEPS=${3:-2000}; URL=${4:-null://}
PY=${PYTHON:-.venv/bin/python}
SCRIPT=$(cat <<'PYEOF'
import asyncio, gc, sys
from planweave import open_engine
from planweave.bench.peers import run_floor, run_journaled_floor
from planweave.bench.workloads import fan_out, layered, plan_document
from planweave.core.plan.graph import parse_plan_document, validate_plan
from planweave.tools import builtin_tools
system, shape, steps, runs, url = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
count_validation = sys.argv[6] == "1"
async def main() -> None:
    w = layered(steps) if shape == "layered" else fan_out(steps)
    if system in ("floor", "floor-fold"):
        for _ in range(runs):
            gc.collect()
            await (run_floor if system == "floor" else run_journaled_floor)(w.deps)
        return
    spec = parse_plan_document(plan_document(w), w.name)
    tools = builtin_tools()
    async with open_engine(url, tools=tools, concurrency=None) as engine:
        plan = spec if count_validation else validate_plan(spec, tools, engine.capacities, source=w.name)
        for _ in range(runs):
            gc.collect()
            await (await engine.start(plan, source=w.name)).wait()
asyncio.run(main())
PYEOF
)
count() {
    PYTHONHASHSEED=0 valgrind --tool=callgrind --callgrind-out-file=/dev/null \
        "$PY" -c "$SCRIPT" "$SYSTEM" "$SHAPE" "$STEPS" "$1" "$URL" "${COUNT_VALIDATION:-0}" 2>&1 | sed -n 's/.*Collected : //p'
}
one=$(count 1); three=$(count 3)
echo "$SYSTEM $SHAPE $STEPS steps ($URL$([ "${COUNT_VALIDATION:-0}" = 1 ] && echo ', validation counted')): $(( (three - one) / 2 / STEPS )) instructions per step"
