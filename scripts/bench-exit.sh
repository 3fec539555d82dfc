#!/usr/bin/env bash
# What the agent's process_exit program costs the kernel when traced
# processes exit: kernel.bpf_stats over the bpf test that starts and ends
# 1,000 traced processes (each makes and destroys 100 communicators; 8 at a
# time), sampled from bpftool while the test's probes are loaded.
#   scripts/bench-exit.sh [BUILD]
# Needs root (eBPF), bpftool and python3. Run it on a quiet machine.
set -euo pipefail
build=${1:-build}
if [ "$(id -u)" -ne 0 ]; then
  echo "rankscope: eBPF probes need root; run it as root, e.g.  sudo $0 $build" >&2
  exit 1
fi
command -v bpftool >/dev/null || { echo "rankscope: bpftool is needed (apt-get install bpftool)" >&2; exit 1; }
work=$(mktemp -d /tmp/rankscope-bench-exit.XXXXXX)
sampler=0
cleanup() {
  [ "$sampler" -gt 0 ] && kill "$sampler" 2>/dev/null || true
  sysctl -qw kernel.bpf_stats_enabled=0 || true
  rm -rf "$work"
}
trap cleanup EXIT
sysctl -qw kernel.bpf_stats_enabled=1
( while true; do bpftool prog show name process_exit -j 2>/dev/null >>"$work/samples" || true
    echo >>"$work/samples"; sleep 0.2; done ) &
sampler=$!
t0=$(date +%s.%N)
rc=0
"$build/bin/bpf_tests" --gtest_filter='*AgentMemoryStaysBounded*' >"$work/test.log" 2>&1 || rc=$?
t1=$(date +%s.%N)
if [ "$rc" -ne 0 ]; then
  echo "rankscope: the test failed (exit $rc):" >&2
  tail -20 "$work/test.log" >&2
  exit 1
fi
python3 - "$work/samples" "$t0" "$t1" <<'PY'
import json, sys
best = None
for line in open(sys.argv[1]):
    line = line.strip()
    if not line:
        continue
    try:
        progs = json.loads(line)
    except ValueError:
        continue
    for p in progs if isinstance(progs, list) else [progs]:
        if best is None or p.get("run_cnt", 0) > best.get("run_cnt", 0):
            best = p
if not best or not best.get("run_cnt"):
    sys.exit("rankscope: process_exit never ran while sampled")
print("bpf_tests *AgentMemoryStaysBounded*: %.1f s; process_exit ran %d times (every exiting thread), "
      "%.1f ms in all, %.1f us a run" % (float(sys.argv[3]) - float(sys.argv[2]), best["run_cnt"],
                                         best["run_time_ns"] / 1e6, best["run_time_ns"] / best["run_cnt"] / 1e3))
PY
