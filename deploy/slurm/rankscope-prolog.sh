#!/bin/sh
# Slurm Prolog for rankscope (slurm.conf: Prolog=/path/to/rankscope-prolog.sh,
# PrologFlags=Alloc; with other Prolog scripts, list it beside them). slurmd
# runs it as root on each node of a job before any of its tasks starts; it
# records the job's account where the rankscope agent reads it
# (--slurm-jobs-dir, default /run/rankscope/slurm): a task's own
# SLURM_JOB_ACCOUNT is its user's word, this record is Slurm's.
# It never fails the job: a Prolog that exits non-zero drains the node.
dir=${RANKSCOPE_SLURM_DIR:-/run/rankscope/slurm}
case "${SLURM_JOB_ID:-}" in
  '' | *[!0-9]*) exit 0 ;;
esac
umask 022
mkdir -p "$dir" 2>/dev/null || exit 0
tmp=$(mktemp "$dir/.$SLURM_JOB_ID.XXXXXX" 2>/dev/null) || exit 0
if printf 'account=%s\n' "${SLURM_JOB_ACCOUNT:-}" > "$tmp" && chmod 0644 "$tmp"; then
  mv -f "$tmp" "$dir/$SLURM_JOB_ID" 2>/dev/null || rm -f "$tmp"
else
  rm -f "$tmp"
fi
exit 0
