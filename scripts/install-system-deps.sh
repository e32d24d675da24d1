#!/usr/bin/env bash
# Debian packages the tests need: Chromium (browser tests), Node.js (the dashboard's JavaScript
# unit tests, tests/frontend) and npm, docker-compose (checks the compose file; no Docker engine is
# needed) and PostgreSQL (the storage tests start a throwaway cluster of their own with its
# initdb/pg_ctl, from /usr/lib/postgresql/<version>/bin; the package's default cluster is not
# used). Installs only what is missing, so running it again changes nothing.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v node >/dev/null 2>&1 || need+=(nodejs)
# npm for `make setup`'s Plotly (scripts/install-vendor-js.sh): installed here with the rest, so
# that a fresh machine runs apt-get update once (`make test` runs this script before `setup`)
command -v npm >/dev/null 2>&1 || need+=(npm)
command -v docker-compose >/dev/null 2>&1 || need+=(docker-compose)
compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null || need+=(postgresql)
[ ${#need[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing Debian packages: ${need[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
