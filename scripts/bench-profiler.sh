#!/usr/bin/env bash
# The NCCL profiler plugin's cost per collective, called as NCCL calls it,
# against a table of empty functions in the same run, printed as Markdown
# for docs/benchmarks.md.
#   scripts/bench-profiler.sh [BUILD] [rankscope-bench-profiler options...]
# Run it on a quiet machine: the figures are per-collective times.
set -euo pipefail
build=${1:-build}
shift || true
plugin="$build/lib/librankscope-nccl-profiler.so"
[ -e "$plugin" ] || { echo "rankscope: no $plugin: build first (make build)" >&2; exit 1; }
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "### NCCL profiler plugin cost per collective ($(date -u +%F), $(nproc) cores, kernel $(uname -r))"
echo
echo "Command: \`scripts/bench-profiler.sh $build${*:+ $*}\` (\`scripts/bench.sh\` runs it too), which runs"
echo "\`$build/bin/rankscope-bench-profiler --plugin $plugin${*:+ $*}\`. Machine: $(nproc) cores of $cpu,"
echo "kernel $(uname -r), load average before the run $(cut -d' ' -f1-3 /proc/loadavg)."
echo "Per collective, as NCCL calls the plugin: the collective's start, two kernel channels started, the"
echo "collective's stop, each channel's KernelChStop state (with its GPU time) and stop: eight calls, six"
echo "records. Each collective is timed on its own."
echo
# Chained to the test suite's stand-in plugin (it counts and hands out
# handles, nothing else): what chaining itself costs.
chain="$build/lib/librankscope-test-chained-profiler.so"
chain_args=()
if [ -e "$chain" ]; then
  chain_args=(--chain "$chain")
  echo "The chained run: \`--chain $chain\`, the test suite's stand-in plugin (it counts calls and hands out"
  echo "handles, nothing else), so that row is what chaining adds beside the chained plugin's own work."
  echo
fi
"$build/bin/rankscope-bench-profiler" --plugin "$plugin" "${chain_args[@]}" "$@"
