#!/usr/bin/env bash
# How long `rankscope report` takes over 30 days of a 1,000-node fleet's usage
# ledger, against reading the same range without the day rollups.
#
# The ledger comes from rankscope-sim: its fleet (125 jobs of 8 nodes, one
# GPU each, ten accounts, one slowed rank per job) runs against a real
# collector for --sim-seconds; the collector's ledger rows (each node's
# identities and per-minute figures, and the waste edges) are then repeated
# over the 30 days by rankscope-bench-report --template, with a job turnover
# a day. Usage: scripts/bench-report.sh [BUILD_DIR] [--sim-seconds S]
#                                        [rankscope-bench-report options]
set -euo pipefail
build=${1:-build}
[ $# -gt 0 ] && shift
sim_seconds=240
if [ "${1:-}" = "--sim-seconds" ]; then
  sim_seconds=$2
  shift 2
fi
bin="$build/bin"
work=$(mktemp -d /tmp/rankscope-bench-report-XXXXXX)
collector=""
cleanup() {
  [ -n "$collector" ] && kill "$collector" 2>/dev/null || true
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# shellcheck source=scripts/lib-loopback.sh
. "$(dirname "$0")/lib-loopback.sh"
rs_loopback_collector "$(rs_loopback_port)" "$work/sim-db" "$work/collector.log"
collector=$collector_pid
echo "rankscope-sim: 1,000 nodes for $sim_seconds s against the collector (its ledger is the template)"
"$bin/rankscope-sim" run --collector "$agents" --truth "$work/truth.jsonl" --log-level warn \
  --scenario slowdown --jobs 125 --nodes-per-job 8 --gpus 1 --pp 1 --step-ms 2000 --culprits 1 \
  --fault-after-s 20 --duration-s "$sim_seconds" --seed 11 --prefix fleet 2>"$work/sim.log" || {
  echo "bench-report: rankscope-sim failed; its log:" >&2
  tail -20 "$work/sim.log" >&2
  exit 1
}
# SIGTERM: the collector writes its last ledger rows before it exits.
kill -TERM "$collector"
wait "$collector" || {
  echo "bench-report: the collector did not stop cleanly; its log:" >&2
  tail -20 "$work/collector.log" >&2
  exit 1
}
collector=""
"$bin/rankscope-bench-report" --template "$work/sim-db" "$@"
