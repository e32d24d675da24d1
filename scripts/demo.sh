#!/usr/bin/env bash
# make demo: a gradwatch server on SQLite, a real training run streaming to it, the dashboard URL.
# Ctrl-C stops the server (and the training, if it still runs).
set -euo pipefail
PORT="${PORT:-8765}"
BIN=.venv/bin
URL="http://127.0.0.1:${PORT}"

"$BIN/gradwatch" serve --db "sqlite:///$PWD/gradwatch.db" --port "$PORT" &
server=$!
train=""
cleanup() {
  trap - INT TERM EXIT
  [ -n "$train" ] && kill "$train" 2>/dev/null || true
  kill "$server" 2>/dev/null || true
  wait 2>/dev/null || true
  echo "gradwatch demo stopped."
}
trap cleanup INT TERM EXIT

for _ in $(seq 100); do
  curl -fsS "$URL/api/health" >/dev/null 2>&1 && break
  kill -0 "$server" 2>/dev/null || { echo "the server did not start (is port $PORT taken? try PORT=8766 make demo)"; exit 1; }
  sleep 0.1
done

echo
echo "  gradwatch dashboard: $URL"
echo
"$BIN/python" examples/train_transformer.py --server "$URL" --steps "${STEPS:-400}" --delay "${DELAY:-0.05}" &
train=$!
wait "$train" || true
train=""
echo
echo "  training finished; the run stays on the dashboard: $URL   (Ctrl-C to stop)"
wait "$server"
