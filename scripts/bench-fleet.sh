#!/usr/bin/env bash
# A fleet of collectors sharing one etcd (docs/operations.md "A fleet of
# collectors"), measured on this machine:
#   1. Aggregate ingest with 1, 2 and 3 collectors: one `rankscope-sim flood`
#      per collector, all at once, each its own job of RS_FLEET_RANKS (512)
#      ranks and RS_FLEET_STEPS (150) steps, RocksDB and every detector on.
#      Each flood sends straight to its collector, as agents following
#      placement would. Aggregate = all records / (the last flood's end of
#      sending - the first one's start), on the wall clock. Collectors and
#      floods share this machine's cores.
#   2. How long a job takes to move when its collector is SIGKILLed: from
#      the kill to the moment both survivors log the new membership (a
#      job's owner is a function of the membership, so the dead member's
#      jobs are the survivors' from then), RS_FLEET_KILLS (5) times, with
#      the default lease (--lease-ttl-s 5).
#
#   scripts/bench-fleet.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: scripts/bench-fleet.sh BUILD_DIR}
bin="$build/bin"
ranks=${RS_FLEET_RANKS:-512}
steps=${RS_FLEET_STEPS:-150}
kills=${RS_FLEET_KILLS:-5}
ttl=5
work=$(mktemp -d /tmp/rankscope-bench-fleet-XXXXXX)
pids=()  # running: etcd, the collectors, the floods
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# forget PID: it was waited for (its number may be reused).
forget() {
  local kept=() pid
  for pid in "${pids[@]}"; do [ "$pid" = "$1" ] || kept+=("$pid"); done
  pids=("${kept[@]}")
}
# shellcheck source=scripts/lib-loopback.sh
. "$(dirname "$0")/lib-loopback.sh"
port=$(rs_loopback_port)
command -v etcd >/dev/null || { echo "bench-fleet: etcd is missing (scripts/install-deps.sh test installs it)" >&2; exit 1; }

etcd_url="http://127.0.0.1:$port"
etcd --name bench --data-dir "$work/etcd" --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
  --listen-peer-urls "http://127.0.0.1:$((port + 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((port + 1))" \
  --initial-cluster "bench=http://127.0.0.1:$((port + 1))" >"$work/etcd.log" 2>&1 &
pids+=($!)
deadline=$((SECONDS + 30))
until grep -q "ready to serve client requests" "$work/etcd.log"; do
  [ "$SECONDS" -lt "$deadline" ] || { echo "bench-fleet: etcd did not start; its log:" >&2; cat "$work/etcd.log" >&2; exit 1; }
  sleep 0.2
done

declare -A agents queries member_pid
# start_member ID: a collector of the fleet on new ports, its own database.
start_member() {
  local id=$1
  port=$((port + 2))
  agents[$id]="tcp://127.0.0.1:$port"
  queries[$id]="tcp://127.0.0.1:$((port + 1))"
  "$bin/rankscope-collector" --listen "${agents[$id]}" --query "${queries[$id]}" --db "$work/db-$id" --insecure \
    --max-messages-per-s 0 --max-bytes-per-s 0 --etcd "$etcd_url" --collector-id "$id" --advertise 127.0.0.1 \
    --lease-ttl-s "$ttl" >>"$work/$id.log" 2>&1 &
  member_pid[$id]=$!
  pids+=($!)
}
stop_member() {
  kill "${member_pid[$1]}" 2>/dev/null || true
  wait "${member_pid[$1]}" 2>/dev/null || true
  forget "${member_pid[$1]}"
}
# wait_fleet N: until N collectors answer and each sees N.
wait_fleet() {
  local deadline=$((SECONDS + 60)) out
  while [ "$SECONDS" -lt "$deadline" ]; do
    out=$("$bin/rankscope" --etcd "$etcd_url" --insecure --timeout-ms 1000 fleet --json 2>/dev/null || true)
    [ "$(grep -o "\"members_seen\":$1" <<<"$out" | wc -l)" -eq "$1" ] &&
      [ "$(grep -o '"answering":true' <<<"$out" | wc -l)" -eq "$1" ] && return 0
    sleep 0.2
  done
  echo "bench-fleet: the fleet did not settle at $1 collectors: $out" >&2
  exit 1
}

echo "## A fleet of collectors ($(date -u +%F), $(nproc) cores, $(uname -r))"
echo
echo "Command: \`scripts/bench-fleet.sh $build\`. One etcd member on loopback."
echo
echo "| collectors | floods at once | records | first start to last end (s) | aggregate records/s | vs 1 collector | collectors' CPU (s) |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
base=0
for n in 1 2 3; do
  ids=()
  for i in $(seq 1 "$n"); do ids+=("f$n-$i"); start_member "f$n-$i"; done
  wait_fleet "$n"
  floods=()
  for id in "${ids[@]}"; do
    "$bin/rankscope-sim" flood --collector "${agents[$id]}" --query "${queries[$id]}" --ranks "$ranks" --steps "$steps" \
      --history-steps 60 --seed "$RANDOM" --collector-pid "${member_pid[$id]}" --log-level warn >"$work/flood-$id.json" &
    floods+=($!)
    pids+=($!)
  done
  for pid in "${floods[@]}"; do wait "$pid"; forget "$pid"; done
  cpu=0
  for id in "${ids[@]}"; do
    ticks=$(awk '{print $14 + $15}' "/proc/${member_pid[$id]}/stat")
    cpu=$(awk -v c="$cpu" -v t="$ticks" -v hz="$(getconf CLK_TCK)" 'BEGIN { print c + t / hz }')
  done
  records=0; first=0; last=0
  for id in "${ids[@]}"; do
    num() { grep -o "\"$1\":[0-9]*" "$work/flood-$id.json" | cut -d: -f2; }
    records=$((records + $(num records)))
    start=$(num start_unix_ns) end=$(num end_unix_ns)
    if [ "$first" -eq 0 ] || [ "$start" -lt "$first" ]; then first=$start; fi
    if [ "$end" -gt "$last" ]; then last=$end; fi
  done
  longest=$(awk -v a="$first" -v b="$last" 'BEGIN { print (b - a) / 1e9 }')
  rate=$(awk -v r="$records" -v s="$longest" 'BEGIN { printf "%.0f", r / s }')
  [ "$n" -eq 1 ] && base=$rate
  awk -v n="$n" -v r="$records" -v s="$longest" -v rate="$rate" -v base="$base" -v cpu="$cpu" 'BEGIN {
    printf "| %d | %d | %d | %.2f | **%d** | %.2fx | %.1f |\n", n, n, r, s, rate, rate / base, cpu }'
  for id in "${ids[@]}"; do stop_member "$id"; done
done
echo
echo "A job's move after its collector is SIGKILLed (lease ${ttl} s; from the kill to both survivors' logging the"
echo "new membership, from their logs' millisecond timestamps):"
echo
for id in m1 m2 m3; do start_member "$id"; done
wait_fleet 3
moves=()
for k in $(seq 1 "$kills"); do
  victim=m$(( (k - 1) % 3 + 1 ))
  killed_ms=$(date +%s%3N)
  kill -9 "${member_pid[$victim]}"
  wait "${member_pid[$victim]}" 2>/dev/null || true
  forget "${member_pid[$victim]}"
  worst=0
  for id in m1 m2 m3; do
    [ "$id" = "$victim" ] && continue
    deadline=$((SECONDS + 60))
    until awk -v since="$killed_ms" '/fleet: 2 collector\(s\)/ {
          t = $1; gsub(/Z$/, "", t); cmd = "date -u -d " t " +%s%3N"; cmd | getline ms; close(cmd);
          if (ms >= since) { found = 1 } } END { exit !found }' "$work/$id.log"; do
      [ "$SECONDS" -lt "$deadline" ] || { echo "bench-fleet: $id never saw $victim leave" >&2; exit 1; }
      sleep 0.2
    done
    seen=$(awk -v since="$killed_ms" '/fleet: 2 collector\(s\)/ {
          t = $1; gsub(/Z$/, "", t); cmd = "date -u -d " t " +%s%3N"; cmd | getline ms; close(cmd);
          if (ms >= since) { print ms; exit } }' "$work/$id.log")
    [ $((seen - killed_ms)) -gt "$worst" ] && worst=$((seen - killed_ms))
  done
  moves+=("$worst")
  echo "- kill $k ($victim): moved after $worst ms"
  start_member "$victim"
  wait_fleet 3
done
sorted=$(printf '%s\n' "${moves[@]}" | sort -n | tr '\n' ' ')
echo
echo "Moves (ms, sorted): $sorted(lease ${ttl} s; members are read every second)."
