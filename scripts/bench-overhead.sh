#!/usr/bin/env bash
# The agent's cost per NCCL call against the floor of a bare uprobe +
# uretprobe pair on this kernel, and its CPU at 10,000 collective calls per
# second, printed as Markdown for docs/benchmarks.md.
#   scripts/bench-overhead.sh [BUILD] [rankscope-bench-overhead options...]
# Run it on a quiet machine: the figures are per-call times.
set -euo pipefail
build=${1:-build}
shift || true
if [ "$(id -u)" -ne 0 ]; then
  echo "rankscope: eBPF probes need root; run it as root, e.g.  sudo $0 $build" >&2
  exit 1
fi
cpu=$(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')
echo "### Agent cost per NCCL call and agent CPU ($(date -u +%F), $(nproc) cores, kernel $(uname -r))"
echo
echo "Command: \`scripts/bench-overhead.sh $build${*:+ $*}\` (\`scripts/bench.sh\` runs it too), which runs"
echo "\`$build/bin/rankscope-bench-overhead${*:+ $*}\`. Machine: $(nproc) cores of $cpu, kernel $(uname -r),"
echo "load average before the run $(cut -d' ' -f1-3 /proc/loadavg)."
echo "One run: per repetition, a no-op function in a shared library called alone, \`ncclAllReduce\`"
echo "(fakenccl, one-rank communicator, one float, in place, inside a group) alone and with a bare"
echo "uprobe + uretprobe pair on it, then, in alternating blocks, the no-op function with the bare pair on"
echo "it (the floor) and \`ncclAllReduce\` traced by a real \`rankscope-agent\` (\`--pid\` this process,"
echo "default options) sending to a real \`rankscope-collector\`. Every call is timed on its own."
echo
"$build/bin/rankscope-bench-overhead" "$@"
