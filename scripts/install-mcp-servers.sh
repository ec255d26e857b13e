#!/usr/bin/env bash
# Install the reference MCP servers the tests and benchmarks use into .cache/mcp (idempotent, no global installs).
#
#   scripts/install-mcp-servers.sh            # into <repo>/.cache/mcp
#   PLANWEAVE_MCP_CACHE=/some/dir scripts/install-mcp-servers.sh
#
# The binaries land in $PLANWEAVE_MCP_CACHE/node_modules/.bin (mcp-server-everything, mcp-server-filesystem,
# mcp-inspector).
# Versions are pinned so a test run means the same thing tomorrow; bump them here.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache="${PLANWEAVE_MCP_CACHE:-$repo/.cache/mcp}"
packages=(
  "@modelcontextprotocol/server-everything@2026.8.31"
  "@modelcontextprotocol/server-filesystem@2026.8.31"
  "@modelcontextprotocol/inspector@2.12.0"  # an independent MCP client: tests/server/test_mcp_server_inspector.py
)

if ! command -v npm >/dev/null 2>&1; then
  echo "install-mcp-servers: npm is not installed (apt-get install -y nodejs npm); it is needed for the MCP tests" >&2
  exit 1
fi

mkdir -p "$cache"
# The cache is build output: keep it out of git whatever the repository's .gitignore says.
[ -f "$cache/.gitignore" ] || printf '*\n' > "$cache/.gitignore"

installed() {  # installed NAME@VERSION -> exit 0 if that exact version is in the cache
  local spec="$1" name="${1%@*}" version="${1##*@}"
  local manifest="$cache/node_modules/$name/package.json"
  [ -f "$manifest" ] && grep -q "\"version\": \"$version\"" "$manifest"
}

missing=()
for spec in "${packages[@]}"; do
  installed "$spec" || missing+=("$spec")
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-mcp-servers: up to date in $cache"
  exit 0
fi

echo "install-mcp-servers: installing ${missing[*]} into $cache"
npm install --prefix "$cache" --save-exact --no-audit --no-fund --loglevel=error "${packages[@]}"
for bin in mcp-server-everything mcp-server-filesystem mcp-inspector; do
  if [ ! -x "$cache/node_modules/.bin/$bin" ]; then
    echo "install-mcp-servers: $bin is missing from $cache/node_modules/.bin after npm install" >&2
    exit 1
  fi
done
echo "install-mcp-servers: done"
