#!/usr/bin/env bash
# Set up, then run the whole test suite (PostgreSQL must be reachable: see .ci/run, which starts it).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
if [ -x scripts/install-mcp-servers.sh ]; then ./scripts/install-mcp-servers.sh; fi
exec .venv/bin/python -m pytest "$@"
