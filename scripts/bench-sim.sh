#!/usr/bin/env bash
# The simulated-fleet benchmarks: accuracy of the detectors against ground
# truth, and the collector's scale and cost. Prints one Markdown report for
# docs/benchmarks.md.
#   scripts/bench-sim.sh BUILD_DIR           the whole suite (under 15 minutes)
#   scripts/bench-sim.sh BUILD_DIR --smoke   a one-minute run of every part (make test runs it)
#   scripts/bench-sim.sh BUILD_DIR --scale   the collector scale part only
#   scripts/bench-sim.sh BUILD_DIR --accuracy  the accuracy part only
#   scripts/bench-sim.sh BUILD_DIR --live     one 8,192-rank job (1,024 nodes) with 64 stragglers,
#                                             live: backlog, memory, findings (about 3 minutes)
#   scripts/bench-sim.sh BUILD_DIR --patterns  straggler accuracy per training pattern of the
#                                             workload zoo (about 5 minutes a pattern)
#   scripts/bench-sim.sh BUILD_DIR --rate     one healthy job at a real call rate (fsdp: 210
#                                             collectives per rank and 1 s step), live: what
#                                             the collector stores and its CPU per million records
# --patterns: RS_PATTERNS="ddp fsdp ..." picks patterns (default: all seven);
# RS_PATTERN_JOBS x RS_PATTERN_NODES x 8 ranks per slowdown run (default
# 8 x 4: 256 ranks, one slowed rank per job), RS_HEALTHY_S seconds of
# RS_HEALTHY_JOBS healthy jobs of RS_HEALTHY_RANKS ranks (default 8, a
# multiple of 4) per pattern (default 120 s, 12 jobs;
# RS_HEALTHY_S=0: none), at 100 ms steps standing for 1 s
# (RS_HEALTHY_REAL_STEPS=1: at real 1 s steps, each bucket of the
# detector's then holding fewer steps, and more of their noise). RS_PATTERN_RANGES picks the slowdown ranges (default
# "1.05-1.1 1.1-1.5 1.5-5"; the others' cells read "-"; none: the healthy jobs only). RS_SLOWDOWN_SHAPE=stalls slows the ranks by stalls
# instead of evenly (rankscope-sim --slowdown-shape: a CPU quota, CPU hogs).
# RS_PATTERN_S: each slowdown run's length (default 40 s; onsets at 10-15 s).
# RS_KEEP_DIR=DIR keeps each run's findings, truth and scores there (made if missing).
# RS_RATE_NODES x 8 ranks (default 64 256), RS_RATE_S seconds each (default
# 40), RS_RATE_PATTERN (default fsdp) for --rate; RS_RATE_CULPRITS=N slows N
# ranks of the job (from 15-25 s on; default 0: a healthy job) by factors
# drawn in RS_RATE_FACTORS (default 1.02-5; a rank slowed 5x slows its
# whole job, and with it the call rate: 1.05-1.5 keeps the job near its rate);
# each run's findings and clocks are scored against the truth;
# RS_RATE_WITNESS_NODES (default 32; 0: none) nodes of a light witness job
# (the default pattern, 1 s steps) run from a simulator process of their
# own beside it, from its 5th second to 5 s before its end (runs of more
# than 20 s), and their clocks are scored apart: the job's simulator times
# all its nodes' probes from one process that is busy making their
# records, so its clock line measures mostly that process's own delays
# (docs/benchmarks.md); the witness's records are left out of "stored",
# not out of the collector's CPU, and a finding on it counts as a false
# alarm in the job's scores;
# RS_RATE_PROBE_JITTER_MS is the simulated network's mean extra round trip
# of a clock probe (default 1; 0: what is left is the collector's and the
# simulator's own delay).
# RS_LIVE_S=N makes the --live run N s long (default 120). RS_COLLECTOR=PATH
# runs that collector binary instead of BUILD_DIR's (a baseline build: the
# same command then gives the before figures); RS_COLLECTOR_ARGS=ARGS adds
# ARGS to every collector it starts (e.g. --clock-listen none). RS_FLOOD_ARGS=ARGS adds
# ARGS to each --scale flood (e.g. --columns: batches as to a collector
# that does not read them compact, for a before figure with one collector).
# Every run gets a fresh collector (its own database, ports); rankscope-sim
# drives it over its agent socket and scores it over its query socket. The
# collector never sees the truth files.
set -euo pipefail
build=${1:?usage: scripts/bench-sim.sh BUILD_DIR [--smoke]}
mode=${2:-full}
bin="$build/bin"
if [ -n "${RS_KEEP_DIR:-}" ] && ! mkdir -p "$RS_KEEP_DIR"; then
  echo "RS_KEEP_DIR: cannot make '$RS_KEEP_DIR'" >&2
  exit 2
fi
work=$(mktemp -d /tmp/rankscope-bench-sim-XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT INT TERM
# A collector of a thousand nodes holds a thousand connections (the systemd
# unit sets LimitNOFILE for the same reason).
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
collector_pid=0
# shellcheck source=scripts/lib-loopback.sh
. "$(dirname "$0")/lib-loopback.sh"
port=$(rs_loopback_port)

# start_collector NAME [collector options...]: a fresh collector on new ports.
start_collector() {
  local name=$1
  shift
  port=$((port + 2))
  # shellcheck disable=SC2086 # RS_COLLECTOR_ARGS is split into its words
  rs_loopback_collector "$port" "$work/db-$name" "$work/collector-$name.log" --max-messages-per-s 0 \
    --max-bytes-per-s 0 "$@" ${RS_COLLECTOR_ARGS:-}
  pids+=("$collector_pid")
}
stop_collector() {
  kill "$collector_pid" 2>/dev/null || true
  wait "$collector_pid" 2>/dev/null || true
  rm -rf "$work"/db-*
}

# score_kept TRUTH SCORES WHAT: scores the running collector against TRUTH
# into SCORES (kept in RS_KEEP_DIR too); a failure is said, not fatal.
score_kept() {
  timeout 180 "$bin/rankscope-sim" score --query "$query" --truth "$1" --out "$2" >&2 ||
    echo "bench-sim: scoring $3 failed" >&2
  if [ -n "${RS_KEEP_DIR:-}" ]; then cp "$1" "$2" "$RS_KEEP_DIR/" 2>/dev/null || true; fi
}

# accuracy NAME SCORES collector-options -- sim-options: one scored run.
accuracy() {
  local name=$1 scores=$2
  shift 2
  local copts=()
  while [ "$1" != "--" ]; do copts+=("$1"); shift; done
  shift
  start_collector "$name" "${copts[@]}"
  "$bin/rankscope-sim" run --collector "$agents" --truth "$work/truth-$name.jsonl" --log-level warn "$@"
  "$bin/rankscope-sim" score --query "$query" --truth "$work/truth-$name.jsonl" --out "$scores" >&2 ||
    echo "bench-sim: scoring $name failed (the collector did not answer in time)" >&2
  if [ -n "${RS_KEEP_DIR:-}" ]; then
    "$bin/rankscope" --collector "$query" --insecure findings >"$RS_KEEP_DIR/findings-$name.txt" 2>&1 || true
    cp "$scores" "$RS_KEEP_DIR/" 2>/dev/null || true
  fi
  stop_collector
}

hang_timeout=5
started=$(date +%s)
if [ "$mode" = "--smoke" ]; then
  seeds="1"; mixed_s=16; healthy_jobs=2; healthy_s=6; straggler_nodes=8; straggler_s=25
  straggler_culprits=2; laststage_s=20; flood_sizes="512"; flood_steps=5; history=600; hang_timeout=3
else
  seeds="1 2 3"; mixed_s=25; healthy_jobs=12; healthy_s=185; straggler_nodes=256; straggler_s=75
  straggler_culprits=32; laststage_s=60; flood_sizes="512 2048 8192"; flood_steps=20; history=3600
fi

if [ "$mode" = "--live" ]; then
  # 8,192 ranks analysed live: 1,024 simulated nodes (connections), 1 s
  # steps, 64 ranks slowed 1.02x-5x from 15-25 s on, 75 s. The collector
  # must keep up (every batch acknowledged at the end, bounded memory) and
  # answer the scorer.
  start_collector live
  live_start=$(date +%s)
  live_s=${RS_LIVE_S:-120}  # RS_LIVE_S: a longer run, to see memory level off
  # The collector's memory every 15 s: bounded means it levels off.
  ( for _ in $(seq $((live_s / 15))); do
      sleep 15
      awk '/^VmRSS/ {printf "%d ", $2 / 1024}' "/proc/$collector_pid/status" 2>/dev/null
    done >"$work/live-rss" ) &
  pids+=($!)
  "$bin/rankscope-sim" run --collector "$agents" --truth "$work/truth-live.jsonl" --log-level warn \
    --scenario slowdown --seed 11 --jobs 1 --nodes-per-job 1024 --pp 4 --step-ms 1000 --duration-s "$live_s" \
    --fault-after-s 15 --fault-window-s 10 --culprits 64 --last-stage-factor 1 --prefix big 2>"$work/live-sim.log" || true
  live_end=$(date +%s)
  rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$collector_pid/status")
  hwm_kb=$(awk '/^VmHWM/ {print $2}' "/proc/$collector_pid/status")
  unacked=$(grep -o '[0-9]* batch(es) not acknowledged' "$work/live-sim.log" | cut -d' ' -f1 || true)
  score_start=$(date +%s)
  timeout 180 "$bin/rankscope-sim" score --query "$query" --truth "$work/truth-live.jsonl" \
    --out "$work/scores-live.jsonl" >&2 || echo "bench-sim: scoring live failed (the collector did not answer in time)" >&2
  score_end=$(date +%s)
  echo "## 8,192 ranks live ($(date -u +%F), $(nproc) cores)"
  echo
  echo "Command: \`scripts/bench-sim.sh $build --live\`: 1,024 nodes x 8 ranks, TP 8, PP 4, 1 s steps, ${live_s} s, 64 ranks slowed 1.02x-5x."
  echo
  echo "| run (s) | batches unacknowledged at the end | collector RSS every 15 s (MiB) | RSS at the end (MiB) | peak RSS (MiB) | scoring (s) |"
  echo "| --- | --- | --- | --- | --- | --- |"
  echo "| $((live_end - live_start)) | ${unacked:-0} | $(cat "$work/live-rss" 2>/dev/null) | $((rss_kb / 1024)) | $((hwm_kb / 1024)) | $((score_end - score_start)) |"
  echo
  [ -s "$work/scores-live.jsonl" ] && "$bin/rankscope-sim" report "$work/scores-live.jsonl"
  stop_collector
  exit 0
fi

if [ "$mode" = "--rate" ]; then
  # A job at a real call rate, live: every rank issues the pattern's
  # collectives each 1 s step, each node's agent batches them every 100 ms
  # and re-sends what is not acknowledged in time, as the real agent does.
  # A collector that keeps up stores every record made, with no re-sends.
  rate_pattern=${RS_RATE_PATTERN:-fsdp}
  rate_s=${RS_RATE_S:-40}
  echo "## A job at a real call rate, live ($(date -u +%F), $(nproc) cores)"
  echo
  echo "Command: \`scripts/bench-sim.sh $build --rate\`: one job (${RS_RATE_CULPRITS:-0} ranks slowed), pattern $rate_pattern, 1 s steps, ${rate_s} s;"
  witness_nodes=${RS_RATE_WITNESS_NODES:-32}
  [ "$rate_s" -gt 20 ] || witness_nodes=0
  echo "records made: what the simulator's agents sent; CPU: the collector's user + system time over the run."
  if [ "$witness_nodes" -gt 0 ]; then
    echo "A witness job of $witness_nodes nodes ran beside it (scored below): its records are left out of \"stored\","
    echo "not out of the CPU; a finding on it would count as a false alarm in the job's scores."
  fi
  echo
  echo "| ranks | records made | records/s/rank | stored | re-sent batches ignored | batches unacknowledged at the end | collector CPU (cores) | CPU s per million stored | RSS at the end (MiB) | RSS every 30 s (MiB) |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
  ticks=$(getconf CLK_TCK)
  scored=()
  witnessed=()
  for nodes in ${RS_RATE_NODES:-64 256}; do
    start_collector "rate-$nodes"
    cpu0=$(awk '{print $14 + $15}' "/proc/$collector_pid/stat")
    # The collector's memory every 30 s: bounded means it levels off.
    ( for _ in $(seq $((rate_s / 30))); do
        sleep 30
        awk '/^VmRSS/ {printf "%d ", $2 / 1024}' "/proc/$collector_pid/status" 2>/dev/null
      done >"$work/rate-rss" ) &
    pids+=($!)
    rate_start=$(date +%s.%N)
    culprits=${RS_RATE_CULPRITS:-0}
    scenario=(--scenario healthy)
    rate_factors=${RS_RATE_FACTORS:-1.02-5}
    case $rate_factors in
      *-*) ;;
      *) echo "RS_RATE_FACTORS: '$rate_factors' is not MIN-MAX (e.g. 1.05-1.5)" >&2; exit 2 ;;
    esac
    [ "$culprits" -gt 0 ] && scenario=(--scenario slowdown --fault-after-s 15 --fault-window-s 10 --culprits "$culprits"
      --min-factor "${rate_factors%-*}" --max-factor "${rate_factors#*-}")
    witness_pid=0
    if [ "$witness_nodes" -gt 0 ]; then
      ( sleep 5
        exec "$bin/rankscope-sim" run --collector "$agents" --truth "$work/truth-witness-$nodes.jsonl" \
          --scenario healthy --seed 7 --jobs 1 --nodes-per-job "$witness_nodes" --pp 1 --step-ms 1000 \
          --duration-s $((rate_s - 10)) --probe-jitter-ms "${RS_RATE_PROBE_JITTER_MS:-1}" --prefix witness --log-level info \
          2>"$work/witness-sim-$nodes.log" ) &
      witness_pid=$!
      pids+=("$witness_pid")
    fi
    "$bin/rankscope-sim" run --collector "$agents" --truth "$work/truth-rate.jsonl" --log-level info \
      "${scenario[@]}" --seed 5 --jobs 1 --nodes-per-job "$nodes" --pp 1 --pattern "$rate_pattern" \
      --step-ms 1000 --duration-s "$rate_s" --probe-jitter-ms "${RS_RATE_PROBE_JITTER_MS:-1}" --prefix rate \
      2>"$work/rate-sim.log" || true
    [ "$witness_pid" -gt 0 ] && { wait "$witness_pid" || true; }
    rate_end=$(date +%s.%N)
    cpu1=$(awk '{print $14 + $15}' "/proc/$collector_pid/stat")
    rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$collector_pid/status")
    made=$(grep -o '[0-9]* records sent' "$work/rate-sim.log" | tail -1 | cut -d' ' -f1 || true)
    unacked=$(grep -o '[0-9]* batch(es) not acknowledged' "$work/rate-sim.log" | cut -d' ' -f1 || true)
    # The witness's records are stored too: counted apart (records made stay the job's).
    witness_made=$(grep -o '[0-9]* records sent' "$work/witness-sim-$nodes.log" 2>/dev/null | tail -1 | cut -d' ' -f1 || true)
    stored_offset=${witness_made:-0}
    status=$("$bin/rankscope" --collector "$query" --insecure status 2>/dev/null | head -1 || true)
    stored=$(grep -o '[0-9]* records stored' <<<"$status" | cut -d' ' -f1 || true)
    resent=$(grep -o '([0-9]* re-sent' <<<"$status" | tr -dc 0-9 || true)
    [ -n "$stored" ] && stored=$((stored - stored_offset))
    awk -v r=$((nodes * 8)) -v made="${made:-0}" -v s="$rate_s" -v stored="${stored:-0}" -v resent="${resent:-0}" \
      -v unacked="${unacked:-0}" -v cpu=$((cpu1 - cpu0)) -v tk="$ticks" -v t0="$rate_start" -v t1="$rate_end" \
      -v rss="$rss_kb" -v samples="$(cat "$work/rate-rss" 2>/dev/null)" 'BEGIN {
        wall = t1 - t0; c = cpu / tk;
        printf "| %d | %d | %.0f | %d | %d | %d | %.2f | %.2f | %.0f | %s |\n", r, made, made / r / s, stored, resent,
          unacked, c / wall, (stored > 0 ? c / (stored / 1e6) : 0), rss / 1024, samples }'
    # Scored against the truth: stragglers (where slowed), false alarms and the clocks.
    score_kept "$work/truth-rate.jsonl" "$work/scores-rate-$nodes.jsonl" "rate-$nodes"
    scored+=("$work/scores-rate-$nodes.jsonl")
    if [ "$witness_pid" -gt 0 ]; then
      score_kept "$work/truth-witness-$nodes.jsonl" "$work/scores-witness-$nodes.jsonl" "the witness"
      witnessed+=("$work/scores-witness-$nodes.jsonl")
    fi
    stop_collector
  done
  if [ "${#scored[@]}" -gt 0 ]; then
    echo
    echo "Scored against the truth (${RS_RATE_CULPRITS:-0} ranks slowed ${RS_RATE_FACTORS:-1.02-5}x per job, from 15-25 s on):"
    echo
    for f in "${scored[@]}"; do [ -s "$f" ] && "$bin/rankscope-sim" report "$f"; done
  fi
  if [ "${#witnessed[@]}" -gt 0 ]; then
    echo
    echo "The witness job's clocks ($witness_nodes nodes from a simulator process of their own, beside the job above):"
    echo
    for f in "${witnessed[@]}"; do [ -s "$f" ] && "$bin/rankscope-sim" report "$f" | grep -E '^(Clock|Healthy jobs):'; done
  fi
  exit 0
fi

if [ "$mode" = "--patterns" ]; then
  # Per pattern: slowed ranks in three factor ranges at real 1 s steps (one
  # per job, from 10-15 s on), then healthy jobs with their benign
  # confounders at compressed steps standing for 1 s each (fsdp's 210
  # collectives a step at 500 ms: the collector's ingest bounds it; the
  # others at 100 ms).
  patterns=${RS_PATTERNS:-ddp sync-each fsdp accum jitter pipeline tp-dp}
  pjobs=${RS_PATTERN_JOBS:-8}
  pnodes=${RS_PATTERN_NODES:-4}
  healthy_s=${RS_HEALTHY_S:-120}
  healthy_jobs=${RS_HEALTHY_JOBS:-12}
  healthy_ranks=${RS_HEALTHY_RANKS:-8}
  case $healthy_ranks in
    '' | *[!0-9]*) echo "RS_HEALTHY_RANKS: '$healthy_ranks' is not a number of ranks" >&2; exit 2 ;;
  esac
  if [ "$healthy_ranks" -lt 4 ] || [ $((healthy_ranks % 4)) -ne 0 ]; then
    echo "RS_HEALTHY_RANKS: $healthy_ranks is not a multiple of 4 (4 ranks a node; pipeline and tp-dp: 2)" >&2
    exit 2
  fi
  pattern_s=${RS_PATTERN_S:-40}
  slowdown_shape=${RS_SLOWDOWN_SHAPE:-even}
  echo "## Straggler accuracy per training pattern ($(date -u +%F), $(nproc) cores, kernel $(uname -r))"
  echo
  echo "Command: \`scripts/bench-sim.sh $build --patterns\` (RS_PATTERNS='$patterns', $pjobs jobs x $pnodes nodes x 8 ranks"
  echo "per slowdown run, ${pattern_s} s, 1 s steps (accum: 1 s optimizer steps of 4 micro-steps); $healthy_jobs healthy jobs of $healthy_ranks ranks"
  if [ "${RS_HEALTHY_REAL_STEPS:-0}" = 1 ]; then
    echo "for ${healthy_s} s, at real step times as the slowdown runs'; seeds 21, 22)."
  else
    echo "for ${healthy_s} s, 100 ms steps standing for 1 s (fsdp: 500 ms; accum: 100 ms optimizer steps); seeds 21, 22)."
  fi
  echo "Slowdown runs: $((pjobs * pnodes * 8)) ranks, slowed $slowdown_shape (RS_SLOWDOWN_SHAPE; rankscope-sim --slowdown-shape)."
  echo
  echo "| pattern | 1.05-1.1x found | 1.1-1.5x found | 1.5-5x found | latency p50 / p90 (s), all | straggler precision | healthy job-hours | false alarms |"
  echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
  for pattern in $patterns; do
    scores="$work/scores-pattern-$pattern.jsonl"
    # accum: 4 micro-steps of 250 ms to an optimizer step of 1 s (its collectives).
    slow_step=1000
    [ "$pattern" = accum ] && slow_step=250
    for range in ${RS_PATTERN_RANGES:-1.05-1.1 1.1-1.5 1.5-5}; do
      case $range in
        none) continue ;;
        *-*) ;;
        *) echo "RS_PATTERN_RANGES: '$range' is not MIN-MAX (e.g. 1.05-1.1)" >&2; exit 2 ;;
      esac
      set -- ${range/-/ }
      accuracy "$pattern-$1" "$scores" -- --pattern "$pattern" --scenario slowdown --seed 21 --jobs "$pjobs" \
        --nodes-per-job "$pnodes" --pp 2 --step-ms "$slow_step" --duration-s "$pattern_s" --fault-after-s 10 --fault-window-s 5 \
        --culprits 1 --min-factor "$1" --max-factor "$2" --slowdown-shape "$slowdown_shape" --prefix "p$1"
    done
    healthy_scores="$work/scores-pattern-$pattern-healthy.jsonl"
    step=100
    [ "$pattern" = fsdp ] && step=500
    nominal=1
    [ "$pattern" = accum ] && step=25 nominal=0.25  # micro-steps: its optimizer steps of 100 ms stand for 1 s
    # RS_HEALTHY_REAL_STEPS=1: at the slowdown runs' real step times instead.
    [ "${RS_HEALTHY_REAL_STEPS:-0}" = 1 ] && step=$slow_step
    shape="--nodes-per-job $((healthy_ranks / 4)) --gpus 4"
    # Pipeline stages need two data-parallel replicas: nodes of 2 ranks.
    case $pattern in pipeline | tp-dp) shape="--nodes-per-job $((healthy_ranks / 2)) --gpus 2" ;; esac
    if [ "$healthy_s" -gt 0 ]; then
      # shellcheck disable=SC2086
      accuracy "$pattern-healthy" "$healthy_scores" -- --pattern "$pattern" --scenario healthy --seed 22 \
        --jobs "$healthy_jobs" $shape --pp 2 --step-ms "$step" --duration-s "$healthy_s" --nominal-step-s "$nominal" \
        --batch-loss 0.01 --prefix healthy
      "$bin/rankscope-sim" report "$healthy_scores" >"$work/report-$pattern-healthy.md"
    else
      : >"$work/report-$pattern-healthy.md"
    fi
    if [ -f "$scores" ]; then "$bin/rankscope-sim" report "$scores" >"$work/report-$pattern.md"; else : >"$work/report-$pattern.md"; fi
    found() { awk -F'|' -v r="slowdown_rank $1" '$2 ~ r {gsub(/ /, "", $3); gsub(/ /, "", $4); printf "%.0f of %s", $3 * $4, $3; f = 1} END {if (!f) printf "-"}' "$work/report-$pattern.md"; }
    latency=$({ [ -f "$scores" ] && grep -h '"kind":"slowdown_rank"' "$scores" || true; } | { grep -o '"latency_s":[0-9.][0-9.]*' || true; } | cut -d: -f2 | sort -n |
      awk '{v[NR] = $1} END {if (NR) printf "%.1f / %.1f", v[int((NR + 1) / 2)], v[int(NR * 0.9 + 0.999)]; else printf "-"}')
    precision=$(awk -F'|' '$2 ~ /^ straggler / {gsub(/ /, "", $6); printf "%s", $6}' "$work/report-$pattern.md")
    hours=$(grep -o 'Healthy jobs: [0-9.]* simulated job-days' "$work/report-$pattern-healthy.md" | awk '{printf "%.1f", $3 * 24}' || true)
    alarms=$(grep -o '[0-9]* false alarm(s)' "$work/report-$pattern-healthy.md" | head -1 | cut -d' ' -f1 || true)
    echo "| $pattern | $(found 1.05-1.1x) | $(found 1.1-1.5x) | $(found 1.5-5x) | ${latency} | ${precision:--} | ${hours:-0} | ${alarms:-?} |"
  done
  echo
  echo "Suite time: $(( $(date +%s) - started )) s."
  exit 0
fi

if [ "$mode" != "--scale" ]; then
# 1. Hangs, mismatches, dead agents, slowed ranks and nodes: 7 jobs of 4
#    nodes x 8 ranks side by side (mixed: one healthy job, one per fault
#    type), 100 ms steps, clocks off by up to 2 s with 30 ppm drift and 1 ms
#    probe jitter, 1% of batch sends lost, 2% reordered.
for seed in $seeds; do
  accuracy "mixed-$seed" "$work/scores-mixed.jsonl" --hang-timeout-s "$hang_timeout" --node-lost-timeout-s 5 -- \
    --scenario mixed --seed "$seed" --jobs 7 --nodes-per-job 4 --pp 2 --step-ms 100 --duration-s "$mixed_s" \
    --fault-after-s 6 --fault-window-s 3 --batch-loss 0.01 --batch-reorder 0.02
done
# 2. Stragglers at scale: one job of straggler_nodes x 8 ranks (TP 8 in the
#    node, PP 4, DP across), real-time 1 s steps, 32 ranks slowed by
#    1.02x-5x (log-uniform) from 15-25 s on. (At 1,024 nodes / 8,192 ranks
#    the collector falls behind live: see docs/benchmarks.md.)
#    Pipeline stages are equally fast here (--last-stage-factor 1): the
#    slower last stage is measured on its own in 2b.
accuracy "stragglers" "$work/scores-stragglers.jsonl" -- \
  --scenario slowdown --seed 11 --jobs 1 --nodes-per-job "$straggler_nodes" --pp 4 --step-ms 1000 \
  --duration-s "$straggler_s" --fault-after-s 15 --fault-window-s 10 --culprits "$straggler_culprits" \
  --min-factor 1.02 --max-factor 5 --last-stage-factor 1 --prefix big
# 2b. The benign confounder at real step times: a healthy 64-rank job (PP 4)
#     whose last pipeline stage computes 20% longer, 1 s steps.
accuracy "laststage" "$work/scores-laststage.jsonl" -- \
  --scenario healthy --seed 12 --jobs 1 --nodes-per-job 8 --pp 4 --step-ms 1000 --duration-s "$laststage_s" \
  --last-stage-factor 1.2 --prefix stage
# 3. Healthy jobs with their benign confounders (log-normal jitter, GC-like
#    pauses, a 20% slower last pipeline stage, clock offsets and drift, 1%
#    lost batches): jobs of 2 nodes x 4 ranks (PP 2), compressed 25 ms
#    steps, each standing for 1 s of a real job (--nominal-step-s 1).
accuracy "healthy" "$work/scores-healthy.jsonl" -- \
  --scenario healthy --seed 5 --jobs "$healthy_jobs" --nodes-per-job 2 --gpus 4 --pp 2 --step-ms 25 \
  --duration-s "$healthy_s" --nominal-step-s 1 --batch-loss 0.01 --prefix healthy

echo "## Simulated fleet: accuracy ($(date -u +%F), $(nproc) cores, kernel $(uname -r))"
echo
echo "Command: \`scripts/bench-sim.sh $build${2:+ $2}\`; seeds: $seeds; hang timeout ${hang_timeout} s, node-lost timeout 5 s."
echo
echo "### Hangs, mismatches, lost nodes, slowed ranks and nodes (7 jobs of 4 nodes x 8 ranks, 100 ms steps)"
echo
"$bin/rankscope-sim" report "$work/scores-mixed.jsonl"
echo
echo "### Stragglers in one job of $((straggler_nodes * 8)) ranks ($straggler_nodes nodes, TP 8, PP 4, 1 s steps, $straggler_culprits ranks slowed 1.02x-5x)"
echo
"$bin/rankscope-sim" report "$work/scores-stragglers.jsonl"
echo
echo "### The slower last pipeline stage (benign): one healthy 64-rank job, PP 4, last stage 20% slower, 1 s steps, ${laststage_s} s"
echo
"$bin/rankscope-sim" report "$work/scores-laststage.jsonl" | grep -E '^(Healthy)|^\| (straggler|hang|mismatch|node_lost) '
echo
echo "### Healthy jobs ($healthy_jobs jobs of 8 ranks, 25 ms steps standing for 1 s each)"
echo
"$bin/rankscope-sim" report "$work/scores-healthy.jsonl" | grep -E '^(Healthy|Clock|Delivery)|^\| (straggler|hang|mismatch|node_lost) '
echo
fi
[ "$mode" = "--accuracy" ] && exit 0

# 4. Scale: pre-built batches of an N-rank job (1 s steps, one batch per node
#    and second, TP 8 / PP 4 / DP N/32, plus one world AllReduce per step)
#    sent as fast as the collector acks them, RocksDB and every detector on.
echo "## Collector scale and cost ($(date -u +%F), $(nproc) cores)"
echo
echo "Command: \`scripts/bench-sim.sh $build${2:+ $2}\`. Ingest of $flood_steps steps after a one-node job with"
echo "$history 1 s steps of history (whose rank 0 is the 1-hour timeline asked); memory is the collector's RSS"
echo "after the run; JSON lines: the same records as the CLI's \`timeline --json\` objects, one per line."
echo
echo "| ranks | records | ingest records/s | wire bytes/record | JSON lines bytes/record | JSON / wire | RSS idle (MiB) | RSS after (MiB) | MiB per 1,000 ranks | findings query (ms) | 1-hour timeline (records, ms) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for ranks in $flood_sizes; do
  start_collector "flood-$ranks" --hang-timeout-s 30
  # shellcheck disable=SC2086 # RS_FLOOD_ARGS: words meant
  out=$("$bin/rankscope-sim" flood --collector "$agents" --query "$query" --ranks "$ranks" --steps "$flood_steps" \
    --history-steps "$history" --collector-pid "$collector_pid" --log-level warn ${RS_FLOOD_ARGS:-})
  comm=$(grep -o '"history_comm":"[0-9a-f]*"' <<<"$out" | cut -d'"' -f4)
  json_bytes=$("$bin/rankscope" --collector "$query" --insecure timeline --comm "$comm" --rank 0 --last 0 --json |
    sed -e 's/^.*"records":\[//' -e 's/\]}$//' -e 's/},{/}\n{/g' | wc -c)
  num() { grep -o "\"$1\":[0-9.e+-]*" <<<"$out" | cut -d: -f2; }
  awk -v r="$ranks" -v rec="$(num records)" -v rate="$(num records_per_s)" -v wb="$(num wire_bytes_per_record)" \
    -v jb="$json_bytes" -v tr="$(num timeline_records)" -v idle="$(num rss_idle_kb)" -v rss="$(num rss_kb)" \
    -v fq="$(num findings_ms)" -v tq="$(num timeline_ms)" 'BEGIN {
      j = tr > 0 ? jb / tr : 0;
      ratio = 0; if (wb > 0) ratio = j / wb;
      per = (rss - idle) / 1024 / (r / 1000);
      printf "| %d | %d | **%.0f** | %.2f | %.1f | %.1fx | %.0f | %.0f | %.1f | %.1f | %d, %.1f |\n",
        r, rec, rate, wb, j, ratio, idle / 1024, rss / 1024, per, fq, tr, tq }'
  stop_collector
done
echo
echo "Suite time: $(( $(date +%s) - started )) s."
