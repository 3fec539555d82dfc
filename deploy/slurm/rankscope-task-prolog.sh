#!/bin/sh
# Slurm TaskProlog for rankscope (slurm.conf:
# TaskProlog=/usr/lib/rankscope/rankscope-task-prolog.sh). slurmd runs it as
# the job's user, in the task's environment, before each task starts; each
# `export NAME=VALUE` line it prints is set in that task's environment.
#
# It names rankscope's NCCL profiler plugin (docs/gpu-timing.md), so that
# NCCL in the task loads it: NCCL_PROFILER_PLUGIN=<the plugin's path>.
# Opt-in per partition: the plugin is named for jobs of the partitions the
# site lists in /etc/rankscope/task-prolog.conf (RANKSCOPE_TASK_PROLOG_CONF;
# root's, not writable by others), a line
#   RANKSCOPE_PROFILER_PARTITIONS="gpu a100"   (or "*": every partition)
# A job decides for itself with RANKSCOPE_NCCL_PROFILER=1 (on, whatever its
# partition) or 0 (off), e.g. `srun --export=ALL,RANKSCOPE_NCCL_PROFILER=0`.
# Nothing is set when
#   - the job names a profiler plugin itself (NCCL_PROFILER_PLUGIN already
#     set: NCCL loads one plugin per process, and the job's choice, e.g.
#     NVIDIA's NCCL Inspector, wins);
#   - the job opts out, or its partition is not listed and it did not opt in;
#   - the plugin is not installed on this node.
# The plugin's path: /usr/lib/rankscope/librankscope-nccl-profiler.so, or
# RANKSCOPE_PROFILER_LIB set by a wrapper that names this script.
# With no rankscope agent reading it, the plugin costs NCCL a counter
# increment per event (docs/benchmarks.md). Never fails the task.
plugin=${RANKSCOPE_PROFILER_LIB:-/usr/lib/rankscope/librankscope-nccl-profiler.so}
[ -n "${NCCL_PROFILER_PLUGIN:-}" ] && exit 0
case "${RANKSCOPE_NCCL_PROFILER:-}" in
  0) exit 0 ;;
  1) ;;
  *)
    # The site's list of partitions (read, not run: a line of plain words).
    conf=${RANKSCOPE_TASK_PROLOG_CONF:-/etc/rankscope/task-prolog.conf}
    # Read only a plain file owned by root and writable by root alone; not
    # through a symbolic link (the file it names could be anyone's).
    [ -f "$conf" ] && [ ! -L "$conf" ] || exit 0
    case "$(stat -c '%u %a' "$conf" 2>/dev/null)" in
      0\ [0-7][0145][0145]) ;;
      *) exit 0 ;;
    esac
    partitions=$(sed -n 's/^[[:space:]]*RANKSCOPE_PROFILER_PARTITIONS=["'\'']\{0,1\}\([^"'\'']*\)["'\'']\{0,1\}[[:space:]]*$/\1/p' "$conf" | tail -n 1)
    # A job may list several partitions (Slurm runs it in one of them: SLURM_JOB_PARTITION).
    listed=0
    set -f  # "*" is a word here, not a file name pattern
    for p in $partitions; do
      [ "$p" = "*" ] && listed=1
      [ "$p" = "${SLURM_JOB_PARTITION:-}" ] && listed=1
    done
    [ "$listed" = 1 ] || exit 0
    ;;
esac
[ -r "$plugin" ] || exit 0
case "$plugin" in
  *[!A-Za-z0-9_./+-]*) exit 0 ;;  # printed into a line slurmd parses: plain path characters only
esac
echo "export NCCL_PROFILER_PLUGIN=$plugin"
exit 0
