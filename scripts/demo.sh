#!/usr/bin/env bash
# The demo behind `make demo`: a collector, two agents acting as two nodes
# (network namespaces on one bridge), an 8-rank fakenccl-train job across
# them, and what the collector then knows. Cleans up after itself.
set -euo pipefail
source "$(dirname "$0")/lib-deployment.sh"
rs_setup "${1:-build}"

say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

say "a collector and two agents, each speaking for one simulated node (gpu-0, gpu-1)"
rs_start 2
rs_cli status

say "an 8-rank training job, 4 ranks per node, 100 steps of 3 AllReduce buckets (fakenccl)"
rs_job 2 8 demo-job --steps 100 --check --quiet
grep -h '^fakenccl-train' "$work"/rank-*.log | sort -t' ' -k3 -n
rs_wait_records $((8 * 100 * 3))

say "rankscope status"
rs_cli status
say "rankscope jobs"
rs_cli jobs
comm=$(rs_cli jobs --json | grep -o '"comm":"[0-9a-f]*"' | head -1 | cut -d'"' -f4)
say "rankscope timeline --comm ${comm:0:8} --last 2   (the last two collectives of every rank)"
rs_cli timeline --comm "${comm:0:8}" --last 2
