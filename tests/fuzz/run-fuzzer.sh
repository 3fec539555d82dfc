#!/usr/bin/env bash
# Runs one fuzz target for a bounded time from its seed corpus; fails on any
# crash, sanitizer report (ASan, UBSan, LeakSanitizer), input slower than
# the per-input timeout, or memory past the limit.
#   run-fuzzer.sh FUZZER SEED_DIR SECONDS ARTIFACT_DIR [DICT] [extra libFuzzer flags...]
# New inputs go to a temporary corpus that is removed afterwards; an input
# that failed is kept in ARTIFACT_DIR (reproduce: FUZZER ARTIFACT_DIR/crash-...).
set -euo pipefail
fuzzer=$1 seeds=$2 seconds=$3 artifacts=$4
shift 4
dict=()
if [ $# -gt 0 ] && [ -n "$1" ]; then dict=("-dict=$1"); fi
[ $# -gt 0 ] && shift

[ -x "$fuzzer" ] || { echo "run-fuzzer: $fuzzer is not built" >&2; exit 1; }
[ -d "$seeds" ] || { echo "run-fuzzer: no seed corpus at $seeds" >&2; exit 1; }
mkdir -p "$artifacts"
base=/tmp
[ -d /dev/shm ] && base=/dev/shm
work=$(mktemp -d "$base/rankscope-fuzz-run.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir "$work/corpus" "$work/tmp"

# The fuzz targets put their RocksDB under RANKSCOPE_FUZZ_TMP (tests/fuzz/fuzz_store.h).
export RANKSCOPE_FUZZ_TMP="$work/tmp"
export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
set +e
"$fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
  -artifact_prefix="$artifacts/" "${dict[@]}" "$@" "$work/corpus" "$seeds"
status=$?
set -e
if [ $status -ne 0 ]; then
  echo "run-fuzzer: $(basename "$fuzzer") failed (exit $status); the input that did it is in $artifacts/" >&2
fi
exit $status
