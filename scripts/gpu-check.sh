#!/usr/bin/env bash
# rankscope on a real GPU machine: a collector, an agent (real eBPF) and a
# 3-rank PyTorch NCCL job (scripts/gpu-job.py) loading rankscope's NCCL
# profiler plugin; a healthy run, then one whose rank 2 GPU slows down
# mid-run while its host issues on time, then one whose rank 2 sends slowly
# for a while (a slow link: build/lib/librankscope-slow-send.so preloaded,
# 400 MB/s). Prints what rankscope found.
#   scripts/gpu-check.sh [BUILD] [OUTDIR]
# Needs root, python3 with PyTorch (CUDA) and its NCCL. With one GPU the
# ranks share it, each a "node" of its own (NCCL_HOSTID), so NCCL moves the
# data over its network transport on loopback; with three GPUs or more each
# rank has its own (GPUS=3).
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
out=${2:-$(mktemp -d /tmp/rankscope-gpu-check.XXXXXX)}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
nccl=$(python3 -c "import nvidia.nccl, os; print(os.path.join(nvidia.nccl.__path__[0], 'lib', 'libnccl.so.2'))")
port=${PORT:-7700}
pids=()
cleanup() { for p in "${pids[@]}"; do kill -INT "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$build/bin/rankscope-collector" --listen tcp://127.0.0.1:$port --query tcp://127.0.0.1:$((port + 1)) \
  --db "$out/db" --insecure --metrics 127.0.0.1:$((port + 2)) >"$out/collector.log" 2>&1 &
pids+=($!)
sleep 1
"$build/bin/rankscope-agent" --collector tcp://127.0.0.1:$port --node "$(hostname)" --insecure --nccl-lib "$nccl" \
  --spool-dir "" --slurm-jobs-dir "" >"$out/agent.log" 2>&1 &
pids+=($!)
sleep 3
job() {  # name slow_rank steps slow_after [kind [slow_until]]
  local ranks=() kind=${5:-gpu} until=${6:-$3} preload=""
  [ "$kind" = link ] && preload="$build/lib/librankscope-slow-send.so"
  for r in 0 1 2; do
    local local_rank=0 hostid=node$r
    if [ "${GPUS:-1}" -ge 3 ]; then local_rank=$r; hostid=$(hostname); fi
    RANK=$r WORLD_SIZE=3 LOCAL_RANK=$local_rank MASTER_ADDR=127.0.0.1 MASTER_PORT=$((port + 10)) \
      NCCL_HOSTID=$hostid NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1 RANKSCOPE_JOB_ID=$1 \
      NCCL_PROFILER_PLUGIN="$build/lib/librankscope-nccl-profiler.so" SLOW_RANK=$2 STEPS=$3 SLOW_AFTER=$4 \
      SLOW_KIND=$kind SLOW_UNTIL=$until LD_PRELOAD=$preload RANKSCOPE_SLOW_SEND_FILE="$out/slow-send-$1-$r" \
      python3 "$here/gpu-job.py" >"$out/job-$1-$r.log" 2>&1 &
    ranks+=($!)
  done
  for p in "${ranks[@]}"; do wait "$p"; done
  grep -h '^nccl' "$out/job-$1-0.log" | sed "s/^/$1: /"
}
job healthy -1 300 0
job slowgpu 2 900 300
job slowlink 2 900 300 link 700
sleep 2
q=(--collector tcp://127.0.0.1:$((port + 1)) --insecure)
"$build/bin/rankscope" "${q[@]}" jobs
"$build/bin/rankscope" "${q[@]}" findings
env -u LD_LIBRARY_PATH curl -s 127.0.0.1:$((port + 2))/metrics | grep -E '^rankscope_ingest_(gpu_)?records_total'
ps -o pid,pcpu,cputime,rss,comm -p "$(IFS=,; echo "${pids[*]}")"
echo "logs: $out"
