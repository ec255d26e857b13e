#!/usr/bin/env bash
# Create .venv (if missing) and install planweave with its test tools. Idempotent; run from anywhere.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi
.venv/bin/python -m pip install --quiet -e ".[dev${PLANWEAVE_EXTRAS:+,$PLANWEAVE_EXTRAS}]"
