#!/usr/bin/env bash
# The fuzz targets of fuzz/ (one per parser: the calculator's expressions, file
# name patterns, filesystem_roots, toolkit files, setting values, routed messages),
# each run for FUZZ_SECONDS (default 20) with libFuzzer.
#
# On the stable toolchain. cargo-fuzz needs nightly (for `-Zsanitizer=address`), and
# a new machine of this project has one stable toolchain and can fetch no other (a
# nightly found on some machine is not one CI can count on). The coverage
# instrumentation libFuzzer needs is stable
# (`-Cpasses=sancov-module` and LLVM's sanitizer-coverage options), so the targets
# are built here with it, as cargo-fuzz would, without AddressSanitizer. The code
# under test forbids `unsafe`, so ASan's findings (out-of-bounds, use-after-free)
# cannot arise in it; what fuzzing finds here is panics, failed assertions,
# integer overflow (overflow checks are on), runaway time and memory.
#
#   scripts/fuzz.sh [TARGET...]        # default: every target
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
seconds="${FUZZ_SECONDS:-20}"
target_dir="${CARGO_TARGET_DIR:-$(pwd)/../target}/fuzz"
triple="$(rustc -vV | sed -n 's/^host: //p')"
export RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing"
# --target keeps the instrumentation off build scripts and proc-macros.
cargo build --release --locked --target "$triple" --target-dir "$target_dir" --bins
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(expression file_pattern filesystem_roots toolkit_file setting_value route_message)
fi
for target in "${targets[@]}"; do
    corpus="$target_dir/corpus/$target"
    mkdir -p "$corpus"
    echo "fuzzing $target for ${seconds}s"
    log="$target_dir/$target.log"
    status=0
    "$target_dir/$triple/release/$target" "$corpus" \
        -max_total_time="$seconds" -max_len=4096 -rss_limit_mb=2048 -timeout=10 \
        -print_final_stats=1 >"$log" 2>&1 || status=$?
    grep -E '^stat::(number_of_executed_units|peak_rss_mb)' "$log" || true
    if [ "$status" -ne 0 ]; then
        # libFuzzer names the input that failed (crash-*, timeout-*, oom-* here).
        echo "fuzz target $target failed (exit $status):" >&2
        grep -vE '^(#[0-9]|INFO:)' "$log" | tail -40 >&2
        exit 1
    fi
done
