#!/usr/bin/env bash
# Vendors the dashboard's graph library into src/planweave/server/static/vendor/ from the npm registry (npm pack),
# with each package's LICENSE: the server serves them itself, so the dashboard needs no CDN and works offline.
#   cytoscape        rendering, zoom, pan, selection of thousands of nodes (canvas)
#   cytoscape-dagre  a layered layout for small plans (it bundles @dagrejs/dagre, whose LICENSE is kept too).
# Large plans are laid out from their known depths instead: dagre took 0.24 s at 100 steps, 2.2 s at 1,000 and
# overflowed its stack at 3,000 (node 20, 2026-12-05), see docs/benchmarks.md.
# Usage: bash scripts/vendor-dashboard.sh   (then commit the vendor folder)
set -euo pipefail
here="$(cd "$(dirname "$0")/.." && pwd)"
out="$here/src/planweave/server/static/vendor"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
packages=(cytoscape@3.34.4 cytoscape-dagre@4.0.1 @dagrejs/dagre@1.1.4)
cd "$work"
for spec in "${packages[@]}"; do
  tarball="$(npm pack --silent "$spec" | tail -n 1)"
  name="${spec%@*}"; name="${name#@dagrejs/}"
  mkdir -p "$name"
  tar -xzf "$tarball" -C "$name"
done
rm -rf "$out"
mkdir -p "$out"
cp cytoscape/package/dist/cytoscape.min.js "$out/cytoscape.min.js"
cp cytoscape/package/LICENSE "$out/cytoscape.LICENSE"
cp cytoscape-dagre/package/dist/cytoscape-dagre.min.js "$out/cytoscape-dagre.min.js"
cp cytoscape-dagre/package/LICENSE "$out/cytoscape-dagre.LICENSE"
cp dagre/package/LICENSE "$out/dagre.LICENSE"
{
  echo "Vendored by scripts/vendor-dashboard.sh from the npm registry; do not edit."
  for spec in "${packages[@]}"; do echo "$spec"; done
} > "$out/VERSIONS"
ls -l "$out"
