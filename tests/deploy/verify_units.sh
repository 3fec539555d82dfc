#!/usr/bin/env bash
# The systemd units as shipped, checked by systemd's own verifier
# (`systemd-analyze verify`: directives, specifiers, credentials) with their
# binaries pointed at this build. The collector runs as a dynamic user, so
# its root-owned 0600 key must reach it as a credential, not as a path.
#   tests/deploy/verify_units.sh BUILD_DIR
set -euo pipefail
build=$(cd "${1:?usage: $0 BUILD_DIR}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d /tmp/rankscope-units-XXXXXX)
trap 'rm -rf "$work"' EXIT
for unit in "$src"/deploy/systemd/*.service; do
  sed "s|/usr/local/bin/|$build/bin/|g" "$unit" >"$work/$(basename "$unit")"
done
collector="$work/rankscope-collector.service"
if grep -q '^DynamicUser=yes' "$collector"; then
  grep -q '^LoadCredential=collector.key:/etc/rankscope/collector.key$' "$collector" ||
    { echo "FAIL: the collector runs as a dynamic user but its key is not loaded as a credential"; exit 1; }
  grep -q -- '--key %d/collector.key' "$collector" ||
    { echo "FAIL: the collector is not given its credential's path (%d/collector.key)"; exit 1; }
fi
out=$(systemd-analyze verify "$work"/*.service 2>&1) || { echo "$out"; exit 1; }
if [ -n "$out" ]; then
  echo "FAIL: systemd-analyze has remarks:"
  echo "$out"
  exit 1
fi
echo "units verified: $(cd "$work" && echo *.service)"
