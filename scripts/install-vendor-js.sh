#!/usr/bin/env bash
# The dashboard's browser code from the npm registry, as vendor/package-lock.json pins it:
# Plotly's basic bundle, copied to frontend/vendor/plotly.min.js where the server (and the
# wheel, which carries frontend/) serves it. Needs npm: Debian's is installed when there is none.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v npm >/dev/null 2>&1; then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  echo "installing Debian's npm (for the dashboard's Plotly)"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends npm >/dev/null
fi
npm ci --prefix vendor --no-audit --no-fund --loglevel=error
mkdir -p frontend/vendor
# With this first line (V8's explicit compile hints), Chromium compiles the whole file on a
# background thread while it loads, rather than function by function on the main thread as
# Plotly first runs, so the run page draws sooner (docs/benchmarks.md). Other browsers read a comment.
{ echo '//# allFunctionsCalledOnLoad'; cat vendor/node_modules/plotly.js-basic-dist-min/plotly-basic.min.js; } \
  > frontend/vendor/plotly.min.js
