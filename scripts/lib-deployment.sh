# Shared by scripts/demo.sh and scripts/bench.sh (sourced, not run): a
# collector, one agent per simulated node, and fakenccl-train jobs across
# the nodes. Call rs_setup first; rs_cleanup runs on exit.

rs_setup() {
  build=${1:-build}
  bin="$build/bin"
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  if [ "$(id -u)" -ne 0 ]; then
    echo "rankscope: eBPF probes and network namespaces need root; this shell is not root." >&2
    echo "rankscope: run it as root, e.g.  sudo make demo" >&2
    exit 1
  fi
  work=$(mktemp -d /tmp/rankscope-XXXXXX)
  prefix="rs$$"
  # Below the kernel's range for outgoing connections (32768 and up by
  # default), so that no client socket of this machine holds it.
  agent_port=$((21000 + RANDOM % 11000))
  query_port=$((agent_port + 1))
  rs_pids=()
  trap rs_cleanup EXIT INT TERM
}

rs_cleanup() {
  for pid in "${rs_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  "$here/scripts/netns-cluster.sh" down "$prefix" 2>/dev/null || true
  rm -rf "$work"
}

rs_cli() {
  "$bin/rankscope" --collector "tcp://127.0.0.1:$query_port" --key "$work/keys/client.key" \
    --collector-key "$work/keys/collector.pub" "$@"
}

# rs_keys NODE_NAMES...: CurveZMQ keys as an operator makes them
# (docs/operations.md): the collector's, one per agent (its .pub in the
# allow-list, bound to its node name) and the CLI's.
rs_keys() {
  mkdir -p "$work/keys/allowed"
  [ -f "$work/keys/collector.key" ] || "$bin/rankscope" keygen --role collector --out "$work/keys/collector" >/dev/null
  [ -f "$work/keys/client.key" ] || {
    "$bin/rankscope" keygen --role client --name demo --out "$work/keys/client" >/dev/null
    cp "$work/keys/client.pub" "$work/keys/allowed/"
  }
  local node
  for node in "$@"; do
    [ -f "$work/keys/$node.key" ] && continue
    "$bin/rankscope" keygen --role agent --name "$node" --out "$work/keys/$node" >/dev/null
    cp "$work/keys/$node.pub" "$work/keys/allowed/"
  done
}
# rs_agent_keys NODE: the agent flags for NODE's key.
rs_agent_keys() { echo "--key $work/keys/$1.key --collector-key $work/keys/collector.pub"; }
rs_collector_keys() { echo "--key $work/keys/collector.key --allow $work/keys/allowed"; }

# rs_start NODES [collector options...]: the namespaces, the collector and one agent per node.
rs_start() {
  local nodes=$1
  shift
  "$here/scripts/netns-cluster.sh" up "$prefix" "$nodes"
  local names=()
  for ((node = 0; node < nodes; node++)); do names+=("gpu-$node"); done
  rs_keys "${names[@]}"
  # shellcheck disable=SC2046 # word splitting of the key flags is meant
  "$bin/rankscope-collector" --listen "tcp://127.0.0.1:$agent_port" --query "tcp://127.0.0.1:$query_port" \
    --db "$work/db" $(rs_collector_keys) "$@" >"$work/collector.log" 2>&1 &
  local collector_pid=$!
  rs_pids+=("$collector_pid")
  for ((node = 0; node < nodes; node++)); do
    # shellcheck disable=SC2046
    "$bin/rankscope-agent" --collector "tcp://127.0.0.1:$agent_port" --node "gpu-$node" --spool-dir "$work/spool" $(rs_agent_keys "gpu-$node") \
      --netns "/run/netns/$prefix-$node" --nccl-lib "$build/fakenccl/libnccl.so.2" ${RS_AGENT_ARGS:-} \
      >"$work/agent-$node.log" 2>&1 &
    rs_pids+=($!)
  done
  for _ in $(seq 200); do
    [ "$(rs_cli --timeout-ms 1000 status --json 2>/dev/null | grep -o '"connected":true' | wc -l)" -eq "$nodes" ] &&
      return 0
    if ! kill -0 "$collector_pid" 2>/dev/null; then
      echo "rankscope: the collector stopped; its log:" >&2
      cat "$work/collector.log" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "rankscope: the agents did not connect; their logs:" >&2
  cat "$work"/agent-*.log "$work/collector.log" >&2
  return 1
}

# rs_job_start NODES RANKS JOB_ID fakenccl-train-args...: starts one job in
# the background; its rank processes are in rank_pids (rank order). A rank
# listed in RS_CPU_OF ("rank:cpu ..."), or every rank with "*:cpu", is pinned.
rs_job_start() {
  local nodes=$1 ranks=$2 job=$3
  shift 3
  local per_node=$(((ranks + nodes - 1) / nodes))
  rank_pids=()
  rm -f "$work/nccl.id"
  for ((rank = 0; rank < ranks; rank++)); do
    local pin=() cpu
    cpu=$(tr ' ' '\n' <<<"${RS_CPU_OF:-}" | awk -F: -v r="$rank" '$1 == r {print $2; found = 1} $1 == "*" {d = $2} END {if (!found && d != "") print d}')
    [ -n "$cpu" ] && pin=(taskset -c "$cpu")
    RANK=$rank WORLD_SIZE=$ranks LOCAL_RANK=$((rank % per_node)) RANKSCOPE_JOB_ID=$job \
      ip netns exec "$prefix-$((rank / per_node))" "${pin[@]}" "$bin/fakenccl-train" --id-file "$work/nccl.id" "$@" \
      >"$work/rank-$rank.log" 2>&1 &
    rank_pids+=($!)
    rs_pids+=($!)
  done
}

# rs_job NODES RANKS JOB_ID fakenccl-train-args...: runs one job to the end.
rs_job() {
  local failed=0
  rs_job_start "$@"
  for pid in "${rank_pids[@]}"; do wait "$pid" || failed=1; done
  if [ "$failed" -ne 0 ]; then
    echo "rankscope: a rank of job $3 failed; the logs:" >&2
    cat "$work"/rank-*.log >&2
    return 1
  fi
}

# rs_wait_records N [SECONDS]: until the collector has stored at least N records (10 s at most by default).
rs_wait_records() {
  for _ in $(seq $((${2:-10} * 10))); do
    local stored
    stored=$(rs_cli status --json | grep -o '"records_stored":[0-9]*' | cut -d: -f2)
    [ "${stored:-0}" -ge "$1" ] && return 0
    sleep 0.1
  done
  echo "rankscope: the collector holds ${stored:-0} records, expected $1" >&2
  return 1
}

# rs_wait_finding COMMAND SECONDS: until `rankscope COMMAND --json` lists one.
rs_wait_finding() {
  for _ in $(seq $(($2 * 5))); do
    [ "$(rs_cli "$1" --json)" != "[]" ] && return 0
    sleep 0.2
  done
  echo "rankscope: no finding from '$1' within $2 s; the collector's log:" >&2
  tail -20 "$work/collector.log" >&2
  return 1
}
