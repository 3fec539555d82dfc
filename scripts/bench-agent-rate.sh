#!/usr/bin/env bash
# The agent at a real call rate: RANKS fakenccl-train ranks on one simulated
# node (fsdp: an AllGather and a ReduceScatter per layer), traced by one real
# agent sending to a real collector, for SECONDS after a 5 s warm-up.
# Prints, as Markdown for docs/benchmarks.md: the collectives stored per
# rank and second, the agent's and the collector's CPU (/proc stat), the
# time inside the agent's BPF programs per call (kernel.bpf_stats) and the
# agent's drops.
#   scripts/bench-agent-rate.sh [BUILD] [SECONDS]
# RS_RANKS (default 8), RS_LAYERS (default 100), RS_COMPUTE_ITERS (CPU work
# per step; default 10000000: about 1,000 collectives per rank and second
# on 2 cores) shape the job. The ranks share the machine with the agent:
# run it on a quiet machine.
set -euo pipefail
source "$(dirname "$0")/lib-deployment.sh"
rs_setup "${1:-build}"
seconds=${2:-30}
ranks=${RS_RANKS:-8}
layers=${RS_LAYERS:-100}
iters=${RS_COMPUTE_ITERS:-10000000}

stats_before=$(sysctl -n kernel.bpf_stats_enabled)
restore_stats() { sysctl -q -w kernel.bpf_stats_enabled="$stats_before" || true; }
trap 'restore_stats; rs_cleanup' EXIT INT TERM
sysctl -q -w kernel.bpf_stats_enabled=1

# The agent's programs: those loaded after it starts (bpftool here cannot
# name a program's process).
prog_ids() { bpftool prog show -j | python3 -c 'import json, sys; print(" ".join(str(p["id"]) for p in json.load(sys.stdin)))'; }
ids_before=$(prog_ids)
rs_start 1 >/dev/null
agent_pid=$(pgrep -f "rankscope-agent --collector tcp://127.0.0.1:$agent_port " | head -1)
collector_pid=$(pgrep -f "rankscope-collector --listen tcp://127.0.0.1:$agent_port " | head -1)
ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
hz=$(getconf CLK_TCK)
# Run time and count of the agent's BPF programs, summed.
bpf_totals() {
  bpftool prog show -j | python3 -c '
import json, sys
before = set(int(i) for i in sys.argv[1].split())
ns = runs = 0
for p in json.load(sys.stdin):
    if p["id"] not in before:
        ns += p.get("run_time_ns", 0)
        runs += p.get("run_cnt", 0)
print(ns, runs)' "$ids_before"
}
# Each program of the agent: name, run time (ns), runs.
bpf_programs() {
  bpftool prog show -j | python3 -c '
import json, sys
before = set(int(i) for i in sys.argv[1].split())
for p in json.load(sys.stdin):
    if p["id"] not in before:
        print(p.get("name", "?"), p.get("run_time_ns", 0), p.get("run_cnt", 0))' "$ids_before"
}
stored() { rs_cli status --json | grep -o '"records_stored":[0-9]*' | cut -d: -f2; }
# Every drop the node's agent counted, all reasons together.
drops() { rs_cli status --json | python3 -c 'import json, sys; print(sum(sum(n["drops"].values()) for n in json.load(sys.stdin)["nodes"]))'; }

rs_job_start 1 "$ranks" bench-rate --pattern fsdp --layers "$layers" --steps 100000000 --compute-iters "$iters" \
  --bucket-elems 1024 --quiet
sleep 5
a0=$(ticks "$agent_pid") c0=$(ticks "$collector_pid") s0=$(stored) t0=$(date +%s%N)
read -r ns0 runs0 < <(bpf_totals)
bpf_programs >"$work/programs-0"
sleep "$seconds"
a1=$(ticks "$agent_pid") c1=$(ticks "$collector_pid") s1=$(stored) t1=$(date +%s%N)
read -r ns1 runs1 < <(bpf_totals)
bpf_programs >"$work/programs-1"
kill "${rank_pids[@]}" 2>/dev/null || true
wait "${rank_pids[@]}" 2>/dev/null || true

cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "Command: \`scripts/bench-agent-rate.sh ${1:-build} $seconds\`. Machine: $(nproc) cores of $cpu, kernel $(uname -r)."
echo "$ranks fakenccl-train ranks (fsdp, $layers layers, --compute-iters $iters) on one simulated node, one real agent"
echo "(default options) and a real collector; a 5 s warm-up, then $seconds s measured."
echo
echo "| ranks | collectives/s/rank | collectives/s | agent CPU (% of a core) | agent CPU per 1,000 calls/s | BPF time per call (ns) | collector CPU (% of a core) | drops |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
awk -v r="$ranks" -v s0="$s0" -v s1="$s1" -v t0="$t0" -v t1="$t1" -v a0="$a0" -v a1="$a1" -v c0="$c0" -v c1="$c1" \
  -v hz="$hz" -v n0="$ns0" -v n1="$ns1" -v u0="$runs0" -v u1="$runs1" -v d="$(drops)" 'BEGIN {
    secs = (t1 - t0) / 1e9; calls = (s1 - s0) / secs;
    agent = (a1 - a0) / hz / secs * 100; coll = (c1 - c0) / hz / secs * 100;
    # Each call runs two of the agent programs (its entry and its return).
    per_call = (s1 > s0) ? (n1 - n0) / (s1 - s0) : 0;
    printf "| %d | %.0f | %.0f | %.2f%% | %.3f%% | %.0f | %.2f%% | %s |\n", r, calls / r, calls, agent,
      (calls > 0 ? agent / (calls / 1000) : 0), per_call, coll, d }'
echo
echo "Where the BPF time goes (ns per collective stored; programs that ran):"
echo
echo "| program | runs per collective | ns per run | ns per collective |"
echo "| --- | --- | --- | --- |"
join <(sort "$work/programs-0") <(sort "$work/programs-1") | awk -v calls="$((s1 - s0))" '
  $5 > $3 { runs = $5 - $3; ns = $4 - $2; printf "%s %.3f %.0f %.0f\n", $1, runs / calls, ns / runs, ns / calls }' |
  sort -k4 -n -r | awk '{ printf "| %s | %s | %s | %s |\n", $1, $2, $3, $4 }'
