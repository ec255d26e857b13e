#!/usr/bin/env bash
# Run every benchmark from the repository root: the AsyncHow check, then the engine benchmark (table + JSON).
# Usage: benchmarks/run_all.sh [ASYNCHOW_DIR] [-- extra options for the engine benchmark]
# The JSON goes to $OUT (default benchmarks/results/, not meant to be committed).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
DATA=../shared/data/asynchow
if [ $# -gt 0 ] && [ "$1" != "--" ]; then DATA=$1; shift; fi
if [ "${1:-}" = "--" ]; then shift; fi
OUT=${OUT:-benchmarks/results}

if [ -d "$DATA" ]; then
  "$PY" -m planweave.bench.asynchow "$DATA"
else
  echo "AsyncHow data not found at $DATA: skipping that check" >&2
fi

mkdir -p "$OUT"
json="$OUT/engine-$(date -u +%Y%m%dT%H%M%SZ).json"
"$PY" -m planweave.bench.engine --json "$@" > "$json"
"$PY" - "$json" <<'PYEOF'
import json, sys
from planweave.bench.engine import render_table
print(render_table(json.load(open(sys.argv[1]))))
PYEOF
echo "JSON: $json" >&2
