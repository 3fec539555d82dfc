# Shared by scripts/load-test.sh, scripts/bench-sim.sh and
# scripts/bench-report.sh (sourced, not run): a plaintext collector on
# loopback for rankscope-sim, which speaks for every simulated node from one
# process (docs/operations.md). Needs $bin.

# rs_loopback_collector PORT DB LOG [collector options...]: starts it on
# PORT (agents) and PORT+1 (queries), sets $agents, $query and
# $collector_pid, and returns once it answers; exits with its log if it
# never does. RS_COLLECTOR, if set, is the collector binary to run instead
# of $bin's (a baseline build, for before/after figures in one session).
rs_loopback_collector() {
  local port=$1 db=$2 log=$3
  shift 3
  agents="tcp://127.0.0.1:$port"
  query="tcp://127.0.0.1:$((port + 1))"
  "${RS_COLLECTOR:-$bin/rankscope-collector}" --listen "$agents" --query "$query" --db "$db" --log-level warn --insecure "$@" \
    >"$log" 2>&1 &
  collector_pid=$!
  for _ in $(seq 100); do
    "$bin/rankscope" --collector "$query" --insecure status >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "$(basename "$0"): the collector did not start; its log:" >&2
  cat "$log" >&2
  kill "$collector_pid" 2>/dev/null || true
  exit 1
}
