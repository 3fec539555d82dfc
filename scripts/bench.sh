#!/usr/bin/env bash
# Benchmarks that need no GPU, printed as Markdown for docs/benchmarks.md.
#   scripts/bench.sh [BUILD]
# wire: bytes per collective record per rank on the wire, measured on the
# batches that real traced jobs produced, against the same records as JSON
# lines. Two workloads: a dense one (many calls per 100 ms batch) and a
# paced one (a few calls per batch, where each block's header counts most),
# each sent plain (the collector run with --plain-batches: a block per
# communicator and rank, not compressed) and compact (the default: a table,
# compressed), the collector restarted between them.
# Then the hang detection latency, and scripts/bench-overhead.sh (the agent's
# cost per NCCL call against a bare uprobe pair, and its CPU).
set -euo pipefail
source "$(dirname "$0")/lib-deployment.sh"
rs_setup "${1:-build}"

nodes=2 ranks=8 buckets=3
# The agents trace NCCL only: the rows count collective records alone (host
# waits are measured below, with their own agents).
RS_AGENT_ARGS="--cuda-waits=false" rs_start "$nodes" >/dev/null

field() { grep -o "\"$1\":[0-9]*" | head -1 | cut -d: -f2; }
jobs_run=0

# measure LABEL fakenccl-train-args...: one job; prints one table row.
measure() {
  local label="$1, $batches_as"
  shift
  local before after records bytes batches comm json_bytes steps
  local job="bench-wire-$((++jobs_run))"
  before=$(rs_cli status --json)
  rs_job "$nodes" "$ranks" "$job" --buckets "$buckets" --bucket-elems 4096 --quiet "$@"
  steps=$(grep -h -o '[0-9]* steps' "$work"/rank-0.log | cut -d' ' -f1)
  rs_wait_records $(( $(field records_stored <<<"$before") + ranks * steps * buckets ))
  after=$(rs_cli status --json)
  records=$(( $(field records_stored <<<"$after") - $(field records_stored <<<"$before") ))
  bytes=$(( $(field batch_bytes <<<"$after") - $(field batch_bytes <<<"$before") ))
  batches=$(( $(field batches_stored <<<"$after") - $(field batches_stored <<<"$before") ))
  comm=$(rs_cli jobs --json | grep -o "\"job\":\"$job\",\"first_ns\":[0-9]*,\"last_ns\":[0-9]*,\"comms\":\[{\"comm\":\"[0-9a-f]*" |
    grep -o '[0-9a-f]*$')
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
echo "buckets per step, traced by two real agents; bytes are all batch bytes the collector received as they"
echo "came (packed Cap'n Proto, or its zstd frame; headers, comm tables, clock samples included) divided by the"
echo "records stored. Plain: the collector run with --plain-batches; compact: the default."
echo
echo "| workload | mean step | records | batches | records/batch | bytes/record | JSON lines bytes/record | JSON / rankscope |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
# restart_collector [options...]: the same collector (database, ports) again
# with these options; the agents reconnect and say hello to it.
restart_collector() {
  pkill -f "rankscope-collector --listen tcp://127.0.0.1:$agent_port " || true
  while pgrep -f "rankscope-collector --listen tcp://127.0.0.1:$agent_port " >/dev/null; do sleep 0.1; done
  # shellcheck disable=SC2046 # word splitting of the key flags is meant
  "$bin/rankscope-collector" --listen "tcp://127.0.0.1:$agent_port" --query "tcp://127.0.0.1:$query_port" \
    --db "$work/db" $(rs_collector_keys) "$@" >>"$work/collector.log" 2>&1 &
  rs_pids+=($!)
  for _ in $(seq 200); do
    [ "$(rs_cli --timeout-ms 1000 status --json 2>/dev/null | grep -o '"connected":true' | wc -l)" -eq "$nodes" ] && return 0
    sleep 0.1
  done
  echo "rankscope: the agents did not come back to the restarted collector" >&2
  return 1
}
for batches_as in plain compact; do
  if [ "$batches_as" = plain ]; then restart_collector --plain-batches; else restart_collector; fi
  measure "dense: 300 steps, light compute" --steps 300 --compute-iters 20000
  measure "paced: 100 steps, default compute" --steps 100
done

# Hang detection latency: a rank is stopped with SIGSTOP; how long until the
# collector names it (hang timeout 2 s)? A new job each run, same deployment.
echo
echo "### Hang detection latency ($(date -u +%F), $(nproc) cores)"
echo
echo "Command: \`scripts/bench.sh build\`. 4 fakenccl-train ranks on 2 simulated nodes, collector with"
echo "\`--hang-timeout-s 2\`; rank 2 is stopped with SIGSTOP while the job runs; latency = the finding's"
echo "opening time minus the moment of the signal (both on this machine's clock). Goal: timeout + 2 s."
echo
runs=5
latencies=()
rs_cleanup_job() { kill -CONT "${rank_pids[@]}" 2>/dev/null || true; kill "${rank_pids[@]}" 2>/dev/null || true; wait "${rank_pids[@]}" 2>/dev/null || true; }
rs_keys hang-0 hang-1
# shellcheck disable=SC2046 # word splitting of the key flags is meant
"$bin/rankscope-collector" --listen "tcp://127.0.0.1:$((agent_port + 2))" --query "tcp://127.0.0.1:$((query_port + 2))" \
  --db "$work/db-hang" --hang-timeout-s 2 $(rs_collector_keys) >"$work/collector-hang.log" 2>&1 &
rs_pids+=($!)
for node in 0 1; do
  # shellcheck disable=SC2046
  "$bin/rankscope-agent" --collector "tcp://127.0.0.1:$((agent_port + 2))" --node "hang-$node" --spool-dir "$work/spool" $(rs_agent_keys "hang-$node") \
    --netns "/run/netns/$prefix-$node" --nccl-lib "$build/fakenccl/libnccl.so.2" >"$work/agent-hang-$node.log" 2>&1 &
  rs_pids+=($!)
done
hang_cli() {
  "$bin/rankscope" --collector "tcp://127.0.0.1:$((query_port + 2))" --key "$work/keys/client.key" \
    --collector-key "$work/keys/collector.pub" "$@"
}
for ((run = 0; run < runs; run++)); do
  rs_job_start 2 4 "bench-hang-$run" --steps 1000000 --compute-iters 2000000 --bucket-elems 1024 --quiet
  for _ in $(seq 200); do
    progress=$(hang_cli jobs --json | { grep -o "\"job\":\"bench-hang-$run\".*" || true; } |
      { grep -o '"last_seq":[0-9]*' || true; } | cut -d: -f2 | sort -n | head -1)
    [ "${progress:-0}" -ge 30 ] && break
    sleep 0.1
  done
  before=$(hang_cli findings --json | { grep -o '"id":[0-9]*' || true; } | head -1 | cut -d: -f2)
  stopped=$(date +%s%N)
  kill -STOP "${rank_pids[2]}"
  opened=""
  for _ in $(seq 300); do
    newest=$(hang_cli hangs --json)
    id=$({ grep -o '"id":[0-9]*' || true; } <<<"$newest" | head -1 | cut -d: -f2)
    if [ -n "$id" ] && [ "$id" != "${before:-0}" ]; then
      opened=$(grep -o '"opened_ns":[0-9]*' <<<"$newest" | head -1 | cut -d: -f2)
      break
    fi
    sleep 0.05
  done
  rs_cleanup_job
  [ -n "$opened" ] && latencies+=("$(awk -v o="$opened" -v s="$stopped" 'BEGIN { printf "%.2f", (o - s) / 1e9 }')")
  sleep 3  # the stopped job's hang resolves once its processes are gone
done
echo "| runs | found | latencies (s) | worst (s) | goal (s) |"
echo "| --- | --- | --- | --- | --- |"
worst=$(printf '%s\n' "${latencies[@]}" | sort -n | tail -1)
echo "| $runs | ${#latencies[@]} | ${latencies[*]} | ${worst:-none} | 4.00 |"

# The agent's cost per NCCL call and its CPU: alone on the machine, after
# this deployment is gone (its agents probe the same libnccl file).
rs_cleanup
trap - EXIT INT TERM
echo
"$here/scripts/bench-overhead.sh" "$build"

# The NCCL profiler plugin per collective, called as NCCL calls it.
echo
"$here/scripts/bench-profiler.sh" "$build"
