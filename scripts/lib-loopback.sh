# Shared by scripts/load-test.sh, scripts/bench-sim.sh and
# scripts/bench-report.sh (sourced, not run): a plaintext collector on
# loopback for rankscope-sim, which speaks for every simulated node from one
# process (docs/operations.md). Needs $bin.

# rs_loopback_collector PORT DB LOG [collector options...]: starts it on
# PORT (agents) and PORT+1 (queries), sets $agents, $query, $port and
# $collector_pid, and returns once it answers. A collector that cannot
# listen because another program holds a port is started again two ports
# up (five tries); one that dies for another reason, or never answers
# within 20 s, ends the script with its log. RS_COLLECTOR, if set, is the
# collector binary to run instead of $bin's (a baseline build, for
# before/after figures in one session).
rs_loopback_collector() {
  port=$1
  local db=$2 log=$3 try
  shift 3
  for try in 1 2 3 4 5; do
    agents="tcp://127.0.0.1:$port"
    query="tcp://127.0.0.1:$((port + 1))"
    "${RS_COLLECTOR:-$bin/rankscope-collector}" --listen "$agents" --query "$query" --db "$db" --log-level warn \
      --insecure "$@" >"$log" 2>&1 &
    collector_pid=$!
    local deadline=$((SECONDS + 20))
    while [ "$SECONDS" -lt "$deadline" ]; do
      "$bin/rankscope" --collector "$query" --insecure --timeout-ms 500 status >/dev/null 2>&1 && return 0
      kill -0 "$collector_pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$collector_pid" 2>/dev/null; then
      echo "$(basename "$0"): the collector on $agents did not answer within 20 s; its log:" >&2
      kill "$collector_pid" 2>/dev/null || true
      cat "$log" >&2
      exit 1
    fi
    wait "$collector_pid" 2>/dev/null || true
    grep -q "Address already in use" "$log" || break
    echo "$(basename "$0"): port $port or $((port + 1)) is taken (try $try of 5); trying two ports up" >&2
    port=$((port + 2))
  done
  echo "$(basename "$0"): the collector on $agents did not start; its log:" >&2
  cat "$log" >&2
  exit 1
}

# rs_loopback_port: where to start looking for two free ports, below the
# kernel's range for outgoing connections (32768 and up by default), so
# that no client socket of this machine can be holding it.
rs_loopback_port() { echo $((21000 + RANDOM % 11000)); }
