#!/usr/bin/env bash
# Set up, then run the example plan end to end on the embedded defaults (SQLite journal, built-in tools, no model),
# then a goal planned offline: the planning loop runs as with a model, its answers scripted (docs/offline.md).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
.venv/bin/planweave run examples/hello.yaml "$@"
echo
echo "A goal, planned offline (answers from examples/offline/weather.yaml: no model, no key; docs/offline.md):"
exec .venv/bin/planweave goal "Compare tomorrow's weather in Paris and Rome and recommend one" \
  --tools examples.weather:toolbox --model scripted:examples/offline/weather.yaml "$@"
