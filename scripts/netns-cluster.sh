#!/usr/bin/env bash
# Simulated nodes on one kernel: one network namespace per node, all joined
# to a bridge that lives in a namespace of its own, so nothing in the root
# namespace (routes, addresses, sysctls) changes. Node i gets 10.213.0.(i+1)
# on its eth0; the subnet exists only inside these namespaces.
#
#   scripts/netns-cluster.sh up   PREFIX N   # creates PREFIX-sw, PREFIX-0 .. PREFIX-(N-1)
#   scripts/netns-cluster.sh down PREFIX     # removes them (and their links)
set -euo pipefail

cmd=${1:-}; prefix=${2:-}
[ -n "$cmd" ] && [ -n "$prefix" ] || { echo "usage: $0 up PREFIX N | down PREFIX" >&2; exit 2; }

case "$cmd" in
  up)
    n=${3:?number of nodes}
    ip netns add "$prefix-sw"
    ip -n "$prefix-sw" link add br0 type bridge
    ip -n "$prefix-sw" link set br0 up
    for ((i = 0; i < n; i++)); do
      node="$prefix-$i"
      ip netns add "$node"
      ip link add eth0 netns "$node" type veth peer name "p$i" netns "$prefix-sw"
      ip -n "$prefix-sw" link set "p$i" master br0 up
      ip -n "$node" addr add "10.213.0.$((i + 1))/24" dev eth0
      ip -n "$node" link set eth0 up
      ip -n "$node" link set lo up
    done
    ;;
  down)
    for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}-(sw|[0-9]+)$" || true); do
      ip netns del "$ns" || true
    done
    ;;
  *) echo "usage: $0 up PREFIX N | down PREFIX" >&2; exit 2 ;;
esac
