#!/usr/bin/env bash
# The demo behind `make demo`: a collector, two agents acting as two nodes
# (network namespaces on one bridge), and 8-rank fakenccl-train jobs across
# them, in three phases: healthy; one rank starved of CPU (a straggler); one
# rank stopped (a hang). Each time it shows what an operator would read.
# Cleans up after itself.
set -euo pipefail
source "$(dirname "$0")/lib-deployment.sh"
rs_setup "${1:-build}"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "a collector (hang timeout 5 s for the demo) and two agents, each speaking for one simulated node"
rs_start 2 --hang-timeout-s 5
rs_cli status

say "phase 1, healthy: an 8-rank job, 4 ranks per node, 100 steps of 3 AllReduce buckets"
rs_job 2 8 demo-healthy --steps 100 --check --quiet
grep -h '^fakenccl-train' "$work"/rank-*.log | sort -t' ' -k3 -n
rs_wait_records $((8 * 100 * 3))
say "rankscope status"
rs_cli status
say "rankscope jobs"
rs_cli jobs
comm=$(rs_cli jobs --json | grep -o '"comm":"[0-9a-f]*"' | head -1 | cut -d'"' -f4)
say "rankscope timeline --comm ${comm:0:8} --last 1   (the last collective of every rank)"
rs_cli timeline --comm "${comm:0:8}" --last 1
say "rankscope findings   (a healthy job: nothing to say)"
rs_cli findings

say "phase 2, a straggler: a job of another shape (each AllReduce followed by a synchronize and a host copy); after 40 healthy steps rank 5 shares its CPU with 12 stress-ng hogs (taskset: ranks on CPU 0, rank 5 and the hogs on CPU 1)"
RS_CPU_OF="*:0 5:1" rs_job_start 2 8 demo-training --pattern sync-each --steps 1000000 --compute-iters 2000000 --bucket-elems 16384 --quiet
job_pids=("${rank_pids[@]}")
# Healthy for 40 steps first: what a rank does from its first collectives
# on is its structure (docs/detection.md), a slowdown that appears is a fault.
rs_wait_records $((8 * 100 * 3 + 8 * 3 * 40)) 60
taskset -c 1 stress-ng --cpu 12 --timeout 300s --quiet &
hog=$!
rs_pids+=("$hog")
rs_wait_finding stragglers 90
for _ in $(seq 50); do rs_cli stragglers | grep -q 'Why:' && break; sleep 0.2; done  # the agents' CPU reports follow within seconds
say "rankscope stragglers"
rs_cli stragglers
kill "$hog" 2>/dev/null || true

say "phase 3, a hang: rank 2 is stopped with SIGSTOP (kill -STOP ${job_pids[2]})"
kill -STOP "${job_pids[2]}"
rs_wait_finding hangs 30
say "rankscope hangs"
rs_cli hangs
kill -CONT "${job_pids[2]}"
kill "${job_pids[@]}" 2>/dev/null || true

say "rankscope findings --json   (the same, for scripts; first finding)"
rs_cli findings --json | sed -e 's/},{"id"/},\n{"id"/g' | head -1
