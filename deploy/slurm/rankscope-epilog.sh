#!/bin/sh
# Slurm Epilog for rankscope (slurm.conf: Epilog=/path/to/rankscope-epilog.sh):
# removes the job's record that rankscope-prolog.sh wrote. Never fails.
dir=${RANKSCOPE_SLURM_DIR:-/run/rankscope/slurm}
case "${SLURM_JOB_ID:-}" in
  '' | *[!0-9]*) exit 0 ;;
esac
rm -f "$dir/$SLURM_JOB_ID"
exit 0
