#!/usr/bin/env bash
# Benchmarks that need no GPU, printed as Markdown for docs/benchmarks.md.
#   scripts/bench.sh [BUILD]
# wire: bytes per collective record per rank on the wire, measured on the
# batches that real traced jobs produced, against the same records as JSON
# lines. Two workloads: a dense one (many calls per 100 ms batch) and a
# paced one (a few calls per batch, where each block's header counts most).
set -euo pipefail
source "$(dirname "$0")/lib-deployment.sh"
rs_setup "${1:-build}"

nodes=2 ranks=8 buckets=3
rs_start "$nodes" >/dev/null

field() { grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }

# measure LABEL fakenccl-train-args...: one job; prints one table row.
measure() {
  local label=$1
  shift
  local before after records bytes batches comm json_bytes steps
  before=$(rs_cli status --json)
  rs_job "$nodes" "$ranks" "bench-$RANDOM" --buckets "$buckets" --bucket-elems 4096 --quiet "$@"
  steps=$(grep -h -o '[0-9]* steps' "$work"/rank-0.log | cut -d' ' -f1)
  rs_wait_records $(( $(field records_stored <<<"$before") + ranks * steps * buckets ))
  after=$(rs_cli status --json)
  records=$(( $(field records_stored <<<"$after") - $(field records_stored <<<"$before") ))
  bytes=$(( $(field batch_bytes <<<"$after") - $(field batch_bytes <<<"$before") ))
  batches=$(( $(field batches_stored <<<"$after") - $(field batches_stored <<<"$before") ))
  comm=$(rs_cli jobs --json | grep -o '"comm":"[0-9a-f]*"' | tail -1 | cut -d'"' -f4)
  # The same records as JSON lines, one object per record (the collector's
  # own JSON export of them, as tracers that ship JSON lines send).
  json_bytes=$(rs_cli timeline --comm "$comm" --last 0 --json |
    sed -e 's/^.*"records":\[//' -e 's/\]}$//' -e 's/},{/}\n{/g' | wc -c)
  local step_ms
  step_ms=$(grep -h -o 'mean step [0-9.]* ms' "$work"/rank-0.log | cut -d' ' -f3)
  awk -v l="$label" -v s="$step_ms" -v r="$records" -v bt="$batches" -v b="$bytes" -v j="$json_bytes" 'BEGIN {
    printf "| %s | %s ms | %d | %d | %.1f | **%.2f** | %.1f | %.1fx |\n", l, s, r, bt, r / bt, b / r, j / r, j / b;
  }'
}

echo "### Wire size of collective records ($(date -u +%F), $(nproc) cores, kernel $(uname -r))"
echo
echo "Command: \`scripts/bench.sh build\`. $ranks fakenccl-train ranks on $nodes simulated nodes, $buckets AllReduce"
echo "buckets per step, traced by two real agents; bytes are all packed Cap'n Proto batch bytes the collector"
echo "received (headers, comm tables, clock samples included) divided by the records stored."
echo
echo "| workload | mean step | records | batches | records/batch | bytes/record | JSON lines bytes/record | JSON / rankscope |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
measure "dense: 300 steps, light compute" --steps 300 --compute-iters 20000
measure "paced: 100 steps, default compute" --steps 100
