#!/bin/sh
# Slurm Epilog for rankscope (slurm.conf: Epilog=/path/to/rankscope-epilog.sh).
# slurmd runs it as root on each node of a job once the job ends. It
#   - removes the job's record that rankscope-prolog.sh wrote;
#   - on the job's first node only, writes the job's rankscope report
#     (`rankscope report --job ID`: GPU-hours, whom it waited on, its
#     stragglers and hangs) into the job's working directory as
#     rankscope-<job id>.txt, as the job's user (so that the user's own
#     permissions apply to the path, never root's).
# The report needs the collector and a client key; they come from
# /etc/rankscope/slurm-epilog.conf (RANKSCOPE_EPILOG_CONF), a root-owned
# file of shell assignments:
#   RANKSCOPE_COLLECTOR=tcp://collector:7601
#   RANKSCOPE_KEY=/etc/rankscope/epilog-client.key     # rankscope keygen --role client
#   RANKSCOPE_COLLECTOR_KEY=/etc/rankscope/collector.pub
# Without it no report is written. Never fails: an Epilog that exits non-zero
# drains the node; the report is bounded to 20 s.
dir=${RANKSCOPE_SLURM_DIR:-/run/rankscope/slurm}
case "${SLURM_JOB_ID:-}" in
  '' | *[!0-9]*) exit 0 ;;
esac
rm -f "$dir/$SLURM_JOB_ID"

conf=${RANKSCOPE_EPILOG_CONF:-/etc/rankscope/slurm-epilog.conf}
[ -f "$conf" ] || exit 0
# Only a root-owned file that no one else may write is read: it is run as root.
owner=$(stat -c '%u %a' "$conf" 2>/dev/null) || exit 0
case "$owner" in
  0\ [0-7][0145][0145]) ;;
  *) logger -t rankscope-epilog "not reading $conf: it must be root's and not writable by others" 2>/dev/null; exit 0 ;;
esac
RANKSCOPE_COLLECTOR='' RANKSCOPE_KEY='' RANKSCOPE_COLLECTOR_KEY='' RANKSCOPE_CLI=''
. "$conf"
cli=${RANKSCOPE_CLI:-/usr/bin/rankscope}
[ -x "$cli" ] && [ -n "$RANKSCOPE_COLLECTOR" ] || exit 0

# The job's first node writes it, once.
first=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-}" 2>/dev/null | head -n 1)
[ -z "$first" ] || [ "$first" = "${SLURMD_NODENAME:-$(hostname -s)}" ] || exit 0
workdir=$(scontrol show job -o "$SLURM_JOB_ID" 2>/dev/null | tr ' ' '\n' | sed -n 's/^WorkDir=//p' | head -n 1)
user=${SLURM_JOB_USER:-}
[ -n "$workdir" ] && [ -n "$user" ] || exit 0

tmp=$(mktemp /tmp/rankscope-report.XXXXXX 2>/dev/null) || exit 0
export RANKSCOPE_KEY RANKSCOPE_COLLECTOR_KEY
{
  printf 'rankscope report of Slurm job %s (written at its end by the Epilog on %s; usage up to a few seconds before)\n\n' \
    "$SLURM_JOB_ID" "$(hostname -s)"
  timeout 20 "$cli" --collector "$RANKSCOPE_COLLECTOR" report --job "$SLURM_JOB_ID" 2>&1 ||
    printf '\n(the report could not be read from the collector at %s)\n' "$RANKSCOPE_COLLECTOR"
} > "$tmp"
chmod 0644 "$tmp"
# As the job's user: a path the user controls is only written with the user's rights.
setpriv --reuid="$user" --regid="$(id -g "$user")" --init-groups \
  sh -c 'cat > "$1/rankscope-$2.txt"' sh "$workdir" "$SLURM_JOB_ID" < "$tmp" 2>/dev/null ||
  logger -t rankscope-epilog "could not write the report of job $SLURM_JOB_ID into $workdir as $user" 2>/dev/null
rm -f "$tmp"
exit 0
