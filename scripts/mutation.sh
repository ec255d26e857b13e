#!/usr/bin/env bash
# Mutation testing of the pure core (mutmut), on a throwaway copy of the repository, one module at a time.
#
#   scripts/mutation.sh                      # every module below, in turn
#   scripts/mutation.sh src/planweave/core/scheduler.py
#
# mutmut rewrites the code it mutates, so it never runs on this work tree: the committed HEAD (or MUTATION_REV, to
# compare the tests of two commits) is exported to
# $MUTATION_DIR (default /tmp/planweave-mutation), which keeps its own venv between runs. Only the fast tests that
# exercise the module run (see tests_for below; MUTATION_TESTS="tests/a tests/b" overrides), without the PostgreSQL
# variants (the fold and the plan code are the same over every journal). Bounded: MUTATION_CHILDREN workers
# (default 2) under `nice`, and each module is stopped after MUTATION_MODULE_SECONDS (default 600). Scores go to $MUTATION_DIR/scores.txt, survivors are listed
# by `cd $MUTATION_DIR && .venv/bin/mutmut results` and shown by `.venv/bin/mutmut show NAME`.
# Unraisable-exception warnings are not errors here: mutmut's slower trampolines move garbage collection, and a
# leaked coroutine (see docs/testing.md) must not stop the run. See docs/testing.md for the latest scores.
set -euo pipefail

repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
dir=${MUTATION_DIR:-/tmp/planweave-mutation}
rev=$(git -C "$repo" rev-parse --short "${MUTATION_REV:-HEAD}")
children=${MUTATION_CHILDREN:-2}
budget=${MUTATION_MODULE_SECONDS:-600}
modules=("$@")
if [ ${#modules[@]} -eq 0 ]; then
  modules=(
    src/planweave/core/scheduler.py
    src/planweave/core/state.py
    src/planweave/core/splice.py
    src/planweave/core/plan/refs.py
    src/planweave/core/plan/graph.py
    src/planweave/core/plan/passes.py
    src/planweave/core/plan/critical.py
    src/planweave/core/plan/defaults.py
    src/planweave/core/plan/document.py
    src/planweave/core/plan/model.py
  )
fi

mkdir -p "$dir"
rm -rf "$dir/src" "$dir/tests" "$dir/mutants"
git -C "$repo" archive --format=tar "$rev" | tar -x -C "$dir"
if [ ! -x "$dir/.venv/bin/mutmut" ]; then
  python3 -m venv "$dir/.venv"
  "$dir/.venv/bin/pip" install -q -e "$dir[dev]" "mutmut==3.8.1"
fi

# The tests that exercise a module: mutmut then runs, per mutant, those of them that reach the mutated function.
tests_for() {
  if [ -n "${MUTATION_TESTS:-}" ]; then echo "$MUTATION_TESTS"; return; fi
  case "$1" in
    src/planweave/core/plan/*) echo "tests/plan tests/engine/test_state.py tests/engine/test_failures.py" ;;
    *) echo "tests/engine tests/plan" ;;
  esac
}

cd "$dir"
for module in "${modules[@]}"; do
  rm -rf mutants
  selection=$(tests_for "$module" | tr ' ' '\n' | sed 's/^/    /')
  # pyproject.toml has no [tool.mutmut] section, so mutmut reads this file.
  cat > setup.cfg <<EOF
[mutmut]
source_paths=src
only_mutate=$module
also_copy=
    examples
    docs
pytest_add_cli_args_test_selection=
$selection
pytest_add_cli_args=
    -p
    no:cacheprovider
    -q
    -m
    not postgres
    -W
    ignore::pytest.PytestUnraisableExceptionWarning
EOF
  echo "== $module"
  status=0
  timeout "$budget" nice -n 10 .venv/bin/mutmut run --max-children "$children" > "mutmut-$(basename "$module" .py).log" 2>&1 \
    || status=$?
  [ "$status" -eq 124 ] && echo "   stopped after ${budget}s: the score counts the mutants checked so far"
  # Every mutant with its status (killed, survived, timeout, not checked...).
  .venv/bin/mutmut results --all true > "results-$(basename "$module" .py)-$rev.txt"
  python3 - "$module" "results-$(basename "$module" .py)-$rev.txt" <<'EOF' | sed "s/^/$rev /" | tee -a scores.txt
import collections, sys
counts = collections.Counter(line.rsplit(":", 1)[1].strip() for line in open(sys.argv[2]) if ":" in line)
checked = counts["killed"] + counts["survived"] + counts["timeout"] + counts["segfault"]
score = (checked - counts["survived"]) / checked if checked else 0.0
print(f"{sys.argv[1]}: {score:.0%} killed of {checked} checked; {dict(counts)}")
EOF
done
