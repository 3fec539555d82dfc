#!/usr/bin/env bash
# Back-pressure: what a stopped collector costs the traced job and the agent.
# The same 4-rank fakenccl-train job (2 simulated nodes) runs twice: once
# with the collector running (the baseline), once with it stopped (SIGSTOP:
# its connections stay up and nobody reads them, the hardest case for a
# sender). Printed as Markdown for docs/benchmarks.md: the job's time in both
# runs and their ratio, the agents' peak memory and spool size against their
# bounds, and whether every record arrived once the collector went on.
#   scripts/bench-backpressure.sh [BUILD] [STEPS]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$here/scripts/lib-deployment.sh"
rs_setup "${1:-build}"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
steps=${2:-20000}
memory_mb=1 spool_mb=64
export RS_AGENT_ARGS="--max-unacked-mb $memory_mb --spool-max-mb $spool_mb"
rs_start 2
collector_pid=${rs_pids[0]}
agent_pids=("${rs_pids[1]}" "${rs_pids[2]}")
job_args=(--steps "$steps" --buckets 3 --bucket-elems 1024 --compute-iters 20000 --quiet)

peak_rss_kb=0 peak_spool=0
sample() {  # the agents' largest VmRSS (kB) and their spools' total size (bytes)
  for pid in "${agent_pids[@]}"; do
    rss=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
    [ "$rss" -gt "$peak_rss_kb" ] && peak_rss_kb=$rss
  done
  spool=$(du -sb "$work/spool" | cut -f1)
  [ "$spool" -gt "$peak_spool" ] && peak_spool=$spool
  return 0
}
timed_job() {  # NAME: runs the job, sampling every 0.2 s; sets job_s
  local start end
  start=$(date +%s.%N)
  rs_job_start 2 4 "$1" "${job_args[@]}"
  while kill -0 "${rank_pids[@]}" 2>/dev/null; do sample; sleep 0.2; done
  for pid in "${rank_pids[@]}"; do wait "$pid"; done
  end=$(date +%s.%N)
  job_s=$(echo "$end - $start" | bc)
}
records() { rs_cli status --json | grep -o '"records_stored":[0-9]*' | cut -d: -f2; }

timed_job base
rs_wait_records $((4 * 3 * steps))
base_s=$job_s base_rss=$peak_rss_kb base_spool=$peak_spool
peak_rss_kb=0 peak_spool=0

kill -STOP "$collector_pid"
timed_job stopped
stopped_s=$job_s
sleep 2
sample
kill -CONT "$collector_pid"
resume=$(date +%s.%N)
rs_wait_records $((2 * 4 * 3 * steps)) || true
for _ in $(seq 600); do
  [ "$(records)" -ge $((2 * 4 * 3 * steps)) ] && break
  sleep 0.1
done
caught_up_s=$(echo "$(date +%s.%N) - $resume" | bc)
stored=$(records)
drops=$(rs_cli status --json | grep -o '"send_queue_full":[0-9]*,"lost_records":[0-9]*' | tr '\n' ' ')

cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "### Back-pressure: a stopped collector ($(date -u +%F), $(nproc) cores, kernel $(uname -r))"
echo
echo "Command: \`scripts/bench-backpressure.sh ${1:-build} $steps\`. Machine: $(nproc) cores of $cpu,"
echo "load average before the run $load_before. A 4-rank fakenccl-train job on two"
echo "simulated nodes (\`${job_args[*]}\`, $((4 * 3 * steps)) collectives in all), traced by two agents with"
echo "\`--max-unacked-mb $memory_mb --spool-max-mb $spool_mb\`; run once with the collector up, once with it"
echo "stopped (SIGSTOP), then the collector continued."
echo
echo "| | collector up (baseline) | collector stopped | ratio |"
echo "| --- | ---: | ---: | ---: |"
printf "| job wall time | %.2f s | %.2f s | %.2f |\n" "$base_s" "$stopped_s" "$(echo "$stopped_s / $base_s" | bc -l)"
printf "| agent peak RSS (larger of two) | %d KiB | %d KiB | %.2f |\n" "$base_rss" "$peak_rss_kb" \
  "$(echo "$peak_rss_kb / $base_rss" | bc -l)"
printf "| spool on disk, peak (both agents; bound %d MiB each) | %d B | %d B | |\n" "$spool_mb" "$base_spool" "$peak_spool"
echo
echo "With the collector up the spool holds acknowledged batches too until its segment (an eighth of the bound) is"
echo "closed: deleting is per segment."
echo
printf "After SIGCONT the collector held %d of %d records %.2f s later; the agents' drop counters: %s.\n" "$stored" \
  $((2 * 4 * 3 * steps)) "$caught_up_s" "${drops:-none}"
