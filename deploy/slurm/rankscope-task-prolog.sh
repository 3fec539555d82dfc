#!/bin/sh
# Slurm TaskProlog for rankscope (slurm.conf:
# TaskProlog=/usr/lib/rankscope/rankscope-task-prolog.sh). slurmd runs it as
# the job's user, in the task's environment, before each task starts; each
# `export NAME=VALUE` line it prints is set in that task's environment.
#
# It names rankscope's NCCL profiler plugin (docs/gpu-timing.md), so that
# NCCL in every task loads it: NCCL_PROFILER_PLUGIN=<the plugin's path>.
# Nothing is set when
#   - the job names a profiler plugin itself (NCCL_PROFILER_PLUGIN already
#     set: NCCL loads one plugin per process, and the job's choice, e.g.
#     NVIDIA's NCCL Inspector, wins);
#   - the job opts out (RANKSCOPE_NCCL_PROFILER=0, e.g.
#     `srun --export=ALL,RANKSCOPE_NCCL_PROFILER=0`);
#   - the plugin is not installed on this node.
# The plugin's path: /usr/lib/rankscope/librankscope-nccl-profiler.so, or
# RANKSCOPE_PROFILER_LIB set by a wrapper that names this script.
# With no rankscope agent reading it, the plugin costs NCCL a counter
# increment per event (docs/benchmarks.md). Never fails the task.
plugin=${RANKSCOPE_PROFILER_LIB:-/usr/lib/rankscope/librankscope-nccl-profiler.so}
[ "${RANKSCOPE_NCCL_PROFILER:-1}" = 0 ] && exit 0
[ -n "${NCCL_PROFILER_PLUGIN:-}" ] && exit 0
[ -r "$plugin" ] || exit 0
case "$plugin" in
  *[!A-Za-z0-9_./+-]*) exit 0 ;;  # printed into a line slurmd parses: plain path characters only
esac
echo "export NCCL_PROFILER_PLUGIN=$plugin"
exit 0
