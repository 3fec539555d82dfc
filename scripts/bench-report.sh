#!/bin/sh
# How long `rankscope report` takes over 30 days of a 1,000-node fleet's usage
# ledger, against reading the same range without the day rollups.
# Usage: scripts/bench-report.sh [BUILD_DIR] [rankscope-bench-report options]
set -eu
build=${1:-build}
[ $# -gt 0 ] && shift
exec "$build/bin/rankscope-bench-report" "$@"
