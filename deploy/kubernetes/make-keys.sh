#!/usr/bin/env bash
# Makes rankscope's CurveZMQ keys for a Kubernetes cluster, into ./keys
# (next to this file), for `kubectl apply -k`:
#   keys/collector.key, .pub      the collector's pair (a Secret; the .pub a ConfigMap)
#   keys/agents/NODE.key          each node's agent key: copy it to the node as
#                                 /etc/rankscope/agent.key (0600, root) with your
#                                 node bootstrap; it never goes into the cluster
#   keys/clients/NAME.key         a client key for the CLI (and rankscope mcp)
#   keys/allowed-configmap.yaml   the allow-list: every agent's and client's .pub
#
#   deploy/kubernetes/make-keys.sh [--rankscope PATH] [--client NAME] NODE...
# Run it again with more nodes to add them: existing keys are kept (rotate
# one by deleting its files first; docs/operations.md, "Kubernetes").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
rankscope=rankscope
client=ops
while [ $# -gt 0 ]; do
  case "$1" in
    --rankscope) rankscope=$2; shift 2 ;;
    --client) client=$2; shift 2 ;;
    -h | --help) sed -n '2,15p' "$0"; exit 0 ;;
    --*) echo "make-keys.sh: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
done
[ $# -gt 0 ] || { echo "usage: $0 [--rankscope PATH] [--client NAME] NODE..." >&2; exit 2; }
command -v "$rankscope" >/dev/null || { echo "make-keys.sh: $rankscope not found (give --rankscope PATH)" >&2; exit 1; }
command -v kubectl >/dev/null || { echo "make-keys.sh: kubectl not found" >&2; exit 1; }
keys=$here/keys
umask 077
mkdir -p "$keys/agents" "$keys/clients" "$keys/allowed"
keygen() {  # ROLE NAME PREFIX: made unless it exists
  [ -f "$3.key" ] || "$rankscope" keygen --role "$1" --name "$2" --out "$3" >/dev/null
}
keygen collector collector "$keys/collector"
for node in "$@"; do
  keygen agent "$node" "$keys/agents/$node"
  cp "$keys/agents/$node.pub" "$keys/allowed/agent-$node.pub"
done
keygen client "$client" "$keys/clients/$client"
cp "$keys/clients/$client.pub" "$keys/allowed/client-$client.pub"
kubectl create configmap rankscope-allowed --from-file="$keys/allowed" --dry-run=client -o yaml \
  >"$keys/allowed-configmap.yaml"
echo "keys in $keys: $(ls "$keys/allowed" | wc -l) admitted; copy keys/agents/NODE.key to each node's /etc/rankscope/agent.key"
