#!/usr/bin/env bash
# Load test of `POST /api/route` from a second process on loopback (issue 5 bench).
#
# Builds the release binary, starts `loadout serve` on a free port with a fresh data
# dir, and runs `wrk` (Debian package `wrk`) twice: one-off messages (no session) and
# messages within sessions (each request names one of 64 sessions, so the session
# path runs: state read, message append, decision log). Prints requests/s and the
# p50/p90/p99 latency of each. Targets: >= 20k req/s, p99 <= 5 ms on 2 cores.
#
# Usage: scripts/bench_route.sh [DURATION_SECONDS] [CONNECTIONS] [THREADS]
#   LOADOUT_BIN=path   use this binary instead of building target/release/loadout
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION="${1:-10}"
CONNECTIONS="${2:-32}"
THREADS="${3:-1}"

if ! command -v wrk >/dev/null; then
    echo "wrk is missing: apt-get install -y wrk" >&2
    exit 1
fi
if [[ -z "${LOADOUT_BIN:-}" ]]; then
    cargo build --release -p loadout-server --bin loadout >&2
    LOADOUT_BIN="target/release/loadout"
fi

DATA_DIR="$(mktemp -d)"
SCRIPTS="$(mktemp -d)"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
LOADOUT_DATA_DIR="$DATA_DIR" "$LOADOUT_BIN" serve --addr "127.0.0.1:$PORT" 2>"$DATA_DIR/serve.log" &
SERVER=$!
cleanup() {
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
    rm -rf "$DATA_DIR" "$SCRIPTS"
}
trap cleanup EXIT

for _ in $(seq 100); do
    curl -fsS "http://127.0.0.1:$PORT/openapi.json" >/dev/null 2>&1 && break
    sleep 0.1
done
URL="http://127.0.0.1:$PORT/api/route"

# Same messages in both runs; the session run spreads them over 64 sessions.
cat >"$SCRIPTS/common.lua" <<'EOF'
local messages = {
  "what time is it in Seoul",
  "remember that my parrot is called Polly",
  "read the file notes.txt in my documents folder",
  "create a table of my expenses with date and amount",
  "calculate 17% of 2,340",
  "what do you remember about my trip to Busan",
}
local counter = 0
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local function summary(latency, summary_requests)
  io.write(string.format("requests/s %.0f  p50 %.2f ms  p90 %.2f ms  p99 %.2f ms  max %.2f ms  errors %d\n",
    summary_requests.requests / (summary_requests.duration / 1e6),
    latency:percentile(50) / 1000, latency:percentile(90) / 1000,
    latency:percentile(99) / 1000, latency.max / 1000,
    summary_requests.errors.status + summary_requests.errors.connect + summary_requests.errors.read
      + summary_requests.errors.write + summary_requests.errors.timeout))
end
function done(summary_requests, latency, requests)
  summary(latency, summary_requests)
end
EOF
cat "$SCRIPTS/common.lua" >"$SCRIPTS/plain.lua"
cat >>"$SCRIPTS/plain.lua" <<'EOF'
function request()
  counter = counter + 1
  local body = string.format('{"message": "%s"}', messages[counter % #messages + 1])
  return wrk.format(nil, nil, nil, body)
end
EOF
cat "$SCRIPTS/common.lua" >"$SCRIPTS/session.lua"
cat >>"$SCRIPTS/session.lua" <<'EOF'
local thread_id = 0
function setup(thread)
  thread:set("thread_id", thread_id)
  thread_id = thread_id + 1
end
function request()
  counter = counter + 1
  local body = string.format('{"session": "bench-%d-%d", "message": "%s"}',
    thread_id, counter % 64, messages[counter % #messages + 1])
  return wrk.format(nil, nil, nil, body)
end
EOF

echo "# $(nproc) cores, $CONNECTIONS connections, $THREADS wrk threads, ${DURATION}s each, $LOADOUT_BIN"
# Warm-up: first requests build the tokenizer and caches.
wrk -t1 -c4 -d2s -s "$SCRIPTS/plain.lua" "$URL" >/dev/null
echo -n "no session:   "
wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" -s "$SCRIPTS/plain.lua" "$URL" | tail -n 1
echo -n "with session: "
wrk -t"$THREADS" -c"$CONNECTIONS" -d"${DURATION}s" -s "$SCRIPTS/session.lua" "$URL" | tail -n 1
