#!/usr/bin/env bash
# Set up, then run the example plan end to end on the embedded defaults (SQLite journal, built-in tools, no model).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
exec .venv/bin/planweave run examples/hello.yaml "$@"
