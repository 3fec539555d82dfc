#!/usr/bin/env bash
# Load test of the collector on loopback: N simulated node agents (each its
# own ZeroMQ connection, Hello, clock probes, batches, heartbeats: rankscope-sim)
# connect at once and push a healthy job's records for S seconds. Afterwards
# every record sent must be acknowledged and stored once, and the collector's
# memory, sampled every few seconds, must level off. Prints Markdown for
# docs/benchmarks.md; exits 1 when a record was lost or memory kept growing.
#   scripts/load-test.sh BUILD_DIR [--agents N] [--seconds S] [--gpus G] [--batch-loss P] [--reorder P]
#                        [--max-rss-mb M] [--no-level-check]
# --max-rss-mb fails the run if the collector's memory ever passed M MiB;
# --no-level-check skips the levelling-off test (a short run is still
# filling its first memtables: make test's smoke run uses the bound instead).
# Defaults: 1,000 agents of 8 ranks for 240 s, 1% of batch sends lost and
# 1% reordered on the way (re-sent by the agents; the collector must store
# each once).
set -euo pipefail
build=${1:?usage: scripts/load-test.sh BUILD_DIR [--agents N] [--seconds S] [--gpus G] [--batch-loss P] [--reorder P]}
shift
agents_n=1000 seconds=240 gpus=8 loss=0.01 reorder=0.01 max_rss_mb=0 level_check=1
while [ $# -gt 0 ]; do
  case $1 in
    --agents) agents_n=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --gpus) gpus=$2; shift 2 ;;
    --batch-loss) loss=$2; shift 2 ;;
    --reorder) reorder=$2; shift 2 ;;
    --max-rss-mb) max_rss_mb=$2; shift 2 ;;
    --no-level-check) level_check=0; shift ;;
    *) echo "load-test: unknown option $1" >&2; exit 2 ;;
  esac
done
bin="$build/bin"
work=$(mktemp -d /tmp/rankscope-load-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
# A collector of a thousand nodes holds a thousand connections, and so does
# the simulator.
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
# Plaintext (scripts/lib-loopback.sh); the rate limit stays on, at its defaults.
# shellcheck source=scripts/lib-loopback.sh
. "$(dirname "$0")/lib-loopback.sh"
# shellcheck disable=SC2086  # extra options, split on purpose
rs_loopback_collector "$(rs_loopback_port)" "$work/db" "$work/collector.log" ${RANKSCOPE_LOAD_COLLECTOR_ARGS:-}
collector=$collector_pid
pids+=("$collector")

rss_kb() { awk '/^VmRSS:/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat" 2>/dev/null || echo 0; }
# Memory every 2 s while the agents push.
(
  while kill -0 "$collector" 2>/dev/null; do
    echo "$(date +%s.%N) $(rss_kb "$collector")"
    sleep 2
  done
) >"$work/rss" &
pids+=("$!")

nodes=$agents_n
pp=1
[ $((nodes % 4)) -eq 0 ] && pp=4
# Each phase says on stderr where it stands, so that a run stopped from
# outside (a test's time limit) shows which phase it was in.
say() { echo "load-test: $(date -u +%T) $*" >&2; }
say "collector up on $agents (pid $collector); $agents_n simulated agents for $seconds s"
start_ticks=$(cpu_ticks "$collector")
started=$(date +%s.%N)
# The simulator ends by itself 5 s after the run (its last acks); the bound
# is for a simulator that does not.
timeout --signal=KILL $((seconds + 60)) "$bin/rankscope-sim" run --collector "$agents" --truth "$work/truth.jsonl" --log-level warn \
  --scenario healthy --jobs 1 --nodes-per-job "$nodes" --gpus "$gpus" --pp "$pp" --step-ms 1000 \
  --duration-s "$seconds" --batch-loss "$loss" --batch-reorder "$reorder" --seed 7 --prefix load \
  2>"$work/sim.log" || {
  say "rankscope-sim failed or ran past $((seconds + 60)) s; its log, then the collector's:"
  tail -20 "$work/sim.log" >&2
  tail -20 "$work/collector.log" >&2
  exit 1
}
wall=$(echo "$(date +%s.%N) - $started" | bc)
end_ticks=$(cpu_ticks "$collector")
hz=$(getconf CLK_TCK)

# What the collector holds, once it has caught up with what it acknowledged.
run_line=$(head -1 "$work/truth.jsonl")
field() { echo "$run_line" | sed -n "s/.*\"$1\":\([0-9.e+-]*\).*/\1/p"; }
sent=$(field records_sent)
acked=$(field records_acked)
batches=$(field batches)
resent=$(field resent)
lost_sends=$(field sends_lost)
say "rankscope-sim done: $sent records sent, $acked acknowledged; waiting for the collector to store them"
stored=0
deadline=$((SECONDS + 60))
while [ "$SECONDS" -lt "$deadline" ]; do
  stored=$("$bin/rankscope" --collector "$query" --insecure --timeout-ms 10000 --json status |
    sed -n 's/.*"records_stored":\([0-9]*\).*/\1/p')
  [ "${stored:-0}" -ge "$sent" ] && break
  sleep 0.2
done
say "$stored records stored"
status_json=$("$bin/rankscope" --collector "$query" --insecure --timeout-ms 20000 --json status)
duplicates=$(echo "$status_json" | sed -n 's/.*"duplicate_batches":\([0-9]*\).*/\1/p')
nodes_seen=$(echo "$status_json" | grep -o '"node":' | wc -l)

# Memory: the peak, and the mean of each quarter of the run.
read -r q1 q2 q3 q4 peak < <(awk -v n="$(wc -l <"$work/rss")" '
  { v[NR] = $2; if ($2 > peak) peak = $2 }
  END {
    for (q = 1; q <= 4; q++) { s = 0; c = 0
      for (i = int((q - 1) * n / 4) + 1; i <= int(q * n / 4); i++) { s += v[i]; c++ }
      m[q] = c ? s / c / 1024 : 0 }
    printf "%.0f %.0f %.0f %.0f %.0f\n", m[1], m[2], m[3], m[4], peak / 1024 }' "$work/rss")
cpu=$(echo "scale=1; 100 * ($end_ticks - $start_ticks) / $hz / $wall" | bc)

echo "### Load: $agents_n agents at once on loopback ($(date -u +%F), $(nproc) cores, kernel $(uname -r))"
echo
echo "Command: \`scripts/load-test.sh $build --agents $agents_n --seconds $seconds --gpus $gpus --batch-loss $loss --reorder $reorder\`."
echo "rankscope-sim opens $agents_n connections to a fresh collector at once (RocksDB on $(df --output=source "$work" | tail -1),"
echo "every detector on) and pushes a healthy $((agents_n * gpus))-rank job (1 s steps, $pp pipeline stages) for $seconds s;"
echo "$(awk "BEGIN{print $loss*100}")% of batch sends are lost and $(awk "BEGIN{print $reorder*100}")% reordered on the way (the agents re-send after the ack timeout)."
echo
echo "| agents | seconds | batches | records sent | acknowledged | stored | duplicates ignored | resends | collector CPU |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
echo "| $agents_n | $(printf %.0f "$wall") | $batches | $sent | $acked | **$stored** | $duplicates | $resent ($lost_sends lost sends) | $cpu% of a core |"
echo
echo "| collector memory (MiB) | 1st quarter | 2nd | 3rd | 4th | peak |"
echo "| --- | --- | --- | --- | --- | --- |"
echo "| mean RSS | $q1 | $q2 | $q3 | $q4 | $peak |"
echo
status=0
if [ "$stored" != "$sent" ] || [ "$acked" != "$sent" ]; then
  echo "**Records lost: $sent sent, $acked acknowledged, $stored stored.**"
  status=1
else
  echo "Every record sent was acknowledged and stored once ($nodes_seen nodes known to the collector)."
fi
# Levelled off: the last quarter within 25% of the second (the first holds
# the connection storm and the first memtables).
if [ "$level_check" = 0 ]; then
  echo "Memory: ${q2} MiB in the second quarter, ${q4} MiB in the last (levelling not checked in a run this short)."
elif awk -v a="$q2" -v b="$q4" 'BEGIN { exit !(b > a * 1.25 + 32) }'; then
  echo "**Memory kept growing: ${q2} MiB in the second quarter, ${q4} MiB in the last.**"
  status=1
else
  echo "Memory levelled off: ${q2} MiB in the second quarter, ${q4} MiB in the last."
fi
if [ "$max_rss_mb" -gt 0 ] && [ "$peak" -gt "$max_rss_mb" ]; then
  echo "**Memory passed the bound: peak ${peak} MiB, bound ${max_rss_mb} MiB.**"
  status=1
fi
exit $status
