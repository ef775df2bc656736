#!/usr/bin/env bash
# schemathesis against a real `loadout serve` on loopback: every check, each
# operation's examples, the coverage phase, fuzzing and stateful links, bounded by
# MAX_TIME seconds (default 60). Findings that are not bugs are justified in
# schemathesis.toml beside this script; anything else fails the run.
#
#   LOADOUT_BIN=target/debug/loadout SCHEMATHESIS=path/to/schemathesis tests/schemathesis/run.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
bin="${LOADOUT_BIN:-$here/../../target/debug/loadout}"
schemathesis="${SCHEMATHESIS:-schemathesis}"
max_time="${MAX_TIME:-60}"
data="$(mktemp -d)"
log="$data/serve.log"
LOADOUT_DATA_DIR="$data" LOADOUT_LOG=warn "$bin" serve --addr 127.0.0.1:0 2>"$log" &
pid=$!
cleanup() {
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -rf "$data"
}
trap cleanup EXIT
for _ in $(seq 100); do
    grep -q "serving on" "$log" && break
    sleep 0.1
done
base="$(grep -o 'http://127\.0\.0\.1:[0-9]*' "$log" | head -1)"
if [ -z "$base" ]; then
    echo "loadout serve did not start:" >&2
    cat "$log" >&2
    exit 1
fi
# The report's example bodies can be megabytes (the 413 cases): keep the output to
# its summary and the findings' headers. One worker: Hypothesis parses lambdas
# with `ast.parse`, which CPython before 3.11.8 cannot run in two threads at once
# (gh-106905, "AST constructor recursion depth mismatch"); two workers failed CI.
set +e
"$schemathesis" --config-file "$here/schemathesis.toml" run "$base/openapi.json" \
    --max-time "$max_time" --workers 1 --request-timeout 30 \
    --seed "${SEED:-31}" >"$data/report.txt" 2>&1
status=$?
set -e
grep -vE '^ *curl ' "$data/report.txt" | cut -c1-300 | tail -60
if ! kill -0 "$pid" 2>/dev/null; then
    echo "loadout serve died during the run:" >&2
    tail -20 "$log" >&2
    exit 1
fi
if grep -qE 'panicked|internal error' "$log"; then
    echo "the server logged a panic or an internal error:" >&2
    grep -E 'panicked|internal error' "$log" | head -20 >&2
    exit 1
fi
exit "$status"
