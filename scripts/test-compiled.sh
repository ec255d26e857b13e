#!/usr/bin/env bash
# Build the engine's hot path with mypyc (setup.py, PLANWEAVE_COMPILE=1) and run pytest against that build:
#   scripts/test-compiled.sh [pytest arguments]   (default: the whole suite, -q)
# The compiled package is installed into a temporary directory put first on PYTHONPATH, so the tests import it
# instead of the editable sources; the suite's own conftest-free imports then exercise the native modules.
# Needs ./scripts/setup.sh first (mypy and setuptools come with the dev extra) and a C compiler.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=$(mktemp -d "${TMPDIR:-/tmp}/planweave-compiled.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
started=$(date +%s)
PLANWEAVE_COMPILE=1 .venv/bin/python -m pip wheel -qq --no-build-isolation --no-deps -w "$WORK/dist" "$WORK/src"
.venv/bin/python -m pip install -qq --no-deps --target "$WORK/site" "$WORK"/dist/planweave-*.whl
echo "test-compiled: built $(basename "$WORK"/dist/planweave-*.whl) in $(( $(date +%s) - started )) s"
PYTHONPATH="$WORK/site" .venv/bin/python - <<'PY'
import sys
from planweave.engine import COMPILED
import planweave.engine.runtime as runtime
sys.exit(0 if COMPILED else f"test-compiled: the engine imported from {runtime.__file__} is not the compiled one")
PY
[ $# -gt 0 ] || set -- -q
PYTHONPATH="$WORK/site" "$REPO/.venv/bin/python" -m pytest -p no:cacheprovider "$@"
